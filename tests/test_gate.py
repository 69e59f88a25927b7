"""The in-job gate: the pure decision, and `gate node` + `gate decide` on the real cluster."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.replay import SHARED_FIXTURES, write_replay
from trainctl.health.gate import decide, format_report
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
HEALTHY_NVLINK = SHARED_FIXTURES / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
INACTIVE_LINKS = Path(__file__).parent / "health/fixtures/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt"


def node_report(host, *checks):
    return {"host": host, "status": max((c[1] for c in checks), default="ok"),
            "checks": [{"name": n, "status": s, "reason": r, "details": {}} for n, s, r in checks]}


def fabric_report(excluded=(), warn=()):
    nodes = {h: {"rank": i, "status": "ok", "reason": "ok"} for i, h in enumerate(["n1", "n2", "n3", "n4"])}
    for host, reason in excluded:
        nodes[host] = {"rank": 0, "status": "fail", "reason": reason}
    for host in warn:
        nodes[host]["status"], nodes[host]["reason"] = "warn", "suspect: one slow pair"
    return {"status": "fail" if excluded else "ok", "nodes": nodes, "joined": 4, "world": 4,
            "judged_size": 1 << 24, "pair_reference_gbps": 0.7,
            "excluded": [{"host": h, "reason": r} for h, r in excluded]}


ALLOCATED = ["n1", "n2", "n3", "n4"]
HEALTHY = {h: node_report(h, ("nvlink.links", "ok", "fine")) for h in ALLOCATED}


def test_spares_absorb_failures_in_allocation_order():
    reports = dict(HEALTHY, n2=node_report("n2", ("nvlink.links", "fail", "GPU 3: NVLink 3, 5 inactive")))
    decision = decide(ALLOCATED, reports, fabric_report([("n3", "straggler: slow against all 3 partners")]),
                      wanted=2, minimum=2)
    assert decision.ok and decision.chosen == ("n1", "n4")
    assert {e.host: e.reasons for e in decision.excluded} == {
        "n2": ("nvlink.links: GPU 3: NVLink 3, 5 inactive",),
        "n3": ("fabric: straggler: slow against all 3 partners",)}


def test_too_few_healthy_nodes_fail_with_one_line_naming_each():
    reports = dict(HEALTHY, n2=node_report("n2", ("gpu.xid", "fail", "Xid 79 on GPU 2")))
    del reports["n4"]
    decision = decide(ALLOCATED, reports, fabric_report([("n3", "did not join within 15 s")]),
                      wanted=2, minimum=2)
    assert not decision.ok and decision.chosen == ()
    line = decision.failure_line()
    assert "\n" not in line
    assert line.startswith("only 1 of 4 nodes healthy, need 2: ")
    assert "n2 gpu.xid: Xid 79 on GPU 2" in line
    assert "n3 fabric: did not join within 15 s" in line
    assert "n4 no health report" in line


def test_min_nodes_lets_the_job_shrink():
    reports = dict(HEALTHY, n1=node_report("n1", ("host.memory", "unknown", "not collected: host.json")))
    decision = decide(ALLOCATED, reports, fabric_report(), wanted=4, minimum=3)
    assert decision.ok and decision.chosen == ("n2", "n3", "n4")


def test_warnings_are_reported_but_do_not_exclude():
    reports = dict(HEALTHY, n3=node_report("n3", ("host.defunct", "warn", "5 defunct processes")))
    decision = decide(ALLOCATED, reports, fabric_report(warn=["n4"]), wanted=4, minimum=4)
    assert decision.chosen == tuple(ALLOCATED)
    assert decision.warnings == ("n3 host.defunct: 5 defunct processes", "n4 fabric: suspect: one slow pair")
    assert "warning: n3 host.defunct" in format_report(decision, fabric_report(warn=["n4"]))


def test_missing_fabric_report_blames_its_coordinator():
    decision = decide(ALLOCATED, HEALTHY, None, wanted=3, minimum=3)
    assert decision.chosen == ("n2", "n3", "n4")
    assert decision.excluded[0].host == "n1" and "coordinator" in decision.excluded[0].reasons[0]


def gate_decide(gate_dir, *args):
    return subprocess.run([TRAINCTL, "gate", "decide", "--dir", str(gate_dir), *args],
                          capture_output=True, text=True, timeout=60)


def test_decide_cli_rejects_bad_input(tmp_path):
    out = gate_decide(tmp_path, "--nodes", "2", "--min-nodes", "3", "--allocated", "n[1-4]")
    assert out.returncode == 2 and "--min-nodes 3 is more than --nodes 2" in out.stderr
    out = gate_decide(tmp_path, "--nodes", "2", "--allocated", "n[1-4")
    assert out.returncode == 2 and "bad hostlist" in out.stderr


def test_decide_cli_failure_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.json").write_text(json.dumps(HEALTHY["n1"]))
    (tmp_path / "nodes" / "n2.json").write_text("{ truncated")
    out = gate_decide(tmp_path, "--nodes", "2", "--allocated", "n[1-2]")
    assert out.returncode == 2
    assert out.stdout == ""
    errors = [l for l in out.stderr.splitlines() if l.startswith("trainctl: error:")]
    assert errors == ["trainctl: error: only 0 of 2 nodes healthy, need 2: n1 fabric: the fabric test's "
                      "coordinator (rank 0) left no report; n2 no health report (the gate did not run or "
                      "finish on this node)"]
    assert "unreadable" in out.stderr
    assert json.loads((tmp_path / "decision.json").read_text())["ok"] is False


@pytest.mark.cluster
def test_gate_on_the_cluster_leaves_out_the_nvlink_fault_and_the_straggler(devcluster, tmp_path):
    made = [write_replay(devcluster.node_bin_dir(node), "nvidia-smi",
                         {"nvlink -s": INACTIVE_LINKS if node == "node2" else HEALTHY_NVLINK})
            for node in ("node1", "node2", "node3", "node4")]
    devcluster.set_rate("node3", "1gbit")
    gate_dir = tmp_path / "gate"
    try:
        step = run(["srun", "-N4", "--ntasks-per-node=1", TRAINCTL, "gate", "node", "--site", "local-demo",
                    "--dir", str(gate_dir)], timeout=180, env=devcluster.client_env())
        assert step.returncode == 0, step.stderr[-3000:]
        out = run([TRAINCTL, "gate", "decide", "--site", "local-demo", "--dir", str(gate_dir), "--nodes", "2",
                   "--allocated", "node[1-4]"], timeout=60, env=devcluster.client_env())
    finally:
        devcluster.set_rate("node3", None)
        for script in made:
            script.unlink()
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["node[1,4]", "10.77.0.1"]
    report = (gate_dir / "report.txt").read_text()
    assert "excluded node2:\n  - nvlink.links: GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive" in report
    assert "excluded node3:\n  - fabric: straggler" in report
    assert sorted(p.name for p in (gate_dir / "nodes").iterdir()) == [f"node{i}.json" for i in range(1, 5)]
