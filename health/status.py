"""Check results and the node verdict.

Statuses are ordered like Nagios and share its exit codes, so a node's status is
the `max` of its checks' statuses and doubles as the process exit code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Status(enum.IntEnum):
    OK = 0
    WARN = 1
    FAIL = 2
    UNKNOWN = 3

    @property
    def label(self) -> str:
        return self.name.lower()


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
        return max((c.status for c in self.checks), default=Status.UNKNOWN)

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
    ordered = sorted(issues, key=lambda issue: -issue[0])
    return Finding(ordered[0][0], "; ".join(text for _, text in ordered), details)
