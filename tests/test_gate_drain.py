"""`[gate] drain_on`: what the gate excluded reaches Slurm (pure plan; `gate decide` on the dev cluster,
as root, as a user without operator rights, and with a probe broken on every node, held to the breaker)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support.nobody import setpriv_nobody
from test_gate import fabric_json
from trainctl.detections import DetectionKind
from trainctl.errors import ConfigError
from trainctl.health.fabric.report import FabricReport
from trainctl.job.gate import decide
from trainctl.site import load_site
from trainctl.slurm import REASON_MAX_BYTES, SINFO_FORMAT, parse_sinfo_states
from trainctl.sweep.db import History
from trainctl.sweep.drain import RECHECK, plan_resumes
from trainctl.job.gate_drain import plan_gate_drains

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
DEMO_SITE = Path(__file__).resolve().parents[1] / "site-configs" / "local-demo.toml"
NVLINK = ("nvlink.links", "fail", "GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive")


def node_report(host, *checks):
    """The shape `trainctl health check --json` (and `gate node`) writes."""
    return {"host": host, "status": max((c[1] for c in checks), default="ok"),
            "checks": [{"name": n, "status": s, "reason": r, "details": {}} for n, s, r in checks]}


def fabric_report(hosts, excluded):
    """A fabric.json as `health.fabric.report` writes it."""
    return fabric_json({h: {"rank": i, "status": "ok", "reason": "ok"} for i, h in enumerate(hosts)}, "fail",
                       excluded.items())


HOSTS = ["n1", "n2", "n3", "n4"]
REPORTS = {h: node_report(h, ("host.memory", "ok", "fine")) for h in HOSTS} | {
    "n2": node_report("n2", NVLINK, ("host.memory", "ok", "fine")),
    "n4": node_report("n4", ("host.memory", "unknown", "not collected: host.json"))}
FABRIC = FabricReport.from_json(fabric_report(HOSTS, {"n3": "straggler: slow against all 3 partners"}))
DECISION = decide(HOSTS, REPORTS, FABRIC, wanted=1, minimum=1)


def test_only_the_exclusions_the_site_names_are_drained_with_the_check_and_the_job():
    (drain,) = plan_gate_drains(DECISION, REPORTS, FABRIC, ("fail",), "4242")
    assert (drain.host, drain.check) == ("n2", "nvlink.links")
    assert drain.reason == f"trainctl: nvlink.links: {NVLINK[2]} (gate of job 4242)"
    everything = plan_gate_drains(DECISION, REPORTS, FABRIC, ("fail", "unknown", "fabric"), "4242")
    assert [(d.host, d.check) for d in everything] == [("n2", "nvlink.links"), ("n3", "fabric"), ("n4", "host.memory")]
    assert plan_gate_drains(DECISION, REPORTS, FABRIC, (), "4242") == []


def test_a_long_reason_is_cut_but_keeps_the_tag_and_the_job():
    reports = dict(REPORTS, n2=node_report("n2", ("gpu.xid", "fail", "Xid 79 " * 80), NVLINK))
    (drain,) = plan_gate_drains(decide(HOSTS, reports, None, 1, 1), reports, None, ("fail",), "4242")
    assert len(drain.reason.encode()) <= REASON_MAX_BYTES
    assert drain.reason.startswith("trainctl: gpu.xid: Xid 79") and drain.reason.endswith(
        "... [+nvlink.links] (gate of job 4242)")


def test_drain_on_accepts_only_known_exclusions(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text(DEMO_SITE.read_text().replace("[gate]\n", '[gate]\ndrain_on = ["fail", "slow"]\n'))
    with pytest.raises(ConfigError, match=r"gate\.drain_on: expected an array of 'fail', 'unknown', 'fabric'"):
        load_site(str(site))
    assert load_site("local-demo").config.gate.drain_on == ()   # off unless a site asks


# ---------------------------------------------------------------- gate decide on the dev cluster

def gate_dir_with(root: Path, reports: dict) -> Path:
    """What `gate node` leaves: a report per node, and rank 0's fabric report (here: nobody excluded)."""
    (root / "nodes").mkdir(parents=True)
    for host, report in reports.items():
        (root / "nodes" / f"{host}.json").write_text(json.dumps(report))
    (root / "fabric.json").write_text(json.dumps(fabric_report(list(reports), {})))
    return root


def states(cluster):
    return parse_sinfo_states(subprocess.run(["sinfo", "-h", "-N", "-o", SINFO_FORMAT], capture_output=True,
                                             text=True, timeout=30, env=cluster.client_env(), check=True).stdout)


@pytest.mark.cluster
def test_gate_decide_drains_what_it_excluded_and_resume_resumes_it_as_trainctls(devcluster, nobody_python):
    # Under /tmp and open to all: the second half runs `gate decide` as nobody.
    work = Path(tempfile.mkdtemp(prefix="trainctl-gate-drain-", dir="/tmp"))
    try:
        work.chmod(0o777)
        db = work / "sweeps.db"
        site = work / "site.toml"
        login = devcluster.start_sshd("node2")   # resume re-checks a drained node over SSH
        site.write_text(DEMO_SITE.read_text().replace("[gate]\n", '[gate]\ndrain_on = ["fail"]\n')
                        .replace('db = "/tmp/trainctl-demo-sweeps.db"', f'db = "{db}"')
                        .replace("/tmp/trainctl-devcluster/ssh/id_ed25519", login.key_path)
                        .replace("/tmp/trainctl-devcluster/ssh/known_hosts", login.known_hosts_path))
        site.chmod(0o644)
        reports = {f"node{i}": node_report(f"node{i}", ("nvlink.links", "ok", "fine")) for i in range(1, 5)}
        reports |= {"node2": node_report("node2", NVLINK), "node3": node_report("node3", NVLINK)}
        env = devcluster.client_env() | {"SLURM_JOB_ID": "4242"}
        argv = [TRAINCTL, "gate", "decide", "--site", str(site), "--nodes", "2", "--allocated", "node[1-4]"]
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bad DIMM"], env=env,
                       check=True, timeout=30)

        as_root = subprocess.run([*argv, "--dir", str(gate_dir_with(work / "root", reports))],
                                 capture_output=True, text=True, timeout=60, env=env)
        assert as_root.returncode == 0, as_root.stderr
        after = states(devcluster)
        reason = f"trainctl: nvlink.links: {NVLINK[2]} (gate of job 4242)"
        assert after["node2"].drained and after["node2"].reason == reason
        assert after["node3"].reason == "bad DIMM"                          # an admin's drain: left alone
        report = (work / "root" / "report.txt").read_text()
        assert f"drain node2: {reason} (recorded in {db}" in report
        assert "drain node3: not drained: has a reason trainctl did not set (root: 'bad DIMM')" in report
        with History.open(db) as history:
            held = history.drains(open_only=True)
        assert [(d.host, d.reason) for d in held] == [("node2", reason)]
        assert plan_resumes(held, after)[0].action == RECHECK               # resume considers it its own
        # ... and resumes it once its re-check (the site's sweep checks, over SSH) passes.
        resumed = subprocess.run([TRAINCTL, "resume", "--site", str(site), "--apply", "--json"],
                                 capture_output=True, text=True, timeout=120, env=env)
        assert resumed.returncode == 0, resumed.stderr
        assert [(a["host"], a["action"]) for a in json.loads(resumed.stdout)["actions"]] == [("node2", "resume")]
        assert states(devcluster)["node2"].reason == "" and states(devcluster)["node3"].reason == "bad DIMM"

        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], env=env, check=True, timeout=30)
        nobody_dir = gate_dir_with(work / "nobody", reports)
        nobody_dir.chmod(0o777)
        nobodys_argv = [*setpriv_nobody(), nobody_python, "-P", "-m", "trainctl", *argv[1:],
                        "--dir", str(nobody_dir)]
        as_nobody = subprocess.run(nobodys_argv, capture_output=True, text=True, timeout=60, env=env)
        assert as_nobody.returncode == 0, as_nobody.stderr                 # nothing fails
        assert as_nobody.stdout.splitlines()[0] == "node[1,4]"
        assert "drain node2: not drained: no operator rights" in (nobody_dir / "report.txt").read_text()
        assert states(devcluster)["node2"].reason == ""

        # A probe broken on every node, drain_on = ["unknown"]: the default breaker (10 % of the
        # 4-node partition, at least one node) drains one node, and its line is in the job's output
        # and the history; the gate fails for want of nodes, as it would without drains.
        site.write_text(site.read_text().replace('drain_on = ["fail"]', 'drain_on = ["unknown"]'))
        broken = {f"node{i}": node_report(f"node{i}", ("gpu.count", "unknown", "nvidia-smi: unexpected output"))
                  for i in range(1, 5)}
        probe = subprocess.run([*argv, "--dir", str(gate_dir_with(work / "broken", broken))],
                               capture_output=True, text=True, timeout=60, env=env)
        assert probe.returncode != 0
        drained = [n for n, s in states(devcluster).items() if s.drained and s.reason.startswith("trainctl:")]
        assert len(drained) == 1, drained
        (line,) = [text for text in probe.stderr.splitlines() if text.startswith("trainctl: breaker tripped")]
        assert "[breaker] max_share = 0.1 allows 1" in line
        assert line in (work / "broken" / "report.txt").read_text().splitlines()
        with History.open(db) as history:
            assert [t.error for t in history.breaker_trips(since=0.0)] == [line]
    finally:
        for node in ("node1", "node2", "node3", "node4"):   # one at a time: an idle node refuses RESUME
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=devcluster.client_env(),
                           timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        devcluster.wait_idle(timeout_s=60)


def test_the_watchs_condemned_nodes_drain_as_the_site_asks():
    from trainctl.job.gate_drain import plan_watch_drains

    condemned = {"node2": (DetectionKind.SICK, (("gpu.xid", "Xid 79 on GPU 3"),)),
                 "node3": (DetectionKind.HUNG,
                           (("watch.hung", "no rank finished a step for 600 s; the agent of node3 fell silent"),))}
    drains = plan_watch_drains(condemned, ("fail",), "42")
    assert [(d.host, d.check) for d in drains] == [("node2", "gpu.xid")]
    assert drains[0].reason == "trainctl: gpu.xid: Xid 79 on GPU 3 (watch of job 42)"
    assert [d.host for d in plan_watch_drains(condemned, ("fail", "unknown"), "42")] == ["node2", "node3"]
    assert plan_watch_drains(condemned, ("fabric",), "42") == []
