"""Check results and the node verdict: one status algebra for every consumer.

Two orders, kept apart on purpose:

- severity (which status wins when several meet): fail > unknown > warn > ok. A check that
  failed is a fact about the node; one that could not decide is not, so it never hides a
  failure. `max()` of statuses and `Status.worst()` follow severity.
- exit code (what a process returns, as Nagios does): ok 0, warn 1, fail 2, unknown 3.

Health check, gate, fabric test, sweeps, reports and drain planning all order statuses
through this class (`sweep.model` maps the stored labels onto it).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@functools.total_ordering
class Status(enum.Enum):
    # Declared least severe first: the declaration order is the severity order.
    OK = "ok"
    WARN = "warn"
    UNKNOWN = "unknown"
    FAIL = "fail"

    @property
    def label(self) -> str:
        return self.value

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def exit_code(self) -> int:
        return _EXIT_CODE[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Status):
            return NotImplemented
        return self.severity < other.severity

    @classmethod
    def worst(cls, statuses: Iterable[Status], default: Status) -> Status:
        """The most severe of `statuses`; `default` when there are none."""
        return max(statuses, default=default)


_SEVERITY = {status: rank for rank, status in enumerate(Status)}
_EXIT_CODE = {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2, Status.UNKNOWN: 3}


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.label, "reason": self.reason,
                "details": self.details}


@dataclass(frozen=True)
class NodeReport:
    host: str
    checks: tuple[CheckResult, ...]

    @property
    def status(self) -> Status:
        # A report with no checks proves nothing about the node.
        return Status.worst((c.status for c in self.checks), default=Status.UNKNOWN)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status.label,
                "checks": [c.to_json() for c in self.checks]}


class Finding(NamedTuple):
    """What a check function returns; the registry adds the check's name."""
    status: Status
    reason: str
    details: dict[str, Any]


def summarize(issues: list[tuple[Status, str]], ok_reason: str, details: dict[str, Any]) -> Finding:
    """One finding from many: the worst status, and every issue's text, worst first."""
    if not issues:
        return Finding(Status.OK, ok_reason, details)
    ordered = sorted(issues, key=lambda issue: -issue[0].severity)
    return Finding(ordered[0][0], "; ".join(text for _, text in ordered), details)
