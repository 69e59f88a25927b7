"""The job journal's lines (journal.jsonl): the event kinds, each kind's fields and their types,
the writer, and the reader that trusts nothing (torn lines, NaN, huge numbers, wrong types, deep
nesting). Kept below job/ and sweep/ so that the job's supervisor, `trainctl job show` and the
fleet history (trainctl.sweep.fleet) read every journal by the same rules; the job directory
(trainctl.job.jobdir) names the file and re-exports these.

An event is one JSON object a line: {"t": <unix seconds>, "at": <ISO time>, "event": <kind>,
...its fields}. A reader gets a dict with "t" (a float) and "event" (a Kind, or the string of a
kind it does not know), and each field of the kind's type; a field of another type is dropped
(with `strict`, the line is refused).
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from trainctl.files import inside, open_append_regular, open_regular, read_fd

JOURNAL_LINE_MAX_BYTES = 1 << 20        # one event; a longer line is skipped, never cut
JOURNAL_MAX_BYTES = 64 << 20            # read, copied or folded at most; a few kB, tens of kB with a watch's details
NUMBER_LIMIT = 1e15                     # beyond any clock (Unix seconds), step count or duration
MAX_DEPTH = 16                          # of a value inside an event


def _reject_constant(name: str) -> None:
    return None    # NaN, Infinity and -Infinity read as null


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def loads(text: str | bytes, *, strict: bool = False) -> Any:
    """JSON as the job's files hold it: NaN and Infinity read as null (with `strict`, as not JSON);
    ValueError for anything that is not JSON (nesting too deep included)."""
    try:
        # a number too large for a float (1e400) reads as inf: `number` and `clean` refuse it
        return json.loads(text, parse_constant=_refuse_constant if strict else _reject_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def number(value: Any) -> float | None:
    """`value` when it is a number within NUMBER_LIMIT (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if abs(value) <= NUMBER_LIMIT else None


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and number(value) is not None else None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")   # JSON's "\ud800" alone: no character, and no UTF-8


def without_lone_surrogates(value: str) -> str:
    """`value` with each lone surrogate (which JSON's escapes can spell, but no UTF-8 output can
    hold, and strict JSON parsers refuse) as U+FFFD; a pair the escapes spell is one character already."""
    return _LONE_SURROGATE.sub("\ufffd", value)


def clean(value: Any, depth: int = 0) -> Any:
    """`value` with numbers out of range and anything nested past MAX_DEPTH as None, and lone
    surrogates in strings and keys as U+FFFD (`without_lone_surrogates`)."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, dict):
        return None if depth >= MAX_DEPTH else {without_lone_surrogates(str(k)): clean(v, depth + 1)
                                                for k, v in value.items()}
    if isinstance(value, list):
        return None if depth >= MAX_DEPTH else [clean(v, depth + 1) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number(value)
    return value


def all_strings(*values: Any) -> bool:
    return all(isinstance(value, str) for value in values)


def string_list(value: Any) -> bool:
    return isinstance(value, list) and all_strings(*value)


class Kind(str, Enum):
    """The journal's event kinds, each with what `job show` says of it."""

    def __new__(cls, value: str, description: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description   # type: ignore[attr-defined]
        return member

    def __str__(self) -> str:
        return self.value

    JOB_START = "job_start", "job started"
    SUBMITTED = "submitted", "submitted to Slurm"
    GATE_START = "gate_start", "gate started"
    NODE_VERDICT = "node_verdict", "node verdict"
    GATE_END = "gate_end", "gate ended"
    CONFIRMATION = "confirmation", "watch: what the gate after a detection named"
    DRAIN = "drain", "watch: drained a node it named (the site's gate.drain_on)"
    RELEASED = "released", "released unused nodes"
    TRAINING_START = "training_start", "training step started"
    FIRST_STEP = "first_step", "first step reported"
    CHECKPOINT = "checkpoint", "checkpoint seen"
    DETECTION = "detection", "watch: detection"
    WEIGHED = "weighed", "watch: a slowdown no node is named for, weighed: the gate's gain against a restart's price"
    AGENT_SILENT = "agent_silent", "watch: node agent silent"
    STACKS = "stacks", "watch: every rank's stack recorded"
    CHECKPOINT_REQUEST = "checkpoint_request", "watch: asked the ranks to checkpoint"
    STEP_END = "step_end", "training step ended"
    RETRY = "retry", "retry"
    JOB_END = "job_end", "job ended"


class Verdict(str, Enum):
    """A `node_verdict` event's verdict: what the gate made of a node of the job."""

    CHOSEN = "chosen"
    EXCLUDED = "excluded"
    NOT_NEEDED = "healthy, not needed"

    def __str__(self) -> str:
        return self.value


# Each kind's fields and their types: "str", "int", "time" (a number), "strs" (a list of
# strings), "names" (an object of strings), "object", "any". A field of another type is dropped.
EVENT_FIELDS: Mapping[Kind, Mapping[str, str]] = {
    Kind.JOB_START: {"job": "str", "site": "str", "attempt": "any", "nodes": "strs", "batch_host": "str", "slurm": "str"},
    Kind.SUBMITTED: {"submitted_t": "time"},
    Kind.GATE_START: {"nodes": "strs", "evidence": "str"},
    Kind.NODE_VERDICT: {"node": "str", "verdict": "str", "reasons": "strs"},
    Kind.GATE_END: {"status": "int", "why": "str", "chosen": "strs", "master_addr": "str"},
    Kind.CONFIRMATION: {"kind": "str", "named": "names", "checked": "strs", "note": "str"},
    Kind.DRAIN: {"node": "str", "outcome": "str", "reason": "str"},
    Kind.RELEASED: {"holds": "str"},
    Kind.TRAINING_START: {"nodes": "str", "master_addr": "str", "restart": "int"},
    Kind.FIRST_STEP: {"steps": "int"},
    Kind.CHECKPOINT: {"checkpoint_t": "time", "note": "str", "source": "str"},
    Kind.DETECTION: {"kind": "str", "suspects": "strs", "evidence": "str", "details": "object", "note": "str"},
    Kind.WEIGHED: {"kind": "str", "evidence": "str", "details": "object", "action": "str", "gain_s": "time",
                   "price_s": "time", "restart_s": "time", "restart_basis": "str", "lost_work_s": "time",
                   "left_s": "time", "left_basis": "str", "pay_factor": "time", "step_s": "time",
                   "baseline_s": "time", "paid_s": "time"},
    Kind.AGENT_SILENT: {"node": "str", "note": "str"},
    Kind.STACKS: {"files": "names"},
    Kind.CHECKPOINT_REQUEST: {"signal": "any", "listening": "any", "refused": "str", "saved": "any"},
    # detection: the kind the watch found that ended the step (trainctl.detections), absent when it ended by itself
    Kind.STEP_END: {"status": "int", "cause": "str", "training_start_t": "time", "last_checkpoint_t": "time",
                    "detection": "str"},
    Kind.RETRY: {"retry": "any", "reason": "str", "successor": "str", "bad_nodes": "strs", "exclude": "strs"},
    Kind.JOB_END: {"status": "int", "cause": "str"},
}
KINDS = {kind.value: kind for kind in Kind}


def _typed(tag: str, value: Any) -> bool:
    if tag == "str":
        return isinstance(value, str)
    if tag == "int":
        return integer(value) is not None
    if tag == "time":
        return number(value) is not None
    if tag == "strs":
        return string_list(value)
    if tag == "names":
        return isinstance(value, dict) and all_strings(*value.values())
    if tag == "object":
        return isinstance(value, dict)
    return True


def parse_event(line: str | bytes, *, strict: bool = False) -> dict | None:
    """One journal line as an event, or None: torn, foreign, or without a finite time and a kind.
    With `strict` (a reader that counts what the events say: fleet memory), an event with a field
    of another type than EVENT_FIELDS gives is None too, instead of losing that field (null is
    always a field's "none": the supervisor writes it so)."""
    entry = event_entry(line)
    return None if entry is None else typed_event(entry, strict=strict)


def event_entry(line: str | bytes) -> dict | None:
    """A journal line's JSON object as it stands when it has a finite time and a kind, else None:
    the first half of `parse_event`, enough to count a line by its kind (`entry["event"]`)."""
    try:
        entry = loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or number(entry.get("t")) is None or not isinstance(entry.get("event"), str):
        return None
    return entry


def typed_event(entry: dict, *, strict: bool = False) -> dict | None:
    """The second half of `parse_event`: an `event_entry` cleaned, its kind and its fields typed."""
    entry = clean(entry)
    kind = KINDS.get(entry["event"], entry["event"])
    types = EVENT_FIELDS.get(kind, {})     # type: ignore[call-overload]
    if strict and not all(entry[key] is None or _typed(tag, entry[key]) for key, tag in types.items() if key in entry):
        return None
    event = {"t": float(entry["t"]), "event": kind}
    event.update((key, value) for key, value in entry.items()
                 if key not in ("t", "event") and (key not in types or _typed(types[key], value)))
    return event


def journal_lines(data: str | bytes) -> Iterator[str | bytes | None]:
    """Each line of a journal's text or bytes, one at a time, split at "\n" alone (as the writer ends
    its lines: the fleet history's line numbers count them so); None for one longer than
    JOURNAL_LINE_MAX_BYTES (no event of trainctl's is), never copied. No list of them all, no copy
    of the text. The one rule every reader of a journal splits it by."""
    newline = "\n" if isinstance(data, str) else b"\n"
    start = 0
    while start < len(data):
        end = data.find(newline, start)          # type: ignore[arg-type]
        end = len(data) if end < 0 else end
        yield data[start:end] if end - start <= JOURNAL_LINE_MAX_BYTES else None
        start = end + 1


def parse_journal(data: str | bytes) -> list[dict]:
    """The events of a journal's text, in order; a torn or foreign line is skipped, and so is one
    longer than JOURNAL_LINE_MAX_BYTES."""
    return [event for line in journal_lines(data) if line is not None and (event := parse_event(line)) is not None]


def iter_journal(path: str | os.PathLike, root: str | os.PathLike | None = None,
                 cap: int = JOURNAL_MAX_BYTES) -> Iterator[dict]:
    """Stream a journal's events, in order, from its first `cap` bytes (none: no journal); the lines
    split as `journal_lines` splits them, one longer than JOURNAL_LINE_MAX_BYTES skipped unread.
    OSError where it cannot be read."""
    fd = open_regular(path, root)
    if fd is None:
        return
    with os.fdopen(fd, "rb") as handle:
        left = cap
        while left > 0 and (line := handle.readline(min(left, JOURNAL_LINE_MAX_BYTES + 1))):
            left -= len(line)
            if len(line) > JOURNAL_LINE_MAX_BYTES and not line.endswith(b"\n"):
                while left > 0 and (rest := handle.readline(min(left, JOURNAL_LINE_MAX_BYTES))):
                    left -= len(rest)
                    if rest.endswith(b"\n"):
                        break
                continue
            event = parse_event(line)
            if event is not None:
                yield event


def read_journal_since(path: str | os.PathLike, offset: int, root: str | os.PathLike | None = None,
                       cap: int = JOURNAL_MAX_BYTES) -> tuple[list[dict], int]:
    """The events a growing journal gained after byte `offset`, and the offset to read from next:
    only whole lines (one still being written waits for the next read), at most `cap` bytes a
    call. ([], offset) while there is no journal; ([], 0) when the file shrank (it was replaced):
    the next call reads it from the start. A line longer than JOURNAL_LINE_MAX_BYTES is skipped.
    OSError where it cannot be read."""
    fd = open_regular(path, root)
    if fd is None:
        return [], offset
    try:
        size = os.fstat(fd).st_size
        if size < offset:
            return [], 0
        os.lseek(fd, offset, os.SEEK_SET)
        data = read_fd(fd, min(cap, size - offset))
    finally:
        os.close(fd)
    whole = data.rfind(b"\n") + 1
    if whole == 0 and len(data) >= cap:   # one line longer than a read: never an event of trainctl's
        return [], offset + len(data)
    return parse_journal(data[:whole]), offset + whole


def read_journal(path: str | os.PathLike, root: str | os.PathLike | None = None) -> list[dict]:
    """Every event of a journal's first JOURNAL_MAX_BYTES (see the module's docstring for their
    shape); [] without one. A bad line is skipped: the job's own readers show what the rest says."""
    return list(iter_journal(path, root))


class JournalUnreadable(Exception):
    """A journal that `read_journal_bytes` will not read; the message is the one line that says why."""


def read_journal_bytes(path: str | os.PathLike, root: str | os.PathLike | None = None) -> bytes:
    """A journal's bytes, whole, for copying it or folding it into the fleet history (which refuses
    a journal with a bad line, `trainctl.sweep.fleet`): only a regular file (inside `root`, when
    given: a link out of it is another user's file, never read), never blocking (a FIFO), at most
    JOURNAL_MAX_BYTES. JournalUnreadable, saying why, for anything else."""
    return read_journal_file(path, root)[0]


def read_journal_file(path: str | os.PathLike, root: str | os.PathLike | None = None) -> tuple[bytes, int]:
    """`read_journal_bytes`, and the uid that owns the file read (from the same descriptor: the
    owner of what was read, not of a file swapped in after)."""
    try:
        fd = open_regular(path, root)
    except OSError as exc:
        raise JournalUnreadable(f"cannot read: {exc.strerror or exc}") from None
    if fd is None:
        if not os.path.lexists(path):
            raise JournalUnreadable(f"cannot read: {os.strerror(errno.ENOENT)}")
        if root is not None and os.path.islink(path) and not inside(path, root):
            raise JournalUnreadable(f"a link out of {root}, not read")
        raise JournalUnreadable("not a regular file")
    try:
        found = os.fstat(fd)
        if found.st_size > JOURNAL_MAX_BYTES:
            raise JournalUnreadable(f"{found.st_size} bytes, more than a journal's {JOURNAL_MAX_BYTES}")
        data = read_fd(fd, JOURNAL_MAX_BYTES + 1)
    except OSError as exc:
        raise JournalUnreadable(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > JOURNAL_MAX_BYTES:
        raise JournalUnreadable(f"grew past a journal's {JOURNAL_MAX_BYTES} bytes while read")
    return data, found.st_uid


def job_ended(events: Iterable[Mapping]) -> bool:
    """Whether the job's journal holds its end (else it still runs, or died unrecorded)."""
    return any(event["event"] == Kind.JOB_END for event in events)


def journal_line(now: float, event: Kind, fields: Mapping[str, Any]) -> tuple[dict, str]:
    """An event at `now` as the journal holds it, and its line (without the newline)."""
    entry = {"t": round(now, 3), "at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
             "event": str(event), **fields}
    try:
        return entry, json.dumps(entry, default=str, allow_nan=False)
    except ValueError:   # a NaN in a value: written as null, so the journal stays JSON
        return entry, json.dumps(clean(entry), default=str, allow_nan=False)


class Journal:
    """Appends events; one write per line, so a reader never sees half an event."""

    def __init__(self, path: str | os.PathLike, clock=time.time, *, keep: bool = False):
        self.path = path
        self.clock = clock
        self.failed = False
        # with `keep`, every event added, as a reader reads it back (kept whether written or not): the
        # supervisor's metrics and alerts read them here, not from the file again
        self.events: list[dict] = []
        self.keep = keep

    def add(self, event: Kind, **fields) -> dict:
        """Append `event`; a journal that cannot be written (a full quota) never ends the job: one warning."""
        entry, line = journal_line(self.clock(), event, fields)
        if self.keep and (kept := parse_event(line)) is not None:
            self.events.append(kept)
        try:
            fd = open_append_regular(self.path)   # a FIFO in its place is refused, never waited on
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            if not self.failed:
                print(f"trainctl: warning: cannot write the journal {self.path}: {exc.strerror or exc}",
                      file=sys.stderr, flush=True)
            self.failed = True
        return entry
