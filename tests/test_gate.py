"""The in-job gate: the pure decision, and `gate node` + `gate decide` on the real cluster."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.replay import LIBRARY, write_replay
from trainctl.health.fabric.report import FabricReport
from trainctl.job.gate import decide, format_report
from trainctl.job.sentinel import BeatWatch
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
INACTIVE_LINKS = Path(__file__).parent / "health/fixtures/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt"


def node_report(host, *checks):
    return {"host": host, "status": max((c[1] for c in checks), default="ok"),
            "checks": [{"name": n, "status": s, "reason": r, "details": {}} for n, s, r in checks]}


def fabric_json(nodes, status, excluded=(), reference_gbps=None):
    """A fabric.json as `health.fabric.report` writes it, around the given nodes."""
    return {"status": status, "world": len(nodes), "joined": len(nodes), "sizes": [1 << 24],
            "judged_size": 1 << 24, "rounds": 3, "retest_rounds": 0, "straggler_factor": 0.7, "floor_gbps": None,
            "reference_gbps": reference_gbps, "pair_reference_gbps": 0.7, "duration_s": 1.0, "nodes": nodes,
            "pairs": [], "excluded": [{"host": h, "reason": r} for h, r in excluded]}


def fabric_report(excluded=(), warn=(), lost=(), busbw=None):
    nodes = {h: {"rank": i, "status": "ok", "reason": "ok"} for i, h in enumerate(["n1", "n2", "n3", "n4"])}
    for host, reason in excluded:
        nodes[host] = {"rank": 0, "status": "fail", "reason": reason}
    for host in warn:
        nodes[host]["status"], nodes[host]["reason"] = "warn", "suspect: one slow pair"
    for host in lost:
        nodes[host]["lost"] = True
    for host, figure in (busbw or {}).items():
        nodes[host].update(busbw_gbps=figure, intra_busbw_gbps=None, inter_busbw_gbps={})
    return FabricReport.from_json(fabric_json(nodes, "fail" if excluded else "ok", excluded))


ALLOCATED = ["n1", "n2", "n3", "n4"]
HEALTHY = {h: node_report(h, ("nvlink.links", "ok", "fine")) for h in ALLOCATED}


def test_spares_absorb_failures_in_allocation_order():
    reports = dict(HEALTHY, n2=node_report("n2", ("nvlink.links", "fail", "GPU 3: NVLink 3, 5 inactive")))
    decision = decide(ALLOCATED, reports, fabric_report([("n3", "straggler: slow against all 3 partners")]),
                      wanted=2, minimum=2)
    assert decision.ok and decision.chosen == ("n1", "n4")
    assert {e.host: tuple(map(str, e.reasons)) for e in decision.excluded} == {
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


def test_unknown_checks_exclude_by_default_but_apart_from_failures():
    reports = dict(HEALTHY, n1=node_report("n1", ("host.memory", "unknown", "not collected: host.json")),
                   n2=node_report("n2", ("ib.ports", "fail", "mlx5_0 port 1 is Down"),
                                  ("gpu.count", "unknown", "not collected: nvidia-smi-q.xml")))
    decision = decide(ALLOCATED, reports, fabric_report(), wanted=3, minimum=3)
    assert not decision.ok
    assert [(e.host, e.status) for e in decision.excluded] == [("n1", "unknown"), ("n2", "fail")]
    line = decision.failure_line()
    # failures first, then what could not be checked
    assert line.index("n2 ib.ports: mlx5_0 port 1 is Down") < line.index("could not be checked: n1 host.memory")
    assert "excluded n1 (could not be checked: unknown):" in format_report(decision, fabric_report())
    assert decision.to_json()["excluded"][0] == {"host": "n1", "status": "unknown", "lost": False,
                                                 "reasons": ["host.memory: not collected: host.json"]}


def test_site_policy_keep_runs_on_nodes_whose_checks_could_not_decide():
    reports = dict(HEALTHY, n1=node_report("n1", ("host.memory", "unknown", "not collected: host.json")),
                   n2=node_report("n2", ("ib.ports", "fail", "Down"), ("gpu.count", "unknown", "no XML")))
    decision = decide(ALLOCATED, reports, fabric_report(), wanted=3, minimum=3, unknown_policy="keep")
    assert decision.chosen == ("n1", "n3", "n4")
    # a failing node stays out whatever the policy
    assert [(e.host, e.status) for e in decision.excluded] == [("n2", "fail")]
    assert decision.unknown == ("n1 host.memory: not collected: host.json",)
    assert "unknown (kept by site policy): n1 host.memory" in format_report(decision, fabric_report())


def test_warnings_are_reported_but_do_not_exclude():
    reports = dict(HEALTHY, n3=node_report("n3", ("host.defunct", "warn", "5 defunct processes")))
    decision = decide(ALLOCATED, reports, fabric_report(warn=["n4"]), wanted=4, minimum=4)
    assert decision.chosen == tuple(ALLOCATED)
    assert decision.warnings == ("n3 host.defunct: 5 defunct processes", "n4 fabric: suspect: one slow pair")
    assert "warning: n3 host.defunct" in format_report(decision, fabric_report(warn=["n4"]))


def test_missing_fabric_report_blames_its_coordinator():
    decision = decide(ALLOCATED, HEALTHY, None, wanted=3, minimum=3)
    assert decision.chosen == ("n2", "n3", "n4")
    assert decision.excluded[0].host == "n1" and "coordinator" in str(decision.excluded[0].reasons[0])


def lost_fabric_report(lost):
    return fabric_report([(host, reason) for host, reason in lost.items()], lost=lost)


def test_a_node_lost_during_the_gate_is_named_so_and_left_out():
    reports = {h: r for h, r in HEALTHY.items() if h != "n3"}  # n3 died before writing its report
    fabric = lost_fabric_report({"n3": "did not join within 15 s",
                                 "n4": "no heartbeat for 5 s during pair round0/1-3 (died or hung)"})
    decision = decide(ALLOCATED, reports, fabric, wanted=2, minimum=2, missing="no report within 91 s")
    assert decision.chosen == ("n1", "n2")
    assert {e.host: tuple(map(str, e.reasons)) for e in decision.excluded} == {
        "n3": ("lost during the gate: fabric test: did not join within 15 s",),
        "n4": ("lost during the gate: fabric test: no heartbeat for 5 s during pair round0/1-3 (died or hung)",)}
    assert [e["lost"] for e in decision.to_json()["excluded"]] == [True, True]


def test_a_node_with_no_report_by_the_deadline_is_lost_with_the_deadline_named():
    reports = {h: r for h, r in HEALTHY.items() if h != "n4"}
    decision = decide(ALLOCATED, reports, fabric_report(), wanted=4, minimum=4, missing="no report within 91 s")
    assert decision.failure_line() == ("only 3 of 4 nodes healthy, need 4: n4 lost during the gate: "
                                       "no report within 91 s")


def test_too_few_nodes_checked_is_said_so_not_as_a_node_that_failed_to_report():
    """After a detection the gate checks only the nodes the job still trusts: all may pass and still
    be fewer than the job needs."""
    decision = decide(("n1",), {"n1": HEALTHY["n1"]}, fabric_report(), wanted=2, minimum=2)
    assert decision.failure_line() == ("only 1 of 1 nodes healthy, need 2: no node failed; fewer nodes were "
                                       "checked than are needed")


def test_failure_line_folds_nodes_by_cause_within_300_characters():
    hosts = [f"gpu{i:03d}" for i in range(1, 201)]
    reports = {h: node_report(h, ("ib.ports", "fail", f"mlx5_{i % 8} port 1 is Down")) for i, h in enumerate(hosts[:120])}
    reports.update({h: node_report(h, ("nvlink.links", "fail", "GPU 3: NVLink 3, 5 inactive")) for h in hosts[120:150]})
    reports.update({h: node_report(h, ("gpu.xid", "unknown", "not collected: " + "x" * 400)) for h in hosts[150:199]})
    decision = decide(hosts, reports, None, wanted=8, minimum=8, missing="no report within 91 s")
    line = decision.failure_line()
    assert len("trainctl: error: " + line) <= 300 and "\n" not in line
    # each cause once, with its hosts folded; a detail only where all its nodes share it
    assert line.startswith("only 0 of 200 nodes healthy, need 8: gpu[001-120] ib.ports; ")
    assert "; gpu[121-150] nvlink.links: GPU 3: NVLink 3, 5 inactive; " in line
    assert "gpu200 lost during the gate: no report within 91 s" in line
    # nodes left out only because a check could not decide come last
    assert line.index("gpu200 lost") < line.index("could not be checked: gpu[151-199] gpu.xid")
    assert "gpu001 fabric" in line  # rank 0's node: the fabric test left no report


def test_failure_line_is_cut_when_even_the_causes_do_not_fit():
    hosts = [f"n{i}" for i in range(1, 61)]
    reports = {h: node_report(h, (f"check.number{i}", "fail", "bad")) for i, h in enumerate(hosts)}
    line = decide(hosts, reports, None, wanted=2, minimum=2).failure_line()
    assert len(line) <= 283 and line.endswith("...")


def test_more_healthy_nodes_than_wanted_prefers_the_fastest_measured():
    fabric = fabric_report(busbw={"n1": 0.52, "n2": 0.91, "n3": 0.88, "n4": 0.70})
    decision = decide(ALLOCATED, HEALTHY, fabric, wanted=2, minimum=2)
    assert decision.chosen == ("n2", "n3")  # the two fastest, in allocation order
    text = format_report(decision, fabric)
    assert "  n1           ok          0.52 GB/s" in text
    assert "  n2           ok          0.91 GB/s" in text
    # nothing measured (no fabric report's figures): allocation order, as before
    assert decide(ALLOCATED, HEALTHY, fabric_report(), wanted=2, minimum=2).chosen == ("n1", "n2")


def test_a_fabric_test_that_judged_nothing_is_reported_not_passed_off_as_ok():
    # The shape `build_report` writes for 2 nodes and no floor (tests/test_fabric_report.py).
    reason = "not judged: 2 nodes and no busbw floor"
    nodes = {h: {"rank": i, "status": "not judged", "reason": reason, "busbw_gbps": 0.6,
                 "intra_busbw_gbps": None, "inter_busbw_gbps": {}}
             for i, h in enumerate(["n1", "n2"])}
    fabric = FabricReport.from_json(fabric_json(nodes, "not judged"))
    decision = decide(["n1", "n2"], HEALTHY, fabric, wanted=2, minimum=2)
    assert decision.ok and decision.chosen == ("n1", "n2")  # not excluding
    assert decision.warnings == (f"fabric: n1, n2: {reason}",)
    text = format_report(decision, fabric)
    assert f"warning: fabric: n1, n2: {reason}" in text
    assert "  n1           not judged  0.60 GB/s" in text


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
                      "coordinator (rank 0) left no report; n2 no health report: the gate did not run or "
                      "finish on this node"]
    assert f"{tmp_path / 'nodes' / 'n2.json'}: not JSON; treated as missing" in out.stderr
    assert json.loads((tmp_path / "decision.json").read_text())["ok"] is False


def test_decide_waits_for_the_deadline_and_names_nodes_without_a_report(tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.json").write_text(json.dumps(HEALTHY["n1"]))
    out = gate_decide(tmp_path, "--nodes", "1", "--allocated", "n[1-2]", "--deadline", "1")
    assert out.returncode == 2
    errors = [l for l in out.stderr.splitlines() if l.startswith("trainctl: error:")]
    assert errors == ["trainctl: error: only 0 of 2 nodes healthy, need 1: n1 fabric: the fabric test's "
                      "coordinator (rank 0) left no report; n2 lost during the gate: no report within 1 s"]
    assert "gate: deciding after 1." in out.stderr
    assert "excluded n2:" not in out.stderr  # the detail goes to report.txt, not the job output
    assert "excluded n2:\n  - lost during the gate: no report within 1 s" in (tmp_path / "report.txt").read_text()


def test_decide_stops_waiting_when_the_gate_step_ended_or_the_fabric_report_is_in(tmp_path):
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.json").write_text(json.dumps(HEALTHY["n1"]))
    (tmp_path / "gate-step.status").write_text("0\n")  # the job script writes it when srun returns
    out = gate_decide(tmp_path, "--nodes", "2", "--allocated", "n[1-2]", "--deadline", "600")
    assert out.returncode == 2 and "gate: deciding after 0." in out.stderr
    assert "n2 lost during the gate: no report (the gate step ended after 0 s)" in out.stderr
    (tmp_path / "gate-step.status").unlink()
    fabric = fabric_report([("n2", "did not join within 15 s")]).to_json()
    fabric["nodes"] = {h: fabric["nodes"][h] for h in ("n1", "n2")}
    fabric["nodes"]["n2"]["lost"] = True
    (tmp_path / "fabric.json").write_text(json.dumps(fabric))
    (tmp_path / "nodes" / "n1.final").write_text("{}")  # `gate node` marks its report final last
    out = gate_decide(tmp_path, "--nodes", "2", "--allocated", "n[1-2]", "--deadline", "600")
    assert out.returncode == 2 and "gate: deciding after 0." in out.stderr
    assert "n2 lost during the gate: fabric test: did not join within 15 s" in out.stderr


def test_decide_judges_a_node_report_rewritten_after_the_fabric_report(tmp_path):
    """A node re-reads its error counters after the fabric test and rewrites its report: decide
    waits for that (the .final marker), or the grace after the fabric report, not just fabric.json."""
    (tmp_path / "nodes").mkdir()
    for host in ("n1", "n2"):
        (tmp_path / "nodes" / f"{host}.json").write_text(json.dumps(HEALTHY[host]))
    fabric = fabric_report([]).to_json()
    fabric["nodes"] = {h: fabric["nodes"][h] for h in ("n1", "n2")}
    (tmp_path / "fabric.json").write_text(json.dumps(fabric))
    (tmp_path / "nodes" / "n1.final").write_text("{}")
    grown = node_report("n2", ("nvlink.links", "ok", "fine"),
                        ("ib.counters", "fail", "mlx5_0 port 1: link_downed +1"))
    decide = subprocess.Popen([TRAINCTL, "gate", "decide", "--dir", str(tmp_path), "--nodes", "2",
                               "--allocated", "n[1-2]", "--deadline", "600"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # decide is running and has seen fabric.json, n2 not yet final
    (tmp_path / "nodes" / "n2.json").write_text(json.dumps(grown))
    (tmp_path / "nodes" / "n2.final").write_text("{}")
    out, err = decide.communicate(timeout=60)
    assert decide.returncode == 2, err
    assert "only 1 of 2 nodes healthy, need 2: n2 ib.counters: mlx5_0 port 1: link_downed +1" in err
    assert "excluded n2:\n  - ib.counters: mlx5_0 port 1: link_downed +1" in (tmp_path / "report.txt").read_text()


def test_a_heartbeat_is_silent_only_after_it_stopped_changing_for_the_whole_silence():
    watch = BeatWatch(silence_s=10)
    assert not watch.silent(None, now=0)          # no file yet: the clock starts
    assert not watch.silent("1", now=9)           # it changed
    assert not watch.silent("1", now=18)
    assert watch.silent("1", now=19)              # unchanged for 10 s
    assert not watch.silent("2", now=100)         # beating again


def test_sentinel_cancels_the_job_when_the_batch_host_stops_beating(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scancel", "scontrol"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/slurm.log\n')
        (bin_dir / name).chmod(0o755)
    (tmp_path / "batch-host.beat").write_text("7\n")  # and never again: the batch host is gone
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    out = subprocess.run([TRAINCTL, "gate", "sentinel", "--dir", str(tmp_path), "--silence", "1"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "batch host lost: no heartbeat" in out.stderr
    calls = (tmp_path / "slurm.log").read_text().splitlines()
    assert calls[0].startswith("scontrol update JobId=42 Comment=trainctl: batch host lost")
    assert calls[1] == "scancel 42"


def test_sentinel_logs_to_its_own_file_and_retries_a_refused_scancel(tmp_path):
    # its srun's output runs through the (dead) batch host: the sentinel writes its own log; and
    # a controller busy with the node's failure may refuse the first scancel
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scancel").write_text(
        f'#!/bin/sh\necho "scancel $*" >> {tmp_path}/slurm.log\n'
        f'[ "$(wc -l < {tmp_path}/slurm.log)" -gt 1 ] || {{ echo "Socket timed out" >&2; exit 1; }}\n')
    for name in ("scontrol", "scancel"):
        (bin_dir / name).chmod(0o755)
    (tmp_path / "batch-host.beat").write_text("7\n")
    log = tmp_path / "sentinel.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    out = subprocess.run([TRAINCTL, "gate", "sentinel", "--dir", str(tmp_path), "--silence", "1", "--log", str(log)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, log.read_text()
    assert out.stdout == out.stderr == ""
    text = log.read_text()
    assert "sentinel of job 42: watching" in text and "batch host lost: no heartbeat" in text
    assert "scancel 42 failed (attempt 1 of 10)" in text and "Socket timed out" in text
    assert (tmp_path / "slurm.log").read_text().splitlines() == ["scancel 42", "scancel 42"]


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
    assert out.stdout.splitlines() == ["node[1,4]", devcluster.spec.address("node1")]
    report = (gate_dir / "report.txt").read_text()
    assert "excluded node2:\n  - nvlink.links: GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive" in report
    assert "excluded node3:\n  - fabric: straggler" in report
    assert sorted(p.name for p in (gate_dir / "nodes").iterdir()) == sorted(f"node{i}.{kind}" for i in range(1, 5) for kind in ("final", "json"))


def test_decide_cli_reads_the_sites_unknown_policy(tmp_path):
    gate_dir = tmp_path / "gate"
    (gate_dir / "nodes").mkdir(parents=True)
    (gate_dir / "nodes" / "n1.json").write_text(json.dumps(
        node_report("n1", ("host.memory", "unknown", "not collected: host.json"))))
    (gate_dir / "nodes" / "n2.json").write_text(json.dumps(node_report("n2", ("ib.ports", "fail", "Down"))))
    (gate_dir / "fabric.json").write_text(json.dumps(fabric_report().to_json()))
    demo = (Path(__file__).parents[1] / "site-configs" / "local-demo.toml").read_text()
    keep = tmp_path / "keep.toml"
    keep.write_text(demo.replace("[gate]\n", '[gate]\nunknown = "keep"\n'))

    def error_line(*site):
        out = gate_decide(gate_dir, *site, "--nodes", "2", "--allocated", "n[1-2]")
        assert out.returncode == 2
        return [l for l in out.stderr.splitlines() if l.startswith("trainctl: error:")]

    assert error_line() == ["trainctl: error: only 0 of 2 nodes healthy, need 2: n2 ib.ports: Down; "
                            "could not be checked: n1 host.memory: not collected: host.json"]
    assert error_line("--site", str(keep)) == ["trainctl: error: only 1 of 2 nodes healthy, need 2: "
                                               "n2 ib.ports: Down"]


def test_failure_line_at_4096_nodes_names_each_cause_once_with_shortened_hostlists():
    hosts = [f"gpu{i:04d}" for i in range(1, 4097)]
    scattered = hosts[7::50]                       # 82 nodes, no two adjacent: a long hostlist
    reports = {h: node_report(h) for h in hosts}
    reports.update({h: node_report(h, ("gpu.count", "fail", "1 of 8 GPUs"), ("nvlink.links", "fail", "inactive"))
                    for h in scattered})
    for h in hosts[3::100]:
        del reports[h]
    line = decide(hosts, reports, None, wanted=4096, minimum=4096).failure_line()
    assert len("trainctl: error: " + line) <= 300
    assert "41 nodes (gpu[0004,0104," in line and " more) no health report" in line
    assert "82 nodes (gpu[0008,0058," in line and " more) gpu.count, nvlink.links" in line


def test_decide_on_one_node_waits_for_its_report_to_be_final(tmp_path):
    """A one-node gate runs its compute test after writing its report: decide waits for the
    .final marker (the compute file is in by then), not only for the report."""
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.json").write_text(json.dumps(HEALTHY["n1"]))
    out = gate_decide(tmp_path, "--nodes", "1", "--allocated", "n1", "--deadline", "2", "--min-nodes", "1")
    assert "gate: deciding after 2." in out.stderr
    (tmp_path / "nodes" / "n1.final").write_text("{}")
    out = gate_decide(tmp_path, "--nodes", "1", "--allocated", "n1", "--deadline", "600")
    assert "gate: deciding after 0." in out.stderr


@pytest.mark.parametrize("log", ["no/log", "fifo"])
def test_a_sentinel_that_cannot_write_its_log_says_so_and_watches_on(tmp_path, log):
    """Its log is not worth the job's safety net: one line where srun put its output, then the watch."""
    os.mkfifo(tmp_path / "fifo")   # a log nobody reads must not block it either
    env = {**os.environ, "SLURM_JOB_ID": "42"}
    sentinel = subprocess.Popen([TRAINCTL, "gate", "sentinel", "--dir", str(tmp_path), "--log", str(tmp_path / log)],
                                stderr=subprocess.PIPE, text=True, env=env)
    try:
        said = [sentinel.stderr.readline(), sentinel.stderr.readline()]
        assert said[0].startswith("trainctl: sentinel: cannot write its log") and "watching without it" in said[0]
        assert said[1].startswith("trainctl: sentinel of job 42: watching") and sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()


def test_gate_decide_reads_the_site_once(tmp_path, monkeypatch):
    """The site is loaded into one GatePolicy that travels: deadline, grace, compute, [gate], drains."""
    from click.testing import CliRunner

    import trainctl.site as site_module
    from trainctl.errors import GateFailed
    from trainctl.job.gate_cli import gate

    loads = []
    real_load = site_module.load_site
    monkeypatch.setattr(site_module, "load_site", lambda *args, **kwargs: loads.append(args) or real_load(*args, **kwargs))
    (tmp_path / "nodes").mkdir()
    (tmp_path / "gate-step.status").write_text("0\n")   # the gate step is over: decide does not wait
    result = CliRunner().invoke(gate, ["decide", "--site", "local-demo", "--dir", str(tmp_path), "--nodes", "1",
                                       "--allocated", "n1", "--wait"], standalone_mode=False)
    assert isinstance(result.exception, GateFailed)   # n1 never reported
    assert loads == [("local-demo",)]
