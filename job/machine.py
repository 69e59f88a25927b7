"""The life of a job, as a pure state machine: gate -> release unused nodes -> training step ->
done, a successor job around bad nodes, or the end. While training runs, the watch
(`trainctl.job.watch`) may find the job slow, a node sick or the job hung. A slowdown no evidence
names a node for is weighed first (`trainctl.job.watch.weigh`): training goes on at the slower
step time unless the gate's gain over the time left pays `watch.pay_factor` times a restart's
price. Otherwise the machine asks for
evidence (a checkpoint, or the ranks' stacks), stops the step, and the gate runs again on the
nodes the job holds, less those the detection named; what the gate says confirms the detection,
and training restarts from its checkpoint on the nodes it chooses (a held spare included), down
to --min-nodes, up to the site's `watch.max_restarts`. Where the allocation cannot carry on, a
successor job excluding the named nodes goes on from the checkpoint, even without --retries (up
to the site's `watch.max_successors`).

`advance(facts, state, event)` is pure: from what the job knows and what just happened, it returns
the next state and the effects to carry out, in order; at most one of them (the last) answers
with the next event. The driver (`trainctl.job.driver`) carries them out and feeds that event back.
The argv builders and parsers here are pure too, so the whole job is unit-tested without Slurm.
"""

from __future__ import annotations

import shlex
import signal as signals
from dataclasses import dataclass, replace
from typing import Literal, Mapping, NamedTuple, Union

from trainctl.detections import RULES, DetectionKind, HungDetails
from trainctl.job.journal import weighed_line
from trainctl.job.jobdir import (AGENT_LOG_PATTERN, CHECKPOINT_MARKER, GATE_LOG_PATTERN, SENTINEL_LOG, SENTINEL_OUT,
                                 Kind, Save)
from trainctl.job.watch import (Detection, NodeReading, SlowRent, WatchLimits, WatchState, confirm, observe,
                                silent_nodes, start as start_watch, still_slow, weigh)
from trainctl.launcher.plan import RANK_OUTPUT, JobPlan
from trainctl.slurm import fold_hostlist
from trainctl.validate import SLURM_SIGNAL

GATE_STEP = "trainctl-gate"          # step names: scancel finds the steps to end by them
SENTINEL_STEP = "trainctl-sentinel"
AGENT_STEP = "trainctl-agent"
PROBE_STEP = "trainctl-probe"
OWN_STEPS = (GATE_STEP, SENTINEL_STEP, AGENT_STEP, PROBE_STEP)   # every other numbered step is the training step
Phase = Literal["start", "gate", "release", "train", "asking", "awaiting", "stopping", "retry", "end"]


@dataclass(frozen=True)
class WatchFacts:
    """The site's `[watch]` settings the machine decides with (absent: the watch is off)."""

    limits: WatchLimits
    checkpoint_signal: int | None  # what the ranks checkpoint on (submit --signal); None: not asked
    checkpoint_wait_s: float
    dump_wait_s: float
    end_grace_s: float
    pay_factor: float              # a slowdown nobody is named for stops the job when gain > this x price
    restart_cost_s: float          # a restart's price before the job has measured one of its own
    end_t: float | None = None     # the allocation's end (Slurm's SLURM_JOB_END_TIME); None: unknown


@dataclass(frozen=True)
class JobFacts:
    """What stays true for the whole job."""

    allocated: tuple[str, ...]     # the job's nodes at its start, in Slurm's order
    batch_host: str                # runs the supervisor; never released
    release_unused: bool           # the site's launch.release_unused
    retries: int                   # submit --retries (0: a failure ends the chain)
    max_restarts: int = 0          # the site's watch.max_restarts: in-allocation restarts after a detection
    hold_spares: int = 0           # the site's watch.hold_spares: healthy unused nodes kept through training
    min_nodes: int = 1             # submit --min-nodes: the fewest nodes training may restart on
    successors: int = 0            # the site's watch.max_successors: successors after a detection (0: none)
    watch: WatchFacts | None = None   # None: the watch is off
    binds_tasks: bool = True       # the cluster's srun binds tasks to CPUs (a TaskPlugin that binds)
    alerts: bool = False           # the job has an alert command (the site's [alerts] command, submit --alert-command)


@dataclass(frozen=True)
class JobState:
    phase: Phase = "start"
    job_nodes: str = ""            # the hostlist the gate chose, as `gate decide` printed it
    chosen: tuple[str, ...] = ()   # the nodes training runs (or last ran) on
    master_addr: str = ""
    sentinel_moved: bool = False   # the release cancelled the sentinel: it must start again
    status: int = 0                # the exit status the job ends with
    held: tuple[str, ...] = ()     # the job's nodes now, in Slurm's order (empty: all allocated)
    spares: tuple[str, ...] = ()   # healthy nodes the gate did not choose, kept through training
    restarts: int = 0              # in-allocation restarts so far
    condemned: tuple[str, ...] = ()  # nodes a watch detection named: never chosen again by this job
    releasing: tuple[str, ...] = ()  # the nodes a Release in flight keeps
    gate_rounds: int = 0           # gate rounds started (a detection runs the gate again)
    detection: Detection | None = None   # the last detection, until the gate after it has judged
    accepted_step_s: float = 0.0   # a slowdown the gate could not localise: the watch's new normal
    watch: WatchState | None = None  # the watch over the training step running now
    trained_since: float = 0.0     # the first training step's start (0: none yet)
    stopped_t: float = 0.0         # when the watch last decided to stop the step, until training again
    restart_s: float | None = None   # the job's last restart, from that decision to its first step again
    stepped: bool = False          # a training step of this job has reported a step
    step_started_t: float = 0.0    # the training step running now (or last): when it started
    saved_t: float | None = None   # that step's last save seen (None: none yet)
    request: Mapping[str, object] | None = None   # the checkpoint request under way: how it was asked
    # the job's environment as scontrol's resize script rewrote it: (name, value); value None: unset
    env_changes: tuple[tuple[str, str | None], ...] = ()


# ---------------------------------------------------------------- events (what happened)

class Started(NamedTuple):
    pass


class GateDecided(NamedTuple):
    job_nodes: str                 # folded hostlist
    chosen: tuple[str, ...]
    master_addr: str
    healthy_unused: tuple[str, ...] = ()   # passed the gate, not chosen: candidate spares
    gate_named: Mapping[str, str] = {}     # node -> why the gate excluded it (its decision)


class GateRefused(NamedTuple):
    status: int                    # gate decide's exit status (2: too few healthy nodes)
    retryable: bool = True         # False: decide printed nonsense, not a verdict about nodes
    gate_named: Mapping[str, str] = {}


class Resized(NamedTuple):
    node_count: int                # the job's nodes after the update (all of them when refused)
    exported: tuple[tuple[str, str], ...] = ()   # scontrol's resize script: variables set
    unset: tuple[str, ...] = ()                  # and unset


class TrainingStarted(NamedTuple):
    t: float                       # wall time the training step started


class Polled(NamedTuple):
    """The watch's poll: each training node's agent file (None: none yet), read at `t`; the
    program's newest save seen since the last look (`trainctl.job.jobdir.Checkpoints`; None: none)."""
    t: float
    readings: Mapping[str, NodeReading | None]
    saved: Save | None = None


class SaveSeen(NamedTuple):
    """A new save of the program, seen while the step runs unwatched (answers WaitStep(poll=False))."""
    save: Save


class StepEnded(NamedTuple):
    """The training step ended by itself; with the watch on, the agents' files read at its end;
    a save seen at its end that was not seen before."""
    status: int
    t: float = 0.0
    readings: Mapping[str, NodeReading | None] = {}
    saved: Save | None = None


class CheckpointAsked(NamedTuple):
    """The checkpoint request posted, and what the ranks had said of themselves (answers PostCheckpointRequest)."""
    posted: bool                   # the request is in the watch folder for the agents to pass on
    listening: bool                # a rank takes requests over trainctl's channel (it said so)
    refused: str = ""              # a rank's line: the job's signal would not get a save ("": none said so)
    running: bool = True           # the training step still runs


class SaveAwaited(NamedTuple):
    """The first save seen after the request; None: none before the wait ran out or the step
    ended (answers AwaitSave)."""
    saved: Save | None


class StepStopped(NamedTuple):
    """The training step, ended by the driver on the machine's StopStep; a save seen at its end
    that was not seen before."""
    status: int
    saved: Save | None = None


class RetryHandled(NamedTuple):
    successor: bool = False        # a successor job was submitted


Event = Union[Started, GateDecided, GateRefused, Resized, TrainingStarted, Polled, SaveSeen, StepEnded,
              CheckpointAsked, SaveAwaited, StepStopped, RetryHandled]


# ---------------------------------------------------------------- effects (what to do next)

class Journal(NamedTuple):
    """An event for the journal (`trainctl.job.jobdir.Journal`)."""
    kind: Kind
    fields: Mapping[str, object] = {}


class Say(NamedTuple):
    """One line on the job's output (stderr: `err`)."""
    line: str
    err: bool = True


class StartSentinel(NamedTuple):
    pass


class RunGate(NamedTuple):
    """Answers GateDecided or GateRefused."""
    nodes: tuple[str, ...] = ()    # the nodes to check (empty: every node of the job)
    archive: int = 0               # again after a detection: set round N's files aside first (0: none)


class Drain(NamedTuple):
    """Drain the nodes a detection named where the site's `[gate] drain_on` asks."""
    nodes: Mapping[str, tuple[DetectionKind, tuple[tuple[str, str], ...]]]   # node -> (kind, its (check, reason)s)


class Release(NamedTuple):
    """Answers Resized."""
    keep: str                      # NodeList= for scontrol update
    move_sentinel: bool            # the sentinel's node goes: cancel it first


class RunTraining(NamedTuple):
    """Start the training step (answers TrainingStarted)."""
    job_nodes: str
    node_count: int
    master_addr: str
    start_sentinel: bool           # the release moved it off its node: start it on the new second node
    restart: int = 0               # 0: the first training step; N: the Nth restart after a detection


class StartAgents(NamedTuple):
    """The watch's node agents, one on each training node."""
    job_nodes: str
    node_count: int


class WaitStep(NamedTuple):
    """Wait for the training step: answers StepEnded, or with `poll` a Polled at the next poll,
    without it a SaveSeen when the program saves."""
    poll: bool


class RequestStacks(NamedTuple):
    """Evidence of a hang: the agents of `nodes` record every rank's stacks (and NCCL dumps)."""
    nodes: tuple[str, ...]
    wait_s: float


class PostCheckpointRequest(NamedTuple):
    """Evidence of a live job: post a checkpoint request for the ranks that take them over
    trainctl's channel, and read what the ranks said of themselves (`trainctl.job.checkpoint_request`);
    answers CheckpointAsked."""


class SendSignal(NamedTuple):
    """The job's checkpoint signal to every task of the training step (srun forwards it)."""
    signum: int


class AwaitSave(NamedTuple):
    """Look for a new save of the program until one is seen, `wait_s` pass or the step ends;
    answers SaveAwaited."""
    wait_s: float


class StopStep(NamedTuple):
    """End the training step (SIGTERM, scancel, SIGKILL, `grace_s` apart); answers StepStopped."""
    grace_s: float


class StepOver(NamedTuple):
    """The training step has ended: its agents go, and the journal records the end (these fields)."""
    status: int
    cause: str
    agents: bool                   # the watch's agents ran beside it
    detection: DetectionKind | None = None   # what the watch found that ended it (None: it ended by itself)
    training_start_t: float = 0.0  # when it started
    last_checkpoint_t: float | None = None   # its last save seen (None: none)


class Retry(NamedTuple):
    """Collect the evidence and submit a successor where it decides to; answers RetryHandled."""
    phase: Literal["gate", "step"]
    status: int
    nodes: tuple[str, ...]
    condemned: tuple[str, ...] = ()   # nodes the watch named: excluded by the successor too
    budget: int = 0                # successors the chain may have in all (the attempt after the last one ends)


class Finish(NamedTuple):
    """Journal the job's end; the job's exit status (the effects after it are carried out, then the job ends)."""
    status: int
    why: str = ""                  # after a detection: one plain line, the nodes and why the job cannot go on


class Alert(NamedTuple):
    """Run the job's alert command on the journal's newest `kind` event, journaled just before;
    the job never waits for it (`trainctl.job.alerts`)."""
    kind: Kind


Effect = Union[Journal, Say, StartSentinel, RunGate, Drain, Release, RunTraining, StartAgents, WaitStep,
               RequestStacks, PostCheckpointRequest, SendSignal, AwaitSave, StopStep, StepOver, Retry, Finish, Alert]
Effects = tuple[Effect, ...]


def advance(facts: JobFacts, state: JobState, event: Event) -> tuple[JobState, Effects]:
    """The next state and effects after `event`. Raises ValueError for an event the phase cannot have."""
    phase = state.phase
    if phase == "start" and isinstance(event, Started):
        sentinel = (StartSentinel(),) if len(facts.allocated) > 1 else ()
        return replace(state, phase="gate", held=facts.allocated, gate_rounds=1), sentinel + (RunGate(),)
    if phase == "gate" and isinstance(event, (GateDecided, GateRefused)):
        state, said = _confirm(state, event.gate_named)
        state, effects = _after_gate(facts, state, event)
        return state, said + effects
    if phase == "release" and isinstance(event, Resized):
        held = state.releasing if event.node_count == len(state.releasing) else state.held
        changes = tuple(event.exported) + tuple((name, None) for name in event.unset)
        return _train(replace(state, held=held, releasing=(), env_changes=state.env_changes + changes),
                      event.node_count)
    if phase == "train" and isinstance(event, TrainingStarted):
        state = replace(state, trained_since=state.trained_since or event.t, step_started_t=event.t, saved_t=None)
        restarted = _alert(facts, Kind.TRAINING_START) if state.restarts else ()
        if facts.watch is None:
            return state, (*restarted, WaitStep(poll=False))
        watching = start_watch(event.t, state.accepted_step_s, stepped_before=state.stepped)
        return (replace(state, watch=watching),
                (*restarted, StartAgents(state.job_nodes, len(state.chosen)), WaitStep(poll=True)))
    if phase == "train" and isinstance(event, Polled) and facts.watch is not None and state.watch is not None:
        return _watch_poll(facts, state, event)
    if phase == "train" and isinstance(event, SaveSeen):
        state, saw = _saw(state, event.save)
        return state, (*saw, WaitStep(poll=False))
    if phase == "train" and isinstance(event, StepEnded):
        state, saw = _saw(state, event.saved)
        state, effects = _step_ended(facts, state, event)
        return state, saw + effects
    if phase == "asking" and isinstance(event, CheckpointAsked):
        return _asked(facts, state, event)
    if phase == "awaiting" and isinstance(event, SaveAwaited):
        state, saw = _saw(state, event.saved)
        return _stop_after_request(facts, state, event.saved is not None, saw)
    if phase == "stopping" and isinstance(event, StepStopped):
        state, saw = _saw(state, event.saved)
        detection = state.detection
        over = _over(state, event.status, f"ended by the watch ({detection.kind})", facts.watch is not None,
                     detection.kind)
        state, effects = _after_detection(facts, replace(state, watch=None), detection, event.status)
        return state, (*saw, over) + effects
    if phase == "retry" and isinstance(event, RetryHandled):
        successor = _alert(facts, Kind.RETRY) if event.successor else ()
        return replace(state, phase="end"), (*successor, *_end(facts, state.status))
    raise ValueError(f"job machine: {type(event).__name__} cannot happen in phase {phase}")


def _after_gate(facts: JobFacts, state: JobState, event: GateDecided | GateRefused) -> tuple[JobState, Effects]:
    if isinstance(event, GateRefused):
        if not event.retryable:
            return replace(state, phase="end", status=event.status), _end(facts, event.status)
        if state.restarts:   # the gate after a detection: the job goes on in a successor where it may
            return _go_on_elsewhere(facts, state, "gate", event.status, state.held,
                                    "the gate after the detection found too few healthy nodes")
        if facts.retries:
            return (replace(state, phase="retry", status=event.status),
                    (Retry("gate", event.status, state.held, state.condemned, facts.retries),))
        return replace(state, phase="end", status=event.status), _end(facts, event.status)
    decided = replace(state, job_nodes=event.job_nodes, chosen=event.chosen, master_addr=event.master_addr,
                      spares=event.healthy_unused[:facts.hold_spares])
    kept = nodes_to_keep(facts, decided) if facts.release_unused else None
    if kept is None:
        return _train(decided, len(decided.held))
    moved = len(decided.held) > 1 and decided.held[1] not in kept
    return (replace(decided, phase="release", sentinel_moved=moved, releasing=kept),
            (Release(fold_hostlist(list(kept)), moved),))


def _confirm(state: JobState, gate_named: Mapping[str, str]) -> tuple[JobState, Effects]:
    """After a detection, what the gate said about the nodes confirms it: whom it names, or nobody."""
    detection = state.detection
    if detection is None:
        return state, ()
    confirmed = confirm(detection, gate_named, state.chosen, state.accepted_step_s)
    state = replace(state, detection=None, accepted_step_s=confirmed.accepted_step_s)
    checked = [node for node in state.held if node not in state.condemned]
    journal = Journal(Kind.CONFIRMATION, {"kind": confirmed.kind.value, "named": dict(confirmed.named),
                                          "checked": checked,
                                          **({"note": confirmed.note} if confirmed.note else {})})
    if not confirmed.named:
        return state, (journal, Say(f"trainctl: watch: the gate names no node ({detection.kind} not localised): "
                                    "resuming on the same nodes"))
    drains = {node: (detection.kind, detection.details.causes(node, detection.evidence))
              for node in detection.suspects}
    return state, (journal, Say(f"trainctl: watch: leaving out {', '.join(sorted(confirmed.named))}"),
                   *((Drain(drains),) if drains else ()))


def _watch_poll(facts: JobFacts, state: JobState, event: Polled) -> tuple[JobState, Effects]:
    watch = facts.watch
    stepped = state.watch.progress_steps >= 0
    seen = observe(watch.limits, state.watch, event.t, event.readings)
    state, saw = _saw(replace(state, watch=seen.state), event.saved)
    effects: list[Effect] = list(saw)
    if not stepped and seen.state.progress_steps >= 0:   # training again: the restart's cost ends here
        effects.append(Journal(Kind.FIRST_STEP, {"steps": seen.state.progress_steps}))
        state = replace(state, stepped=True)
        if state.stopped_t:
            state = replace(state, restart_s=event.t - state.stopped_t, stopped_t=0.0)
    effects += [Journal(Kind.AGENT_SILENT, {"node": node, "note": "training goes on: not a detection"})
                for node in seen.silent_while_progressing]
    detection = seen.detection
    rent = state.watch.rent
    unnamed = detection is None or (RULES[detection.kind].unnamed == "weigh" and not detection.suspects)
    if rent and unnamed:   # measured against its first baseline, which the rolling one may have caught up with
        detection = still_slow(watch.limits, state.watch, event.t) or detection
        if detection is None:        # it passed before it cost a restart's price
            state = replace(state, watch=replace(state.watch, rent=None))
            passed = {"kind": rent.detection.kind.value, "action": "passed", "paid_s": round(rent.paid_s, 1),
                      "evidence": f"after {event.t - rent.since_t:.0f} s, having cost {rent.paid_s:.0f} s "
                                  "of training"}
            effects += [Journal(Kind.WEIGHED, passed), Say(f"trainctl: {weighed_line(passed)}")]
    if detection is None:
        return state, (*effects, WaitStep(poll=True))
    return on_detection(facts, state, event, detection, effects)


def on_detection(facts: JobFacts, state: JobState, event: Polled, detection: Detection,
                 effects: list[Effect]) -> tuple[JobState, Effects]:
    """The watch found `detection` at the poll `event`: by its kind's rules (`trainctl.detections.RULES`)
    it is recorded only, weighed, or its evidence asked for and the step stopped for the gate."""
    watch = facts.watch
    rules = RULES[detection.kind]
    if rules.unnamed == "weigh" and not detection.suspects and state.restarts >= facts.max_restarts:
        # the gate could only run again in a successor job, and this slowdown names nobody: ending the
        # step would stop a job that can go on (its program may not even survive the checkpoint
        # signal), on a guess. Training goes on, and the slower step time is the new normal.
        note = (f"not acted on: the {facts.max_restarts} restarts the site allows inside the allocation "
                "are used up; the slower step time is the new normal")
        accepted = detection.details.accepted_step_s or 0.0
        return (replace(state, accepted_step_s=accepted, watch=replace(state.watch, accepted_step_s=accepted)),
                (*effects, Journal(Kind.DETECTION, {**detection.journal_fields(), "note": note}),
                 *_alert(facts, Kind.DETECTION),
                 Say(f"trainctl: watch: {detection.kind}: {detection.evidence} ({note})"), WaitStep(poll=True)))
    if rules.unnamed == "weigh" and not detection.suspects:
        # nobody is named: stopping for the gate is a bet, taken only where it pays several times over
        rent = state.watch.rent
        weighed = weigh(detection, event.t, watch.pay_factor, state.restart_s, watch.restart_cost_s,
                        max(state.saved_t or 0.0, state.watch.started_t), watch.end_t,
                        event.t - (state.trained_since or state.watch.started_t), rent)
        fields = {key: value for key, value in detection.journal_fields().items() if key != "suspects"}
        fields.update(weighed.fields())
        if weighed.action == "wait":   # journaled once: the poll it passes, or the one it pays, says the rest
            waiting = (rent._replace(last_t=event.t, paid_s=weighed.paid_s) if rent
                       else SlowRent(event.t, event.t, 0.0, detection))
            journal = [Journal(Kind.WEIGHED, fields), Say(f"trainctl: {weighed_line(fields)}")] if rent is None else []
            return replace(state, watch=replace(state.watch, rent=waiting)), (*effects, *journal, WaitStep(poll=True))
        effects += [Journal(Kind.WEIGHED, fields), Say(f"trainctl: {weighed_line(fields)}")]
        state = replace(state, watch=replace(state.watch, rent=None))
        if weighed.action == "go on":   # the slower step time is the new normal: the same slowdown is not weighed again
            accepted = weighed.step_s
            return (replace(state, accepted_step_s=accepted, watch=replace(state.watch, accepted_step_s=accepted)),
                    (*effects, WaitStep(poll=True)))
    if detection.details.at_startup and not detection.suspects:
        # no rank reached its first step and no node is named: the ranks' stacks say where they wait,
        # and training is not stopped on a guess (a long start-up, a program that steps no torch
        # optimizer); the bound is not judged again in this step
        note = "not acted on: no node is named; the ranks' stacks say where they wait"
        return (replace(state, watch=replace(state.watch, startup=False)),
                (*effects, Journal(Kind.DETECTION, {**detection.journal_fields(), "note": note}),
                 *_alert(facts, Kind.DETECTION),
                 Say(f"trainctl: watch: {detection.kind}: {detection.evidence} ({note}: trainctl job show)"),
                 RequestStacks(tuple(state.chosen), watch.dump_wait_s), WaitStep(poll=True)))
    if rules.evidence == "stacks":   # the stacks of the ranks whose agent still answers
        return (replace(state, phase="stopping", detection=detection, stopped_t=event.t),
                (*effects, *_detected(facts, detection),
                 RequestStacks(tuple(n for n in state.chosen if n not in detection.suspects), watch.dump_wait_s),
                 StopStep(watch.end_grace_s)))
    return (replace(state, phase="asking", detection=detection, stopped_t=event.t),
            (*effects, *_detected(facts, detection), PostCheckpointRequest()))


def _asked(facts: JobFacts, state: JobState, event: CheckpointAsked) -> tuple[JobState, Effects]:
    """How the checkpoint request reaches the ranks (`trainctl.job.checkpoint_request`): over
    trainctl's channel where a rank takes requests there, and then no signal (Lightning takes the
    signal for "requeue the job"); else the job's signal, unless a rank said it would not get a
    save; then nothing more, and training resumes from the program's last save. Where a request
    reached the ranks, the save is waited for."""
    signum = facts.watch.checkpoint_signal
    listening = event.posted and event.listening
    refused = event.refused if signum is not None and not listening else ""
    send = signum is not None and not listening and not refused and event.running
    request = {"signal": signum if send else None, "listening": listening, **({"refused": refused} if refused else {})}
    state = replace(state, request=request)
    if not (listening or send):
        return _stop_after_request(facts, state, False, ())
    return replace(state, phase="awaiting"), (*((SendSignal(signum),) if send else ()),
                                              AwaitSave(facts.watch.checkpoint_wait_s))


def _stop_after_request(facts: JobFacts, state: JobState, saved: bool, saw: Effects) -> tuple[JobState, Effects]:
    request = dict(state.request or {})
    refused = request.pop("refused", None)
    fields = {**request, "saved": saved, **({"refused": refused} if refused else {})}
    return (replace(state, phase="stopping", request=None),
            (*saw, Journal(Kind.CHECKPOINT_REQUEST, fields), StopStep(facts.watch.end_grace_s)))


def _saw(state: JobState, save: Save | None) -> tuple[JobState, Effects]:
    """A new save of the program: the step's last, journaled with what said so."""
    if save is None:
        return state, ()
    fields = {"checkpoint_t": save.t, "note": save.note, **({"source": save.source}
                                                            if save.source != CHECKPOINT_MARKER else {})}
    return replace(state, saved_t=save.t), (Journal(Kind.CHECKPOINT, fields),)


def _over(state: JobState, status: int, cause: str, agents: bool,
          detection: DetectionKind | None = None) -> StepOver:
    return StepOver(status, cause, agents, detection, state.step_started_t, state.saved_t)


def _detected(facts: JobFacts, detection: Detection) -> Effects:
    return (Journal(Kind.DETECTION, detection.journal_fields()),
            *_alert(facts, Kind.DETECTION),
            Say(f"trainctl: watch: {detection.kind}: {detection.evidence}"))


def _alert(facts: JobFacts, kind: Kind) -> Effects:
    """The alert on the event just journaled, where the job has an alert command."""
    return (Alert(kind),) if facts.alerts else ()


def _end(facts: JobFacts, status: int, why: str = "") -> Effects:
    """The job's end, and its alert."""
    return (Finish(status, why), *_alert(facts, Kind.JOB_END))


def stopped(facts: JobFacts, signum: int) -> Effects:
    """The job stopped by a signal (scancel, the time limit): its end is journaled, and alerted."""
    return (Journal(Kind.JOB_END, {"status": 128 + signum, "cause": f"stopped by signal {signum}"}),
            *_alert(facts, Kind.JOB_END))


def _step_ended(facts: JobFacts, state: JobState, event: StepEnded) -> tuple[JobState, Effects]:
    watching = facts.watch is not None and state.watch is not None
    if watching and event.status != 0:
        # the step failed by itself: the nodes whose agent fell silent before, as a detection
        # (a node Slurm lost stops its agent too)
        limits = facts.watch.limits
        seen = observe(limits, state.watch, event.t, event.readings).state
        silent = silent_nodes(limits, seen, event.t)
        if silent:
            evidence = (f"the training step ended with status {event.status} after the agent of "
                        f"{', '.join(silent)} fell silent")
            detection = Detection(DetectionKind.HUNG, silent, evidence, HungDetails(silent))
            over = _over(state, event.status, f"ended by the watch ({detection.kind})", True, detection.kind)
            state, effects = _after_detection(facts, replace(state, watch=None, detection=detection,
                                                             stopped_t=event.t), detection, event.status)
            return state, (*_detected(facts, detection), over, *effects)
    over = _over(state, event.status, "completed" if event.status == 0 else f"exit status {event.status}", watching)
    state = replace(state, watch=None)
    if event.status == 0:
        return replace(state, phase="end"), (over, *_end(facts, 0))
    if facts.retries:
        return (replace(state, phase="retry", status=event.status),
                (over, Retry("step", event.status, state.chosen, state.condemned, facts.retries)))
    return replace(state, phase="end", status=event.status), (over, *_end(facts, event.status))


def _after_detection(facts: JobFacts, state: JobState, detection: Detection, status: int) -> tuple[JobState, Effects]:
    """The step ended on a detection: the gate again on the nodes the job still trusts, or elsewhere."""
    condemned = state.condemned + tuple(node for node in detection.suspects if node not in state.condemned)
    stopped = replace(state, condemned=condemned, status=status)
    again = tuple(node for node in state.held if node not in condemned)
    if state.restarts >= facts.max_restarts:
        return _go_on_elsewhere(facts, stopped, "step", status, state.chosen,
                                f"{_named(detection)}; the {facts.max_restarts} restarts the site allows "
                                "inside the allocation are used up")
    if len(again) < facts.min_nodes:   # the gate cannot choose enough: no need to ask it
        return _go_on_elsewhere(facts, stopped, "step", status, state.chosen,
                                f"{_named(detection)}; {_count(len(again))} left in the allocation, "
                                f"--min-nodes is {facts.min_nodes}")
    return (replace(stopped, phase="gate", restarts=state.restarts + 1, status=0,
                    gate_rounds=state.gate_rounds + 1),
            (RunGate(again, archive=state.gate_rounds),))


def _go_on_elsewhere(facts: JobFacts, state: JobState, phase: Literal["gate", "step"], status: int,
                     nodes: tuple[str, ...], why: str) -> tuple[JobState, Effects]:
    """After a detection the allocation cannot carry on: a successor job excluding the condemned
    nodes, within the larger of --retries and the site's watch.max_successors; else the end, with
    why in one line. The detection waits no longer for a gate to confirm it."""
    state = replace(state, detection=None)
    budget = max(facts.retries, facts.successors)
    if budget:
        return (replace(state, phase="retry", status=status),
                (Retry(phase, status, nodes, state.condemned, budget),))
    return (replace(state, phase="end", status=status),
            _end(facts, status, f"{why}; no successor job: --retries is 0 and the site's watch.max_successors is 0"))


def _named(detection: Detection) -> str:
    if detection.suspects:
        return f"the watch found {fold_hostlist(list(detection.suspects))} {detection.kind}"
    return f"the watch found the job {detection.kind} and named no node"


def _count(nodes: int) -> str:
    return f"{nodes} node{'' if nodes == 1 else 's'}"


def _train(state: JobState, node_count: int) -> tuple[JobState, Effects]:
    restart_sentinel = state.sentinel_moved and node_count > 1
    return (replace(state, phase="train", sentinel_moved=False),
            (RunTraining(state.job_nodes, len(state.chosen), state.master_addr, restart_sentinel, state.restarts),))


def nodes_to_keep(facts: JobFacts, state: JobState) -> tuple[str, ...] | None:
    """The nodes the job keeps, in Slurm's order, when it can give nodes back; None when it keeps
    them all. It keeps the chosen nodes, the spares the site holds through training, and the
    batch host, which runs the supervisor, even when the gate left it out."""
    wanted = set(state.chosen) | set(state.spares) | {facts.batch_host}
    kept = tuple(node for node in state.held if node in wanted)
    return None if len(kept) >= len(state.held) else kept


def job_environment(base: Mapping[str, str], state: JobState) -> dict[str, str]:
    """The environment the job's steps get now: the batch script's, as the release rewrote it."""
    env = dict(base)
    for name, value in state.env_changes:
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


# ---------------------------------------------------------------- what the job runs (argv, pure)

def gate_step_argv(plan: JobPlan, gate_dir: str, task_count: int, nodes: tuple[str, ...] = ()) -> list[str]:
    """One task per allocated node runs the node checks and the fabric test. --kill-on-bad-exit=0:
    one node's failure must not end the others' tasks. Each node logs to its own file: srun aborts
    the whole step when its I/O connection to one node's slurmstepd breaks (Slurm 22.05,
    step_launch_notify_io_failure), so a node that dies would take the others' tasks with it.
    --overlap: a lost node keeps this step registered until Slurm gives up on it; an overlapping
    step does not hold the nodes the training step needs (srun(1): "A step using this option will
    overlap all other steps, even those that did not specify --overlap"). --ntasks overrides the
    job's SLURM_NTASKS, which srun would otherwise read."""
    only = [f"--nodelist={fold_hostlist(list(nodes))}", f"--nodes={len(nodes)}"] if nodes else []
    return ["srun", "--overlap", f"--job-name={GATE_STEP}", *only, f"--ntasks={len(nodes) or task_count}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--input=none", f"--output={gate_dir}/{GATE_LOG_PATTERN}",
            plan.trainctl, "gate", "node", "--site", plan.site_ref, "--partition", plan.partition,
            "--dir", gate_dir]


def decide_argv(plan: JobPlan, gate_dir: str, nodes: tuple[str, ...] = ()) -> list[str]:
    """Waits until every node has reported or the gate's deadline (from the site), then prints the
    chosen nodes and MASTER_ADDR, or one line on stderr naming which nodes failed and why.
    `nodes`: only these (a gate after a detection leaves the condemned nodes out)."""
    only = ["--allocated", fold_hostlist(list(nodes))] if nodes else []
    return [plan.trainctl, "gate", "decide", "--site", plan.site_ref, "--partition", plan.partition,
            "--dir", gate_dir, "--nodes", str(plan.nodes), "--min-nodes", str(plan.min_nodes), *only, "--wait"]


def agent_argv(plan: JobPlan, action: StartAgents, gate_dir: str) -> list[str]:
    """The watch's node agents: one task on each training node, for the training step's life
    (--overlap: beside the training step, on its CPUs)."""
    return ["srun", "--overlap", f"--job-name={AGENT_STEP}", f"--nodelist={action.job_nodes}",
            f"--nodes={action.node_count}", f"--ntasks={action.node_count}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", "--input=none", f"--output={gate_dir}/{AGENT_LOG_PATTERN}",
            plan.trainctl, "job", "agent", "--dir", gate_dir, "--site", plan.site_ref,
            "--partition", plan.partition]


def sentinel_argv(plan: JobPlan, gate_dir: str) -> list[str]:
    """On the job's second node, for the job's life; it writes its own log (srun's output forwarding
    runs through the batch host, whose loss is what the sentinel reports)."""
    return ["srun", "--overlap", f"--job-name={SENTINEL_STEP}", "--nodes=1", "--ntasks=1", "--relative=1",
            "--input=none", "--open-mode=append", f"--output={gate_dir}/{SENTINEL_OUT}",
            plan.trainctl, "gate", "sentinel", "--dir", gate_dir, "--log", f"{gate_dir}/{SENTINEL_LOG}"]


def training_argv(plan: JobPlan, action: RunTraining, gate_dir: str, binds_tasks: bool = True) -> list[str]:
    """The program, on the chosen nodes only; rank-exec sets the torch.distributed environment,
    binds each rank (when the plan binds) and execs the program. --kill-on-bad-exit=1: one rank
    that fails ends the step, rather than leaving the others waiting in a collective.
    --cpu-bind=none keeps Slurm's own binding out of rank-exec's way, on a cluster whose srun binds
    (`binds_tasks`, JobFacts); elsewhere srun would only say it cannot bind."""
    argv = ["srun", f"--nodelist={action.job_nodes}", f"--nodes={action.node_count}",
            f"--ntasks={action.node_count * plan.tasks_per_node}", f"--ntasks-per-node={plan.tasks_per_node}",
            "--kill-on-bad-exit=1"]
    if action.restart:
        # the ended step stays registered on a hung node until Slurm declares that node down
        # (SlurmdTimeout), holding its CPUs on every node of the step; an overlapping step does not
        # wait for them (srun(1) --overlap). Its tasks on the live nodes are gone.
        argv.append("--overlap")
    if plan.bind and binds_tasks:
        argv.append("--cpu-bind=none")
    if plan.rank_output:
        argv.append(f"--output={gate_dir}/{RANK_OUTPUT}")
    argv += [plan.trainctl, "rank-exec", "--site", plan.site_ref, "--partition", plan.partition,
             "--master-addr", action.master_addr, "--gate-dir", gate_dir]
    if not plan.bind:
        argv.append("--no-bind")
    return argv + ["--", *plan.program]


def checkpoint_signal(sbatch_signal: str) -> int | None:
    """The signal the job's program checkpoints on, from the plan's sbatch --signal value, read
    with the same pattern that checked it (`trainctl.validate.SLURM_SIGNAL`); None when there is
    none, or it goes to the batch shell only (B:), which the ranks never see."""
    match = SLURM_SIGNAL.fullmatch(sbatch_signal)
    if not match or "B" in (match["prefix"] or "").upper():
        return None
    name = match["sig"].upper().removeprefix("SIG")
    if name.isdigit():
        return int(name)
    return int(signals.Signals["SIG" + name]) if "SIG" + name in signals.Signals.__members__ else None


# ---------------------------------------------------------------- what comes back (parsers, pure)

def parse_resize_script(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """scontrol's slurm_job_<id>_resize.sh -> (variables it exports, variables it unsets).

    scontrol writes `export NAME="value"` and `unset NAME` lines (src/scontrol/update_job.c,
    _update_job_size; Slurm's FAQ, "Can I change my job's size after it has started running?"),
    so that the job's later steps see the smaller job. Read as shell words, never run."""
    exported: dict[str, str] = {}
    unset: list[str] = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            exported[name] = value
        elif len(words) >= 2 and words[0] == "unset":
            unset += words[1:]
    return exported, tuple(unset)
