"""The job's journal: every event of the supervisor, timestamped, one JSON object per line in
trainctl-gate-<id>/journal.jsonl; and, from the journals of a chain of attempts, its timeline
(its goodput: `trainctl.job.goodput`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone

JOURNAL_FILE = "journal.jsonl"
CHECKPOINT_ENV = "TRAINCTL_CHECKPOINT_FILE"
CHECKPOINT_FILE = "checkpoint.seen"    # in the gate directory, written by the program


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


def drop_journal(path: str, directory: str, job_id: str) -> str:
    """Copy the journal at `path` to `directory`/<job_id>.jsonl (a partial copy is never seen
    under that name); returns "" or what went wrong, in a few words."""
    target = os.path.join(os.path.expanduser(directory), f"{job_id}{os.path.splitext(JOURNAL_FILE)[1]}")
    part = os.path.join(os.path.dirname(target), f".{job_id}.part-{os.getpid()}")
    try:
        with open(path, "rb") as source:
            data = source.read()
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(part, target)
    except OSError as exc:
        try:
            os.unlink(part)
        except OSError:
            pass
        return f"{exc.filename or target}: {exc.strerror or exc}"
    return ""


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


def timeline_lines(attempts: list[tuple[str, list[dict]]], start: float) -> list[str]:
    """One line per event, at its offset from the chain's first submit (or first event), in time
    order; a submit is shown when Slurm took the job, not when the job journaled it."""
    timed = []
    for job_id, events in attempts:
        for event in events:
            when = event.get("submitted_t") if event["event"] == "submitted" else event["t"]
            if isinstance(when, (int, float)):
                timed.append((when, job_id, event))
    return [f"  +{hms(when - start)} job {job_id}: {describe(event)}"
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
    # job_start's job and site are for the fleet history (trainctl.sweep.fleet): the timeline names the job already
    hidden = ("t", "at", "event", "job", "site") if kind == "job_start" else ("t", "at", "event")
    detail = {key: value for key, value in event.items() if key not in hidden and not key.endswith("_t")}
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


def hms(seconds: float) -> str:
    """3725 -> '1:02:05'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
