"""The gate's decision: which allocated nodes the job runs on, and why the others do not (pure).

Inputs are what `trainctl gate node` left in the gate directory: one health report per
node (the `health check --json` shape) and the fabric test's report from rank 0. A node is
left out when its node checks fail or cannot decide (fail, unknown), when the fabric test
excludes it, or when it left no report at all. Warnings are kept in the report but do not
exclude a node: the site chose its thresholds for failures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXCLUDING_STATUSES = ("fail", "unknown")


@dataclass(frozen=True)
class Exclusion:
    host: str
    reasons: tuple[str, ...]

    def summary(self) -> str:
        return f"{self.host} {'; '.join(self.reasons)}"


@dataclass(frozen=True)
class Decision:
    allocated: tuple[str, ...]
    healthy: tuple[str, ...]
    chosen: tuple[str, ...]
    excluded: tuple[Exclusion, ...]
    warnings: tuple[str, ...]
    wanted: int
    minimum: int

    @property
    def ok(self) -> bool:
        return len(self.healthy) >= self.minimum

    def failure_line(self) -> str:
        reasons = "; ".join(e.summary() for e in self.excluded) or "no node reported"
        return (f"only {len(self.healthy)} of {len(self.allocated)} nodes healthy, need {self.minimum}: "
                f"{reasons}")

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "allocated": list(self.allocated), "healthy": list(self.healthy),
                "chosen": list(self.chosen), "wanted": self.wanted, "minimum": self.minimum,
                "excluded": [{"host": e.host, "reasons": list(e.reasons)} for e in self.excluded],
                "warnings": list(self.warnings)}


def decide(allocated: list[str], node_reports: dict[str, dict], fabric: dict | None,
           wanted: int, minimum: int) -> Decision:
    """Choose up to `wanted` healthy nodes in allocation order; `minimum` decides success."""
    reasons: dict[str, list[str]] = {host: [] for host in allocated}
    warnings: list[str] = []
    for host in allocated:
        report = node_reports.get(host)
        if report is None:
            reasons[host].append("no health report (the gate did not run or finish on this node)")
            continue
        for check in report["checks"]:
            if check["status"] in EXCLUDING_STATUSES:
                reasons[host].append(f"{check['name']}: {check['reason']}")
            elif check["status"] == "warn":
                warnings.append(f"{host} {check['name']}: {check['reason']}")
    if fabric is None:
        if len(allocated) > 1:
            # rank 0 coordinates the test; without its report nothing was judged, and the
            # most likely cause is rank 0's own node
            reasons[allocated[0]].append("fabric: the fabric test's coordinator (rank 0) left no report")
    else:
        by_host = {item["host"]: item["reason"] for item in fabric["excluded"]}
        for host in allocated:
            if host in by_host:
                reasons[host].append(f"fabric: {by_host[host]}")
        for host, node in fabric["nodes"].items():
            if node["status"] == "warn" and host in reasons:
                warnings.append(f"{host} fabric: {node['reason']}")
        warnings += [f"fabric: {item['reason']}" for item in fabric["excluded"] if item["host"] not in reasons]
    healthy = tuple(host for host in allocated if not reasons[host])
    return Decision(
        allocated=tuple(allocated),
        healthy=healthy,
        chosen=healthy[:wanted] if len(healthy) >= minimum else (),
        excluded=tuple(Exclusion(host, tuple(found)) for host, found in reasons.items() if found),
        warnings=tuple(warnings),
        wanted=wanted,
        minimum=minimum,
    )


def format_report(decision: Decision, fabric: dict | None) -> str:
    """The gate report a user reads in the job's directory."""
    lines = [f"trainctl gate: {len(decision.healthy)} of {len(decision.allocated)} nodes healthy; "
             f"job wants {decision.wanted}, needs at least {decision.minimum}"]
    if decision.ok:
        lines.append(f"job runs on: {', '.join(decision.chosen)}")
    else:
        lines.append(f"job does not run: {decision.failure_line()}")
    for exclusion in decision.excluded:
        lines.append(f"excluded {exclusion.host}:")
        lines += [f"  - {reason}" for reason in exclusion.reasons]
    for warning in decision.warnings:
        lines.append(f"warning: {warning}")
    if fabric is not None:
        lines.append(f"fabric: {fabric['joined']} of {fabric['world']} joined, judged at "
                     f"{fabric['judged_size'] / (1 << 20):g} MiB, pair reference "
                     f"{_gbps(fabric.get('pair_reference_gbps'))}")
        for host, node in sorted(fabric["nodes"].items(), key=lambda item: item[1]["rank"]):
            partners = ", ".join(f"{peer} {bw:.2f}" for peer, bw in sorted((node.get("inter_busbw_gbps") or {}).items()))
            lines.append(f"  {host:<12} {node['status']:<7} {partners or '-'}")
    return "\n".join(lines) + "\n"


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GB/s"
