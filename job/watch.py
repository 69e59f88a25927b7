"""Watching the training step: from what each node's agent writes, decide whether the job has
slowed, a node is sick, or the job hangs, and whom the evidence names. Pure: the supervisor
reads the files and the clock and passes them in; `observe` returns the next state and at most
one detection.

The evidence is relative to the job itself, never to a fixed figure:

- **slow**: the job's step time over the last `slow_window_s` (the median step of the samples
  in it, each sample weighing the steps it covers) is above `slow_factor` x its own baseline
  (the same median of the samples before that window, at most `baseline_window_s` of them,
  after `warmup_s`). In synchronous data-parallel training every rank waits for the slowest, so
  the step time says *that* the job slowed, not *who*. Who: each rank's main thread's own time
  per step (on a CPU, and runnable but waiting for one, as the node's agent reads it from the
  kernel with no help from the program) before and during the slow window. A rank whose own time
  made the rise names its node while its peers' stays flat (`own_time_verdict`): a throttled or
  crowded CPU, a slower core. Where no rank's own time made the rise (the time goes to waiting),
  each node's own links (`link_wait_verdict`): a link that holds its sender back per byte sent as
  before, while every other node's holds back less, names its node. Otherwise the detection
  names nobody, and the machine weighs it
  (`weigh`: the gate's gain over the time left against a restart's price) and lets training go
  on, or stops for the gate, whose fabric and compute tests, re-run on the job's nodes, decide
  who (or "slowdown not localised"). Where the ranks time their compute section
  (`trainctl.progress.compute()`), the evidence says on which nodes that time rose the same way:
  on some (those nodes compute slower), on every node (the program itself), or on none (the time
  goes to waiting: the wire, the input). It narrows what to look at; the gate still decides.
- **sick**: a node's agent reports a check that passed when training started and fails now
  (an Xid in the kernel log, a port down, error counters growing). The check is the evidence.
- **hung**: no rank finished a step, and no rank's main thread moved, for the hang timeout:
  `hang_floor_s`, or `hang_steps` x the baseline step time when that is longer. It names the
  nodes whose agent fell silent (a hung node stops everything on it), else the nodes whose ranks
  are behind the others; when neither, nobody.
  Before the first step: no rank reached it within the start-up bound (`startup_s`), where the
  program reports steps at all; it names nobody.

A phase without steps is not a hang while a rank's main thread moves (`activity`: each rank
looks at it once a second, `trainctl.progress`): evaluation, a long save, warm-up, compilation.
Nor is it a slowdown: the steps that end a phase without steps longer than the hang timeout
measure that phase, not the training speed, so that poll adds no step-time sample; a shorter
phase adds one long sample covering one step (`split_longest`: the poll that ends it holds the
phase's step apart from the steps around it), which the median step over the slow window
outweighs however few polls the phase left in it. A rank stuck in one
call (a collective that never completes) does not move; a rank spinning in Python code that
never ends its step does, and hides a hang.

A node's agent is silent when its file, once written, has not changed for `agent_silence_s`.
Silence while the job still makes progress is not a detection: training goes on, and the
journal says so once. An agent that never wrote names nobody (it may simply not have started).
A Python rank's optimizer steps count as its steps where it does not call `trainctl.progress`
itself (`trainctl.guest.hook`). A program that reports no steps at all (not Python, or the hook
turned off): then only a node whose agent has been silent for the hang floor is detected
(hung), and slowdowns are not seen.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, NamedTuple

from trainctl.detections import (LINK_WAIT, OWN_TIME, RULES, Details, DetectionKind, FailedCheck, HungDetails,
                                  SickDetails, SlowDetails)
from trainctl.job.jobdir import LinkReading, NodeReading, RankProgress

MIN_BASELINE_SAMPLES = 5
MIN_RECENT_SAMPLES = 3
MAX_SAMPLES = 4096                      # bounded memory, whatever the job's length
OWN_SHARE = 0.5                         # of the step's rise that a rank's own time must account for
FLAT_SHARE = 0.25                       # of the step's rise that the named nodes' peers may have risen by
OWN_SAMPLES_PER_WINDOW = 10             # own-time samples per slow window (the verdict needs MIN_BASELINE_SAMPLES before it)
LINK_WAIT_FACTOR = 1.5                  # a node's link holds back this many times as much per MB as the others'
LINK_SAMPLES_PER_WINDOW = 6             # link samples per slow window: the counts are cumulative, two span it


@dataclass(frozen=True)
class WatchLimits:
    """The site's `[watch]` thresholds (trainctl.site.WatchConfig), as the detectors use them."""

    slow_factor: float
    slow_window_s: float
    baseline_window_s: float
    warmup_s: float
    hang_floor_s: float
    hang_steps: float
    agent_silence_s: float
    startup_s: float = 0.0               # the job's start-up bound (site startup_s + per node); 0: none
    steps_expected: bool = False         # the ranks count steps without the program's help (auto_steps on)

    def hang_timeout_s(self, baseline_step_s: float | None) -> float:
        return max(self.hang_floor_s, self.hang_steps * baseline_step_s if baseline_step_s else 0.0)


@dataclass(frozen=True)
class Detection:
    kind: DetectionKind
    suspects: tuple[str, ...]            # nodes the evidence names (slow: none, the gate decides)
    evidence: str                        # one line for the job's output and the journal
    details: Details = field(compare=False)

    def journal_fields(self) -> dict:
        """The journal's `detection` (and `weighed`) event's own fields."""
        return {"kind": self.kind.value, "suspects": list(self.suspects), "evidence": self.evidence,
                "details": self.details.to_json()}


@dataclass(frozen=True)
class Sample:
    t: float
    step_s: float
    steps: int = 1                       # the steps it covers (a rank's, the median over ranks): its weight


@dataclass(frozen=True)
class ComputeSample:
    t: float
    compute_s: float                     # a node's compute seconds per step since the last poll


class LinkSample(NamedTuple):            # a tuple of untracked values: the collector stops tracking it
    t: float                             # when the node's agent read its links
    links: tuple[LinkReading, ...]       # cumulative counts


class SlowRent(NamedTuple):
    """A slowdown nobody is named for whose gate would pay, not yet acted on: it must first cost the
    training as much as a restart would (the ski-rental rule), so a phase that passes (an
    evaluation, a save, a stall) never costs a restart. It lasts while the step time stays above
    the slow factor x the baseline it was first judged against, though the rolling baseline
    catches up with it."""
    since_t: float                       # its first weighing
    last_t: float                        # its last weighing
    paid_s: float                        # the training time it has cost since its first weighing
    detection: "Detection"               # as first detected: its baseline stays the measure


class OwnSample(NamedTuple):             # a tuple of numbers: Python's collector stops tracking it
    t: float
    cpu_s: float                         # a rank's main thread on a CPU, per step since the node's last sample
    runq_s: float                        # and runnable, waiting for a CPU
    rank: int                            # the node's rank that spent the most per step

    @property
    def own_s(self) -> float:
        return self.cpu_s + self.runq_s


@dataclass(frozen=True)
class WatchState:
    started_t: float                     # the training step's start (wall time)
    accepted_step_s: float = 0.0         # a slowdown the gate did not localise: the new normal
    samples: tuple[Sample, ...] = ()
    # rank -> (steps, step_seconds, compute_seconds, step_seconds_sq) at the last poll
    last: Mapping[int, tuple[int, float, float, float]] = field(default_factory=dict)
    progress_t: float = 0.0              # when a rank last finished a step (the watch's start before that)
    progress_steps: int = -1             # the most steps any rank had then (-1: no rank reported a step)
    active_t: float = 0.0                # when a rank's main thread was last seen to move (0: never)
    activity: Mapping[int, int] = field(default_factory=dict)   # rank -> its activity at the last poll
    silent_noted: tuple[str, ...] = ()   # agents already reported silent while training went on
    heard: Mapping[str, float] = field(default_factory=dict)   # node -> its agent's latest file time
    # node -> its compute time per step, over the baseline and slow windows only (bounded)
    compute: Mapping[str, tuple[ComputeSample, ...]] = field(default_factory=dict)
    startup: bool = True                 # judge the start-up bound (off once it was judged in this step)
    # node -> its slowest rank's own time per step, over the baseline and slow windows only
    own: Mapping[str, tuple[OwnSample, ...]] = field(default_factory=dict)
    # rank -> (steps, CPU seconds, run-queue seconds) at the node's last own sample
    own_last: Mapping[int, tuple[int, float, float]] = field(default_factory=dict)
    own_due: float = 0.0                 # when the next own samples are taken
    stepped_before: bool = False         # an earlier training step of the job reported steps
    # node -> its agent's readings of its links, over the baseline and slow windows only
    links: Mapping[str, tuple[LinkSample, ...]] = field(default_factory=dict)
    links_due: float = 0.0               # when the next link samples are taken
    rent: SlowRent | None = None         # a slowdown waiting to cost a restart's price first


@dataclass(frozen=True)
class Observation:
    state: WatchState
    detection: Detection | None = None
    silent_while_progressing: tuple[str, ...] = ()   # for the journal, once per node


@dataclass(frozen=True)
class Confirmation:
    """What the job makes of a detection once the gate after it has judged."""

    kind: DetectionKind
    named: Mapping[str, str]             # node -> why it is left out (none: resume on the same nodes)
    note: str                            # why nobody is named ("" when somebody is)
    accepted_step_s: float               # the step time the watch takes as normal from now on


def confirm(detection: Detection, gate_named: Mapping[str, str], training_nodes: tuple[str, ...],
            accepted_step_s: float) -> Confirmation:
    """The nodes left out: those the detection itself named (sick, hung) and those of the training
    nodes the gate now excludes. When nobody is named after a slowdown, its step time becomes the
    new normal, so the same slowdown is not detected again; a named node resets it."""
    named = {node: f"{detection.kind}: {detection.evidence}" for node in detection.suspects}
    named.update((node, why) for node, why in gate_named.items() if node in training_nodes)
    if named:
        return Confirmation(detection.kind, named, "", 0.0)
    accepted = detection.details.accepted_step_s
    return Confirmation(detection.kind, {}, RULES[detection.kind].unconfirmed,
                        accepted_step_s if accepted is None else accepted)


def start(now: float, accepted_step_s: float = 0.0, stepped_before: bool = False) -> WatchState:
    return WatchState(started_t=now, accepted_step_s=accepted_step_s, progress_t=now, stepped_before=stepped_before)


def observe(limits: WatchLimits, state: WatchState, now: float,
            readings: Mapping[str, NodeReading | None]) -> Observation:
    """One poll: `readings` maps each training node to its agent's latest file (None: none yet)."""
    ranks = [rank for reading in readings.values() if reading for rank in reading.ranks]
    # steps after a phase without steps longer than the hang timeout measure that phase
    ends_pause = (state.progress_steps >= 0 and now - state.progress_t >= limits.hang_floor_s
                  and now - state.progress_t >= limits.hang_timeout_s(_baseline(limits, state, now)))
    state = _sample(limits, state, now, ranks, readings, ends_pause)
    silent = silent_nodes(limits, state, now)

    sick = [(node, check, reason) for node, reading in sorted(readings.items()) if reading
            for check, reason in reading.failed_checks]
    if sick:
        nodes = tuple(sorted({node for node, _, _ in sick}))
        evidence = "; ".join(f"{node}: {check}: {reason}" for node, check, reason in sick)
        return Observation(state, Detection(DetectionKind.SICK, nodes, evidence,
                                            SickDetails(tuple(FailedCheck(n, c, r) for n, c, r in sick))))

    baseline = _baseline(limits, state, now)
    if state.progress_steps < 0:
        # no rank has reported a step: a program without trainctl.progress (or not yet past its
        # first step). Only a node whose agent fell silent for the hang floor says anything.
        gone = tuple(node for node in silent if now - state.heard[node] >= limits.hang_floor_s)
        if gone:
            return Observation(state, Detection(
                DetectionKind.HUNG, gone, f"the agent of {', '.join(gone)} fell silent {limits.hang_floor_s:.0f} s "
                                          "ago (no rank reports steps: no progress to judge)", HungDetails(gone)))
        startup = _startup_hang(limits, state, now, ranks)
        if startup:
            return Observation(state, startup)
        return _quiet(limits, state, ())
    stalled_s = now - max(state.progress_t, state.active_t)
    hang_after = limits.hang_timeout_s(baseline)
    if stalled_s >= hang_after:
        return Observation(state, _hung(state, readings, silent, stalled_s, hang_after))

    slow = _slow(limits, state, now, baseline)
    if slow:
        return Observation(state, slow)

    return _quiet(limits, state, silent)


def _startup_hang(limits: WatchLimits, state: WatchState, now: float,
                  ranks: list[RankProgress]) -> Detection | None:
    """No rank reached its first step within the start-up bound: a hang (a rendezvous that never
    completes, a rank stuck loading). Judged once a step, and only where the program reports steps
    at all: they are counted without its help (`steps_expected`), a rank has reported something,
    or an earlier training step of the job reported steps. It names nobody: the machine records
    the ranks' stacks and lets the step go on (a long start-up is no fault of a node's)."""
    waited = now - state.started_t
    if not limits.startup_s or waited < limits.startup_s or not state.startup:
        return None
    if not (limits.steps_expected or ranks or state.last or state.stepped_before):
        return None
    return Detection(DetectionKind.HUNG, (), f"no rank reached its first step in {waited:.0f} s "
                                             f"(start-up bound {limits.startup_s:.0f} s)",
                     HungDetails(startup_s=limits.startup_s, waited_s=round(waited, 1)))


def silent_nodes(limits: WatchLimits, state: WatchState, now: float) -> tuple[str, ...]:
    """Nodes whose agent wrote once and not for `agent_silence_s` since."""
    return tuple(sorted(node for node, heard in state.heard.items() if now - heard >= limits.agent_silence_s))


def _quiet(limits: WatchLimits, state: WatchState, silent: tuple[str, ...]) -> Observation:
    # noted only once training went on for agent_silence_s after the agent's last word
    newly_silent = tuple(node for node in silent if node not in state.silent_noted
                         and state.progress_t - state.heard[node] >= limits.agent_silence_s)
    if newly_silent:
        state = replace(state, silent_noted=state.silent_noted + newly_silent)
    return Observation(state, None, newly_silent)


def _sample(limits: WatchLimits, state: WatchState, now: float, ranks: list[RankProgress],
            readings: Mapping[str, NodeReading | None], ends_pause: bool = False) -> WatchState:
    """The job's step time since the last poll: the median over ranks of each rank's own
    (added step seconds / added steps). Ranks that finished no step add nothing; nor does any
    rank when the poll ends a phase without steps (`ends_pause`)."""
    before = state.last
    step_times, step_counts, longest = [], [], []
    for rank in ranks:
        steps, seconds, _, squares = before.get(rank.rank, (rank.steps, rank.step_seconds, 0.0, rank.step_seconds_sq))
        if rank.steps > steps and rank.step_seconds >= seconds:
            added = rank.steps - steps
            rest, long = split_longest(added, rank.step_seconds - seconds, rank.step_seconds_sq - squares)
            step_times.append(rest)
            step_counts.append(added - 1 if long is not None else added)
            if long is not None:
                longest.append(long)
    samples = state.samples
    if step_times and not ends_pause:
        # a poll's steps: its longest apart when the ranks' squares tell it, so that one long step
        # (an evaluation, a save, a stall) weighs as one step, not as many slow ones
        new = ()
        if any(step_counts):
            new += (Sample(now, statistics.median(step_times), max(1, int(statistics.median(step_counts)))),)
        if longest:
            new += (Sample(now, statistics.median(longest), 1),)
        samples = (samples + new)[-MAX_SAMPLES:]
    # progress: any rank finished a step since the last poll (a rank whose agent fell silent
    # keeps its old count, so it neither counts as progress nor holds the others back)
    progressed = any(rank.steps > before.get(rank.rank, (0,))[0] for rank in ranks)
    progress_t, progress_steps = state.progress_t, state.progress_steps
    if progressed:
        progress_t, progress_steps = now, max(progress_steps, max(rank.steps for rank in ranks))
    # activity: a rank's main thread moved since the last poll (a new process starts again from 0)
    active_t = state.active_t
    if any(rank.activity != state.activity.get(rank.rank, 0) for rank in ranks):
        active_t = now
    heard = dict(state.heard)
    for node, reading in readings.items():
        if reading is not None and reading.written_t > heard.get(node, 0.0):
            heard[node] = reading.written_t
    return replace(state, samples=samples, progress_t=progress_t, progress_steps=progress_steps,
                   active_t=active_t, activity={r.rank: r.activity for r in ranks} or state.activity,
                   last={r.rank: (r.steps, r.step_seconds, r.compute_seconds, r.step_seconds_sq) for r in ranks}
                   or state.last,
                   heard=heard, compute=_compute_samples(limits, state, now, before, readings),
                   **_link_samples(limits, state, now, readings), **_own_samples(limits, state, now, readings))


def _link_samples(limits: WatchLimits, state: WatchState, now: float,
                  readings: Mapping[str, NodeReading | None]) -> dict:
    """Each node's link readings every LINK_SAMPLES_PER_WINDOW-th of the slow window (their counts
    are cumulative: two samples span a window, however many reads lie between), kept only as far
    back as the detectors look (a node whose file is missing then keeps its own)."""
    if now < state.links_due:
        return {}
    keep_after = now - limits.slow_window_s - limits.baseline_window_s
    links = {}
    for node in set(state.links) | set(readings):
        kept = state.links.get(node, ())
        if kept and kept[0].t < keep_after:
            kept = tuple(s for s in kept if s.t >= keep_after)
        reading = readings.get(node)
        if reading and reading.links_t is not None and (not kept or reading.links_t > kept[-1].t):
            kept += (LinkSample(reading.links_t, reading.links),)
        if kept:
            links[node] = kept
    return {"links": links, "links_due": now + limits.slow_window_s / LINK_SAMPLES_PER_WINDOW}


def split_longest(steps: int, seconds: float, squares: float) -> tuple[float, float | None]:
    """(the mean of the other steps, the longest step) of `steps` steps that took `seconds`, with
    the summed squares of their durations, as one long step and steps - 1 equal ones would give
    them; (the mean, None) for one step, or where the squares say nothing (none reported, or
    equal steps)."""
    mean = seconds / steps
    spread = steps * squares - seconds * seconds      # steps^2 x the variance of the durations
    if steps < 2 or squares <= 0 or spread <= 0:
        return mean, None
    rest = max(0.0, mean - math.sqrt(spread / (steps - 1)) / steps)
    return rest, seconds - (steps - 1) * rest


def _own_samples(limits: WatchLimits, state: WatchState, now: float,
                 readings: Mapping[str, NodeReading | None]) -> dict:
    """Each node's own time per step since its last sample: that of its rank whose main thread
    spent the most per step (on a CPU, and waiting for one), taken every OWN_SAMPLES_PER_WINDOW-th
    of the slow window (the verdict needs a few samples per window; every poll's would keep one
    object per node per second, tens of thousands on a large job), kept only as far back as the
    detectors look. A new process for a rank (its counts went back) starts again from its next reading."""
    if now < state.own_due:
        return {}
    keep_after = now - limits.slow_window_s - limits.baseline_window_s
    own, last = {}, dict(state.own_last)
    for node, reading in readings.items():
        kept = state.own.get(node, ())
        if kept and kept[0].t < keep_after:   # oldest first: most samples drop nothing
            kept = tuple(s for s in kept if s.t >= keep_after)
        slowest = None                     # (own, cpu, runq, rank) per step: one sample per node, made once
        for rank in reading.ranks if reading else ():
            cpu, runq = rank.cpu_seconds, rank.runq_seconds
            if cpu is None or runq is None:
                continue
            before = last.get(rank.rank)
            if before is not None and rank.steps == before[0] and cpu >= before[1]:
                continue   # no step since: its time so far counts with the step it is in
            last[rank.rank] = (rank.steps, cpu, runq)
            if before is None or rank.steps < before[0] or cpu < before[1] or runq < before[2]:
                continue
            added = rank.steps - before[0]
            own_cpu, own_runq = (cpu - before[1]) / added, (runq - before[2]) / added
            if slowest is None or own_cpu + own_runq > slowest[0]:
                slowest = (own_cpu + own_runq, own_cpu, own_runq, rank.rank)
        if slowest is not None:
            kept += (OwnSample(now, slowest[1], slowest[2], slowest[3]),)
        if kept:
            own[node] = kept
    return {"own": own, "own_last": last, "own_due": now + limits.slow_window_s / OWN_SAMPLES_PER_WINDOW}


def _compute_samples(limits: WatchLimits, state: WatchState, now: float,
                     before: Mapping[int, tuple[int, float, float, float]],
                     readings: Mapping[str, NodeReading | None]) -> Mapping[str, tuple[ComputeSample, ...]]:
    """Each node's compute seconds per step since the last poll (the median over its ranks),
    kept only as far back as the detectors look. Nothing for ranks that time no compute."""
    if not state.compute and not any(rank.compute_seconds for r in readings.values() if r for rank in r.ranks):
        return {}   # a program that times no compute section pays nothing for it
    keep_after = now - limits.slow_window_s - limits.baseline_window_s
    compute = {}
    for node, reading in readings.items():
        kept = state.compute.get(node, ())
        if kept and kept[0].t < keep_after:   # oldest first: most polls drop nothing
            kept = tuple(s for s in kept if s.t >= keep_after)
        per_step = []
        for rank in reading.ranks if reading else ():
            steps, _, seconds, _ = before.get(rank.rank, (rank.steps, 0.0, rank.compute_seconds, 0.0))
            if rank.steps > steps and rank.compute_seconds > seconds:
                per_step.append((rank.compute_seconds - seconds) / (rank.steps - steps))
        if per_step:
            kept += (ComputeSample(now, statistics.median(per_step)),)
        if kept:
            compute[node] = kept
    return compute


def _baseline(limits: WatchLimits, state: WatchState, now: float) -> float | None:
    since = max(state.started_t + limits.warmup_s, now - limits.slow_window_s - limits.baseline_window_s)
    before = [s for s in state.samples if since <= s.t <= now - limits.slow_window_s]
    return step_median(before) if _polls(before) >= MIN_BASELINE_SAMPLES else None


def _polls(samples: list[Sample]) -> int:
    """How many polls the samples come from (a poll whose longest step stood apart gave two)."""
    return len({s.t for s in samples})


def step_median(samples: list[Sample]) -> float:
    """The median step's time: each sample weighs as many steps as it covers. A pause (an
    evaluation, a save, a stall, a collection) is one long step however long it lasts, and the
    polls during it add no sample, so it must not weigh as much as the polls of steady training
    around it: judged by the samples alone, a pause that fills most of the window would leave a
    few samples, two of them long, and their median would be a slowdown."""
    ordered = sorted((s.step_s, s.steps) for s in samples)
    half, seen = sum(steps for _, steps in ordered) / 2, 0
    for index, (step_s, steps) in enumerate(ordered):
        seen += steps
        if seen > half:
            return step_s
        if seen == half:
            return (step_s + ordered[index + 1][0]) / 2
    return ordered[-1][0]


def recent_step_s(limits: WatchLimits, state: WatchState, now: float) -> float | None:
    """The job's step time over the slow window (None: too few polls with steps in it)."""
    recent = [s for s in state.samples if s.t > now - limits.slow_window_s]
    return step_median(recent) if _polls(recent) >= MIN_RECENT_SAMPLES else None


def still_slow(limits: WatchLimits, state: WatchState, now: float) -> Detection | None:
    """The slowdown waiting in `state.rent`, measured again against the baseline it was first judged
    against, while it lasts (None: it passed); the rent unchanged when no poll had steps."""
    rent = state.rent
    current = recent_step_s(limits, state, now)
    if rent is None or current is None:
        return rent.detection if rent else None
    first = rent.detection.details
    if not isinstance(first, SlowDetails) or current <= limits.slow_factor * first.baseline_s:
        return None
    return replace(rent.detection, details=replace(first, step_s=current))


def _slow(limits: WatchLimits, state: WatchState, now: float, baseline: float | None) -> Detection | None:
    if baseline is None:
        return None
    current = recent_step_s(limits, state, now)
    if current is None:
        return None
    recent_polls = _polls([s for s in state.samples if s.t > now - limits.slow_window_s])
    normal = max(baseline, state.accepted_step_s)
    if current <= limits.slow_factor * normal:
        return None
    evidence = (f"step time {current:.3g} s over the last {limits.slow_window_s:g} s, "
                f"{current / normal:.2f}x the job's own {normal:.3g} s")
    suspects: tuple[str, ...] = ()
    named_by, own_fields, link_fields = "", [], []
    own = _own_times(limits, state, now)
    if own:
        suspects, note, own_fields = own_time_verdict(own, current - normal)
        named_by = OWN_TIME if suspects else ""
        evidence += "; " + note
    if not _made_the_rise(own, current - normal):   # the time goes to waiting: the wire?
        links = _link_waits(limits, state, now)
        if links:
            suspects, note, link_fields = link_wait_verdict(links, tuple(sorted({*state.heard, *state.links})))
            named_by = LINK_WAIT if suspects else ""
            evidence += "; " + note
    ratios = _compute_ratios(limits, state, now)
    if ratios:
        evidence += "; " + _compute_note(limits, ratios)
    return Detection(DetectionKind.SLOW, suspects, evidence,
                     SlowDetails(current, normal, recent_polls, named_by, tuple(own_fields), tuple(link_fields),
                                 ratios))


@dataclass(frozen=True)
class OwnTime:
    """One node's own time per step (its slowest rank's, medians) before the slow window and in it,
    and the rank of the median sample in it."""

    node: str
    rank: int
    before: tuple[float, float]          # (on a CPU, waiting for one)
    now: tuple[float, float]

    @property
    def rise_s(self) -> float:
        return sum(self.now) - sum(self.before)

    def fields(self) -> dict:
        return {"node": self.node, "rank": self.rank, "rise_s": round(self.rise_s, 4),
                "cpu_s": [round(self.before[0], 4), round(self.now[0], 4)],
                "runq_s": [round(self.before[1], 4), round(self.now[1], 4)]}

    def line(self) -> str:
        return (f"rank {self.rank} on {self.node} {sum(self.now):.3g} s a step of its own (on a CPU {self.now[0]:.3g}, "
                f"waiting for one {self.now[1]:.3g}), {sum(self.before):.3g} s before")


def _own_times(limits: WatchLimits, state: WatchState, now: float) -> list[OwnTime]:
    """Each node's own time per step over the windows the step time was judged over, for the
    nodes with enough samples in both."""
    since = max(state.started_t + limits.warmup_s, now - limits.slow_window_s - limits.baseline_window_s)
    found = []
    for node, samples in sorted(state.own.items()):
        earlier = [s for s in samples if since <= s.t <= now - limits.slow_window_s]
        recent = [s for s in samples if s.t > now - limits.slow_window_s]
        if len(earlier) >= MIN_BASELINE_SAMPLES and len(recent) >= MIN_RECENT_SAMPLES:
            before, middle = _median(earlier), _median(recent)
            found.append(OwnTime(node, middle.rank, (before.cpu_s, before.runq_s), (middle.cpu_s, middle.runq_s)))
    return found


def _median(samples: list[OwnSample]) -> OwnSample:
    """The sample of the median own time."""
    return sorted(samples, key=lambda s: s.own_s)[len(samples) // 2]


def own_time_verdict(own: list[OwnTime], step_rise_s: float) -> tuple[tuple[str, ...], str, list[dict]]:
    """Whom the ranks' own time names for a step-time rise of `step_rise_s` (the rule, `own-time`).

    In synchronous training every rank waits for the slowest, so a rank whose own work grew by
    about the step's rise made that rise, and the others' own time stays flat: their extra time is
    spent asleep, waiting for it. A node's rank made the rise when its own time per step rose by at
    least OWN_SHARE of the step's rise. Such nodes are named when they are at most half of the
    job's and their peers stayed flat (rose by less than FLAT_SHARE of the step's rise); when more
    rose, the program or every node slowed alike; when a peer rose part of the way too, no node
    stands out (a machine busy everywhere starves its nodes' ranks by turns); when none rose,
    the time goes to waiting (the wire, the input, a slow GPU: its kernels are not the main
    thread's time)."""
    rose = _made_the_rise(own, step_rise_s)
    fields = [o.fields() for o in own]
    if not rose:
        return (), ("own time per step is flat on every node: the time goes to waiting (the wire, the input, "
                    "a GPU), nobody is named by it"), fields
    if 2 * len(rose) > len(own):
        return (), (f"own time per step rose on {len(rose)} of {len(own)} nodes alike (the program itself, or "
                    "every node at once): nobody is named"), fields
    nodes = tuple(o.node for o in rose)
    peers = max((o.rise_s for o in own if o not in rose), default=0.0)
    if peers >= FLAT_SHARE * step_rise_s:
        top = max(o.rise_s for o in rose)
        return (), (f"own time per step rose on {', '.join(nodes)} by up to {round(top, 3):g} s and on the other "
                    f"nodes by up to {round(peers, 3):g} s, of the step's {round(step_rise_s, 3):g} s: no node "
                    f"stands out (rule own-time: the others must stay under {FLAT_SHARE:.0%} of the step's rise), "
                    "nobody is named by it"), fields
    return nodes, (f"{'; '.join(o.line() for o in rose)}; the other nodes' own time rose by at most "
                   f"{round(max(peers, 0.0), 3):g} s (rule own-time: a rank's own time per step rose by "
                   f"{OWN_SHARE:.0%} or more of the step's rise)"), fields


def _made_the_rise(own: list[OwnTime], step_rise_s: float) -> list[OwnTime]:
    return [o for o in own if o.rise_s >= OWN_SHARE * step_rise_s]


@dataclass(frozen=True)
class LinkWait:
    """One of a node's links before the slow window and over it: how often it held its sender back
    for each MB it sent (qdisc: overlimits + requeues + drops; ib: PortXmitWait ticks), and the
    bytes it sent a second."""

    node: str
    link: str
    source: str                          # "qdisc" or "ib"
    wait_per_mb: tuple[float, float]     # (before, now)
    sent_per_s: tuple[float, float]

    def fields(self) -> dict:
        return {"node": self.node, "link": self.link, "source": self.source,
                "wait_per_mb": [round(v, 1) for v in self.wait_per_mb],
                "sent_bytes_per_s": [round(v) for v in self.sent_per_s]}

    def line(self) -> str:
        return link_line(self.fields())


def link_line(item: Mapping) -> str:
    """One link's numbers (`LinkWait.fields`), as the evidence and `job show` say them."""
    (wait_before, wait_now), (sent_before, sent_now) = item["wait_per_mb"], item["sent_bytes_per_s"]
    return (f"{item['node']} {item['link']}: {WAIT_WHAT[item['source']]} {wait_now:.3g} per MB sent, "
            f"{wait_before:.3g} before; sent {sent_now / 1e6:.3g} MB/s, {sent_before / 1e6:.3g} before")


# what a link's wait counts, by source (health/parse/link_counters.py)
WAIT_WHAT = {"qdisc": "held back (qdisc overlimits + requeues + drops)", "ib": "waited for credit (PortXmitWait ticks)"}
# how much holding back counts at all, per MB sent
LINK_WAIT_FLOOR_PER_MB = 10.0
# a link that sent less than this share of what it sent before says nothing of its wire: the job
# stalled (a node starved of CPU, a rank stopped), and a link that sends nothing holds nothing back
LINK_MIN_SENT_SHARE = 0.25


def _link_waits(limits: WatchLimits, state: WatchState, now: float) -> list[LinkWait]:
    """Each node's links over the baseline window and over the last half of the slow window (a
    slowdown is detected once it fills half the window: that half is surely in it), each from the
    sample before it to its last, for the links that sent in both and whose counts never went back
    (a qdisc replaced, a port reset)."""
    since = max(state.started_t + limits.warmup_s, now - limits.slow_window_s - limits.baseline_window_s)
    half = now - limits.slow_window_s / 2
    found = []
    for node, samples in sorted(state.links.items()):
        earlier = [s for s in samples if since <= s.t <= now - limits.slow_window_s]
        before_half = [s for s in samples if s.t <= half]
        if len(earlier) < 2 or not before_half or samples[-1].t <= half:
            continue
        for link in samples[-1].links:
            judged = [_window(start, end, link.link) for start, end in ((earlier[0], earlier[-1]),
                                                                         (before_half[-1], samples[-1]))]
            if None not in judged:
                (wait_before, sent_before), (wait_now, sent_now) = judged
                found.append(LinkWait(node, link.link, link.source, (wait_before, wait_now), (sent_before, sent_now)))
    return found


def _window(start: LinkSample, end: LinkSample, name: str) -> tuple[float, float] | None:
    """Link `name` from `start` to `end`: (its wait per MB sent, its bytes sent a second); None when
    a sample lacks it, it sent nothing, or a count went back."""
    first = next((link for link in start.links if link.link == name), None)
    last = next((link for link in end.links if link.link == name), None)
    if first is None or last is None or end.t <= start.t:
        return None
    sent = last.sent_bytes - first.sent_bytes
    if sent <= 0 or last.wait < first.wait:
        return None
    return (last.wait - first.wait) / (sent / 1e6), sent / (end.t - start.t)


def link_wait_verdict(links: list[LinkWait], nodes: tuple[str, ...]) -> tuple[tuple[str, ...], str, list[dict]]:
    """Whom the nodes' own links name for a slowdown spent waiting (the rule, `link-wait`).

    In synchronous training every node sends its share of each step. A link that cannot keep up
    holds back most of what its node sends (a shaper's tokens run out, the far end grants no
    credit), while the other nodes, waiting for it, send less and in short bursts that go out at
    once: their links hold back less for each byte they send. What a link holds back a second
    falls on every node with the traffic, the slow one's too; per byte sent it singles the slow
    one out. A node is named when one of its links holds back at least LINK_WAIT_FACTOR x as much
    per MB sent as every other node's link of the same kind over the slow window, and at least
    LINK_WAIT_FLOOR_PER_MB, and did not before (a node whose link always held back most is no new
    fault). The rule compares every node of the job (`nodes`), each link still sending at least
    LINK_MIN_SENT_SHARE of what it sent before; where one cannot be judged, it names nobody."""
    fields = [link.fields() for link in links]
    unjudged = [f"{node}: no link readings over the window" for node in nodes
                if not any(link.node == node for link in links)]
    unjudged += [f"{link.node} {link.link}: sent {link.sent_per_s[1] / 1e6:.3g} MB/s, under "
                 f"{LINK_MIN_SENT_SHARE:.0%} of its {link.sent_per_s[0] / 1e6:.3g} before" for link in links
                 if link.sent_per_s[1] < LINK_MIN_SENT_SHARE * link.sent_per_s[0]]
    if unjudged:
        return (), (f"the links cannot be compared ({'; '.join(unjudged)}): nobody is named by the links"), fields
    apart = []
    for link in links:
        others = [o for o in links if o.node != link.node and o.source == link.source]
        if not others:
            continue
        before, now = link.wait_per_mb
        if (now >= LINK_WAIT_FLOOR_PER_MB and now >= LINK_WAIT_FACTOR * max(o.wait_per_mb[1] for o in others)
                and before < LINK_WAIT_FACTOR * max(o.wait_per_mb[0] for o in others)):
            apart.append(link)
    looked_at = ", ".join(f"{link.node} {link.link}" for link in links)
    if not apart:
        return (), (f"no node's link holds back apart from the others' (looked at: {looked_at}): "
                    "nobody is named by the links"), fields
    named = tuple(sorted({link.node for link in apart}))
    others = max((o.wait_per_mb[1] for o in links if o.node not in named and o.source == apart[0].source), default=0.0)
    return named, (f"{'; '.join(link.line() for link in apart)}; the other nodes' links at most {others:.3g} per MB "
                   f"(rule link-wait: a link holds its sender back {LINK_WAIT_FACTOR:g}x or more as much per MB sent as "
                   "every other node's, and did not before)"), fields


def _compute_ratios(limits: WatchLimits, state: WatchState, now: float) -> dict[str, float]:
    """node -> its compute time per step over the slow window, divided by that over the window
    before (the baseline's), for the nodes with enough samples in both."""
    since = max(state.started_t + limits.warmup_s, now - limits.slow_window_s - limits.baseline_window_s)
    ratios = {}
    for node, samples in sorted(state.compute.items()):
        earlier = [s.compute_s for s in samples if since <= s.t <= now - limits.slow_window_s]
        recent = [s.compute_s for s in samples if s.t > now - limits.slow_window_s]
        if len(earlier) >= MIN_BASELINE_SAMPLES and len(recent) >= MIN_RECENT_SAMPLES:
            ratios[node] = round(statistics.median(recent) / statistics.median(earlier), 2)
    return ratios


def _compute_note(limits: WatchLimits, ratios: Mapping[str, float]) -> str:
    """Some nodes are named only when every other node's compute time is unchanged: while a
    slowdown of the whole program fills the window, nodes cross the factor at different polls."""
    rose = {node: ratio for node, ratio in ratios.items() if ratio >= limits.slow_factor}
    unchanged = [node for node, ratio in ratios.items() if ratio < (1 + limits.slow_factor) / 2]
    if len(unchanged) == len(ratios):
        return "compute time per step is unchanged on every node: the time goes to waiting (the wire, the input)"
    if len(rose) == len(ratios):
        return "compute time per step rose on every node alike (the program itself, or every node at once)"
    if rose and len(rose) + len(unchanged) == len(ratios):
        return "compute time per step rose on " + ", ".join(f"{node} ({ratio:g}x)" for node, ratio in rose.items())
    return "compute time per step rose unevenly: " + ", ".join(f"{node} {ratio:g}x" for node, ratio in ratios.items())


def _hung(state: WatchState, readings: Mapping[str, NodeReading | None], silent: tuple[str, ...],
          stalled_s: float, hang_after: float) -> Detection:
    head = f"no rank finished a step for {stalled_s:.0f} s (hang timeout {hang_after:.0f} s)"
    if silent:
        return Detection(DetectionKind.HUNG, silent, f"{head}; the agent of {', '.join(silent)} fell silent",
                         HungDetails(silent))
    steps = {node: min(r.steps for r in reading.ranks)
             for node, reading in readings.items() if reading and reading.ranks}
    if steps and len(set(steps.values())) > 1:
        lowest = min(steps.values())
        behind = tuple(sorted(node for node, count in steps.items() if count == lowest))
        return Detection(DetectionKind.HUNG, behind, f"{head}; the ranks of {', '.join(behind)} are behind "
                                                     f"(step {lowest}, others {max(steps.values())})",
                         HungDetails(steps=steps))
    return Detection(DetectionKind.HUNG, (), f"{head}; every rank is at the same step and every agent answers",
                     HungDetails(steps=steps))


@dataclass(frozen=True)
class Weighing:
    """Whether to stop a job for a slowdown no evidence pins on a node, so the gate can look:
    the price is what a restart costs (its own time, and the work since the last checkpoint),
    the gain the time the slowdown would cost over the time left, were the gate to remove it. A
    gain that pays still waits until the slowdown has cost the price itself: stopping at once
    would pay a restart for a slowdown that may pass on its own (a phase); waiting until then
    costs at most twice what the best choice in hindsight would (the ski-rental rule)."""

    action: Literal["gate", "wait", "go on"]
    gain_s: float
    price_s: float
    restart_s: float
    restart_basis: str                   # "measured" (the job's last restart) or "site default"
    lost_work_s: float
    left_s: float
    left_basis: str                      # to the allocation's end, or the elapsed training standing in
    pay_factor: float
    step_s: float
    baseline_s: float
    paid_s: float                        # the training time the slowdown has cost since it was first weighed

    def fields(self) -> dict:
        """The journal's `weighed` event."""
        return {"action": self.action, "gain_s": round(self.gain_s, 1),
                "price_s": round(self.price_s, 1), "restart_s": round(self.restart_s, 1),
                "restart_basis": self.restart_basis, "lost_work_s": round(self.lost_work_s, 1),
                "left_s": round(self.left_s, 1), "left_basis": self.left_basis, "pay_factor": self.pay_factor,
                "step_s": round(self.step_s, 4), "baseline_s": round(self.baseline_s, 4),
                "paid_s": round(self.paid_s, 1)}


def weigh(detection: Detection, now: float, pay_factor: float, restart_s: float | None, default_restart_s: float,
          saved_t: float, end_t: float | None, trained_s: float, rent: SlowRent | None) -> Weighing:
    """`restart_s`: the job's last restart, from the stop decision to its first step again (None:
    none yet, the site's `default_restart_s`); `saved_t`: the last checkpoint seen, else the
    training step's start; `end_t`: the allocation's end (None: unknown, the job's own elapsed
    training time `trained_s` stands in for the time left); `rent`: the same slowdown's earlier
    weighing, if it waited."""
    details = detection.details
    step_s, baseline_s = (details.step_s, details.baseline_s) if isinstance(details, SlowDetails) else (0.0, 0.0)
    restart, restart_basis = (restart_s, "measured") if restart_s is not None else (default_restart_s, "site default")
    lost = max(0.0, now - saved_t)
    if end_t is not None:
        left, left_basis = max(0.0, end_t - now), "to the allocation's end"
    else:
        left, left_basis = max(0.0, trained_s), "the training so far: the allocation's end is unknown"
    slowed = (step_s - baseline_s) / step_s if step_s > 0 else 0.0   # the share of each second it costs
    gain = slowed * left
    price = restart + lost
    paid = rent.paid_s + slowed * max(0.0, now - rent.last_t) if rent else 0.0
    # pay_factor 0: the site stops for the gate on any slowdown at once
    action = "go on" if gain <= pay_factor * price else "gate" if paid >= price or pay_factor == 0 else "wait"
    return Weighing(action, gain, price, restart, restart_basis, lost, left, left_basis, pay_factor, step_s,
                    baseline_s, paid)
