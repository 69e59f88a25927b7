"""The fabric test on the real Slurm test cluster: gloo across network namespaces, tbf stragglers."""

import json
import sys
import time
from pathlib import Path

import pytest

from trainctl.proc import run

pytestmark = pytest.mark.cluster

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
RUNS = 5   # in a row, each a whole fabric test; bench/straggler_sensitivity.py counts found/false over many
SHAPED_RUNS = 3  # CI; bench/straggler_sensitivity.py does larger N by hand


def fabric(devcluster, out: Path, *, nodes=4, timeout_s=60, wrapper=(), extra=(), kill_on_bad_exit=0):
    """One `srun` step running the fabric test on `nodes` nodes; rank 0's JSON report or None."""
    argv = ["srun", f"-N{nodes}", "--ntasks-per-node=1", f"--kill-on-bad-exit={kill_on_bad_exit}", *wrapper,
            TRAINCTL, "health", "fabric", "--site", "local-demo", "--sizes", "1M,16M",
            "--timeout", str(timeout_s), "--out", str(out), *extra]
    start = time.monotonic()
    result = run(argv, timeout=timeout_s + 60, env=devcluster.client_env())
    elapsed = time.monotonic() - start
    report = json.loads(out.read_text()) if out.exists() else None
    return result, report, elapsed


def test_healthy_nodes_are_never_excluded(devcluster, tmp_path):
    for attempt in range(RUNS):
        result, report, _ = fabric(devcluster, tmp_path / f"healthy{attempt}.json")
        assert report is not None, result.stderr[-2000:]
        assert report["excluded"] == [], (attempt, report["nodes"])
        assert report["joined"] == 4 and report["status"] == "ok"
        assert result.returncode == 0


def test_rate_limited_node_is_the_only_straggler(devcluster, tmp_path):
    devcluster.set_rate("node3", "1gbit")
    try:
        for attempt in range(RUNS):
            result, report, _ = fabric(devcluster, tmp_path / f"slow{attempt}.json")
            assert report is not None, result.stderr[-2000:]
            assert [e["host"] for e in report["excluded"]] == ["node3"], (attempt, report["nodes"])
            assert report["nodes"]["node3"]["reason"].startswith("straggler")
            partners = report["nodes"]["node3"]["inter_busbw_gbps"]
            assert len(partners) >= 2
            assert result.returncode == 2
    finally:
        devcluster.set_rate("node3", None)


def test_two_slow_nodes_among_four_are_both_found(devcluster, tmp_path):
    # Shaped to 0.35x of what a healthy pair measures right now (the test's own reference):
    # 5 of the 6 pairs then touch a slow node, which used to drag the reference down to them.
    # Not 0.5x: on 2 cores the healthy pairs are CPU-bound and measured 0.43 GB/s a minute after
    # a 0.62 GB/s calibration (CI), so a 0.5x wire limit showed as 0.72x, above the 0.7 factor;
    # bench/straggler_sensitivity.py measures 0.5x and 0.8x over many runs.
    result, healthy, _ = fabric(devcluster, tmp_path / "calibration.json")
    assert healthy is not None, result.stderr[-2000:]
    rate = f"{int(0.35 * healthy['reference_gbps'] * 8000)}mbit"  # GB/s of busbw -> Mbit/s
    slow = ["node2", "node3"]
    for node in slow:
        devcluster.set_rate(node, rate)
    try:
        for attempt in range(SHAPED_RUNS):
            result, report, _ = fabric(devcluster, tmp_path / f"two-slow{attempt}.json")
            assert report is not None, result.stderr[-2000:]
            assert sorted(e["host"] for e in report["excluded"]) == slow, (attempt, rate, report["nodes"])
            assert all(report["nodes"][node]["reason"].startswith("straggler") for node in slow)
    finally:
        for node in slow:
            devcluster.set_rate(node, None)


def test_two_nodes_without_a_floor_are_not_judged(devcluster, tmp_path):
    result, report, _ = fabric(devcluster, tmp_path / "two.json", nodes=2)
    assert report is not None, result.stderr[-2000:]
    assert report["status"] == "not judged" and report["excluded"] == []
    assert {n["reason"] for n in report["nodes"].values()} == {"not judged: 2 nodes and no busbw floor"}
    assert "status not judged" in result.stdout and result.returncode == 3


def test_node_that_never_starts_is_reported_within_the_timeout(devcluster, tmp_path):
    # node2's task sleeps instead of running the test, as a node stuck before Python starts
    wrapper = ["bash", "-c", 'if [ "$(hostname)" = node2 ]; then exec sleep 600; fi; exec "$@"', "wrap"]
    timeout_s = 20
    # rank 0's exit ends the step, so srun does not wait out node2's sleep
    result, report, elapsed = fabric(devcluster, tmp_path / "missing.json", timeout_s=timeout_s,
                                     wrapper=wrapper, kill_on_bad_exit=1)
    assert report is not None, result.stderr[-2000:]
    assert report["joined"] == 3
    assert report["nodes"]["node2"]["reason"] == f"did not join within {timeout_s / 4:g} s"
    assert {e["host"] for e in report["excluded"]} == {"node2"}
    assert elapsed < timeout_s + 10


def test_node_killed_mid_test_is_reported(devcluster, tmp_path):
    # node4's process is SIGKILLed once it has connected to rank 0's store (it joined), a
    # second into the test: during the intra-node test or the pair rounds (one pass of 40
    # iterations keeps the rounds long enough to be hit and short enough for the 30 s deadline)
    port = 29611
    wrapper = ["bash", "-c", f"""
        if [ "$(hostname)" != node4 ]; then exec "$@"; fi
        "$@" & pid=$!
        until ss -Htn state established "( dport = :{port} )" | grep -q .; do sleep 0.05; done
        sleep 1; kill -KILL "$pid"; wait "$pid"
        """, "wrap"]
    timeout_s = 60  # long enough that sitting it out (the old behaviour) stands apart from load
    result, report, elapsed = fabric(devcluster, tmp_path / "killed.json", timeout_s=timeout_s,
                                     wrapper=wrapper, extra=["--iters", "40", "--passes", "1", "--port", str(port)])
    assert report is not None, result.stderr[-2000:]
    assert report["joined"] == 4
    assert report["nodes"]["node4"]["status"] == "fail" and report["nodes"]["node4"]["lost"]
    # its heartbeat fell silent, or its pair partner's gloo connection reset: either way named
    assert "no heartbeat" in report["nodes"]["node4"]["reason"] or "sent no results" in report["nodes"]["node4"]["reason"]
    assert "node4" in {e["host"] for e in report["excluded"]}
    # the survivors stop waiting for node4 instead of sitting out the test's timeout
    assert report["duration_s"] < timeout_s * 0.75, report["duration_s"]
    assert elapsed < timeout_s + 10
