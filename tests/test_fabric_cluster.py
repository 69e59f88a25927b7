"""The fabric test on the real Slurm test cluster: gloo across network namespaces, tbf stragglers."""

import json
import sys
import time
from pathlib import Path

import pytest

from trainctl.proc import run

pytestmark = pytest.mark.cluster

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
RUNS = 10


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
    # second into the test: during the intra-node test or the pair rounds
    port = 29611
    wrapper = ["bash", "-c", f"""
        if [ "$(hostname)" != node4 ]; then exec "$@"; fi
        "$@" & pid=$!
        until ss -Htn state established "( dport = :{port} )" | grep -q .; do sleep 0.05; done
        sleep 1; kill -KILL "$pid"; wait "$pid"
        """, "wrap"]
    timeout_s = 30
    result, report, elapsed = fabric(devcluster, tmp_path / "killed.json", timeout_s=timeout_s,
                                     wrapper=wrapper, extra=["--iters", "40", "--port", str(port)])
    assert report is not None, result.stderr[-2000:]
    assert report["joined"] == 4
    assert report["nodes"]["node4"]["status"] == "fail"
    assert "sent no results" in report["nodes"]["node4"]["reason"]
    assert "node4" in {e["host"] for e in report["excluded"]}
    assert elapsed < timeout_s + 10
