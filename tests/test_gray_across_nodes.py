"""Gray failures judged across readings and nodes: counter growth (gate hook, sweeps), the odd node out."""

import json

from support.replay import LIBRARY
from test_gate import fabric_report
from trainctl.job.gate import decide
from trainctl.health.node import NodePolicy, counter_growth
from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.counters import parse_perfquery
from trainctl.health.status import CheckResult, NodeReport, Status
from trainctl.sweep.db import History
from trainctl.sweep.model import CHECKED, CheckRow, NodeOutcome
from trainctl.sweep.runner import record_sweep

PERFQUERY = LIBRARY / "infiniband/perfquery"
FLAPPED = parse_perfquery((PERFQUERY / "treydock-perfquery-x-switch-port-linkdowned1-xmitdiscards20046.txt")
                          .read_text()).to_json()
CLEAN = {"counters": {"lid 2052 port 1": {name: 0 for name in FLAPPED["counters"]["lid 2052 port 1"]}},
         "without_counters": []}


def node(host, *rows, status="ok"):
    return NodeOutcome(host, CHECKED, status=status, checks=tuple(rows))


def versions(driver):
    return CheckRow("node.versions", "ok", f"driver {driver}", {"versions": {"driver": driver, "nccl": "2.21.5"}})


def test_sweep_judges_counter_growth_since_the_nodes_previous_sweep(tmp_path):
    """Night 1 reads the port clean; night 2 reads it as the flapped capture: a flap since sweep #1."""
    with History.open(tmp_path / "h.db", write=True) as history:
        first = history.start_sweep(kind="sweep", started_at=1.0, site="s", via="slurm", target="p", checks="all")
        record_sweep(history, sweep_id=first, not_swept=[], progress=lambda _: None,
                     outcomes=[node("gpu1", CheckRow("ib.counters", "ok", "read", CLEAN))])
        second = history.start_sweep(kind="sweep", started_at=2.0, site="s", via="slurm", target="p", checks="all")
        result = record_sweep(history, sweep_id=second, not_swept=[], progress=lambda _: None,
                              outcomes=[node("gpu1", CheckRow("ib.counters", "ok", "read", FLAPPED))])
        (row,) = history.sweep_results(second)
    assert result.nodes["gpu1"].status == "fail"
    assert (row.status, row.reason.split(";")[0]) == (
        "fail", "lid 2052 port 1 link_downed +1 since sweep #1: link flapped (went down and came back)")
    assert row.details["growth"]["lid 2052 port 1"]["port_xmit_discards"] == 20046
    assert row.details["counters"] == FLAPPED["counters"]      # the next sweep compares with these


def test_nodes_without_a_verdict_stay_as_they_came(tmp_path):
    from trainctl.sweep.model import TIMEOUT

    late = NodeOutcome("gpu2", TIMEOUT, detail="checks did not finish within 60 s")
    with History.open(tmp_path / "h.db", write=True) as history:
        sweep = history.start_sweep(kind="sweep", started_at=1.0, site="s", via="slurm", target="p", checks="all")
        result = record_sweep(history, sweep_id=sweep, not_swept=[], outcomes=[late], progress=lambda _: None)
    assert result.nodes["gpu2"] == late and result.nodes["gpu2"].status is None


def test_sweep_names_the_odd_node_out(tmp_path):
    nodes = [node(f"gpu{i}", versions("565.57.01")) for i in range(1, 5)]
    nodes[2] = node("gpu3", versions("560.35.03"))
    with History.open(tmp_path / "h.db", write=True) as history:
        sweep = history.start_sweep(kind="sweep", started_at=1.0, site="s", via="slurm", target="p", checks="all")
        result = record_sweep(history, sweep_id=sweep, not_swept=[], outcomes=nodes, progress=lambda _: None)
        rows = {r.host: r for r in history.sweep_results(sweep)}
    assert [h for h, n in result.nodes.items() if n.status != "ok"] == ["gpu3"]
    assert (rows["gpu3"].status, rows["gpu3"].reason) == (
        "warn", "odd node out: driver 560.35.03, while 3 of 4 nodes have 565.57.01")
    assert rows["gpu1"].status == "ok"


def test_gate_decide_warns_or_leaves_out_the_odd_node():
    def report(host, driver):
        return {"host": host, "status": "ok", "checks": [
            {"name": "node.versions", "status": "ok", "reason": "", "details": {"versions": {"driver": driver}}}]}
    reports = {h: report(h, "565.57.01") for h in ("n1", "n2", "n4")} | {"n3": report("n3", "560.35.03")}
    warned = decide(["n1", "n2", "n3", "n4"], reports, fabric_report(), wanted=3, minimum=3)
    assert warned.chosen == ("n1", "n2", "n3")
    assert "n3 node.versions: odd node out: driver 560.35.03, while 3 of 4 nodes have 565.57.01" in warned.warnings
    failed = decide(["n1", "n2", "n3", "n4"], reports, fabric_report(), wanted=3, minimum=3, odd_node_fails=True)
    assert failed.chosen == ("n1", "n2", "n4")


def test_gate_hook_reads_the_counters_again_and_judges_their_growth(tmp_path):
    """The gate's second reading, from a sysfs tree whose mlx4_0 port 1 counters are node_exporter's
    real values with link_downed raised by one (the flap the fabric test would have caused)."""
    from trainctl.health.parse.sysfs import parse_ttar

    tree = parse_ttar((LIBRARY / "infiniband/sysfs/node-exporter-i40iw-no-pma-and-mlx4-class-infiniband.ttar")
                      .read_text() + "Mode: 644\n")
    root = tmp_path / "root"
    for path, text in tree.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    before = {"counters": {"mlx4_0:1": {"link_downed": 0, "port_xmit_discards": 5}}, "without_counters": []}
    (root / "sys/class/infiniband/mlx4_0/ports/1/counters/link_downed").write_text("1\n")
    report = NodeReport("n1", (CheckResult("ib.counters", Status.OK, "read", before),
                               CheckResult("host.memory", Status.OK, "fine")))
    policy = NodePolicy(NodeExpectations(), None, {"nvidia-smi": "nvidia-smi-not-here"}, 5.0)
    judged = counter_growth(report, tmp_path / "after", policy, sysfs_root=root)
    counters, memory = judged.checks
    assert (counters.status, counters.reason) == (
        Status.FAIL, "mlx4_0:1 link_downed +1 during the fabric test: link flapped (went down and came back)")
    assert memory == report.checks[1]
    assert json.loads((tmp_path / "after/meta.json").read_text())["probes"]["nvidia-smi-nvlink-e.txt"]["missing"]
