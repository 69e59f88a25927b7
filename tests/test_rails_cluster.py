"""Every rail measured (issue 13 item 2): two rails per node on the real Slurm test cluster.

Each namespace node gets eth1 on a second bridge and subnet; the fabric test runs one rank per
rail, rail r's gloo bound to eth<r>. The wire is the bottleneck, as on a real fabric: every rail
of every node is shaped with tc tbf to WIRE_MBIT, far below what the 2 shared cores move with
four pairs at once, so CPU noise cannot make a healthy rail look slow; the slow rail is shaped
to a third of that.
"""

import json
import sys
from pathlib import Path

import pytest

from trainctl.proc import run

pytestmark = pytest.mark.cluster

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
RAILS = ("eth0", "eth1")
WIRE_MBIT = 500
SLOW_MBIT = 175          # 0.35 x the wire: far below the 0.7 straggler factor
HEALTHY_RUNS = 3
SHAPED_RUNS = 2
TIMEOUT_S = 90


@pytest.fixture(scope="module")
def two_rails(devcluster):
    devcluster.set_rails(len(RAILS))
    try:
        for node in devcluster.spec.node_names:
            for rail in range(len(RAILS)):
                devcluster.set_rate(node, f"{WIRE_MBIT}mbit", rail)
        yield devcluster
    finally:
        for node in devcluster.spec.node_names:
            devcluster.set_rate(node, None, 0)  # rail 1's shaping goes with its interfaces
        devcluster.set_rails(1)


def fabric(cluster, out: Path):
    """One `srun` step of the two-rail fabric test; rank 0's JSON report or None."""
    argv = ["srun", "-N4", "--ntasks-per-node=1", "--kill-on-bad-exit=0", TRAINCTL, "health", "fabric",
            "--site", "local-demo", "--no-intra", "--sizes", "1M,4M", "--passes", "2",
            "--timeout", str(TIMEOUT_S), "--rails", ",".join(RAILS), "--out", str(out)]
    result = run(argv, timeout=TIMEOUT_S + 60, env=cluster.client_env())
    report = json.loads(out.read_text()) if out.exists() else None
    return result, report


def test_healthy_rails_exclude_nothing(two_rails, tmp_path):
    for attempt in range(HEALTHY_RUNS):
        result, report = fabric(two_rails, tmp_path / f"healthy{attempt}.json")
        assert report is not None, result.stderr[-2000:]
        assert report["excluded"] == [] and report["status"] == "ok", (attempt, report["nodes"])
        assert report["rails"] == list(RAILS) and report["joined"] == 4
        for node in report["nodes"].values():
            assert sorted(node["rails"]) == sorted(RAILS)  # every rail of every node measured
            assert all(rail["busbw_gbps"] for rail in node["rails"].values())
        assert result.returncode == 0


def test_slow_rail_is_named_and_nothing_else(two_rails, tmp_path):
    two_rails.set_rate("node3", f"{SLOW_MBIT}mbit", 1)
    try:
        for attempt in range(SHAPED_RUNS):
            result, report = fabric(two_rails, tmp_path / f"slow{attempt}.json")
            assert report is not None, result.stderr[-2000:]
            assert [e["host"] for e in report["excluded"]] == ["node3"], (attempt, report["nodes"])
            reason = report["nodes"]["node3"]["reason"]
            assert reason.startswith("straggler: rail 1 (eth1): ") and "rail 0" not in reason, reason
            assert {host: node["status"] for host, node in report["nodes"].items()} == \
                {"node1": "ok", "node2": "ok", "node3": "fail", "node4": "ok"}, report["nodes"]
            assert report["nodes"]["node3"]["rails"]["eth1"]["ratio"] < 0.7
            assert report["nodes"]["node3"]["rails"]["eth0"]["ratio"] >= 0.7
            assert result.returncode == 2
    finally:
        two_rails.set_rate("node3", f"{WIRE_MBIT}mbit", 1)
