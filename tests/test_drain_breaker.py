"""The breaker on trainctl's automatic drains: the window and partition caps, the latch and its reset,
shadow rules, two claims at once, and every drain path (gate, watch, sweep, lemons) held to it.
Slurm is stood in for here; the dev-cluster proof is in test_gate_drain.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from test_gate_drain import DEMO_SITE, node_report
from trainctl.detections import DetectionKind
from trainctl.errors import UsageError
from trainctl.job.gate import decide
from trainctl.site import BreakerConfig, load_site
from trainctl.slurm import NodeState, job_port, tagged_reason
from trainctl.sweep import drain as sweep_drain
from trainctl.sweep.breaker import Breaker, Count, admit, claim, reset, status
from trainctl.sweep.db import BREAKER_TRIP, History
from trainctl.sweep.drain import DRAIN, SKIP, Action, apply_drains
from trainctl.validate import check_job_id

NODES = [f"node{i}" for i in range(1, 41)]
PARTITIONS = {"gpu": frozenset(NODES)}
RULE = Breaker(max_drains=3, window_s=3600.0, max_share=0.1, shadow=())


def count(window_drains=0, open_since="", held=(), partitions=PARTITIONS):
    return Count(window_drains, open_since, frozenset(held), partitions)


# ---------------------------------------------------------------- the verdict (pure)

def test_defaults_stop_a_broken_probe_from_draining_a_partition():
    defaults = Breaker.from_site(None)
    assert (defaults.max_drains, defaults.window_s, defaults.max_share, defaults.shadow) == (
        BreakerConfig().max_drains, BreakerConfig().window_s, BreakerConfig().max_share, ())
    four = {"debug": frozenset(NODES[:4])}
    granted, line = admit(defaults, count(partitions=four), NODES[:4])
    assert granted == ["node1"]                         # 10 % of 4 nodes: at least one
    assert line.startswith("trainctl: breaker tripped, not drained: node2, node3, node4 (")
    assert "\n" not in line and "`trainctl breaker reset`" in line


def test_the_window_caps_drains_across_calls():
    assert admit(RULE, count(), NODES[:2]) == (NODES[:2], "")
    granted, line = admit(RULE, count(window_drains=2), NODES[2:6])
    assert granted == ["node3"]
    assert "3 drains in the last 3600 s reach [breaker] max_drains = 3" in line


def test_the_share_counts_what_trainctl_holds_in_slurm_and_the_history():
    rule = Breaker(max_drains=100, window_s=3600.0, max_share=0.1, shadow=())
    granted, line = admit(rule, count(held=NODES[:3]), NODES[10:12])   # 10 % of 40: 4 nodes
    assert granted == ["node11"]
    assert "trainctl holds 4 of the 40 nodes of partition gpu drained" in line
    other = {"gpu": frozenset(NODES[:20]), "cpu": frozenset(NODES[20:])}
    assert admit(rule, count(held=NODES[:2], partitions=other), ["node21", "node22"]) == (["node21", "node22"], "")


def test_an_open_breaker_drains_nothing_until_reset():
    granted, line = admit(RULE, count(open_since="trainctl: breaker tripped, ..."), ["node1"])
    assert granted == [] and line.startswith("trainctl: breaker open, not drained: node1 (")


# ---------------------------------------------------------------- the history

def planned(hosts):
    return [(host, tagged_reason([("gpu.xid", "Xid 79")], context="gate of job 7")[1], "gpu.xid") for host in hosts]


def claim_at(path, hosts, now, rule=RULE, held=()):
    with History.open(path, write=True) as history:
        sweep_id = history.start_sweep(kind="gate", started_at=now, site="s", via="slurm", target="job 7", checks="")
        return claim(history, rule, rule="gate", site="s", target="job 7", sweep_id=sweep_id, planned=planned(hosts),
                     slurm_held=held, partitions=PARTITIONS, now=now)


def test_claims_slide_out_of_the_window_and_a_trip_latches_until_reset(tmp_path):
    db = tmp_path / "sweeps.db"
    ids, line = claim_at(db, NODES[:5], now=1000.0)
    assert list(ids) == NODES[:3] and "max_drains = 3" in line
    with History.open(db) as history:
        (trip,) = history.breaker_trips(since=0.0)
    assert (trip.kind, trip.via, trip.target, trip.error) == (BREAKER_TRIP, "gate", "job 7", line)
    # An hour later the window is empty, but the breaker stays open: no rule drains.
    ids, line = claim_at(db, ["node9"], now=1000.0 + 3601)
    assert ids == {} and line.startswith("trainctl: breaker open, not drained: node9")
    with History.open(db, write=True) as history:
        reset(history, site="s", by="admin", now=5000.0)
        assert status(history, RULE, 5000.0).open_since == ""
    assert list(claim_at(db, ["node9"], now=5001.0)[0]) == ["node9"]
    with History.open(db) as history:
        assert status(history, RULE, 5001.0).window_drains == 1    # only drains since the reset count


def test_two_gates_claiming_at_once_never_pass_the_cap(tmp_path):
    db = tmp_path / "sweeps.db"
    History.open(db, write=True).close()
    granted: list[str] = []
    barrier = threading.Barrier(4)

    def gate(hosts):
        barrier.wait()
        granted.extend(claim_at(db, hosts, now=1000.0)[0])

    threads = [threading.Thread(target=gate, args=(NODES[i * 3:i * 3 + 3],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(granted) == 3
    with History.open(db) as history:
        assert len(history.drains(open_only=True)) == 3


# ---------------------------------------------------------------- every drain path

class FakeSlurm:
    """node_states / partition_nodes / drain_unclaimed as trainctl.sweep.drain calls them."""

    def __init__(self, monkeypatch, nodes=NODES[:4]):
        self.states = {n: NodeState(n, n, "idle", "", "", "", "") for n in nodes}
        self.drained: list[str] = []
        monkeypatch.setattr(sweep_drain, "node_states", lambda **_: dict(self.states))
        monkeypatch.setattr(sweep_drain, "partition_nodes", lambda: {"debug": frozenset(nodes)})
        monkeypatch.setattr(sweep_drain, "drain_unclaimed", self.drain)

    def drain(self, host, reason):
        self.drained.append(host)
        self.states[host] = NodeState(host, host, "drained", "", reason, "root", "2026-12-04T12:00:00")
        return self.states[host], ""


def site_with(tmp_path, breaker=""):
    text = (DEMO_SITE.read_text().replace("[gate]\n", '[gate]\ndrain_on = ["fail", "unknown"]\n')
            .replace('db = "/tmp/trainctl-demo-sweeps.db"', f'db = "{tmp_path / "sweeps.db"}"'))
    (tmp_path / "site.toml").write_text(text + breaker)
    return load_site(str(tmp_path / "site.toml")).config


@pytest.fixture
def operator(monkeypatch):
    monkeypatch.setattr("trainctl.slurm.require_operator", lambda env=None: None)


def broken_probe(hosts):
    return {h: node_report(h, ("gpu.count", "unknown", "nvidia-smi: unexpected output")) for h in hosts}


def test_the_gate_with_a_broken_probe_on_every_node_drains_at_most_the_cap(tmp_path, monkeypatch, operator):
    from trainctl.job.gate_drain import drain_excluded

    slurm = FakeSlurm(monkeypatch)
    config = site_with(tmp_path)
    reports = broken_probe(NODES[:4])
    drains = drain_excluded("demo", config, decide(NODES[:4], reports, None, 1, 1), reports, None,
                            {"SLURM_JOB_ID": "4242"})
    assert slurm.drained == ["node1"]
    assert [d.outcome for d in drains.drains] == ["drained"] + ["not drained: held back by the breaker"] * 3
    assert drains.breaker in drains.lines() and drains.breaker.startswith("trainctl: breaker tripped")
    with History.open(tmp_path / "sweeps.db") as history:
        assert [t.error for t in history.breaker_trips(since=0.0)] == [drains.breaker]
        assert [(d.host, d.reason_time) for d in history.drains(open_only=True)] == [("node1", "2026-12-04T12:00:00")]


def test_the_watchs_drains_share_the_gates_breaker(tmp_path, monkeypatch, operator):
    from trainctl.job.gate_drain import drain_condemned

    slurm = FakeSlurm(monkeypatch)
    config = site_with(tmp_path, "\n[breaker]\nmax_share = 1.0\nmax_drains = 2\n")
    condemned = {n: (DetectionKind.HUNG, (("watch.hung", "fell silent"),)) for n in NODES[:4]}
    first = drain_condemned("demo", config, {"node1": condemned["node1"]}, {"SLURM_JOB_ID": "1"})
    second = drain_condemned("demo", config, condemned, {"SLURM_JOB_ID": "2"})
    assert slurm.drained == ["node1", "node2"] and first.breaker == ""
    assert "max_drains = 2" in second.breaker


def sweep_actions(hosts):
    return [Action(h, DRAIN, f"trainctl: ib.ports: mlx5_0/1 Down", "ib.ports") for h in hosts]


@pytest.mark.parametrize("rule", ["sweep", "lemons"])
def test_sweep_and_lemon_drains_stop_at_the_cap(tmp_path, monkeypatch, rule):
    slurm = FakeSlurm(monkeypatch)
    with History.open(tmp_path / "sweeps.db", write=True) as history:
        actions, line = apply_drains(history, 0, sweep_actions(NODES[:4]), Breaker.from_site(None), rule=rule,
                                     site="demo", target=rule)
        assert [t.via for t in history.breaker_trips(since=0.0)] == [rule]
    assert slurm.drained == ["node1"] and line.startswith("trainctl: breaker tripped")
    assert [a.action for a in actions] == [DRAIN, SKIP, SKIP, SKIP]


def test_a_shadow_rule_records_what_it_would_drain_and_drains_nothing(tmp_path, monkeypatch):
    slurm = FakeSlurm(monkeypatch)
    rule = Breaker(3, 3600.0, 0.1, shadow=("sweep",))
    with History.open(tmp_path / "sweeps.db", write=True) as history:
        actions, line = apply_drains(history, 0, sweep_actions(NODES[:4]), rule, rule="sweep", site="demo",
                                     target="sweep #1")
        shadowed = history.drains()
        assert history.drains(open_only=True) == [] and status(history, rule, 1e12).window_drains == 0
    assert slurm.drained == [] and [d.host for d in shadowed] == NODES[:4]
    assert line == ("trainctl: shadow mode ([breaker] shadow has sweep): would drain node1, node2, node3, node4; "
                    "drained nothing")
    assert all(a.action == SKIP and a.text.startswith("shadow mode, would drain") for a in actions)


def test_a_node_someone_else_drained_costs_the_breaker_nothing(tmp_path, monkeypatch):
    slurm = FakeSlurm(monkeypatch)
    slurm.states["node1"] = NodeState("node1", "node1", "drained", "", "bad DIMM", "root", "t")
    with History.open(tmp_path / "sweeps.db", write=True) as history:
        actions, line = apply_drains(history, 0, sweep_actions(["node1", "node2"]), Breaker.from_site(None),
                                     rule="sweep", site="demo", target="sweep #1")
    assert slurm.drained == ["node2"] and line == ""
    assert actions[0].text.startswith("not drained: has a reason trainctl did not set (root: 'bad DIMM')")


def test_a_gate_that_cannot_write_the_history_drains_nothing(tmp_path, monkeypatch, operator):
    from trainctl.job.gate_drain import drain_excluded

    slurm = FakeSlurm(monkeypatch)
    config = site_with(tmp_path)
    (tmp_path / "sweeps.db").mkdir()      # not a file: the history cannot be opened
    reports = broken_probe(NODES[:1])
    drains = drain_excluded("demo", config, decide(NODES[:1], reports, None, 1, 1), reports, None,
                            {"SLURM_JOB_ID": "1"})
    assert slurm.drained == []
    assert drains.drains[0].outcome.startswith(f"not drained: the breaker could not count drains ({tmp_path / 'sweeps.db'}")


# ---------------------------------------------------------------- job ids in drain reasons

def test_a_forged_job_id_never_reaches_a_drain_reason():
    from trainctl.job.gate_drain import job_id_of

    assert [check_job_id(j, "x") for j in ("4242", "4242_7", "4242+1")] == ["4242", "4242_7", "4242+1"]
    for forged in ("42\x1b]2;owned\x07", "42; rm", "", "4294967296", "1_", "\u0664\u0662"):
        with pytest.raises(UsageError, match="is not a Slurm job id"):
            check_job_id(forged, "SLURM_JOB_ID")
        assert job_id_of({"SLURM_JOB_ID": forged}) == "?"
        with pytest.raises(UsageError, match="is not a Slurm job id"):
            job_port({"SLURM_JOB_ID": forged or "x"})
    _, reason = tagged_reason([("gpu.xid", "Xid \x1b[2J79\x07")], context="gate of job 7")
    assert "\x1b" not in reason and "\x07" not in reason and "\\x1b[2J79\\x07" in reason


def test_a_site_may_not_set_a_breaker_outside_its_bounds(tmp_path):
    from trainctl.errors import ConfigError

    for bad in ("max_share = 0.0", "max_share = 1.5", "window_s = 0", "max_drains = -1", 'shadow = ["all"]'):
        with pytest.raises(ConfigError):
            site_with(tmp_path, f"\n[breaker]\n{bad}\n")
    assert site_with(tmp_path, '\n[breaker]\nshadow = ["gate", "lemons"]\n').breaker.shadow == ("gate", "lemons")


def test_the_admin_commands_show_and_reset_the_breaker(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from support.sweeps import night
    from trainctl.sweep.cli import breaker, drain

    db = tmp_path / "sweeps.db"
    claim_at(db, NODES[:5], now=1000.0)
    shown = CliRunner().invoke(breaker, ["status", "--db", str(db)])
    assert shown.exit_code == 0
    assert shown.output.startswith("breaker open since 1970-01-01T00:16:40+00:00: trainctl: breaker tripped")
    with History.open(db, write=True) as history:       # pruning the history does not close it
        history.prune(before=1e12)
        assert status(history, RULE, 2000.0).open_since
    with History.open(db, write=True) as history:   # a sweep to drain from: the plan says --apply would not
        night(history, 1500.0, {"node1": {"ib.ports": ("fail", "mlx5_0/1 Down")}})
    monkeypatch.setattr("trainctl.slurm.node_states", lambda **_: {})
    plan = CliRunner().invoke(drain, ["--db", str(db)])
    assert plan.exit_code == 0 and "trainctl: breaker open, --apply would drain nothing (" in plan.output
    assert CliRunner().invoke(breaker, ["reset", "--db", str(db)]).exit_code == 0
    assert CliRunner().invoke(breaker, ["status", "--db", str(db)]).output.startswith("breaker closed")
