"""Why the gate leaves a node out: `Reason`, and its one text form, "cause: detail". The text
is what decision.json and the journal's node_verdict events hold (`trainctl.job.decision`,
`trainctl.job.driver`); `Reason.read` is its one reader, for `job show` and for the fleet
history (`trainctl.sweep.fleet`, which may not import job/). Kept below job/ and sweep/ for both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    """Why a node is left out: `cause` folds nodes together (a check name, "fabric: straggler",
    "lost during the gate"); `detail` is this node's own evidence."""
    cause: str
    detail: str

    def __str__(self) -> str:
        return f"{self.cause}: {self.detail}" if self.detail else self.cause

    @classmethod
    def read(cls, text: str) -> Reason:
        """The reason `str` wrote: the cause up to the first ": " (a check name, or the first word of
        a two-part cause such as "fabric: straggler"), the detail after it; no ": ", a bare cause."""
        cause, _, detail = text.partition(": ")
        return cls(cause, detail)
