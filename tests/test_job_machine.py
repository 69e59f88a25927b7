"""The job's supervisor without Slurm: the whole life of a job as scripted events fed to the pure
state machine (gate, release, training, each detection kind, confirmation, restart on a spare or
on fewer nodes, successor, the end), the argv of each step, what it reads back from gate decide
and scontrol, and the goodput of a chain of journals."""

from dataclasses import replace

import pytest

from trainctl.detections import DetectionKind, SlowDetails, read_details
from trainctl.job import machine
from trainctl.job.goodput import goodput
from trainctl.job.jobdir import Journal, Save, parse_journal
from trainctl.job.watch import Detection, LinkReading, NodeReading, RankProgress, WatchLimits
from trainctl.launcher.plan import JobPlan, SubmitRequest, plan_job
from trainctl.site import load_site

ALLOCATED = ("node1", "node2", "node3", "node4")
LIMITS = WatchLimits(slow_factor=1.5, slow_window_s=10.0, baseline_window_s=120.0, warmup_s=0.0, hang_floor_s=20.0,
                     hang_steps=20.0, agent_silence_s=10.0)
WATCH = machine.WatchFacts(LIMITS, checkpoint_signal=10, checkpoint_wait_s=15.0, dump_wait_s=5.0, end_grace_s=3.0,
                           pay_factor=3.0, restart_cost_s=600.0)


def facts(*, release=True, retries=0, batch_host="node1", restarts=0, spares=0, min_nodes=1, successors=0,
          watch=None, allocated=ALLOCATED):
    return machine.JobFacts(allocated, batch_host, release, retries, restarts, spares, min_nodes, successors, watch)


def plan(**changes):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/true", "a b"), nodes=2, spare=2, **changes)
    return plan_job(load_site("local-demo").config, request, node_trainctl="/opt/trainctl", node_python="/py",
                    command=("trainctl", "submit"), version="0")


def run_events(job: machine.JobFacts, *events):
    """The last effect of each step, from the start (the one that answers with the next event)."""
    state, effects = machine.advance(job, machine.JobState(), machine.Started())
    actions = [effects[-1]]
    for event in events:
        state, effects = machine.advance(job, state, event)
        actions.append(effects[-1])
    return actions


def feed(job: machine.JobFacts, state: machine.JobState, event) -> tuple[machine.JobState, tuple]:
    return machine.advance(job, state, event)


def reading(node: str, t: float, steps: int, step_s: float = 0.5, failed=(), seconds=None) -> NodeReading:
    """A node agent's file: one rank per node (rank = the node's number), `steps` steps so far,
    which took `seconds` (steps x step_s unless given)."""
    rank = int(node.removeprefix("node"))
    seconds = steps * step_s if seconds is None else seconds
    return NodeReading(node, t, (RankProgress(rank, steps, seconds, t if steps else 0.0),), tuple(failed))


def training(job: machine.JobFacts, chosen=("node1", "node2"), unused=("node3", "node4"), start_t=1000.0):
    """Gate, release and the training step started at `start_t`, from scratch."""
    state, effects = machine.advance(job, machine.JobState(), machine.Started())
    state, effects = feed(job, state, machine.GateDecided(machine.fold_hostlist(list(chosen)), chosen, "10.0.0.1", unused))
    if state.phase == "release":
        state, effects = feed(job, state, machine.Resized(len(state.releasing)))
    assert isinstance(effects[-1], machine.RunTraining)
    return feed(job, state, machine.TrainingStarted(start_t))


def polls(job, state, nodes, times, steps_at, step_s=0.5, failed=None, seconds_at=None):
    """Feed one Polled per time until the phase changes; steps_at(node, t) -> the node's steps then
    (seconds_at(node, t): the seconds they took). Returns the last (state, effects)."""
    effects = ()
    for t in times:
        readings = {node: reading(node, t, steps_at(node, t), step_s, (failed or {}).get(node, ()),
                                  seconds_at(node, t) if seconds_at else None)
                    for node in nodes}
        state, effects = feed(job, state, machine.Polled(t, readings))
        if state.phase != "train":
            break
    return state, effects


def test_a_healthy_job_gates_releases_the_spares_trains_and_ends_with_the_steps_status():
    actions = run_events(facts(), machine.GateDecided("node[1,4]", ("node1", "node4"), "10.0.0.1"), machine.Resized(2),
                         machine.TrainingStarted(1.0), machine.StepEnded(0))
    assert actions == [machine.RunGate(), machine.Release("node[1,4]", move_sentinel=True),
                       machine.RunTraining("node[1,4]", 2, "10.0.0.1", start_sentinel=True), machine.WaitStep(poll=False),
                       machine.Finish(0)]
    state, effects = machine.advance(facts(), machine.JobState(), machine.Started())
    assert effects == (machine.StartSentinel(), machine.RunGate())
    assert machine.advance(facts(allocated=("node1",)), machine.JobState(), machine.Started())[1] == (machine.RunGate(),)


def test_the_step_ends_with_its_record_before_the_jobs_end():
    job = facts(release=False)
    state, _ = training(job)
    state, effects = feed(job, state, machine.StepEnded(0))
    assert effects == (machine.StepOver(0, "completed", agents=False, training_start_t=1000.0), machine.Finish(0))
    assert state.phase == "end"


def test_the_release_rewrites_the_environment_the_later_steps_get():
    job = facts()
    state, _ = machine.advance(job, machine.JobState(), machine.Started())
    state, _ = feed(job, state, machine.GateDecided("node[1-2]", ("node1", "node2"), "a", ("node3", "node4")))
    state, _ = feed(job, state, machine.Resized(2, (("SLURM_JOB_NODELIST", "node[1-2]"), ("SLURM_JOB_NUM_NODES", "2")),
                                                ("SLURM_TASKS_PER_NODE",)))
    base = {"SLURM_JOB_NODELIST": "node[1-4]", "SLURM_JOB_NUM_NODES": "4", "SLURM_TASKS_PER_NODE": "1(x4)", "X": "1"}
    assert machine.job_environment(base, state) == {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2", "X": "1"}
    assert base["SLURM_JOB_NUM_NODES"] == "4"    # the batch script's own is left as it was
    assert state.held == ("node1", "node2")


def test_the_batch_host_is_kept_when_the_gate_left_it_out_and_the_sentinel_stays_on_a_kept_node():
    actions = run_events(facts(), machine.GateDecided("node[2-3]", ("node2", "node3"), "10.0.0.2"), machine.Resized(3))
    assert actions[1] == machine.Release("node[1-3]", move_sentinel=False)
    assert actions[2] == machine.RunTraining("node[2-3]", 2, "10.0.0.2", start_sentinel=False)


def test_nothing_to_release_goes_straight_to_training():
    job = machine.JobFacts(("node1", "node2"), "node1", True, 0)
    actions = run_events(job, machine.GateDecided("node[1-2]", ("node1", "node2"), "10.0.0.1"))
    assert actions[1] == machine.RunTraining("node[1-2]", 2, "10.0.0.1", start_sentinel=False)
    assert run_events(facts(release=False), machine.GateDecided("node1", ("node1",), "a"))[1] == \
        machine.RunTraining("node1", 1, "a", start_sentinel=False)


def test_a_refused_release_restarts_the_cancelled_sentinel_on_the_nodes_the_job_kept():
    actions = run_events(facts(), machine.GateDecided("node1,node4", ("node1", "node4"), "a"), machine.Resized(4))
    assert actions[-1].start_sentinel


def test_a_failed_gate_retries_around_the_allocation_only_with_retries():
    assert run_events(facts(), machine.GateRefused(2))[-1] == machine.Finish(2)
    actions = run_events(facts(retries=1), machine.GateRefused(2), machine.RetryHandled())
    assert actions[1:] == [machine.Retry("gate", 2, ALLOCATED, budget=1), machine.Finish(2)]
    # nonsense from gate decide is not a verdict about nodes: no retry
    assert run_events(facts(retries=1), machine.GateRefused(2, retryable=False))[-1] == machine.Finish(2)


def test_a_failed_step_retries_around_its_nodes_and_ends_with_its_status():
    actions = run_events(facts(retries=1, release=False), machine.GateDecided("node[1-2]", ("node1", "node2"), "a"),
                         machine.TrainingStarted(1.0), machine.StepEnded(137), machine.RetryHandled())
    assert actions[3:] == [machine.Retry("step", 137, ("node1", "node2"), budget=1), machine.Finish(137)]
    assert run_events(facts(release=False), machine.GateDecided("node1", ("node1",), "a"), machine.TrainingStarted(1.0),
                      machine.StepEnded(3))[-1] == machine.Finish(3)


def test_a_held_spare_stays_through_training_and_the_rest_go_back():
    actions = run_events(facts(spares=1), machine.GateDecided("node[1-2]", ("node1", "node2"), "a", ("node3", "node4")))
    assert actions[1] == machine.Release("node[1-3]", move_sentinel=False)


# ---------------------------------------------------------------- training, watched

def test_the_watch_starts_the_agents_and_polls_while_the_job_makes_progress():
    job = facts(release=False, watch=WATCH)
    state, effects = training(job)
    assert effects == (machine.StartAgents("node[1-2]", 2), machine.WaitStep(poll=True))
    state, effects = feed(job, state, machine.Polled(1001.0, {"node1": reading("node1", 1001.0, 1),
                                                              "node2": reading("node2", 1001.0, 1)}))
    assert effects == (machine.Journal("first_step", {"steps": 1}), machine.WaitStep(poll=True))
    state, effects = polls(job, state, ("node1", "node2"), [1002.0 + i for i in range(30)],
                           lambda node, t: int(t - 1000.0) * 2)
    assert effects == (machine.WaitStep(poll=True),) and state.phase == "train"
    state, effects = feed(job, state, machine.StepEnded(0, 1040.0, {}))
    assert effects == (machine.StepOver(0, "completed", agents=True, training_start_t=1000.0), machine.Finish(0))


def test_an_agent_silent_while_training_goes_on_is_journaled_once_and_is_no_detection():
    job = facts(release=False, watch=WATCH)
    state, _ = training(job)
    noted = []
    for second in range(1, 40):
        t = 1000.0 + second
        readings = {"node1": reading("node1", t, second),
                    "node2": reading("node2", min(t, 1005.0), min(second, 5))}   # node2's agent stops at 1005
        state, effects = feed(job, state, machine.Polled(t, readings))
        noted += [e for e in effects if isinstance(e, machine.Journal) and e.kind == "agent_silent"]
        assert state.phase == "train", effects
    assert noted == [machine.Journal("agent_silent", {"node": "node2", "note": "training goes on: not a detection"})]


def sick_detected(job):
    state, _ = training(job)
    state, _ = polls(job, state, ("node1", "node2"), [1001.0, 1002.0], lambda node, t: int(t - 1000.0))
    return polls(job, state, ("node1", "node2"), [1003.0], lambda node, t: int(t - 1000.0),
                 failed={"node2": (("gpu.xid", "Xid 79: fallen off the bus"),)})


def test_a_sick_node_asks_for_a_checkpoint_stops_the_step_and_restarts_on_the_held_spare():
    job = facts(spares=1, restarts=2, watch=WATCH)
    state, effects = sick_detected(job)
    assert state.phase == "asking" and state.detection.suspects == ("node2",)
    assert effects[0].kind == "detection" and effects[0].fields["suspects"] == ["node2"]
    assert effects[1] == machine.Say("trainctl: watch: sick: node2: gpu.xid: Xid 79: fallen off the bus")
    assert effects[2:] == (machine.PostCheckpointRequest(),) and state.phase == "asking"
    # no rank takes requests over trainctl's channel: the job's signal, then the save is awaited
    state, effects = feed(job, state, machine.CheckpointAsked(posted=True, listening=False))
    assert effects == (machine.SendSignal(10), machine.AwaitSave(15.0)) and state.phase == "awaiting"
    state, effects = feed(job, state, machine.SaveAwaited(Save(1003.5, "torch.save", "/ckpt/step_6.pt")))
    assert effects == (machine.Journal("checkpoint", {"checkpoint_t": 1003.5, "note": "/ckpt/step_6.pt",
                                                      "source": "torch.save"}),
                       machine.Journal("checkpoint_request", {"signal": 10, "listening": False, "saved": True}),
                       machine.StopStep(3.0))
    state, effects = feed(job, state, machine.StepStopped(143))
    assert effects == (machine.StepOver(143, "ended by the watch (sick)", agents=True, detection=DetectionKind.SICK,
                                        training_start_t=1000.0, last_checkpoint_t=1003.5),
                       machine.RunGate(("node1", "node3"), archive=1))
    assert state.condemned == ("node2",) and state.restarts == 1 and state.watch is None
    # the gate confirms: the named node is left out (and drained where the site asks), the spare trains
    state, effects = feed(job, state, machine.GateDecided("node[1,3]", ("node1", "node3"), "a"))
    assert effects[0] == machine.Journal("confirmation", {"kind": "sick", "checked": ["node1", "node3"], "named": {
        "node2": "sick: node2: gpu.xid: Xid 79: fallen off the bus"}})
    assert effects[1:] == (machine.Say("trainctl: watch: leaving out node2"),
                           machine.Drain({"node2": ("sick", (("gpu.xid", "Xid 79: fallen off the bus"),))}),
                           machine.Release("node[1,3]", move_sentinel=True))
    assert state.detection is None
    state, effects = feed(job, state, machine.Resized(2))
    assert effects == (machine.RunTraining("node[1,3]", 2, "a", start_sentinel=True, restart=1),)
    state, effects = feed(job, state, machine.TrainingStarted(2000.0))
    assert effects == (machine.StartAgents("node[1,3]", 2), machine.WaitStep(poll=True))


@pytest.mark.parametrize("signum, asked, sent, awaited, journaled", [
    # a rank takes requests over trainctl's channel: no signal (Lightning's would requeue the job)
    (10, machine.CheckpointAsked(True, True), False, True, {"signal": None, "listening": True}),
    (10, machine.CheckpointAsked(True, False), True, True, {"signal": 10, "listening": False}),
    # a rank said the signal would not get a save: nothing sent, nothing awaited, its line journaled
    (10, machine.CheckpointAsked(True, False, "rank 1: SIGUSR1 is ignored"), False, False,
     {"signal": None, "listening": False, "refused": "rank 1: SIGUSR1 is ignored"}),
    # the listener file counts only where the request reached the folder
    (10, machine.CheckpointAsked(False, True), True, True, {"signal": 10, "listening": False}),
    # the step ended meanwhile: nothing to signal or wait for
    (10, machine.CheckpointAsked(False, False, running=False), False, False, {"signal": None, "listening": False}),
    # no checkpoint signal: the request alone, and a refusal of a signal the job does not send is no news
    (None, machine.CheckpointAsked(True, False, "rank 0: SIGUSR1 has its default action"), False, False,
     {"signal": None, "listening": False}),
    (None, machine.CheckpointAsked(True, True), False, True, {"signal": None, "listening": True}),
], ids=["listener", "signal", "refused", "not-posted", "ended", "no-signal", "no-signal-listener"])
def test_the_machine_decides_whether_to_signal_and_whether_to_wait_for_the_save(signum, asked, sent, awaited,
                                                                             journaled):
    job = facts(spares=1, restarts=2, watch=replace(WATCH, checkpoint_signal=signum))
    state, effects = sick_detected(job)
    assert effects[-1] == machine.PostCheckpointRequest()
    state, effects = feed(job, state, asked)
    assert (machine.SendSignal(10) in effects) == sent
    if awaited:
        assert effects[-1] == machine.AwaitSave(15.0)
        state, effects = feed(job, state, machine.SaveAwaited(None))     # no save within the wait
    saved_false = {**journaled, "saved": False}
    assert effects[-2:] == (machine.Journal("checkpoint_request", saved_false), machine.StopStep(3.0))
    assert state.phase == "stopping" and state.request is None


def test_each_save_seen_is_journaled_by_the_machine_and_is_the_steps_last_checkpoint():
    job = facts(release=False, watch=WATCH)
    state, _ = training(job)
    readings = {node: reading(node, 1001.0, 1) for node in ("node1", "node2")}
    state, effects = feed(job, state, machine.Polled(1001.0, readings, Save(1000.5, "checkpoint.seen", "step 1")))
    assert effects[0] == machine.Journal("checkpoint", {"checkpoint_t": 1000.5, "note": "step 1"})   # the marker's
    assert state.saved_t == 1000.5
    state, effects = feed(job, state, machine.StepEnded(0, 1002.0, readings, Save(1001.5, "safetensors", "/m.st")))
    assert effects[0] == machine.Journal("checkpoint", {"checkpoint_t": 1001.5, "note": "/m.st",
                                                        "source": "safetensors"})
    assert effects[1] == machine.StepOver(0, "completed", True, training_start_t=1000.0, last_checkpoint_t=1001.5)
    # unwatched: a save answers the wait, and the wait goes on
    job = facts(release=False)
    state, _ = training(job)
    state, effects = feed(job, state, machine.SaveSeen(Save(1000.7, "torch.save", "/a.pt")))
    assert effects == (machine.Journal("checkpoint", {"checkpoint_t": 1000.7, "note": "/a.pt", "source": "torch.save"}),
                       machine.WaitStep(poll=False))
    # a new training step starts with no save seen
    state, _ = feed(job, replace(state, phase="train"), machine.TrainingStarted(2000.0))
    assert state.saved_t is None and state.step_started_t == 2000.0


def test_a_hung_node_gets_the_others_stacks_and_is_named_by_its_silent_agent():
    job = facts(spares=1, restarts=2, watch=WATCH)
    state, _ = training(job)
    state, _ = polls(job, state, ("node1", "node2"), [1001.0 + i for i in range(5)], lambda node, t: int(t - 1000.0))
    # node2 hangs at 1005: its agent writes no more, and no rank finishes a step
    for t in [1006.0 + i for i in range(25)]:
        readings = {"node1": reading("node1", t, 5), "node2": reading("node2", 1005.0, 5)}
        state, effects = feed(job, state, machine.Polled(t, readings))
        if state.phase != "train":
            break
    assert state.detection.kind == "hung" and state.detection.suspects == ("node2",)
    assert effects[-2:] == (machine.RequestStacks(("node1",), 5.0), machine.StopStep(3.0))
    state, effects = feed(job, state, machine.StepStopped(137))
    assert effects[-1] == machine.RunGate(("node1", "node3"), archive=1)


def slowing(job, state, times, saved_t=None):
    """0.5 s a step for 60 s from 1000, then 1.0 s a step; Polled until the phase changes. `saved_t`:
    the last checkpoint seen (a number, or a function of the poll's time). Returns (state, every effect)."""
    seen = []
    for t in times:
        steps = int(min(t - 1000.0, 60.0) * 2 + max(t - 1060.0, 0.0))
        state = replace(state, saved_t=saved_t(t) if callable(saved_t) else saved_t)
        state, effects = feed(job, state, machine.Polled(t, {node: reading(node, t, steps, 0.5, (), t - 1000.0)
                                                             for node in ("node1", "node2")}))
        seen += effects
        if state.phase != "train":
            break
    return state, tuple(seen)


def weighed(effects):
    return [e for e in effects if isinstance(e, machine.Journal) and e.kind == "weighed"]


def test_a_slowdown_no_evidence_pins_on_a_node_is_weighed_and_training_goes_on_when_the_gate_would_not_pay():
    # the allocation ends in an hour: halving the step time over it gains about 30 min, under 3 x (the
    # site's 600 s restart price + the work since the last checkpoint)
    job = facts(release=False, restarts=3, watch=replace(WATCH, end_t=1065.0 + 3600.0))
    state, _ = training(job)
    state, effects = slowing(job, state, [1001.0 + i for i in range(90)], saved_t=1050.0)
    assert state.phase == "train" and state.detection is None
    assert not any(isinstance(e, (machine.StopStep, machine.PostCheckpointRequest, machine.RunGate)) for e in effects)
    [decision] = weighed(effects)
    fields = decision.fields
    assert fields["action"] == "go on" and fields["kind"] == "slow" and fields["restart_basis"] == "site default"
    assert fields["restart_s"] == 600.0 and fields["left_basis"] == "to the allocation's end"
    assert fields["price_s"] == fields["restart_s"] + fields["lost_work_s"]
    assert fields["gain_s"] <= fields["pay_factor"] * fields["price_s"]
    assert fields["gain_s"] == pytest.approx((fields["step_s"] - fields["baseline_s"]) / fields["step_s"]
                                             * fields["left_s"], abs=0.2)
    said = [e for e in effects if isinstance(e, machine.Say)]
    assert said and "training goes on" in said[0].line
    # the slower step time is the new normal: the same slowdown is not weighed again
    assert state.accepted_step_s > 0.5 and state.watch.accepted_step_s == state.accepted_step_s
    state, effects = slowing(job, state, [1091.0 + i for i in range(120)], saved_t=1050.0)
    assert weighed(effects) == [] and state.phase == "train"


def test_without_the_allocations_end_the_elapsed_training_stands_in_for_the_time_left():
    job = facts(release=False, restarts=3, watch=WATCH)
    state, _ = training(job)
    _, effects = slowing(job, state, [1001.0 + i for i in range(90)])
    [decision] = weighed(effects)
    assert decision.fields["left_basis"].startswith("the training so far") and decision.fields["action"] == "go on"
    assert 60.0 < decision.fields["left_s"] < 90.0    # the training since 1000
    # no checkpoint seen: the work since the training step's start is what a restart loses
    assert decision.fields["lost_work_s"] == decision.fields["left_s"]


def every_30_s(t):
    """A program that saves every 30 s."""
    return t - t % 30.0


def test_a_slowdown_worth_the_gate_stops_for_it_once_it_cost_a_restarts_price():
    job = facts(release=False, restarts=1, watch=replace(WATCH, end_t=1000.0 + 10 * 86400.0))
    state, _ = training(job)
    state, effects = slowing(job, state, [1001.0 + i for i in range(2000)], saved_t=every_30_s)
    assert state.phase == "asking" and state.detection.kind == "slow" and state.detection.suspects == ()
    # weighed twice: when the gate first would pay (training goes on), and when the slowdown has cost its price
    wait, decision = weighed(effects)
    assert wait.fields["action"] == "wait" and wait.fields["paid_s"] == 0.0
    assert wait.fields["gain_s"] > 3 * wait.fields["price_s"]
    assert decision.fields["action"] == "gate" and decision.fields["gain_s"] > 3 * decision.fields["price_s"]
    assert decision.fields["paid_s"] >= decision.fields["price_s"] >= 600.0
    assert decision.fields["step_s"] > 1.5 * decision.fields["baseline_s"]   # still judged against the first baseline
    assert effects[-1] == machine.PostCheckpointRequest() and state.phase == "asking"
    state, _ = feed(job, state, machine.CheckpointAsked(True, True))
    state, effects = feed(job, state, machine.SaveAwaited(None))
    assert effects[-1] == machine.StopStep(3.0)
    stopped_t = state.stopped_t
    state, effects = feed(job, state, machine.StepStopped(143))
    assert effects[-1] == machine.RunGate(ALLOCATED, archive=1) and state.condemned == ()
    state, effects = feed(job, state, machine.GateDecided("node[1-2]", ("node1", "node2"), "a"))
    assert effects[0].kind == "confirmation" and effects[0].fields["note"] == "slowdown not localised"
    assert effects[1] == machine.Say("trainctl: watch: the gate names no node (slow not localised): "
                                     "resuming on the same nodes")
    assert effects[2] == machine.RunTraining("node[1-2]", 2, "a", start_sentinel=False, restart=1)
    assert state.accepted_step_s > 0.5
    state, _ = feed(job, state, machine.TrainingStarted(3000.0))
    assert state.watch.accepted_step_s == state.accepted_step_s
    # the restart's own time, from the decision to its first step, is the job's measured restart price
    state, effects = feed(job, state, machine.Polled(3040.0, {"node1": reading("node1", 3040.0, 1),
                                                              "node2": reading("node2", 3040.0, 1)}))
    assert machine.Journal("first_step", {"steps": 1}) in effects
    assert state.restart_s == 3040.0 - stopped_t and state.stopped_t == 0.0


def test_a_measured_restart_prices_the_next_slowdown():
    job = facts(release=False, restarts=3, watch=replace(WATCH, end_t=1065.0 + 1800.0))
    state, _ = training(job)
    cheap, effects = slowing(job, replace(state, restart_s=60.0), [1001.0 + i for i in range(400)],
                             saved_t=every_30_s)
    decision = weighed(effects)[-1]
    assert decision.fields["restart_basis"] == "measured" and decision.fields["restart_s"] == 60.0
    assert decision.fields["action"] == "gate" and cheap.phase == "asking"
    dear, effects = slowing(job, state, [1001.0 + i for i in range(90)], saved_t=every_30_s)
    assert weighed(effects)[0].fields["action"] == "go on" and dear.phase == "train"


def test_a_slowdown_that_passes_before_it_costs_a_restarts_price_stops_nothing_and_sets_no_new_normal():
    # the gate would pay (a cheap restart, a long allocation), but the slowdown is a 40 s phase
    job = facts(release=False, restarts=3, watch=replace(WATCH, end_t=1000.0 + 86400.0))
    state, _ = training(job)
    state = replace(state, restart_s=60.0)
    state, effects = slowing(job, state, [1001.0 + i for i in range(100)], saved_t=every_30_s)
    assert state.phase == "train" and state.watch.rent is not None
    [wait] = weighed(effects)
    assert wait.fields["action"] == "wait"
    assert "training goes on for now" in [e for e in effects if isinstance(e, machine.Say)][0].line
    steps = 2 * 60 + 40
    for t in [1101.0 + i for i in range(30)]:   # 0.5 s a step again
        steps += 2
        state = replace(state, saved_t=every_30_s(t))
        state, more = feed(job, state, machine.Polled(t, {node: reading(node, t, steps, 0.5, (), t - 1000.0)
                                                          for node in ("node1", "node2")}))
        effects += more
    assert state.phase == "train" and state.watch.rent is None and state.accepted_step_s == 0.0
    passed = weighed(effects)[-1].fields
    assert passed["action"] == "passed" and 0.0 < passed["paid_s"] < 60.0
    assert not any(isinstance(e, (machine.StopStep, machine.PostCheckpointRequest)) for e in effects)


def test_a_slowdown_after_the_last_restart_is_noted_and_training_goes_on():
    # the restarts are used up: a slowdown that names nobody would end a job that can go on
    job = facts(release=False, restarts=1, successors=2, watch=WATCH)
    state, _ = training(job)
    state = replace(state, restarts=1)
    seen = []
    for t in [1001.0 + i for i in range(90)]:   # 0.5 s a step for 60 s, then 1.0 s a step
        steps = int(min(t - 1000.0, 60.0) * 2 + max(t - 1060.0, 0.0))
        state, effects = feed(job, state, machine.Polled(t, {node: reading(node, t, steps, 0.5, (), t - 1000.0)
                                                             for node in ("node1", "node2")}))
        seen += effects
    effects = tuple(seen)
    assert state.phase == "train" and state.detection is None
    noted = [e for e in effects if isinstance(e, machine.Journal) and e.kind == "detection"]
    assert noted and noted[0].fields["note"].startswith("not acted on: the 1 restarts")
    assert effects[-1] == machine.WaitStep(poll=True)
    assert state.accepted_step_s > 0.5 and state.watch.accepted_step_s == state.accepted_step_s
    assert not any(isinstance(e, (machine.StopStep, machine.PostCheckpointRequest, machine.Retry)) for e in effects)


def test_a_slowdown_a_ranks_own_time_pins_on_its_node_stops_without_weighing_and_leaves_the_node_out():
    # node2's main thread waits for a CPU 0.5 s more a step from 1060 (0.5 -> 1.0 s a step); node1's is flat.
    # Even with the restarts used up, a named node is acted on (a successor job goes on without it)
    job = facts(release=False, restarts=1, successors=2, watch=WATCH)
    state, _ = training(job)
    state = replace(state, restarts=1)
    seen = []
    for t in [1001.0 + i for i in range(90)]:
        steps = int(min(t - 1000.0, 60.0) * 2 + max(t - 1060.0, 0.0))
        runq = {"node1": 0.01 * steps, "node2": 0.01 * steps + 0.5 * max(t - 1060.0, 0.0)}
        readings = {node: NodeReading(node, t, (RankProgress(int(node[-1]), steps, t - 1000.0, t, cpu_seconds=0.2 * steps,
                                                             runq_seconds=runq[node]),))
                    for node in ("node1", "node2")}
        state, effects = feed(job, state, machine.Polled(t, readings))
        seen += effects
        if state.phase != "train":
            break
    assert state.phase == "asking" and state.detection.suspects == ("node2",)
    assert weighed(seen) == [] and "rule own-time" in state.detection.evidence
    assert seen[-1] == machine.PostCheckpointRequest()
    state, _ = feed(job, state, machine.CheckpointAsked(True, False))
    state, effects = feed(job, state, machine.SaveAwaited(None))
    state, effects = feed(job, state, machine.StepStopped(143))
    assert state.condemned == ("node2",) and isinstance(effects[-1], machine.Retry)


def test_a_slowdown_a_nodes_link_pins_on_it_stops_without_weighing_and_leaves_the_node_out():
    # every rank's own time flat; from 1060 the step doubles, node2's link holds back 60 times per
    # MB sent as before while node1's, waiting for it, holds back 20 (it held back 55 like node2's)
    job = facts(release=False, restarts=1, successors=2, watch=WATCH)
    state, _ = training(job)
    seen, held = [], {"node1": 0.0, "node2": 0.0}
    for t in [1001.0 + i for i in range(90)]:
        steps = int(min(t - 1000.0, 60.0) * 2 + max(t - 1060.0, 0.0))
        sent = 250_000 * steps                          # each step sends 0.25 MB
        per_mb = {"node1": 20.0 if t > 1060.0 else 55.0, "node2": 60.0 if t > 1060.0 else 55.0}
        held = {node: held[node] + per_mb[node] * (0.5 if t <= 1060.0 else 0.25) for node in held}
        readings = {node: NodeReading(node, t, (RankProgress(int(node[-1]), steps, t - 1000.0, t, cpu_seconds=0.2 * steps,
                                                             runq_seconds=0.01 * steps),),
                                      links=(LinkReading("eth0", "qdisc", sent, int(held[node])),), links_t=t)
                    for node in ("node1", "node2")}
        state, effects = feed(job, state, machine.Polled(t, readings))
        seen += effects
        if state.phase != "train":
            break
    assert state.phase == "asking" and state.detection.suspects == ("node2",)
    assert weighed(seen) == [] and "rule link-wait" in state.detection.evidence
    state, _ = feed(job, state, machine.CheckpointAsked(True, True))
    state, _ = feed(job, state, machine.SaveAwaited(None))
    state, effects = feed(job, state, machine.StepStopped(143))   # a restart is left: the gate, without node2
    assert state.condemned == ("node2",) and effects[-1] == machine.RunGate(("node1", "node3", "node4"), 1)


def test_a_slowdown_the_gate_localises_names_the_node_the_gate_excluded():
    job = facts(release=False, restarts=1, watch=WATCH)
    state = machine.JobState(phase="gate", held=ALLOCATED, chosen=("node1", "node2"), restarts=1,
                             detection=Detection(DetectionKind.SLOW, (), "step time 1 s, 2x", SlowDetails(1.0, 0.5)))
    state, effects = feed(job, state, machine.GateDecided("node[1,3]", ("node1", "node3"), "a",
                                                          gate_named={"node2": "fabric: straggler"}))
    assert effects[0].fields["named"] == {"node2": "fabric: straggler"}
    assert effects[1] == machine.Say("trainctl: watch: leaving out node2")
    assert not any(isinstance(e, machine.Drain) for e in effects)   # gate decide drained it itself
    assert state.accepted_step_s == 0.0


def test_a_program_without_the_progress_api_is_found_hung_by_an_agent_silent_for_the_hang_floor():
    job = facts(spares=1, restarts=2, watch=WATCH)
    state, _ = training(job)
    for t in [1001.0 + i for i in range(40)]:   # no rank reports a step; node2's agent stops at 1005
        state, effects = feed(job, state, machine.Polled(t, {"node1": reading("node1", t, 0),
                                                             "node2": reading("node2", min(t, 1005.0), 0)}))
        if state.phase != "train":
            break
    assert t >= 1005.0 + LIMITS.hang_floor_s
    assert state.detection.kind == "hung" and state.detection.suspects == ("node2",)
    assert effects[-2:] == (machine.RequestStacks(("node1",), 5.0), machine.StopStep(3.0))


def test_the_driver_watches_where_the_plan_says_with_the_sites_watch_settings(tmp_path):
    from support.sites import site_variant
    from trainctl.job.driver import job_facts
    from trainctl.job.policy import load_gate_policy

    # the site watches with its own settings; a job submitted with --no-watch does not
    site = str(site_variant(tmp_path, "local-demo", {"watch.max_restarts": 2, "watch.hold_spares": 1,
                                                     "watch.max_successors": 1}))
    policy = load_gate_policy(site, None)
    watched = job_facts(plan(), policy, ALLOCATED, "node1")
    assert (watched.max_restarts, watched.hold_spares, watched.successors) == (2, 1, 1)
    assert watched.watch == machine.WatchFacts(
        replace(policy.watch_limits, startup_s=policy.startup_s(2), steps_expected=policy.watch.auto_steps),
        10, policy.watch.checkpoint_wait_s, policy.watch.dump_wait_s, policy.watch.end_grace_s,
        policy.watch.pay_factor, policy.watch.restart_cost_s, None)
    off = job_facts(plan(watch=False), policy, ALLOCATED, "node1")
    assert off.watch is None and (off.max_restarts, off.hold_spares, off.successors) == (0, 0, 0)
    assert (off.allocated, off.batch_host, off.min_nodes, off.retries) == (ALLOCATED, "node1", 2, 0)
    # a site that no longer watches leaves a job submitted with the watch on watching: the plan wins
    (tmp_path / "off").mkdir()
    unwatched = load_gate_policy(str(site_variant(tmp_path / "off", "local-demo", {"watch.enabled": False})), None)
    assert job_facts(plan(watch=True), unwatched, ALLOCATED, "node1").watch is not None
    # a plan written before the switch existed (no `watch`: None) watches where the site does now
    assert job_facts(replace(plan(), watch=None), unwatched, ALLOCATED, "node1").watch is None
    assert job_facts(replace(plan(), watch=None), policy, ALLOCATED, "node1").watch is not None
    # the off switch ends what a detection would do: a failed step ends the job
    state, _ = training(off)
    assert state.watch is None
    _, effects = feed(off, state, machine.StepEnded(137))
    assert effects[-1] == machine.Finish(137)


def test_every_effect_the_machine_returns_has_one_executor_in_the_driver():
    import typing

    from trainctl.job.driver import JobDriver

    driver = JobDriver.__new__(JobDriver)     # the table only, no Slurm
    assert set(driver.executors()) == set(typing.get_args(machine.Effect))


def test_every_effect_has_its_executor_carried_out_by_a_test_without_slurm():
    """A new effect type needs a test in tests/test_job_executors.py that carries out its executor."""
    import typing

    from test_job_executors import COVERED

    assert set(typing.get_args(machine.Effect)) - COVERED == set()


def test_a_step_that_fails_after_an_agent_fell_silent_is_a_hang_of_that_node():
    job = facts(spares=1, restarts=2, watch=WATCH)
    state, _ = training(job)
    state, _ = polls(job, state, ("node1", "node2"), [1001.0, 1002.0, 1003.0], lambda node, t: int(t - 1000.0))
    # Slurm ended the step 12 s later, node2's agent silent since 1003
    state, effects = feed(job, state, machine.StepEnded(137, 1015.0, {"node1": reading("node1", 1015.0, 15),
                                                                      "node2": reading("node2", 1003.0, 3)}))
    assert effects[0].kind == "detection" and effects[0].fields["suspects"] == ["node2"]
    assert effects[2:] == (machine.StepOver(137, "ended by the watch (hung)", agents=True, detection=DetectionKind.HUNG,
                                           training_start_t=1000.0),
                           machine.RunGate(("node1", "node3"), archive=1))
    # every agent still wrote: the program's own failure, no detection
    state, _ = training(job)
    state, effects = feed(job, state, machine.StepEnded(1, 1001.0, {"node1": reading("node1", 1001.0, 1),
                                                                    "node2": reading("node2", 1001.0, 1)}))
    assert effects == (machine.StepOver(1, "exit status 1", agents=True, training_start_t=1000.0), machine.Finish(1))


def test_a_hung_node_is_left_out_of_the_next_gate_and_training_restarts_on_the_spare():
    job = facts(restarts=2, spares=1, watch=WATCH)
    state, _ = training(job)
    assert state.held == ("node1", "node2", "node3")
    state, effects = stopped_after(job, state, "hung", ("node2",))
    assert effects[-1] == machine.RunGate(("node1", "node3"), archive=1) and state.condemned == ("node2",)
    state, effects = feed(job, state, machine.GateDecided("node[1,3]", ("node1", "node3"), "a"))
    assert effects[-1] == machine.Release("node[1,3]", move_sentinel=True)
    state, effects = feed(job, state, machine.Resized(2))
    assert effects[-1] == machine.RunTraining("node[1,3]", 2, "a", start_sentinel=True, restart=1)
    assert state.held == ("node1", "node3")
    # a second detection gates again, on fewer nodes, with the next round number
    state, _ = feed(job, state, machine.TrainingStarted(2000.0))
    state, effects = stopped_after(job, state, "hung", ("node3",))
    assert effects[-1] == machine.RunGate(("node1",), archive=2) and state.condemned == ("node2", "node3")


def stopped_after(job, state, kind, suspects, status=143):
    state = replace(state, phase="stopping", detection=Detection(DetectionKind(kind), suspects, "evidence",
                                                                     read_details(DetectionKind(kind), {})))
    return feed(job, state, machine.StepStopped(status))


def test_restarts_used_up_go_on_in_a_successor_within_retries_or_the_sites_successors():
    state, _ = training(facts(release=False))
    state = replace(state, restarts=1)
    job = facts(restarts=1, release=False, watch=WATCH)
    ended = stopped_after(job, state, "sick", ("node2",))[1][-1]
    assert ended == machine.Finish(143, "the watch found node2 sick; the 1 restarts the site allows inside the "
                                   "allocation are used up; no successor job: --retries is 0 and the site's "
                                   "watch.max_successors is 0")
    retrying = facts(restarts=1, release=False, retries=1, watch=WATCH)
    assert stopped_after(retrying, state, "sick", ("node2",))[1][-1] == \
        machine.Retry("step", 143, ("node1", "node2"), ("node2",), budget=1)
    by_default = facts(restarts=1, release=False, successors=2, watch=WATCH)
    state, effects = stopped_after(by_default, state, "sick", ("node2",))
    assert effects[-1] == machine.Retry("step", 143, ("node1", "node2"), ("node2",), budget=2)
    assert state.phase == "retry" and state.detection is None
    assert feed(by_default, state, machine.RetryHandled())[1] == (machine.Finish(143),)


def test_too_few_healthy_nodes_after_a_detection_go_on_in_a_successor_excluding_the_condemned():
    for job, budget in ((facts(restarts=1, retries=1, release=False, watch=WATCH), 1),
                        (facts(restarts=1, release=False, successors=2, watch=WATCH), 2)):
        state, _ = training(job)
        state, _ = stopped_after(job, state, "hung", ("node2",))
        state, effects = feed(job, state, machine.GateRefused(2, gate_named={"node3": "ib.ports: Down"}))
        assert effects[0].kind == "confirmation"
        assert effects[-1] == machine.Retry("gate", 2, ALLOCATED, ("node2",), budget=budget)


def trained_on_two_of_three(job: machine.JobFacts) -> machine.JobState:
    """--nodes 2 --spare 1: the gate chose node[1-2]; node3 passed too."""
    state, _ = training(job, unused=("node3",))
    assert state.phase == "train"
    return state


def three_nodes(**changes) -> machine.JobFacts:
    defaults = dict(release=True, retries=0, max_restarts=3, hold_spares=0, min_nodes=2, successors=2)
    defaults.update(changes)
    return machine.JobFacts(("node1", "node2", "node3"), "node1", defaults["release"], defaults["retries"],
                            defaults["max_restarts"], defaults["hold_spares"], defaults["min_nodes"], defaults["successors"],
                            WATCH)


def test_with_the_sites_defaults_a_named_node_without_a_spare_held_goes_on_in_a_successor_without_a_gate():
    job = three_nodes()
    state = trained_on_two_of_three(job)
    assert state.held == ("node1", "node2")          # the spare went back after the first gate
    state, effects = stopped_after(job, state, "hung", ("node2",))
    assert effects == (machine.StepOver(143, "ended by the watch (hung)", agents=True, detection=DetectionKind.HUNG,
                                        training_start_t=1000.0),
                       machine.Retry("step", 143, ("node1", "node2"), ("node2",), budget=2))
    assert state.phase == "retry" and state.condemned == ("node2",)
    assert feed(job, state, machine.RetryHandled())[1] == (machine.Finish(143),)


def test_a_held_spare_takes_the_named_nodes_place_inside_the_allocation():
    job = three_nodes(hold_spares=1)
    state = trained_on_two_of_three(job)
    assert state.held == ("node1", "node2", "node3")   # nothing to release: the spare is held
    state, effects = stopped_after(job, state, "sick", ("node2",))
    assert effects[-1] == machine.RunGate(("node1", "node3"), archive=1)
    state, effects = feed(job, state, machine.GateDecided("node[1,3]", ("node1", "node3"), "a"))
    assert effects[-1] == machine.Release("node[1,3]", move_sentinel=True)
    assert feed(job, state, machine.Resized(2))[1] == (machine.RunTraining("node[1,3]", 2, "a", True, restart=1),)


def test_without_a_spare_training_restarts_on_fewer_nodes_down_to_min_nodes():
    job = three_nodes(min_nodes=1)
    state = trained_on_two_of_three(job)
    state, effects = stopped_after(job, state, "hung", ("node2",))
    assert effects[-1] == machine.RunGate(("node1",), archive=1)
    state, effects = feed(job, state, machine.GateDecided("node1", ("node1",), "a"))
    assert effects[-1] == machine.Release("node1", move_sentinel=True)     # the hung node goes back to Slurm
    assert feed(job, state, machine.Resized(1))[1] == (machine.RunTraining("node1", 1, "a", False, restart=1),)


def test_when_the_job_truly_cannot_go_on_one_line_names_the_node_and_why():
    job = three_nodes(successors=0)
    state = trained_on_two_of_three(job)
    state, effects = stopped_after(job, state, "hung", ("node2",))
    assert effects[-1] == machine.Finish(143, "the watch found node2 hung; 1 node left in the allocation, --min-nodes "
                                         "is 2; no successor job: --retries is 0 and the site's "
                                         "watch.max_successors is 0")
    assert state.phase == "end"
    # a slowdown nobody could localise, with the restarts used up
    job = three_nodes(successors=0, max_restarts=0)
    state = trained_on_two_of_three(job)
    assert stopped_after(job, state, "slow", ())[1][-1].why.startswith(
        "the watch found the job slow and named no node; the 0 restarts")


@pytest.mark.parametrize("value, expected", [("USR1@120", 10), ("R:USR2@60", 12), ("SIGTERM", 15), ("10@5", 10),
                                             ("B:USR1@60", None), ("", None), ("NOPE", None)])
def test_the_checkpoint_signal_comes_from_the_plans_sbatch_signal(value, expected):
    assert machine.checkpoint_signal(value) == expected


def test_an_event_out_of_place_is_a_bug_not_a_silent_skip():
    with pytest.raises(ValueError, match="StepEnded cannot happen in phase gate"):
        run_events(facts(), machine.StepEnded(0))
    with pytest.raises(ValueError, match="Polled cannot happen in phase train"):   # no watch, no poll
        state, _ = training(facts(release=False))
        feed(facts(release=False), state, machine.Polled(1.0, {}))


def test_step_argv_from_the_plan():
    job = plan(gpus_per_node=0)
    gate = machine.gate_step_argv(job, "/g", 4)
    assert gate[:7] == ["srun", "--overlap", "--job-name=trainctl-gate", "--ntasks=4", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0", "--input=none"]
    assert gate[-9:] == ["/opt/trainctl", "gate", "node", "--site", "local-demo", "--partition", "gpu", "--dir", "/g"]
    training = machine.training_argv(job, machine.RunTraining("node[1,4]", 2, "10.0.0.1", False), "/g")
    assert training[:6] == ["srun", "--nodelist=node[1,4]", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                            "--kill-on-bad-exit=1"]
    assert "--cpu-bind=none" not in training and "--output=/g/rank-%N-%t.out" in training
    assert training[-4:] == ["--no-bind", "--", "/bin/true", "a b"]
    assert machine.decide_argv(job, "/g")[-5:] == ["--nodes", "2", "--min-nodes", "2", "--wait"]
    # after a detection: only the nodes the job still trusts
    assert machine.decide_argv(job, "/g", ("node1", "node3"))[-3:] == ["--allocated", "node[1,3]", "--wait"]
    assert machine.gate_step_argv(job, "/g", 4, ("node1", "node3"))[3:6] == ["--nodelist=node[1,3]", "--nodes=2",
                                                                             "--ntasks=2"]
    restart = machine.training_argv(job, machine.RunTraining("node[1,4]", 2, "10.0.0.1", False, restart=1), "/g")
    assert "--overlap" in restart and "--overlap" not in training
    agents = machine.agent_argv(job, machine.StartAgents("node[1,4]", 2), "/g")
    assert agents[:7] == ["srun", "--overlap", "--job-name=trainctl-agent", "--nodelist=node[1,4]", "--nodes=2",
                          "--ntasks=2", "--ntasks-per-node=1"]
    assert "--relative=1" in machine.sentinel_argv(job, "/g")


def test_slurms_own_binding_is_turned_off_only_where_srun_binds():
    action = machine.RunTraining("node[1,4]", 2, "10.0.0.1", False)
    assert "--cpu-bind=none" in machine.training_argv(plan(), action, "/g", binds_tasks=True)
    # TaskPlugin=task/none: srun cannot bind, and would only say so
    assert "--cpu-bind=none" not in machine.training_argv(plan(), action, "/g", binds_tasks=False)


def test_the_plan_travels_through_the_script_unchanged():
    job = plan(retries=2, signal="USR1@120", job_name="x y")
    assert JobPlan.from_document(job.to_document()) == job
    from trainctl.errors import UsageError

    with pytest.raises(UsageError):
        JobPlan.from_document({"format": 1, "nodes": 2})
    # a job queued before an upgrade: its plan lacks the fields added since, and runs as submitted
    older = {name: value for name, value in job.to_document().items() if name not in ("checkpoints", "watch")}
    assert JobPlan.from_document(older) == replace(job, checkpoints="", watch=None)
    with pytest.raises(UsageError):
        JobPlan.from_document({"format": 99})


def test_the_resize_script_is_read_as_words_never_run():
    text = ('export SLURM_NODELIST="node[1,4]"\nexport SLURM_JOB_NODELIST="node[1,4]"\nexport SLURM_NNODES=2\n'
            'export SLURM_JOB_CPUS_PER_NODE="1(x2)"\nunset SLURM_NPROCS\nunset SLURM_TASKS_PER_NODE\n'
            'export X="$(touch pwned)"\n')
    exported, unset = machine.parse_resize_script(text)
    assert exported["SLURM_JOB_NODELIST"] == "node[1,4]" and exported["SLURM_NNODES"] == "2"
    assert exported["SLURM_JOB_CPUS_PER_NODE"] == "1(x2)" and exported["X"] == "$(touch pwned)"
    assert unset == ("SLURM_NPROCS", "SLURM_TASKS_PER_NODE")


def journal_of(tmp_path, name, timed_events):
    """A journal written by Journal with a fake clock: [(t, event, fields), ...]."""
    times = iter([t for t, _, _ in timed_events])
    journal = Journal(str(tmp_path / name), clock=lambda: next(times))
    for _, event, fields in timed_events:
        journal.add(event, **fields)
    return parse_journal((tmp_path / name).read_text())


def test_goodput_splits_the_chain_into_queue_gate_training_restart_and_lost_work(tmp_path):
    first = journal_of(tmp_path, "1.jsonl", [
        (10, "job_start", {}), (11, "submitted", {"submitted_t": 0}), (30, "training_start", {}),
        (80, "checkpoint", {"checkpoint_t": 70}),
        (100, "step_end", {"status": 1, "training_start_t": 30, "last_checkpoint_t": 70}),
        (110, "job_end", {"status": 1})])
    second = journal_of(tmp_path, "2.jsonl", [
        (120, "job_start", {}), (121, "submitted", {"submitted_t": 105}), (140, "training_start", {}),
        (200, "step_end", {"status": 0, "training_start_t": 140}), (201, "job_end", {"status": 0})])
    result = goodput([first, second], now=1000)
    assert result.wall_s == 201 and not result.running
    # training 30-100 (70 s, of which 70-100 lost) and 140-200 (60 s); the latest mark sets the phase:
    # the successor, submitted at 105, is queued from then on
    assert result.productive_s == pytest.approx(40 + 60)
    assert result.lost_s == pytest.approx({"queue": 10 + 15, "gate": 20 + 20, "restart": 5, "lost_work": 30})
    # the second leaves its finished step at 200 and ends at 201: that second is the job's own end
    assert result.productive_s + sum(result.lost_s.values()) == pytest.approx(result.wall_s - 1)


def test_goodput_of_a_running_job_counts_up_to_now_and_a_step_without_checkpoints_loses_all(tmp_path):
    running = journal_of(tmp_path, "r.jsonl", [(0, "job_start", {}), (10, "training_start", {})])
    result = goodput([running], now=50)
    assert result.running and result.wall_s == 50 and result.productive_s == 40
    failed = journal_of(tmp_path, "f.jsonl", [(0, "job_start", {}), (10, "training_start", {}),
                                              (50, "step_end", {"status": 9, "training_start_t": 10}),
                                              (55, "job_end", {"status": 9})])
    result = goodput([failed], now=999)
    assert result.productive_s == 0 and result.lost_s["lost_work"] == 40 and result.ratio == 0


def test_a_journal_that_cannot_be_written_warns_once_and_never_ends_the_job(tmp_path, capsys):
    journal = Journal(str(tmp_path / "no-such-dir" / "journal.jsonl"), clock=lambda: 5.0)
    assert journal.add("job_start")["t"] == 5.0
    journal.add("gate_start")
    assert capsys.readouterr().err.count("cannot write the journal") == 1


def startup_detections(job, state, start_t: float, polls: int, read) -> tuple[object, list]:
    """Poll a training step that reports no step; every effect list that holds a detection."""
    seen = []
    for t in [start_t + 1.0 + i for i in range(polls)]:
        state, effects = feed(job, state, machine.Polled(t, read(t)))
        assert state.phase == "train", effects          # never stopped: nobody is named
        if any(getattr(e, "kind", None) == "detection" for e in effects):
            seen.append((t, effects))
    return state, seen


def test_ranks_that_never_reach_their_first_step_are_a_hang_recorded_with_their_stacks_once_not_a_stop():
    job = facts(release=False, restarts=3, watch=replace(WATCH, limits=replace(LIMITS, startup_s=30.0,
                                                                                steps_expected=True)))
    state, _ = training(job)
    silent = lambda t: {node: reading(node, t, 0) for node in ("node1", "node2")}   # agents write, no step
    state, seen = startup_detections(job, state, 1000.0, 120, silent)
    [(t, effects)] = seen                                   # once in the step, at the bound
    assert t == 1030.0
    detection = next(e for e in effects if getattr(e, "kind", None) == "detection")
    assert detection.fields["evidence"] == "no rank reached its first step in 30 s (start-up bound 30 s)"
    assert detection.fields["suspects"] == [] and detection.fields["note"].startswith("not acted on")
    assert effects[-2:] == (machine.RequestStacks(("node1", "node2"), 5.0), machine.WaitStep(poll=True))


def test_the_start_up_bound_holds_for_a_restart_of_a_program_that_reported_steps():
    # site auto_steps off: only the job's own earlier steps say that the program reports steps
    job = facts(release=False, restarts=3, watch=replace(WATCH, limits=replace(LIMITS, startup_s=30.0)))
    state, _ = training(job)
    state, _ = polls(job, state, ("node1", "node2"), [1001.0, 1002.0], lambda node, t: int(t - 1000.0))
    assert state.stepped
    state = replace(state, phase="train")
    state, _ = feed(job, state, machine.TrainingStarted(2000.0))
    quiet = lambda t: {node: NodeReading(node, t) for node in ("node1", "node2")}
    _, seen = startup_detections(job, state, 2000.0, 40, quiet)
    assert [t for t, _ in seen] == [2030.0]
    # the same without the earlier steps: nothing says the program reports any
    fresh, _ = training(job)
    _, seen = startup_detections(job, fresh, 1000.0, 120, quiet)
    assert seen == []


def test_the_driver_reads_the_allocations_end_and_whether_steps_are_counted_from_the_jobs_environment():
    from trainctl.job.driver import allocation_end, steps_counted

    assert allocation_end({"SLURM_JOB_START_TIME": "1000", "SLURM_JOB_END_TIME": "4600"}) == 4600.0
    assert allocation_end({}) is None and allocation_end({"SLURM_JOB_END_TIME": "soon"}) is None
    # no time limit: Slurm's end lies years away, which says nothing of the time left
    assert allocation_end({"SLURM_JOB_START_TIME": "1000", "SLURM_JOB_END_TIME": str(1000 + 400 * 86400)}) is None
    assert steps_counted(True, {}) and not steps_counted(False, {})
    assert not steps_counted(True, {"TRAINCTL_AUTO_STEPS": "0"}) and steps_counted(False, {"TRAINCTL_AUTO_STEPS": "1"})


# ---------------------------------------------------------------- a job's whole life, as its effects

def described(item) -> str:
    """An event or effect on one line: its fields, a node file as its ranks' steps, a kind by name."""
    def value(field):
        if isinstance(field, NodeReading):
            return f"<{field.node}: {sum(rank.steps for rank in field.ranks)} steps>"
        if isinstance(field, dict):
            return "{" + ", ".join(f"{key}: {value(item)}" for key, item in field.items()) + "}"
        if isinstance(field, tuple) and hasattr(field, "_fields"):
            return described(field)
        return str(field.value) if hasattr(field, "value") and not isinstance(field, tuple) else repr(field)
    return f"{type(item).__name__}(" + ", ".join(f"{name}={value(getattr(item, name))}" for name in item._fields) + ")"


def life_of(job: machine.JobFacts, events) -> str:
    """Each event the driver feeds back, and the effects the machine answers with, in order."""
    state, lines = machine.JobState(), []
    for event in events:
        state, effects = machine.advance(job, state, event)
        lines += [f"{described(event)}", *(f"    {described(effect)}" for effect in effects)]
    return "\n".join(lines) + "\n"


def test_a_jobs_whole_life_is_the_sequence_of_its_effects(capsys):
    """A scripted run: the gate, training with a save seen, a sick node, the checkpoint request
    (the signal, the save awaited), the gate again leaving the node out, training on the spare to
    the end. Printed (pytest -s), and kept in tests/golden/job-life.txt."""
    from test_render import assert_matches_golden

    job = facts(spares=1, restarts=2, watch=WATCH)
    both, spared = ("node1", "node2"), ("node1", "node3")
    life = life_of(job, [
        machine.Started(),
        machine.GateDecided("node[1-2]", both, "10.0.0.1", ("node3", "node4")),
        machine.Resized(3),
        machine.TrainingStarted(1000.0),
        machine.Polled(1001.0, {node: reading(node, 1001.0, 2) for node in both}),
        machine.Polled(1002.0, {node: reading(node, 1002.0, 4) for node in both},
                       Save(1001.5, "torch.save", "/ckpt/step_3.pt")),
        machine.Polled(1003.0, {"node1": reading("node1", 1003.0, 6),
                                "node2": reading("node2", 1003.0, 6, failed=(("gpu.xid", "Xid 79"),))}),
        machine.CheckpointAsked(posted=True, listening=False),
        machine.SaveAwaited(Save(1004.0, "torch.distributed.checkpoint", "/ckpt/step_7")),
        machine.StepStopped(143),
        machine.GateDecided("node[1,3]", spared, "10.0.0.1"),
        machine.Resized(2),
        machine.TrainingStarted(2000.0),
        machine.Polled(2001.0, {node: reading(node, 2001.0, 2) for node in spared}),
        machine.StepEnded(0, 2002.0, {node: reading(node, 2002.0, 4) for node in spared},
                          Save(2001.8, "safetensors", "/ckpt/step_9/model.safetensors")),
    ])
    print(life)
    assert_matches_golden("job-life.txt", life)
    assert capsys.readouterr().out == life + "\n"
