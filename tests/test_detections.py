"""Detection kinds as one type (trainctl.detections): every member has its details and its rules,
and each consumer (the machine's evidence, the confirmation, the drains, goodput, the fleet)
handles each member by them. A new member without them fails here, not by a silent default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import trainctl
from trainctl.detections import RULES, DetectionKind, read_details
from trainctl.job import machine
from trainctl.job.gate_drain import plan_watch_drains
from trainctl.job.goodput import goodput, watch_account
from trainctl.job.watch import Detection, WatchLimits, confirm, start
from trainctl.sweep.families import DETECTION_FAMILIES, FAMILIES
from trainctl.sweep.fleet import DETECTION, parse_journal_bytes

LIMITS = WatchLimits(slow_factor=1.5, slow_window_s=10.0, baseline_window_s=120.0, warmup_s=0.0, hang_floor_s=20.0,
                     hang_steps=20.0, agent_silence_s=10.0)
WATCH = machine.WatchFacts(LIMITS, checkpoint_signal=10, checkpoint_wait_s=15.0, dump_wait_s=5.0, end_grace_s=3.0,
                           pay_factor=3.0, restart_cost_s=600.0)
# one details object for every kind: each kind's reader takes the fields it knows (a new kind's too)
EVERY_FIELD = {"step_s": 2.0, "baseline_s": 1.0, "samples": 5, "named_by": "own-time",
               "own": [{"node": "node2", "rank": 2, "rise_s": 1.0, "cpu_s": [0.5, 1.5], "runq_s": [0, 0]}],
               "failed": [{"node": "node2", "check": "gpu.xid", "reason": "Xid 79"}], "silent": ["node2"]}
EXAMPLES = {kind: read_details(kind, EVERY_FIELD, ("node2",)) for kind in DetectionKind}


def detection(kind: DetectionKind, suspects=("node2",)) -> Detection:
    return Detection(kind, suspects, f"{kind} evidence", EXAMPLES[kind])


def test_every_kind_has_its_details_rules_example_and_fleet_families():
    for kind in DetectionKind:
        assert kind in RULES and kind in DETECTION_FAMILIES, kind
        assert isinstance(read_details(kind, {}), RULES[kind].details)


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_details_read_back_as_written_and_from_anything_else_as_none(kind):
    written = detection(kind).details
    assert read_details(kind, written.to_json(), ("node2",)) == written
    for junk in (None, [], "text", {"step_s": "x", "failed": 5, "silent": {"a": 1}, "steps": [1]}):
        assert isinstance(read_details(kind, junk), RULES[kind].details)


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_the_machine_asks_for_the_evidence_the_kind_names_and_stops_the_step(kind):
    job = machine.JobFacts(("node1", "node2", "node3"), "node1", False, 0, max_restarts=2, watch=WATCH)
    state = machine.JobState(phase="train", held=job.allocated, chosen=("node1", "node2"),
                             watch=start(1000.0))
    found = detection(kind)
    state, effects = machine.on_detection(job, state, machine.Polled(1100.0, {}), found, [])
    assert effects[0] == machine.Journal("detection", found.journal_fields())
    if RULES[kind].evidence == "checkpoint":      # asked, then the save awaited, before the step is stopped
        assert state.phase == "asking" and effects[-1] == machine.PostCheckpointRequest()
        state, effects = machine.advance(job, state, machine.CheckpointAsked(True, True))
        state, effects = machine.advance(job, state, machine.SaveAwaited(None))
    else:
        assert isinstance(effects[-2], machine.RequestStacks)
    assert state.phase == "stopping" and isinstance(effects[-1], machine.StopStep)
    state, effects = machine.advance(job, state, machine.StepStopped(143))
    assert effects[0] == machine.StepOver(143, f"ended by the watch ({kind.value})", True, kind)


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_a_detection_naming_nobody_is_weighed_or_stops_for_the_gate_as_its_kind_says(kind):
    job = machine.JobFacts(("node1", "node2", "node3"), "node1", False, 0, max_restarts=2, watch=WATCH)
    state = machine.JobState(phase="train", held=job.allocated, chosen=("node1", "node2"), watch=start(1000.0))
    found = Detection(kind, (), "evidence", read_details(kind, EVERY_FIELD, ()))
    state, effects = machine.on_detection(job, state, machine.Polled(1100.0, {}), found, [])
    weighed = [e for e in effects if isinstance(e, machine.Journal) and e.kind == "weighed"]
    assert bool(weighed) == (RULES[kind].unnamed == "weigh")


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_the_confirmation_says_why_nobody_is_left_out_as_the_kind_says(kind):
    confirmed = confirm(detection(kind, ()), {}, ("node1", "node2"), 0.5)
    assert confirmed.kind is kind and confirmed.named == {} and confirmed.note == RULES[kind].unconfirmed
    expected = EXAMPLES[kind].accepted_step_s
    assert confirmed.accepted_step_s == (0.5 if expected is None else expected)
    named = confirm(detection(kind), {}, ("node1", "node2"), 0.5)
    assert named.named == {"node2": f"{kind.value}: {kind.value} evidence"}


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_the_drains_count_each_kind_as_its_rules_say(kind):
    found = detection(kind)
    condemned = {"node2": (kind, found.details.causes("node2", found.evidence))}
    assert [d.host for d in plan_watch_drains(condemned, (RULES[kind].drain_as,), "42")] == ["node2"]
    other = {"fail": "unknown", "unknown": "fail"}[RULES[kind].drain_as]
    assert plan_watch_drains(condemned, (other,), "42") == []


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_goodput_accounts_for_each_kind_by_its_rules(kind):
    found = detection(kind)
    events = [{"t": 0.0, "event": "job_start"}, {"t": 10.0, "event": "training_start"},
              {"t": 100.0, "event": "detection", **found.journal_fields()},
              {"t": 110.0, "event": "step_end", "status": 143, "detection": kind.value},
              {"t": 120.0, "event": "confirmation", "kind": kind.value, "named": {"node2": "x"}},
              {"t": 150.0, "event": "training_start"}, {"t": 400.0, "event": "step_end", "status": 0},
              {"t": 401.0, "event": "job_end", "status": 0}]
    account = watch_account([events], goodput([events], 401.0), 401.0)
    cost = account.detections[0]
    assert cost.kind == kind.value and "does not know" not in cost.basis
    if RULES[kind].not_estimated is None:
        assert cost.wall_change_s is not None
    else:
        assert cost.wall_change_s is None and RULES[kind].not_estimated in cost.basis


@pytest.mark.parametrize("kind", list(DetectionKind))
def test_the_fleet_folds_each_kind_and_counts_its_strikes_in_a_family(kind):
    import json

    found = detection(kind)
    lines = [{"t": 1.0, "event": "job_start", "job": "7"},
             {"t": 2.0, "event": "training_start", "nodes": "node[1-2]"},
             {"t": 3.0, "event": "detection", **found.journal_fields()},
             {"t": 4.0, "event": "step_end", "status": 143, "detection": kind.value}]
    parsed = parse_journal_bytes("".join(json.dumps(line) + "\n" for line in lines).encode(), named_job="7",
                                 site="", now=10.0)
    rows = {(row.host, row.kind) for row in parsed.events}
    assert rows == {("node2", DETECTION), ("node1", "served")}
    what = next(row for row in parsed.events if row.kind == DETECTION)
    assert what.families and set(what.families) <= set(FAMILIES)


def test_a_step_ended_by_the_watch_in_a_journal_from_before_its_detection_field_still_served_its_other_nodes():
    """Journals written before step_end named its detection: the detection the watch acted on says it."""
    import json

    lines = [{"t": 1.0, "event": "job_start", "job": "7"},
             {"t": 2.0, "event": "training_start", "nodes": "node[1-3]"},
             {"t": 3.0, "event": "detection", "kind": "hung", "suspects": ["node2"], "evidence": "x", "details": {}},
             {"t": 4.0, "event": "step_end", "status": 143, "cause": "ended by the watch (hung)"},
             {"t": 5.0, "event": "training_start", "nodes": "node[1,3]"},
             {"t": 6.0, "event": "detection", "kind": "hung", "suspects": [], "evidence": "y", "details": {},
              "note": "not acted on"},
             {"t": 7.0, "event": "step_end", "status": 1, "cause": "exit status 1"}]
    parsed = parse_journal_bytes("".join(json.dumps(line) + "\n" for line in lines).encode(), named_job="7",
                                 site="", now=10.0)
    assert sorted((row.host, row.kind, row.line) for row in parsed.events) == [
        ("node1", "served", 4), ("node2", "detection", 3), ("node3", "served", 4)]


def test_an_old_slow_detection_says_which_rule_named_its_node_from_its_evidence_fields():
    own = {"node": "node2", "rank": 2, "rise_s": 1.0, "cpu_s": [0.5, 1.5], "runq_s": [0, 0]}
    link = {"node": "node2", "link": "eth0", "source": "qdisc", "wait_per_mb": [1, 50],
            "sent_bytes_per_s": [1e6, 1e6]}
    assert read_details(DetectionKind.SLOW, {"step_s": 2, "own": [own]}, ("node2",)).named_by == "own-time"
    assert read_details(DetectionKind.SLOW, {"step_s": 2, "own": [own], "links": [link]}, ("node2",)).named_by == \
        "link-wait"
    assert read_details(DetectionKind.SLOW, {"step_s": 2, "own": [own]}, ()).named_by == ""


KIND_AS_TEXT = re.compile(r"""(==|!=|\bin\b)\s*\(?\s*["'](slow|sick|hung)["']|["'](slow|sick|hung)["']\s*(==|!=)""")


def test_no_consumer_compares_a_kind_with_its_spelling():
    """Every branch on a kind goes through DetectionKind and its rules, so none can miss a member."""
    root = Path(trainctl.__file__).parent
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}"
             for path in sorted(root.rglob("*.py")) if path.name != "detections.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if KIND_AS_TEXT.search(line)]
    assert found == []
