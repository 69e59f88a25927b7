"""The gate's decision as a value: which nodes were chosen, which were left out and why, and
its one-line failure and JSON forms (decision.json; read back by `trainctl.job.jobdir`). Kept
apart from the gate's judging (`trainctl.job.gate`) so that login-node commands such as
`trainctl job show` read a decision without importing the health checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.gate_reasons import Reason
from trainctl.slurm import fold_hostlist

LOST = "lost during the gate"
# The failure line goes to the job's output after "trainctl: error: ": the whole line stays
# within 300 characters; every detail is in report.txt.
FAILURE_LINE_MAX = 300 - len("trainctl: error: ")
HOSTLIST_MAX = 60  # one cause's folded nodes in that line; longer lists are shortened


@dataclass(frozen=True)
class Exclusion:
    host: str
    reasons: tuple[Reason, ...]
    status: str = "fail"    # "unknown": only checks that could not decide left the node out

    def summary(self) -> str:
        return f"{self.host} {'; '.join(map(str, self.reasons))}"


@dataclass(frozen=True)
class Decision:
    allocated: tuple[str, ...]
    healthy: tuple[str, ...]
    chosen: tuple[str, ...]
    excluded: tuple[Exclusion, ...]
    warnings: tuple[str, ...]
    wanted: int
    minimum: int
    unknown: tuple[str, ...] = ()   # unknown checks of nodes kept under `unknown = "keep"`
    master_addr: str = ""           # where rank 0 listens: the first chosen node's NodeAddr ("" when none chosen)

    @property
    def ok(self) -> bool:
        return len(self.healthy) >= self.minimum

    def failure_line(self, limit: int = FAILURE_LINE_MAX) -> str:
        """One line: nodes folded by cause (`node[2-3] lost during the gate: ...`), within `limit`.

        Failures come first, then "could not be checked: " and the causes of nodes left out only
        because checks could not decide. A cause's detail is shown where all its nodes share it
        and the line has room; the rest is cut with "..." (report.txt has everything).
        """
        head = f"only {len(self.healthy)} of {len(self.allocated)} nodes healthy, need {self.minimum}: "
        groups: dict[tuple[bool, str], list[tuple[str, str]]] = {}
        for exclusion in sorted(self.excluded, key=lambda e: e.status == "unknown"):
            for reason in exclusion.reasons:
                key = (exclusion.status == "unknown", reason.cause)
                groups.setdefault(key, []).append((exclusion.host, reason.detail))
        if not groups:
            # every node checked passed: the check was asked of fewer nodes than the job needs
            return _one_line(head + "no node failed; fewer nodes were checked than are needed", limit)
        # causes shared by exactly the same nodes (more than one) are named together, once:
        # "gpu[1-4] gpu.count, host.cpus"; one node's causes stay apart, each with its detail
        merged: dict[tuple[bool, frozenset[str] | str], list[tuple[str, list[tuple[str, str]]]]] = {}
        for (unknown, cause), items in groups.items():
            hosts = frozenset(h for h, _ in items)
            merged.setdefault((unknown, hosts if len(hosts) > 1 else cause), []).append((cause, items))
        first_unknown = next((i for i, (unknown, _) in enumerate(merged) if unknown), None)
        bare = [("could not be checked: " if i == first_unknown else "")
                + f"{_short_hostlist(sorted({h for _, items in causes for h, _ in items}))} "
                + ", ".join(cause for cause, _ in causes)
                for i, causes in enumerate(merged.values())]
        details = [causes[0][1][0][1] if len(causes) == 1 and len({d for _, d in causes[0][1]}) == 1 else None
                   for causes in merged.values()]
        parts = list(bare)
        for index, detail in enumerate(details):  # add details in order while they fit
            if detail:
                trial = parts[:index] + [f"{bare[index]}: {detail}"] + parts[index + 1:]
                if len(head + "; ".join(trial)) <= limit:
                    parts = trial
        return _one_line(head + "; ".join(parts), limit)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "allocated": list(self.allocated), "healthy": list(self.healthy),
                "chosen": list(self.chosen), "wanted": self.wanted, "minimum": self.minimum,
                "excluded": [{"host": e.host, "status": e.status, "reasons": [str(r) for r in e.reasons],
                              "lost": any(r.cause == LOST for r in e.reasons)} for e in self.excluded],
                "warnings": list(self.warnings), "unknown": list(self.unknown), "master_addr": self.master_addr}

    @classmethod
    def from_json(cls, data: Any) -> Decision:
        """The decision `to_json` wrote; ValueError for anything else."""
        def names(key: str) -> tuple[str, ...]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                raise ValueError(f"{key}: not a list of names")
            return tuple(value)

        def count(key: str) -> int:
            value = data.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1 << 31:
                raise ValueError(f"{key}: not a count")
            return value

        if not isinstance(data, dict) or not isinstance(data.get("excluded", []), list):
            raise ValueError("not a decision")
        master_addr = data.get("master_addr", "")
        if not isinstance(master_addr, str) or not master_addr.isprintable() or len(master_addr) > 255:
            raise ValueError("master_addr: not an address")
        excluded = []
        for item in data.get("excluded", []):
            reasons = item.get("reasons", []) if isinstance(item, dict) else None
            if (not isinstance(item, dict) or not isinstance(item.get("host"), str) or not isinstance(reasons, list)
                    or not all(isinstance(reason, str) for reason in reasons)):
                raise ValueError("excluded: not a list of nodes with reasons")
            excluded.append(Exclusion(item["host"], tuple(Reason.read(reason) for reason in reasons),
                                      "unknown" if item.get("status") == "unknown" else "fail"))
        return cls(names("allocated"), names("healthy"), names("chosen"), tuple(excluded), names("warnings"),
                   count("wanted"), count("minimum"), names("unknown"), master_addr)


def _short_hostlist(hosts: list[str]) -> str:
    """The folded hostlist, or where it is long (thousands of scattered nodes), its first nodes
    and how many more: "41 nodes (gpu[0004,0104,0204] and 38 more)"; report.txt has them all."""
    folded = fold_hostlist(hosts)
    if len(folded) <= HOSTLIST_MAX:
        return folded
    shown = 1
    while shown < len(hosts) and len(fold_hostlist(hosts[:shown + 1])) <= HOSTLIST_MAX // 2:
        shown += 1
    return f"{len(hosts)} nodes ({fold_hostlist(hosts[:shown])} and {len(hosts) - shown} more)"


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."
