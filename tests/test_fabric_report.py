"""The fabric verdict as a pure function of what ranks sent back (no torch, no network)."""

import pytest

from trainctl.errors import UsageError
from trainctl.health.fabric.options import parse_size
from trainctl.health.fabric.report import FabricReport, build_report, pair_figures, retest_rounds

SIZES = (1 << 20, 16 << 20)


def measurement(peers, size, busbw, ranks=2, error=None):
    seconds = None if error else size / (busbw * 1e9)
    return {"peers": list(peers), "size": size, "ranks": ranks, "median_s": seconds,
            "algbw_gbps": None if error else busbw, "busbw_gbps": None if error else busbw, "error": error}


def results_for(hosts, pair_bw, intra_bw=None, backend="gloo"):
    results = {}
    for rank, host in enumerate(hosts):
        inter = [measurement(pair, size, bw) for pair, bw in pair_bw.items() if host in pair for size in SIZES]
        intra = [measurement((host,), size, (intra_bw or {}).get(host, 1.0)) for size in SIZES]
        results[rank] = {"rank": rank, "host": host, "backend": backend, "intra": intra, "inter": inter}
    return results


def roster(hosts, missing=()):
    joined = [r for r in range(len(hosts)) if r not in missing]
    return {"joined": joined, "missing": list(missing), "hosts": {str(r): hosts[r] for r in joined}}


def report(results, ros, world, **kw):
    """The report as fabric.json holds it."""
    return build_report(results=results, roster=ros, world=world, sizes=SIZES, rounds=3, retests=0,
                        straggler_factor=0.7, floor_gbps=None, join_timeout_s=15, duration_s=1.0, **kw).to_json()


HOSTS = ["n1", "n2", "n3", "n4"]
RING_AND_FAR = [("n1", "n2"), ("n3", "n4"), ("n2", "n3"), ("n4", "n1"), ("n1", "n3"), ("n2", "n4")]


def test_slow_node_is_the_only_one_excluded():
    bw = {pair: (0.12 if "n3" in pair else 0.7) for pair in RING_AND_FAR}
    out = report(results_for(HOSTS, bw), roster(HOSTS), 4)
    assert [e["host"] for e in out["excluded"]] == ["n3"]
    assert out["status"] == "fail"
    assert out["nodes"]["n3"]["inter_busbw_gbps"] == {"n2": 0.12, "n4": 0.12, "n1": 0.12}


def test_missing_and_silent_ranks_are_failures_with_reasons():
    hosts = ["n1", "n2", "n3"]
    bw = {("n1", "n2"): 0.7}
    results = results_for(hosts, bw)
    del results[2]  # n3 joined but never sent results
    out = report(results, roster(hosts + ["n4"], missing=(3,)), 4)
    assert out["nodes"]["rank 3"]["reason"] == "did not join within 15 s"
    assert out["nodes"]["n3"]["reason"] == "joined but sent no results (died or hung mid-test)"
    assert {e["host"] for e in out["excluded"]} == {"rank 3", "n3"}


def test_failed_pair_warns_the_survivor_without_excluding_it():
    bw = {pair: 0.7 for pair in RING_AND_FAR}
    results = results_for(HOSTS, bw)
    results[0]["inter"].append(measurement(("n1", "n9"), SIZES[-1], 0, error="with n9 (rank 9): timeout"))
    out = report(results, roster(HOSTS), 4)
    assert out["nodes"]["n1"]["status"] == "warn"
    assert "pair failed with n9" in out["nodes"]["n1"]["reason"]
    assert out["excluded"] == []


@pytest.mark.parametrize("backend, excluded", [("nccl", ["n2"]), ("gloo", [])])
def test_intra_node_figures_are_judged_only_on_gpus(backend, excluded):
    bw = {pair: 0.7 for pair in RING_AND_FAR}
    intra = {"n1": 400.0, "n2": 150.0, "n3": 410.0, "n4": 405.0}
    out = report(results_for(HOSTS, bw, intra, backend=backend), roster(HOSTS), 4)
    assert [e["host"] for e in out["excluded"]] == excluded


def test_pair_figure_is_the_slower_side_and_retests_target_suspects():
    results = results_for(["a", "b"], {("a", "b"): 0.7})
    results[1]["inter"][-1]["busbw_gbps"] = 0.5
    positions = {"a": 0, "b": 1}
    assert pair_figures(results, positions, SIZES[-1]) == {(0, 1): 0.5}
    # 5 nodes in a ring, one slow pair between otherwise fast nodes: no straggler, no retest
    hosts = ["a", "b", "c", "d", "e"]
    ring = {("a", "b"): 0.2, ("b", "c"): 0.7, ("c", "d"): 0.7, ("d", "e"): 0.7, ("e", "a"): 0.7,
            ("a", "c"): 0.7, ("b", "d"): 0.7}
    positions = {h: i for i, h in enumerate(hosts)}
    assert retest_rounds(results_for(hosts, ring), positions, SIZES[-1], 0.7, None) == []


@pytest.mark.parametrize("text, size", [("1M", 1 << 20), ("64M", 64 << 20), ("1G", 1 << 30),
                                        ("4096", 4096), ("16k", 16 << 10), ("2MB", 2 << 20)])
def test_sizes_parse_like_nccl_tests(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "1X", "", "M", "6"])
def test_bad_sizes_are_rejected(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_two_nodes_without_a_floor_are_not_judged_never_ok():
    from trainctl.health.cli import format_fabric_report
    from trainctl.health.status import Status

    hosts = ["n1", "n2"]
    out = report(results_for(hosts, {("n1", "n2"): 0.6}), roster(hosts), 2)
    assert out["status"] == "not judged" and out["excluded"] == []
    assert {h: (n["status"], n["reason"]) for h, n in out["nodes"].items()} == {
        h: ("not judged", "not judged: 2 nodes and no busbw floor") for h in hosts}
    assert out["nodes"]["n1"]["busbw_gbps"] == 0.6
    typed = FabricReport.from_json(out)
    assert typed.exit_status is Status.UNKNOWN  # `health fabric` exits 3: nothing was decided
    assert "status not judged" in format_fabric_report(typed)
    # with a floor, the one pair is judged against it
    floored = build_report(results=results_for(hosts, {("n1", "n2"): 0.6}), roster=roster(hosts), world=2,
                           sizes=SIZES, rounds=1, retests=0, straggler_factor=0.7, floor_gbps=0.5,
                           join_timeout_s=15, duration_s=1.0)
    assert floored.status == "ok"


def test_a_failure_outranks_not_judged():
    hosts = ["n1", "n2", "n3"]
    results = results_for(hosts[:2], {("n1", "n2"): 0.6})
    out = report(results, roster(hosts, missing=(2,)), 3)
    assert out["status"] == "fail"
    assert out["nodes"]["n1"]["status"] == "not judged"


def test_two_slow_nodes_of_four_are_both_excluded_and_each_node_shows_its_best():
    bw = {pair: (0.3 if {"n2", "n3"} & set(pair) else 0.7) for pair in RING_AND_FAR}
    out = report(results_for(HOSTS, bw), roster(HOSTS), 4)
    assert sorted(e["host"] for e in out["excluded"]) == ["n2", "n3"]
    assert out["reference_gbps"] == 0.7
    best = {h: n["busbw_gbps"] for h, n in out["nodes"].items()}
    assert best == {"n1": 0.7, "n2": 0.3, "n3": 0.3, "n4": 0.7}
    # both are re-tested with the known-good nodes, and the one reference pair is measured
    # again, before the verdict is final
    positions = {h: i for i, h in enumerate(HOSTS)}
    rounds = retest_rounds(results_for(HOSTS, bw), positions, SIZES[-1], 0.7, None)
    assert sorted(pair for r in rounds for pair in r) == [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]
