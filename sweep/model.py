"""The rows a sweep produces and the history stores; shared by every stage, no I/O here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainctl.health.status import Status

# Node check statuses as stored, least severe first (health.status: fail > unknown > warn > ok).
STATUSES = tuple(status.label for status in Status)
STATUS_CODE = {status.label: status.exit_code for status in Status}


def worst_label(labels: Iterable[str], default: str = "ok") -> str:
    """The most severe of stored status labels (an unrecognised one counts as unknown)."""
    # By the labels' severity rank, not through Status objects: a 10,000-node sweep asks this
    # for every node's 30-odd rows.
    worst = max(labels, key=_label_severity, default=default)
    return worst if worst in _LABEL_SEVERITY else Status.UNKNOWN.label


def _label_severity(label: str) -> int:
    return _LABEL_SEVERITY.get(label, _UNKNOWN_SEVERITY)


_LABEL_SEVERITY = {status.label: status.severity for status in Status}
_UNKNOWN_SEVERITY = Status.UNKNOWN.severity


def _status(label: str) -> Status:
    return Status(label) if label in STATUS_CODE else Status.UNKNOWN

# What happened to a node in a sweep. Only "checked" nodes have check results.
CHECKED = "checked"
TIMEOUT = "timeout"        # the checks did not finish in time: not the same as failing one
ERROR = "error"            # no verdict came back (ssh refused, trainctl crashed on the node)
NOT_SWEPT = "not_swept"    # Slurm had the node busy, drained or down: its state says which


@dataclass(frozen=True)
class CheckRow:
    name: str
    status: str
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeOutcome:
    """One node's part of a sweep, as a collector hands it to the history."""

    host: str
    outcome: str
    status: str | None = None          # worst check status, for checked nodes
    slurm_state: str = ""              # Slurm's state when the sweep looked ("" outside Slurm)
    detail: str = ""                   # why not swept, what timed out, what went wrong
    duration_s: float | None = None
    checks: tuple[CheckRow, ...] = ()

    @property
    def verdict(self) -> Status:
        """This node's share of the sweep's verdict: its status; no verdict counts as unknown."""
        if self.outcome == CHECKED:
            return _status(self.status or "unknown")
        return Status.UNKNOWN if self.outcome in (TIMEOUT, ERROR) else Status.OK

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


@dataclass(frozen=True)
class SweepRow:
    id: int
    kind: str                  # "sweep" or "recheck" (resume's fresh look at drained nodes)
    started_at: float          # Unix seconds
    finished_at: float | None  # None: the sweep never finished (killed, crashed)
    site: str
    via: str
    target: str                # partition name or hostlist
    checks: str
    slurm_job_id: str
    error: str

    @property
    def complete(self) -> bool:
        return self.finished_at is not None


@dataclass(frozen=True)
class NodeRow:
    sweep_id: int
    host: str
    outcome: str
    status: str | None
    slurm_state: str
    detail: str
    recorded_at: float


@dataclass(frozen=True)
class ResultRow:
    sweep_id: int
    host: str
    check: str
    status: str
    reason: str
    details: dict[str, Any]


@dataclass(frozen=True)
class DrainRow:
    id: int
    host: str
    reason: str                # exactly the reason trainctl set
    reason_time: str           # Slurm's timestamp for it, read back after draining
    sweep_id: int
    check: str
    drained_at: float
    closed_at: float | None    # None while trainctl still holds the drain
    closed_how: str            # "resumed", or why trainctl let go of it


@dataclass(frozen=True)
class JobRow:
    """A job whose journal was folded into the history, and how much of it."""
    job_id: str
    site: str
    started_at: float
    ended_at: float | None     # None: the journal had no job_end yet
    status: int | None
    source: str                # the journal it was read from
    lines: int                 # complete lines folded in
    size: int                  # bytes folded in
    ingested_at: float
    uid: int | None            # the job's user, by Slurm's accounting (or the journal's owner, where the site
                               # counts unverified journals); None: folded in before the history kept users


@dataclass(frozen=True)
class JobEventRow:
    """One job's verdict on one node: the gate left it out (exclusion), the watch named it
    (detection), or it trained through a step that ended well (served)."""
    job_id: str
    line: int                  # the event's line in the journal, from 1
    host: str
    kind: str                  # exclusion, detection, served
    at: float
    what: str                  # exclusion: the checks; detection: its kind; served: ""
    detail: str                # exclusion: the reasons; detection: the evidence
    families: tuple[str, ...]  # the failure families it strikes the node in (trainctl.sweep.families), found
                               # when it was folded in; served: none


@dataclass(frozen=True)
class SweepFailure:
    """A full sweep that a node failed, and the checks it failed, each as the sweep recorded it."""
    host: str
    sweep_id: int
    at: float                  # the sweep's start
    failed: tuple[tuple[str, str], ...]   # (check, reason) of each failed check, by check name

    @property
    def text(self) -> str:
        """The failed checks in one line, for a report: "check: reason; check: reason"."""
        return "; ".join(f"{check}: {reason}" for check, reason in self.failed)
