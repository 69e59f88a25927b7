"""Goodput of a chain of attempts, from their journals (`trainctl.job.jobdir`): events in, a
`Goodput` and the watch's `WatchAccount` out, then their lines for `trainctl job show`.

Goodput is ETTR (effective training time ratio) as large-scale training reports use it:
productive training time over the wall time since the first submit. Productive time is counted
without help from the program: the time since the training step started, less the work lost
after the last checkpoint seen when a step fails. A checkpoint is seen (`trainctl.job.jobdir.
checkpoint_seen`, one rule for every source) when the program writes one of its own checkpoint
files (submit --checkpoints, the site's launch.checkpoints), writes the file named by
TRAINCTL_CHECKPOINT_FILE, or calls progress.checkpoint(); a program with none of these loses all
of a failed step's time. The rest of the wall time is split into queue (waiting for
an allocation), gate (job start to training start: the health gate and the release), restart
(a failed step's end to its job's end: evidence, probe, successor) and lost work.

The watch's account, per detection: its cost, from the detection to training again (the
restart's first step reported, so the reload counts; its training start when the program
reports no steps), and the work it threw away (the ended step's time after its last checkpoint).

Goodput without the watch is an estimate, made only where the journal holds what it needs:
the same productive time over an estimated wall time. Without the watch, the wall time would
not hold the watch's cost, nor the work before the detection that the restart did again (the
work after the detection lies inside the cost: counted once). Besides that:

- slow, a node left out: the training after the restart would have run at the slow step time,
  `step_s / baseline_s` times the job's baseline: that training's productive time x
  (step_s / baseline_s - 1) more. The slow steps' extra time is lost, not productive (plain
  ETTR would count slow steps as productive). Each slowdown is counted on its own.
- slow, not localised: training went on at the same step time on the same nodes: nothing else
  changes, so here the watch costs goodput.
- hung, sick, or a slowdown the gate did not judge: not estimated. The job would have waited for
  the collective timeout or its time limit, or crashed, at a time the journal does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainctl.detections import RULES, DetectionKind, read_details
from trainctl.job.jobdir import CHECKPOINT_ENV, Kind, job_ended
from trainctl.job.journal import hms

LOST_KINDS = ("queue", "gate", "restart", "lost_work")


@dataclass(frozen=True)
class Goodput:
    wall_s: float                    # first submit to the last event (or now, while running)
    productive_s: float
    lost_s: dict[str, float] = field(default_factory=dict)   # queue, gate, restart, lost_work
    running: bool = False

    @property
    def ratio(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict:
        return {"wall_s": round(self.wall_s, 1), "productive_s": round(self.productive_s, 1),
                "goodput": None if self.ratio is None else round(self.ratio, 4),
                "lost_s": {kind: round(seconds, 1) for kind, seconds in self.lost_s.items()},
                "running": self.running}


def goodput(attempts: list[list[dict]], now: float) -> Goodput | None:
    """Goodput of a chain of attempts (each a journal's events, first attempt first); None without events.

    One timeline of marks, in time order; each sets the phase until the next: submit -> queue,
    job start -> gate, training start -> training, a failed step's end -> restart (a successful
    one -> the end), a job's end -> queue when a successor follows. A successor is submitted
    while its predecessor still winds down: from its submit on, the time is its queue time.
    Training after the last checkpoint of a failed step is lost work.
    """
    marks: list[tuple[float, str]] = []
    lost_work = 0.0
    running = False
    for number, events in enumerate(attempts):
        for event in events:
            kind, t = event["event"], event["t"]
            if kind == Kind.SUBMITTED and isinstance(event.get("submitted_t"), (int, float)):
                marks.append((event["submitted_t"], "queue"))
            elif kind == Kind.JOB_START:
                marks.append((t, "gate"))
            elif kind == Kind.TRAINING_START:
                marks.append((t, "training"))
            elif kind == Kind.STEP_END and event.get("status", 0) == 0:
                marks.append((t, "end"))
            elif kind == Kind.STEP_END:
                marks.append((t, "restart"))
                lost_work += _lost_work(event)
            elif kind == Kind.JOB_END:
                marks.append((t, "queue" if number + 1 < len(attempts) else "end"))
        if events and not job_ended(events) and number + 1 == len(attempts):
            running = True   # from the events, not the last line: a job's end is journaled once
    if not marks:
        return None
    marks.sort(key=lambda mark: mark[0])
    end = now if running else marks[-1][0]
    spent = {"queue": 0.0, "gate": 0.0, "training": 0.0, "restart": 0.0}
    for (t, phase), (t_next, _) in zip(marks, marks[1:] + [(end, "end")]):
        if phase in spent:
            spent[phase] += max(0.0, t_next - t)
    lost_work = min(lost_work, spent["training"])
    wall = max(0.0, end - marks[0][0])
    lost = {"queue": spent["queue"], "gate": spent["gate"], "restart": spent["restart"], "lost_work": lost_work}
    return Goodput(wall, spent["training"] - lost_work, lost, running)


def _lost_work(step_end: dict) -> float:
    """A failed step's time after its last checkpoint seen (all of it without one)."""
    t = step_end["t"]
    return max(0.0, t - (step_end.get("last_checkpoint_t") or step_end.get("training_start_t") or t))


@dataclass(frozen=True)
class DetectionCost:
    kind: str                      # a DetectionKind's value (another trainctl's kind as its journal says it)
    outcome: str                   # what the gate after it decided: "node2 left out", "slowdown not localised"
    cost_s: float | None           # detection to training again; None: no training since
    lost_work_s: float             # the ended step's time after its last checkpoint
    wall_change_s: float | None    # wall time without the watch minus with it; None: not estimated
    basis: str                     # how wall_change_s was estimated, or why it was not

    def to_json(self) -> dict:
        return {"kind": self.kind, "outcome": self.outcome, "cost_s": _round(self.cost_s),
                "lost_work_s": round(self.lost_work_s, 1), "wall_change_s": _round(self.wall_change_s),
                "basis": self.basis}


@dataclass(frozen=True)
class WatchAccount:
    detections: tuple[DetectionCost, ...]
    productive_s: float
    wall_s: float
    wall_without_s: float | None   # None: not estimated (a detection's basis says why)

    @property
    def ratio_without(self) -> float | None:
        return self.productive_s / self.wall_without_s if self.wall_without_s else None

    def to_json(self) -> dict:
        ratio = self.ratio_without
        return {"detections": [detection.to_json() for detection in self.detections],
                "without_watch": {"wall_s": _round(self.wall_without_s),
                                  "goodput": None if ratio is None else round(ratio, 4)}}


def _round(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


# the kinds `goodput` and `watch_account` read: a reader that cannot keep every event keeps these
COUNTED_KINDS = frozenset({Kind.SUBMITTED, Kind.JOB_START, Kind.TRAINING_START, Kind.FIRST_STEP, Kind.DETECTION,
                           Kind.CONFIRMATION, Kind.STEP_END, Kind.JOB_END})


def watch_account(attempts: list[list[dict]], result: Goodput, now: float) -> WatchAccount | None:
    """What each detection of the chain cost, and the goodput without the watch; None without a detection."""
    events = sorted((event for journal in attempts for event in journal), key=lambda event: event["t"])
    steps_reported = any(event["event"] == Kind.FIRST_STEP for event in events)
    # a detection with a note was only recorded (a start-up hang naming nobody, a slowdown past the
    # restarts the site allows): the watch stopped nothing, so it cost nothing
    chosen = [index for index, event in enumerate(events) if event["event"] == Kind.DETECTION and not event.get("note")]
    if not chosen:
        return None
    following = Following(events, now)
    detections = tuple(_detection_cost(events, index, following, steps_reported) for index in chosen)
    changes = [detection.wall_change_s for detection in detections]
    wall_without = None if None in changes else result.wall_s + sum(changes)
    return WatchAccount(detections, result.productive_s, result.wall_s, wall_without)


def _detection_cost(events: list[dict], index: int, following: Following, steps_reported: bool) -> DetectionCost:
    detection = events[index]
    kind, detected = detection.get("kind", "?"), detection["t"]
    ended = following.step_end[index]
    judged = following.confirmation[index]
    restart = following.training_start[index]
    lost_work = redone = 0.0
    if ended is not None:
        lost_work = _lost_work(events[ended])
        checkpointed = events[ended]["t"] - lost_work    # the last checkpoint, or the step's start
        redone = min(lost_work, max(0.0, detected - checkpointed))   # the rest lies inside the cost
    named = (events[judged].get("named") or {}) if judged is not None else {}
    if judged is None:
        outcome = "not judged by the gate"
    else:
        outcome = f"{', '.join(named)} left out" if named else events[judged].get("note", "nobody named")
    again = None
    if restart is not None and steps_reported:
        first = following.first_step[restart]
        again = None if first is None else events[first]["t"]
    elif restart is not None:
        again = events[restart]["t"]
    cost = None if again is None else again - detected

    known = DetectionKind.read(kind)
    if cost is None:
        change, basis = None, f"{kind}: no training since"
    elif known is None:
        change, basis = None, f"{kind}: a detection this trainctl does not know"
    elif RULES[known].not_estimated is not None:
        change, basis = None, f"{kind}: {RULES[known].not_estimated}"
    elif judged is not None and not named:
        change, basis = -(cost + redone), "slowdown not localised: same nodes, same step time; here the watch cost goodput"
    elif named and (slowdown := read_details(known, detection.get("details")).slowdown) is not None:
        after = following.productive_from[restart]
        change = after * (slowdown - 1) - cost - redone
        basis = f"the {hms(after)} of training after the restart at {slowdown:.2f}x the step time"
    else:
        change, basis = None, f"{kind}: " + ("no step times in the detection" if named else "the gate did not judge it")
    return DetectionCost(kind, outcome, cost, lost_work, change, basis)


class Following:
    """For each event of a chain (in time order), the index of the next event of a kind, in one pass
    from the end each: a detection's account costs the same however many events follow it."""

    def __init__(self, events: list[dict], now: float):
        self.step_end = _next_index(events, {Kind.STEP_END})
        self.confirmation = _next_index(events, {Kind.CONFIRMATION}, stop=Kind.DETECTION)
        self.training_start = _next_index(events, {Kind.TRAINING_START})
        self.first_step = _next_index(events, {Kind.FIRST_STEP}, stop=Kind.STEP_END)
        ends = _next_index(events, {Kind.STEP_END, Kind.JOB_END})
        # productive training time of the training steps from each event on: each step's time, to
        # its end (now while it runs), less the work a failed one lost
        self.productive_from = [0.0] * (len(events) + 1)
        for index in range(len(events) - 1, -1, -1):
            self.productive_from[index] = self.productive_from[index + 1]
            if events[index]["event"] == Kind.TRAINING_START:
                self.productive_from[index] += _productive(events[index], None if ends[index] is None
                                                           else events[ends[index]], now)


def _next_index(events: list[dict], names: set[Kind], stop: Kind | None = None) -> list[int | None]:
    """For each index, the first event after it of one of `names`, unless a `stop` event comes first."""
    table: list[int | None] = [None] * len(events)
    found = None
    for index in range(len(events) - 1, -1, -1):
        table[index] = found
        if events[index]["event"] in names:
            found = index
        elif events[index]["event"] == stop:
            found = None
    return table


def _productive(start: dict, ended: dict | None, now: float) -> float:
    if ended is None:
        return max(0.0, now - start["t"])
    spent = max(0.0, ended["t"] - start["t"])
    failed = ended["event"] == Kind.STEP_END and ended.get("status", 0) != 0
    return spent - (min(spent, _lost_work(ended)) if failed else 0.0)


def goodput_lines(result: Goodput) -> list[str]:
    ratio = "n/a" if result.ratio is None else f"{result.ratio:.1%}"
    lines = [f"goodput: {ratio} ({hms(result.productive_s)} productive of {hms(result.wall_s)} since the "
             f"first submit{', still running' if result.running else ''})"]
    lines.append("  measures: the share of the wall time since the first submit that trained; the start-up "
                 "(queue, gate) weighs most in a short job")
    lines.append("  lost: " + ", ".join(f"{kind.replace('_', ' ')} {hms(result.lost_s.get(kind, 0.0))}"
                                       for kind in LOST_KINDS))
    lines.append("  productive: training step time, less the work after the last checkpoint seen "
                 f"when a step failed (submit --checkpoints, ${CHECKPOINT_ENV} or progress.checkpoint())")
    return lines


def watch_lines(account: WatchAccount) -> list[str]:
    lines = [f"  watch: {d.kind} ({d.outcome}): "
             + (f"cost {hms(d.cost_s)} (detection to training again)" if d.cost_s is not None else "no training since")
             + f", {hms(d.lost_work_s)} of work after the last checkpoint" for d in account.detections]
    ratio = account.ratio_without
    if ratio is None:
        reasons = "; ".join(d.basis for d in account.detections if d.wall_change_s is None)
        return lines + [f"  without the watch: not estimated ({reasons})"]
    bases = "; ".join(d.basis for d in account.detections)
    return lines + [f"  without the watch: about {ratio:.1%}, {hms(account.wall_without_s)} instead of "
                    f"{hms(account.wall_s)} ({bases})"]
