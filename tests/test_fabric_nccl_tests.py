"""The nccl-tests table parser, on real all_reduce_perf outputs from tests/fixtures/library/nccl-tests."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainctl.errors import ParseError
from trainctl.health.fabric.bandwidth import Collective, algbw_gbps, busbw_gbps
from support.nccl_tests import NcclTestsOutput, parse_nccl_tests_output

NCCL_TESTS = Path(__file__).resolve().parent / "fixtures" / "library" / "nccl-tests"

# file -> (rows, rank count, rank count the caller must give, has root column)
TABLES = {
    # No Rank lines: the job definition beside it runs `mpirun -np 8 -N 8` on one p5 node.
    "aws-batch-p5-allreduce-8B-16GB-mpi-tagged-table-only.txt": (32, 8, 8, True),
    "aws-p4d-a100-2node-16gpu-efa-mpijob-tagged-nccl-info.txt": (30, 16, None, False),
    "gcp-a3mega-h100-2node-16gpu-allreduce-header-hash-stripped.txt": (31, 16, None, True),
    "h100-2node-16gpu-ib-ndr-allreduce-srun-label-prefix-issue290.txt": (11, 16, None, True),
    "h100-8gpu-1node-allreduce-128M-4G-nvls-issue290.txt": (6, 8, None, True),
    "hgx-h100-2node-16gpu-ib-cx7-allreduce-8B-16G-openmpi-xpmem-warning-issue309.txt": (32, 16, None, True),
    "superbench-a100-sxm4-40gb-8gpu-1node-old-format-no-root-col.txt": (34, 8, None, False),
}
FAILED_RUN = "errors/h20-vm-system-not-yet-initialized-fabricmanager-mismatch-issue338.txt"


def parse(name, **kwargs):
    kwargs.setdefault("rank_count", TABLES[name][2] if name in TABLES else None)
    return parse_nccl_tests_output((NCCL_TESTS / name).read_text(), source=name, **kwargs)


def print_resolution_us(time_us):
    """The coarsest unit nccl-tests prints a time in (old rule: %.0f above 10 ms, %.1f above 100 us)."""
    return 1.0 if time_us > 10000 else 0.1 if time_us >= 100 else 0.01


def test_every_fixture_is_covered():
    assert {p.name for p in NCCL_TESTS.glob("*.txt")} == set(TABLES)
    assert [p.relative_to(NCCL_TESTS).as_posix() for p in NCCL_TESTS.glob("errors/*")] == [FAILED_RUN]


@pytest.mark.parametrize("name", TABLES)
def test_table_shape(name):
    rows, ranks, _, has_root = TABLES[name]
    output = parse(name)
    assert len(output.rows) == rows
    assert output.rank_count == ranks
    assert output.failure is None and output.out_of_bounds == 0
    assert all((row.root == -1) if has_root else (row.root is None) for row in output.rows)
    assert all(row.dtype == "float" and row.redop == "sum" for row in output.rows)
    sizes = [row.size_bytes for row in output.rows]
    assert sizes == sorted(sizes) and sizes[-1] >= 2**32


def test_busbw_and_algbw_we_compute_match_what_nccl_tests_printed():
    """Every row of every fixture: size, time and rank count give the printed algbw and busbw."""
    checked = 0
    worst_relative_error = 0.0
    for name in TABLES:
        output = parse(name)
        for row in output.rows:
            for figures in (row.out_of_place, row.in_place):
                seconds = figures.time_us / 1e6
                # The printed time is rounded; bound what that does to the bandwidth.
                time_error = print_resolution_us(figures.time_us) / 2 / (figures.time_us - 0.5)
                algbw = algbw_gbps(row.size_bytes, seconds)
                busbw = busbw_gbps(Collective.ALL_REDUCE, row.size_bytes, seconds, output.rank_count)
                assert figures.algbw_gbps == pytest.approx(algbw, abs=0.005 + algbw * time_error + 1e-9), \
                    (name, row.line)
                assert figures.busbw_gbps == pytest.approx(busbw, abs=0.005 + busbw * time_error + 1e-9), \
                    (name, row.line)
                if busbw > 10:  # below, the 0.005 print rounding dominates
                    worst_relative_error = max(worst_relative_error, abs(figures.busbw_gbps / busbw - 1))
                checked += 1
    assert checked == 2 * 176
    # Tight: the next rank count (8 -> 9) would change an all_reduce factor by 1.6%.
    assert worst_relative_error < 1e-3


def test_a_wrong_rank_count_does_not_match_the_printed_busbw():
    """The comparison above can fail: 16 ranks instead of 8 misses the printed figures."""
    output = parse("h100-8gpu-1node-allreduce-128M-4G-nvls-issue290.txt")
    row = output.rows[-1]
    wrong = busbw_gbps(Collective.ALL_REDUCE, row.size_bytes, row.out_of_place.time_us / 1e6, 16)
    assert abs(wrong - row.out_of_place.busbw_gbps) > 30


def test_old_format_error_column_and_na_validation():
    p4d = parse("aws-p4d-a100-2node-16gpu-efa-mpijob-tagged-nccl-info.txt")
    first = p4d.rows[0]
    assert (first.out_of_place.max_error, first.in_place.max_error) == (2e-07, 1e-07)
    assert first.out_of_place.wrong_elements is None
    srun = parse("h100-2node-16gpu-ib-ndr-allreduce-srun-label-prefix-issue290.txt")
    assert all(row.in_place.wrong_elements is None and row.in_place.max_error is None for row in srun.rows)
    modern = parse("hgx-h100-2node-16gpu-ib-cx7-allreduce-8B-16G-openmpi-xpmem-warning-issue309.txt")
    assert all(row.out_of_place.wrong_elements == 0 for row in modern.rows)


def test_last_row_and_footer_values():
    output = parse("hgx-h100-2node-16gpu-ib-cx7-allreduce-8B-16G-openmpi-xpmem-warning-issue309.txt")
    last = output.rows[-1]
    assert (last.size_bytes, last.count) == (17179869184, 4294967296)
    assert (last.out_of_place.time_us, last.out_of_place.algbw_gbps, last.out_of_place.busbw_gbps) == \
        (68652.0, 250.24, 469.21)
    assert last.in_place.busbw_gbps == 469.10
    assert output.avg_busbw_gbps == 139.56


def test_failed_run_is_an_error_result():
    output = parse(FAILED_RUN)
    assert output.rows == ()
    assert output.failure is not None
    assert (output.failure.kind, output.failure.location, output.failure.message) == \
        ("CUDA", "common.cu:1030", "system not yet initialized")
    assert output.failure.host == "gpu"


def test_failure_in_the_middle_of_a_row_keeps_the_rows_before_it():
    text = (NCCL_TESTS / "h100-8gpu-1node-allreduce-128M-4G-nvls-issue290.txt").read_text()
    head, _, _ = text.partition("  1073741824")
    # stdout is buffered: the failure lands right after the half-printed row.
    text = head + "  1073741824     268435456     float     sum      -1node005: Test NCCL failure " \
        "common.cu:1066 'unhandled system error / NET/IB : Got completion with error'\n"
    output = parse_nccl_tests_output(text)
    assert len(output.rows) == 3
    assert output.failure.kind == "NCCL"
    assert output.failure.message.startswith("unhandled system error")


def test_table_only_output_without_rank_count_parses_but_has_none():
    name = "aws-batch-p5-allreduce-8B-16GB-mpi-tagged-table-only.txt"
    output = parse(name, rank_count=None)
    assert output.rank_count is None and len(output.rows) == 32


@pytest.mark.parametrize("name, rank_count, message", [
    ("aws-batch-p5-allreduce-8B-16GB-mpi-tagged-table-only.txt", 16, "busbw"),
    ("h100-8gpu-1node-allreduce-128M-4G-nvls-issue290.txt", 16, "Rank lines list 8 ranks"),
])
def test_rank_count_that_contradicts_the_output_is_refused(name, rank_count, message):
    with pytest.raises(ParseError, match=message):
        parse(name, rank_count=rank_count)


def read(name):
    return (NCCL_TESTS / name).read_text()


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("# Avg bus bandwidth    : 439.369", "# Avg bus bandwidth    : 43"), "average"),
    (lambda t: t[:t.index("# Out of bounds")], "footer"),
    (lambda t: t.replace("15870  270.63", "15870  280.63"), "algbw"),
    (lambda t: t.replace("270.63  473.60", "270.63  470.60"), "busbw"),
    (lambda t: t.replace("#wrong     time", "#wrong    i_min    time"), "unknown column layout"),
    (lambda t: t + t, "second result table"),
    (lambda t: t.replace("#  Rank  3 Group", "#  Rnak  3 Group"), "skip ranks"),
    (lambda t: "", "no nccl-tests result table"),
])
def test_damaged_output_is_a_parse_error(edit, message):
    text = edit(read("h100-8gpu-1node-allreduce-128M-4G-nvls-issue290.txt"))
    with pytest.raises(ParseError, match=message):
        parse_nccl_tests_output(text, source="damaged.txt")


def test_parse_error_names_the_line():
    text = read("h100-8gpu-1node-allreduce-128M-4G-nvls-issue290.txt").replace("613.3", "6l3.3")
    with pytest.raises(ParseError) as caught:
        parse_nccl_tests_output(text, source="x.txt")
    assert caught.value.line == 16 and str(caught.value).startswith("x.txt:16: ")


ALL_FIXTURES = sorted(TABLES) + [FAILED_RUN]
EDITS = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 100_000)),
    st.tuples(st.just("drop line"), st.integers(0, 1_000)),
    st.tuples(st.just("replace char"), st.integers(0, 100_000), st.characters(codec="utf-8")),
    st.tuples(st.just("insert line"), st.integers(0, 1_000), st.text(max_size=60)),
)


def apply_edit(text, edit):
    kind, where, *extra = edit
    if kind == "truncate":
        return text[:where % (len(text) + 1)]
    if not text:
        return "".join(extra)
    lines = text.splitlines(keepends=True)
    if kind == "drop line":
        del lines[where % len(lines)]
        return "".join(lines)
    if kind == "insert line":
        lines.insert(where % (len(lines) + 1), extra[0] + "\n")
        return "".join(lines)
    index = where % len(text)
    return text[:index] + extra[0] + text[index + 1:]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(ALL_FIXTURES), edits=st.lists(EDITS, min_size=1, max_size=3))
def test_mutated_fixtures_parse_or_raise_parse_error_only(name, edits):
    text = read(name)
    for edit in edits:
        text = apply_edit(text, edit)
    try:
        output = parse_nccl_tests_output(text, source=name, rank_count=TABLES.get(name, (0, 0, None))[2])
    except ParseError:
        return
    assert isinstance(output, NcclTestsOutput)
    assert output.failure is not None or output.rows


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(TABLES)), data=st.data())
def test_output_cut_before_its_footer_is_a_parse_error(name, data):
    text = read(name)
    footer = text.index("Avg bus bandwidth")
    cut = data.draw(st.integers(0, footer))
    with pytest.raises(ParseError):
        parse_nccl_tests_output(text[:cut], source=name, rank_count=TABLES[name][2])
