"""Parse the result table that nccl-tests' `all_reduce_perf` (and its siblings) print: the tests'
oracle for trainctl's own bandwidth formulas (health/fabric/bandwidth.py), checked against what
nccl-tests printed on real machines.

Pure: text in, rows out. Handles the layouts seen in real logs:
- the modern table (`root` column, `#wrong`) and the old one (no `root`, an `error` column);
- every line tagged by the launcher: `srun --label` (` 0: `) or Open MPI `--tag-output`
  (`[1,0]<stdout>:`). The table is read from the stream its header came from, so other
  ranks' interleaved NCCL INFO lines are skipped;
- noise inside the header or table (MPI warnings, `NCCL version`, `NCCL INFO` lines);
- a header whose leading `# ` was lost.

Every row is checked against itself: the printed algbw must equal size / time, and where the
rank count is known the printed busbw must equal nccl-tests' formula, each within print
rounding. A table that is cut short (no `# Avg bus bandwidth` footer, or a footer that
disagrees with the rows) or rows that do not add up raise ParseError. A run that nccl-tests
itself reports as failed (`Test CUDA failure ...`) is a result with `failure` set.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import dataclass
from typing import Callable

from trainctl.errors import ParseError
from trainctl.health.fabric.bandwidth import Collective, algbw_gbps, bus_bandwidth_factor

US_PER_S = 1.0e6

# Launcher tags in front of each line: Open MPI --tag-output, then srun --label.
_MPI_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_SRUN_LABEL = re.compile(r"\s*\d+:(?: |$)", re.ASCII)

_COLUMN_HEADER = re.compile(r"#?\s*size\s+count\s+type\s+redop\b")
_RANK_LINE = re.compile(r"#?\s*Rank\s+([0-9]{1,7})\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+device\s+\d+",
                        re.ASCII)
_OUT_OF_BOUNDS = re.compile(r"#\s*Out of bounds values\s*:\s*([0-9]{1,18})\b", re.ASCII)
_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S+)")
# nccl-tests' CUDACHECK / NCCLCHECK print the cause; TESTCHECK prints the call chain after it.
# Searched, not matched: stdout is buffered, so a failure can follow a half-printed row.
_FAILURE = re.compile(r"(\S+): Test (CUDA|NCCL) failure (\S+) '(.*)'")
_FAILURE_TRACE = re.compile(r" \.\. (\S+) pid \d+: Test failure (\S+)")

# Bounded digit counts: a size fits in 20 digits, and no mutated line can make int() choke.
_INT = re.compile(r"-?[0-9]{1,20}", re.ASCII)
_NUMBER = re.compile(r"([0-9]{1,20})(?:\.([0-9]{0,20}))?(?:[eE]([+-]?[0-9]{1,3}))?", re.ASCII)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)

_LEAD_COLUMNS = ("size", "count", "type", "redop")
_TIME_COLUMNS = ("time", "cputime")
_ERROR_COLUMNS = ("#wrong", "error")


@dataclass(frozen=True)
class PlacementFigures:
    """One half of a row: the out-of-place or the in-place run."""
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong_elements: int | None  # modern `#wrong`; None when validation was off (N/A) or in the old format
    max_error: float | None     # old format's `error` column (largest deviation); None otherwise


@dataclass(frozen=True)
class NcclTestsRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None            # None in the old format, which has no root column
    out_of_place: PlacementFigures
    in_place: PlacementFigures
    line: int                   # 1-based line number in the text


@dataclass(frozen=True)
class RunFailure:
    host: str
    kind: str                   # "CUDA", "NCCL", or "test" when only the call chain was printed
    location: str               # e.g. common.cu:1030
    message: str


@dataclass(frozen=True)
class NcclTestsOutput:
    rows: tuple[NcclTestsRow, ...]
    rank_count: int | None      # from the "# Rank N" lines or the caller; None when neither says
    out_of_bounds: int | None   # the footer's "Out of bounds values"; None when the run failed first
    avg_busbw_gbps: float | None
    failure: RunFailure | None  # set when nccl-tests reported the run as failed


@dataclass(frozen=True)
class _Layout:
    has_root: bool
    cputime: bool               # times are CPU time, not the GPU time the bandwidths come from
    error_column: str           # "#wrong" or "error"
    width: int                  # tokens per data row


def parse_nccl_tests_output(text: str, *, source: str = "<text>", rank_count: int | None = None,
                            collective: Collective = Collective.ALL_REDUCE) -> NcclTestsOutput:
    """Parse one nccl-tests run; `rank_count` is needed only when the output lacks its Rank lines."""
    if rank_count is not None and rank_count < 1:
        raise ValueError(f"rank_count must be at least 1, got {rank_count}")
    lines = [_split_tag(line) for line in text.splitlines()]
    failure = _find_failure(lines)
    ranks = _rank_count(lines, rank_count, source)

    header_index = next((i for i, (_, body) in enumerate(lines) if _COLUMN_HEADER.match(body)), None)
    if header_index is None:
        if failure is not None:
            return NcclTestsOutput((), ranks, None, None, failure)
        raise ParseError("no nccl-tests result table (no 'size count type redop' header line)",
                         source=source)
    stream, header_body = lines[header_index]
    layout = _layout(header_body, source, header_index + 1)

    rows: list[NcclTestsRow] = []
    busbw_resolutions: list[float] = []
    out_of_bounds: int | None = None
    avg: float | None = None
    for index in range(header_index + 1, len(lines)):
        tag, body = lines[index]
        line_number = index + 1
        if tag != stream:
            continue
        if _FAILURE.search(body) or _FAILURE_TRACE.search(body):
            break  # the run failed here; a row it cut short may share this line
        tokens = body.split()
        is_row = bool(tokens) and _INT.fullmatch(tokens[0]) is not None
        if _COLUMN_HEADER.match(body) or (avg is not None and is_row):
            raise ParseError("a second result table starts here, or rows follow the footer; "
                             "give one run at a time", source=source, line=line_number)
        if match := _OUT_OF_BOUNDS.match(body):
            out_of_bounds = int(match.group(1))
        elif match := _AVG_BUSBW.match(body):
            if (number := _parse_number(match.group(1))) is None:
                raise ParseError(f"unreadable average bus bandwidth {match.group(1)!r}",
                                 source=source, line=line_number)
            avg = number[0]
        elif is_row:
            row, resolutions = _parse_row(tokens, layout, source, line_number)
            _check_row(row, layout, ranks, collective, resolutions, source)
            rows.append(row)
            busbw_resolutions.extend(resolutions[i] for i in (2, 5))
        # anything else (NCCL INFO lines, MPI warnings, the units line) is not part of the table

    if failure is not None:
        return NcclTestsOutput(tuple(rows), ranks, out_of_bounds, avg, failure)
    if avg is None or out_of_bounds is None:
        raise ParseError("the result table has no '# Out of bounds values' and '# Avg bus bandwidth' "
                         "footer: output truncated, or the run was killed", source=source)
    if not rows:
        raise ParseError("the result table has no rows", source=source)
    _check_average(rows, avg, busbw_resolutions, source)
    return NcclTestsOutput(tuple(rows), ranks, out_of_bounds, avg, None)


def _split_tag(line: str) -> tuple[str, str]:
    """(launcher tag, the line nccl-tests printed)."""
    for tag in (_MPI_TAG, _SRUN_LABEL):
        if match := tag.match(line):
            return match.group().strip(), line[match.end():].rstrip()
    return "", line.rstrip()


def _find_failure(lines: list[tuple[str, str]]) -> RunFailure | None:
    trace: RunFailure | None = None
    for _, body in lines:
        if match := _FAILURE.search(body):
            return RunFailure(host=match[1], kind=match[2], location=match[3], message=match[4])
        if trace is None and (match := _FAILURE_TRACE.search(body)):
            trace = RunFailure(host=match[1], kind="test", location=match[2],
                                message="nccl-tests failed (no cause printed)")
    return trace


def _rank_count(lines: list[tuple[str, str]], given: int | None, source: str) -> int | None:
    ranks = {int(match[1]) for _, body in lines if (match := _RANK_LINE.match(body))}
    if not ranks:
        return given
    listed = max(ranks) + 1
    if given is not None and given != listed:
        raise ParseError(f"the Rank lines list {listed} ranks but the caller gave {given}", source=source)
    if given is None and len(ranks) != listed:
        missing = list(itertools.islice((r for r in range(listed) if r not in ranks), 5))
        raise ParseError(f"the Rank lines skip ranks {missing}: cannot tell the rank count",
                         source=source, hint="pass rank_count")
    return listed


def _layout(header_body: str, source: str, line: int) -> _Layout:
    columns = header_body.lstrip("#").split()
    has_root = columns[4:5] == ["root"]
    lead = len(_LEAD_COLUMNS) + has_root
    groups = [columns[lead:lead + 4], columns[lead + 4:lead + 8]]
    known = (len(columns) == lead + 8 and all(
        group[0] in _TIME_COLUMNS and group[1:3] == ["algbw", "busbw"] and group[3] in _ERROR_COLUMNS
        and group[0] == groups[0][0] and group[3] == groups[0][3] for group in groups))
    if not known:
        raise ParseError(f"unknown column layout: {' '.join(columns)}", source=source, line=line,
                         hint="per-iteration (-I) and timestamp columns are not supported")
    return _Layout(has_root=has_root, cputime=groups[0][0] == "cputime", error_column=groups[0][3],
                   width=lead + 8)


def _parse_row(tokens: list[str], layout: _Layout, source: str,
               line: int) -> tuple[NcclTestsRow, list[float]]:
    """The row, and the print resolution of its six time/algbw/busbw figures."""
    if len(tokens) != layout.width:
        raise ParseError(f"a result row has {len(tokens)} fields, the header {layout.width}",
                         source=source, line=line)

    def fail(what: str, token: str) -> ParseError:
        return ParseError(f"{what} {token!r} is not a valid value", source=source, line=line)

    named_ints = [("size", tokens[0]), ("count", tokens[1])]
    if layout.has_root:
        named_ints.append(("root", tokens[4]))
    for what, token in named_ints:
        if not _INT.fullmatch(token):
            raise fail(what, token)
    for what, token in (("type", tokens[2]), ("redop", tokens[3])):
        if not _WORD.fullmatch(token):
            raise fail(what, token)
    size, count = int(tokens[0]), int(tokens[1])
    if size < 0 or count < 0:
        raise fail("size or count", f"{size} {count}")

    placements: list[PlacementFigures] = []
    resolutions: list[float] = []
    first = 4 + layout.has_root
    for start in (first, first + 4):
        figures = []
        for token in tokens[start:start + 3]:
            if (number := _parse_number(token)) is None:
                raise fail("time or bandwidth", token)
            figures.append(number[0])
            resolutions.append(number[1])
        placements.append(PlacementFigures(*figures, *_error_value(tokens[start + 3], layout, fail)))
    row = NcclTestsRow(size_bytes=size, count=count, dtype=tokens[2], redop=tokens[3],
                       root=int(tokens[4]) if layout.has_root else None,
                       out_of_place=placements[0], in_place=placements[1], line=line)
    return row, resolutions


def _error_value(token: str, layout: _Layout,
                 fail: Callable[[str, str], ParseError]) -> tuple[int | None, float | None]:
    if token == "N/A":
        return None, None
    number = _parse_number(token)
    if number is None:
        raise fail(layout.error_column, token)
    if layout.error_column == "error":
        return None, number[0]
    if not number[0].is_integer():  # printed with %g: 1e+06 is a count, 1.5 is not
        raise fail("#wrong", token)
    return int(number[0]), None


def _parse_number(token: str) -> tuple[float, float] | None:
    """(value, half the unit of its last printed digit), or None if `token` is no plain number."""
    match = _NUMBER.fullmatch(token)
    if match is None:
        return None
    value = float(token)
    if not math.isfinite(value):
        return None
    decimals = len(match[2] or "")
    exponent = int(match[3] or 0)
    return value, 0.5 * 10.0 ** (exponent - decimals)


def _check_row(row: NcclTestsRow, layout: _Layout, rank_count: int | None, collective: Collective,
               resolutions: list[float], source: str) -> None:
    """The printed bandwidths must follow from size and time, within print rounding."""
    if layout.cputime:
        return  # nccl-tests computes bandwidth from GPU time, which the table then does not show
    factor = bus_bandwidth_factor(collective, rank_count) if rank_count is not None else None
    for offset, figures in ((0, row.out_of_place), (3, row.in_place)):
        time_res, algbw_res, busbw_res = resolutions[offset:offset + 3]
        slowest = figures.time_us + time_res
        fastest = figures.time_us - time_res
        low = algbw_gbps(row.size_bytes, slowest / US_PER_S)
        high = algbw_gbps(row.size_bytes, fastest / US_PER_S) if fastest > 0 else math.inf
        if not _within(figures.algbw_gbps, low, high, algbw_res):
            raise ParseError(f"algbw {figures.algbw_gbps} does not follow from size {row.size_bytes} B "
                             f"and time {figures.time_us} us", source=source, line=row.line)
        if factor is not None and not _within(figures.busbw_gbps, low * factor, high * factor, busbw_res):
            raise ParseError(f"busbw {figures.busbw_gbps} does not follow from {collective} over "
                             f"{rank_count} ranks (algbw x {factor:.4g})", source=source, line=row.line,
                             hint="wrong rank count or collective?")


def _within(printed: float, low: float, high: float, resolution: float) -> bool:
    slack = resolution * (1 + 1e-9)  # float error in the bounds themselves
    return low - slack <= printed <= high + slack


def _check_average(rows: list[NcclTestsRow], printed: float, busbw_resolutions: list[float],
                   source: str) -> None:
    """nccl-tests' footer is the mean busbw of every placement; a cut-off footer will not match."""
    mean = statistics.fmean(b for row in rows for b in (row.out_of_place.busbw_gbps, row.in_place.busbw_gbps))
    # Printed with %g: 6 significant digits, trailing zeros dropped, so "139.56" means 139.560.
    significant_res = 0.5 * 10.0 ** (math.floor(math.log10(abs(printed))) - 5) if printed else 0.0
    tolerance = max(busbw_resolutions) + significant_res + 1e-9
    if abs(mean - printed) > tolerance:
        raise ParseError(f"the footer's average bus bandwidth {printed} is not the mean of the rows "
                         f"({mean:.4f}): output truncated or edited", source=source)
