"""Goodput with and without the watch (trainctl.job.goodput), from hand-written journals: what each
detection cost, the work it threw away, and the goodput the job would have had without it,
estimated only where the journal holds what the estimate needs."""

from __future__ import annotations

import json

import pytest

from trainctl.job.goodput import goodput, watch_account, watch_lines


def journal(*events) -> list[dict]:
    return [{"t": t, "event": name, **fields} for t, name, fields in events]


def slow_job(confirmation: dict) -> list[dict]:
    """Slow at 60 s (1.9x the baseline), stopped at 65 with its last checkpoint at 50, the gate's
    verdict at 80, training again at 85 (first step 91), then healthy to the end at 191."""
    return journal(
        (0.5, "submitted", {"submitted_t": 0}), (5, "job_start", {}), (10, "training_start", {}),
        (15, "first_step", {"steps": 1}), (50, "checkpoint", {"checkpoint_t": 50}),
        (60, "detection", {"kind": "slow", "suspects": [], "evidence": "step time 1.9 s, 1.90x the job's own 1.0 s",
                           "details": {"step_s": 1.9, "baseline_s": 1.0, "samples": 10}}),
        (62, "checkpoint_request", {"signal": 10, "saved": False}),
        (65, "step_end", {"status": 143, "cause": "ended by the watch (slow)", "training_start_t": 10,
                          "last_checkpoint_t": 50}),
        (65, "gate_start", {"nodes": ["node1", "node2", "node3"], "evidence": "rounds/1"}),
        (80, "confirmation", {"kind": "slow", **confirmation}),
        (85, "training_start", {"restart": 1}), (91, "first_step", {"steps": 1}),
        (191, "step_end", {"status": 0, "training_start_t": 85}), (192, "job_end", {"status": 0}))


def account_of(*attempts, now=10_000.0):
    result = goodput(list(attempts), now)
    return result, watch_account(list(attempts), result, now)


def test_a_confirmed_slowdown_costs_its_restart_and_saves_the_slow_steps_after_it():
    result, account = account_of(slow_job({"named": {"node2": "fabric: straggler"}}))
    # productive: 10-50 and 85-191 (the 15 s after the checkpoint at 50 are lost work), of 192 s
    assert result.productive_s == 146 and result.wall_s == 192
    (slow,) = account.detections
    assert (slow.kind, slow.outcome) == ("slow", "node2 left out")
    assert slow.cost_s == 31 and slow.lost_work_s == 15          # 60 -> first step 91; 50 -> 65
    # without the watch: the 106 s after the restart at 1.9x (+95.4), no cost (-31), and the 10 s
    # between the checkpoint and the detection not done again (-10): 192 + 54.4
    assert slow.wall_change_s == pytest.approx(54.4)
    assert account.wall_without_s == pytest.approx(246.4)
    assert account.ratio_without == pytest.approx(146 / 246.4)
    assert watch_lines(account) == [
        "  watch: slow (node2 left out): cost 0:00:31 (detection to training again), "
        "0:00:15 of work after the last checkpoint",
        "  without the watch: about 59.3%, 0:04:06 instead of 0:03:12 "
        "(the 0:01:46 of training after the restart at 1.90x the step time)"]


def test_a_slowdown_the_gate_does_not_localise_only_costs_goodput():
    result, account = account_of(slow_job({"named": {}, "note": "slowdown not localised"}))
    (slow,) = account.detections
    assert slow.outcome == "slowdown not localised" and slow.cost_s == 31
    assert account.wall_without_s == pytest.approx(192 - 31 - 10)
    assert account.ratio_without == pytest.approx(146 / 151) and account.ratio_without > result.ratio
    assert watch_lines(account)[1] == ("  without the watch: about 96.7%, 0:02:31 instead of 0:03:12 "
                                       "(slowdown not localised: same nodes, same step time; "
                                       "here the watch cost goodput)")


@pytest.mark.parametrize("kind", ["hung", "sick"])
def test_a_hung_or_sick_node_is_not_estimated_but_its_cost_is_counted(kind):
    events = journal(
        (0, "job_start", {}), (10, "training_start", {}), (12, "first_step", {"steps": 1}),
        (30, "checkpoint", {"checkpoint_t": 30}),
        (40, "detection", {"kind": kind, "suspects": ["node2"], "evidence": "the agent of node2 fell silent"}),
        (45, "stacks", {"files": []}),
        (50, "step_end", {"status": 143, "cause": f"ended by the watch ({kind})", "training_start_t": 10,
                          "last_checkpoint_t": 30}),
        (60, "confirmation", {"kind": kind, "named": {"node2": f"{kind}: the agent fell silent"}}),
        (70, "training_start", {"restart": 1}), (78, "first_step", {"steps": 1}),
        (100, "step_end", {"status": 0, "training_start_t": 70}), (100, "job_end", {"status": 0}))
    _, account = account_of(events)
    (detection,) = account.detections
    assert (detection.cost_s, detection.lost_work_s) == (38, 20)
    assert detection.wall_change_s is None and account.wall_without_s is None and account.ratio_without is None
    assert watch_lines(account)[1] == (
        f"  without the watch: not estimated ({kind}: the job would have waited for the collective timeout "
        "or its time limit, or crashed, at a time the journal does not hold)")


def test_no_detection_no_watch_account_and_a_restart_not_yet_training_is_not_estimated():
    healthy = journal((0, "job_start", {}), (10, "training_start", {}), (50, "step_end", {"status": 0}),
                      (51, "job_end", {"status": 0}))
    assert account_of(healthy)[1] is None
    gating = slow_job({"named": {"node2": "fabric: straggler"}})[:10]    # the gate after it has judged
    _, account = account_of(gating, now=83)
    assert account.detections[0].cost_s is None and account.wall_without_s is None
    assert watch_lines(account) == [
        "  watch: slow (node2 left out): no training since, 0:00:15 of work after the last checkpoint",
        "  without the watch: not estimated (slow: no training since)"]


def test_a_detection_only_recorded_costs_nothing():
    # a start-up hang that named nobody: the stacks were taken, the step went on
    recorded = journal((0, "job_start", {}), (10, "training_start", {}),
                       (130, "detection", {"kind": "hung", "suspects": [], "details": {"startup_s": 120},
                                           "evidence": "no rank reached its first step in 120 s (start-up bound 120 s)",
                                           "note": "not acted on: no node is named"}),
                       (140, "first_step", {"steps": 1}), (200, "step_end", {"status": 0}),
                       (201, "job_end", {"status": 0}))
    assert account_of(recorded)[1] is None


def test_a_chain_counts_the_training_after_the_restart_in_every_attempt_less_its_lost_work():
    """Job 7 restarts after a confirmed slowdown (2x), then loses a node and is retried as job 8."""
    first = journal(
        (5, "job_start", {}), (5.5, "submitted", {"submitted_t": 0}), (10, "training_start", {}),
        (15, "first_step", {"steps": 1}),
        (60, "detection", {"kind": "slow", "suspects": [], "details": {"step_s": 2.0, "baseline_s": 1.0}}),
        (65, "step_end", {"status": 143, "training_start_t": 10, "last_checkpoint_t": 55}),
        (80, "confirmation", {"kind": "slow", "named": {"node2": "fabric: straggler"}}),
        (85, "training_start", {"restart": 1}), (90, "first_step", {"steps": 1}),
        (130, "step_end", {"status": 1, "training_start_t": 85, "last_checkpoint_t": 120}),
        (131, "retry", {"retry": True, "successor": "8"}), (135, "job_end", {"status": 1}))
    second = journal(
        (140, "job_start", {}), (140.5, "submitted", {"submitted_t": 132}), (150, "training_start", {}),
        (155, "first_step", {"steps": 1}), (200, "step_end", {"status": 0, "training_start_t": 150}),
        (201, "job_end", {"status": 0}))
    result, account = account_of(first, second)
    assert result.productive_s == 130 and result.wall_s == 201
    (slow,) = account.detections
    assert (slow.cost_s, slow.lost_work_s) == (30, 10)
    # after the restart: 85-130 less its 10 s of lost work, and job 8's 150-200: 85 s at 2x (+85);
    # no cost (-30), no redone work between the checkpoint at 55 and the detection (-5)
    assert account.wall_without_s == pytest.approx(201 + 85 - 30 - 5)
    assert account.ratio_without == pytest.approx(130 / 251)


def test_job_show_prints_and_returns_the_watch_account(tmp_path):
    from trainctl.job.show import LocalFiles, collect_job, format_job, to_json

    gate = tmp_path / "trainctl-gate-9"
    gate.mkdir()
    events = slow_job({"named": {"node2": "fabric: straggler"}})
    (gate / "journal.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    view = collect_job(LocalFiles(), "9", str(gate), 5)
    text = format_job(view, 5, now=10_000)
    assert "goodput: 76.0% (0:02:26 productive of 0:03:12 since the first submit)" in text
    assert "\n  watch: slow (node2 left out): cost 0:00:31 (detection to training again)" in text
    assert "\n  without the watch: about 59.3%, 0:04:06 instead of 0:03:12" in text
    data = to_json(view, 5, now=10_000)["watch"]
    assert data["detections"] == [{"kind": "slow", "outcome": "node2 left out", "cost_s": 31, "lost_work_s": 15,
                                   "wall_change_s": 54.4, "basis": "the 0:01:46 of training after the restart "
                                                                   "at 1.90x the step time"}]
    assert data["without_watch"] == {"wall_s": 246.4, "goodput": round(146 / 246.4, 4)}
