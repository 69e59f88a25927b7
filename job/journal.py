"""The job's journal: every event of the supervisor, timestamped, one JSON object per line in
trainctl-gate-<id>/journal.jsonl; and, from the journals of a chain of attempts, its timeline
and its goodput.

Goodput is ETTR (effective training time ratio) as large-scale training reports use it:
productive training time over the wall time since the first submit. Productive time is counted
without help from the program: the time since the training step started, less the work lost
after the last checkpoint seen when a step fails. A checkpoint is seen when the program writes
the file named by TRAINCTL_CHECKPOINT_FILE (`checkpoint_api`); a program that never writes it
loses all of a failed step's time. The rest of the wall time is split into queue (waiting for
an allocation), gate (job start to training start: the health gate and the release), restart
(a failed step's end to its job's end: evidence, probe, successor) and lost work.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

JOURNAL_FILE = "journal.jsonl"
CHECKPOINT_ENV = "TRAINCTL_CHECKPOINT_FILE"
CHECKPOINT_FILE = "checkpoint.seen"    # in the gate directory, written by the program
LOST_KINDS = ("queue", "gate", "restart", "lost_work")


class Journal:
    """Appends events; one write per line, so a reader never sees half an event."""

    def __init__(self, path: str, clock=time.time):
        self.path = path
        self.clock = clock
        self.failed = False

    def add(self, event: str, **fields) -> dict:
        """Append `event`; a journal that cannot be written (a full quota) never ends the job: one warning."""
        now = self.clock()
        entry = {"t": round(now, 3), "at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
                 "event": event, **fields}
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, (json.dumps(entry) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            if not self.failed:
                print(f"trainctl: warning: cannot write the journal {self.path}: {exc.strerror or exc}",
                      file=sys.stderr, flush=True)
            self.failed = True
        return entry


def parse_journal(text: str) -> list[dict]:
    """The events of one journal, in order; a torn or foreign line is skipped."""
    events = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("t"), (int, float)) and isinstance(entry.get("event"), str):
            events.append(entry)
    return events


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
            if kind == "submitted" and isinstance(event.get("submitted_t"), (int, float)):
                marks.append((event["submitted_t"], "queue"))
            elif kind == "job_start":
                marks.append((t, "gate"))
            elif kind == "training_start":
                marks.append((t, "training"))
            elif kind == "step_end" and event.get("status", 0) == 0:
                marks.append((t, "end"))
            elif kind == "step_end":
                marks.append((t, "restart"))
                since = event.get("last_checkpoint_t") or event.get("training_start_t") or t
                lost_work += max(0.0, t - since)
            elif kind == "job_end":
                marks.append((t, "queue" if number + 1 < len(attempts) else "end"))
        if events and events[-1]["event"] != "job_end" and number + 1 == len(attempts):
            running = True
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


def timeline_lines(attempts: list[tuple[str, list[dict]]], start: float) -> list[str]:
    """One line per event, at its offset from the chain's first submit (or first event), in time
    order; a submit is shown when Slurm took the job, not when the job journaled it."""
    timed = []
    for job_id, events in attempts:
        for event in events:
            when = event.get("submitted_t") if event["event"] == "submitted" else event["t"]
            if isinstance(when, (int, float)):
                timed.append((when, job_id, event))
    return [f"  +{_clock(when - start)} job {job_id}: {describe(event)}"
            for when, job_id, event in sorted(timed, key=lambda item: item[0])]


def describe(event: dict) -> str:
    kind = event["event"]
    if kind == "node_verdict":
        reasons = "; ".join(event.get("reasons") or [])
        return f"{event.get('node')} {event.get('verdict')}" + (f": {reasons}" if reasons else "")
    if kind == "submitted":
        return "submitted to Slurm"
    if kind == "detection":
        suspects = ",".join(event.get("suspects") or []) or "no node named yet"
        return f"watch: {event.get('kind')} ({suspects}): {event.get('evidence')}"
    if kind == "confirmation":
        named = event.get("named") or {}
        if not named:
            return f"watch: the gate names no node: {event.get('note', 'nobody named')}; same nodes again"
        return "watch: left out " + "; ".join(f"{node}: {why}" for node, why in named.items())
    detail = {key: value for key, value in event.items() if key not in ("t", "at", "event") and not key.endswith("_t")}
    text = {"job_start": "job started", "gate_start": "gate started", "node_verdict": "node verdict",
            "gate_end": "gate ended", "released": "released unused nodes", "training_start": "training step started",
            "checkpoint": "checkpoint seen", "step_end": "training step ended", "retry": "retry",
            "job_end": "job ended", "checkpoint_request": "watch: asked the ranks to checkpoint",
            "stacks": "watch: every rank's stack recorded", "agent_silent": "watch: node agent silent",
            "first_step": "first step reported"}.get(kind, kind)
    if detail:
        text += ": " + ", ".join(f"{key} {_value(value)}" for key, value in detail.items())
    return text


def _value(value) -> str:
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "none"
    return str(value)


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def goodput_lines(result: Goodput) -> list[str]:
    ratio = "n/a" if result.ratio is None else f"{result.ratio:.1%}"
    lines = [f"goodput: {ratio} ({_clock(result.productive_s)} productive of {_clock(result.wall_s)} since the "
             f"first submit{', still running' if result.running else ''})"]
    lines.append("  lost: " + ", ".join(f"{kind.replace('_', ' ')} {_clock(result.lost_s.get(kind, 0.0))}"
                                       for kind in LOST_KINDS))
    lines.append("  productive: training step time, less the work after the last checkpoint seen "
                 f"when a step failed (the program writes ${CHECKPOINT_ENV} after each checkpoint)")
    return lines
