"""The gate's decision: which allocated nodes the job runs on, and why the others do not (pure).

Inputs are what `trainctl gate node` left in the gate directory: one health report per
node (the `health check --json` shape), the fabric test's report from rank 0 and the compute
test's verdicts. A node is left out when its node checks fail, when the fabric or compute
test excludes it, or when it left no report at all. A node whose checks could not decide
(unknown) is left out too by default, but reported apart from the failures; the site's
`[gate] unknown = "keep"` keeps it and lists the unknown checks instead. A node that died or
hung during the gate (no report by the deadline, or the fabric test says it never joined or
fell silent) is "lost during the gate". Warnings are kept in the report but do not exclude a
node: the site chose its thresholds for failures. With more healthy nodes than wanted, the
fastest the fabric test measured are chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainctl.health.compute.judge import GpuVerdict
from trainctl.gate_reasons import Reason
from trainctl.job.decision import LOST, Decision, Exclusion
from trainctl.health.fabric.report import NOT_JUDGED, FabricReport
from trainctl.health.versions import odd_nodes_out, versions_from_reports

UNKNOWN_POLICIES = ("exclude", "keep")   # the site's `[gate] unknown`
# The gate's deadline beyond its parts' own timeouts: a probe is killed within 1 s of its
# timeout, the fabric watchdog fires 5 s after the fabric deadline, and srun must start a task
# per node and Python must import torch on every node first (slow on a busy node).
PROBE_KILL_SLACK_S = 1.0
FABRIC_WATCHDOG_SLACK_S = 5.0
STARTUP_MARGIN_S = 15.0


def gate_deadline_s(probe_timeout_s: float, fabric_timeout_s: float, compute_s: float = 0.0) -> float:
    """How long the gate may take as a whole: node checks, the compute test (`compute_s`, see
    `job.gate_compute.compute_deadline_s`), then the fabric test, plus margins."""
    return (probe_timeout_s + PROBE_KILL_SLACK_S + compute_s + fabric_timeout_s + FABRIC_WATCHDOG_SLACK_S
            + STARTUP_MARGIN_S)


def decide(allocated: list[str], node_reports: dict[str, dict], fabric: FabricReport | None,
           wanted: int, minimum: int, missing: str | None = None, unknown_policy: str = "exclude",
           compute_reasons: Mapping[str, list[str]] | None = None, odd_node_fails: bool = False) -> Decision:
    """Choose up to `wanted` healthy nodes, the fastest the fabric test measured (allocation order
    among equals and unmeasured ones), listed in allocation order; `minimum` decides success.

    `missing`: why a node without a report is missing when the caller waited for the reports
    ("no report within 91 s"): such a node is lost during the gate. Without it, a missing
    report only says that the gate did not run or finish there.
    `compute_reasons`: host -> why the compute test excludes it (`compute.judge.node_reasons`).
    A node whose versions differ from the job's majority (health/versions.py) is named as a
    warning, or left out where the site says `odd_node_out = "fail"`.
    """
    if unknown_policy not in UNKNOWN_POLICIES:
        raise ValueError(f"unknown policy {unknown_policy!r}, not one of {UNKNOWN_POLICIES}")
    reasons: dict[str, list[Reason]] = {host: [] for host in allocated}
    undecided: dict[str, list[Reason]] = {host: [] for host in allocated}
    warnings: list[str] = []
    fabric_lost = {host for host, node in fabric.nodes.items() if node.lost} if fabric else set()
    for host in allocated:
        report = node_reports.get(host)
        if report is None:
            if host in fabric_lost:
                continue  # the fabric test says when and how it was lost
            reasons[host].append(Reason(LOST, missing) if missing else
                                 Reason("no health report", "the gate did not run or finish on this node"))
            continue
        for check in report["checks"]:
            if check["status"] == "fail":
                reasons[host].append(Reason(check["name"], check["reason"]))
            elif check["status"] == "warn":
                warnings.append(f"{host} {check['name']}: {check['reason']}")
            elif check["status"] != "ok":   # unknown, or a status this trainctl does not know
                undecided[host].append(Reason(check["name"], check["reason"]))
    for odd in odd_nodes_out(versions_from_reports({h: r for h, r in node_reports.items() if h in reasons})):
        if odd_node_fails:
            reasons[odd.host].append(Reason("node.versions: odd node out", odd.describe()))
        else:
            warnings.append(f"{odd.host} node.versions: odd node out: {odd.describe()}")
    if fabric is None:
        if len(allocated) > 1:
            # rank 0 coordinates the test; without its report nothing was judged, and the
            # most likely cause is rank 0's own node
            reasons[allocated[0]].append(Reason("fabric", "the fabric test's coordinator (rank 0) left no report"))
    else:
        by_host = {item.host: item.reason for item in fabric.excluded}
        for host in allocated:
            if host in fabric_lost:
                reasons[host].append(Reason(LOST, f"fabric test: {by_host.get(host, 'lost')}"))
            elif host in by_host:
                reasons[host].append(_fabric_reason(by_host[host]))
        for host, node in fabric.nodes.items():
            if node.status == "warn" and host in reasons:
                warnings.append(f"{host} fabric: {node.reason}")
        warnings += [f"fabric: {item.reason}" for item in fabric.excluded if item.host not in reasons]
        if fabric.status == NOT_JUDGED:  # not excluding, but never to pass for "ok"
            unjudged = [host for host, node in fabric.nodes.items() if node.status == NOT_JUDGED]
            reason = next(fabric.nodes[host].reason for host in unjudged)
            warnings.append(f"fabric: {', '.join(unjudged)}: {reason}")
    for host, found in (compute_reasons or {}).items():
        if host in reasons:
            reasons[host] += [_compute_reason(text) for text in found]
    excluding_unknown = unknown_policy == "exclude"
    healthy = tuple(host for host in allocated
                    if not reasons[host] and not (excluding_unknown and undecided[host]))
    excluded = []
    for host in allocated:
        if reasons[host]:
            excluded.append(Exclusion(host, tuple(reasons[host] + undecided[host]), "fail"))
        elif undecided[host] and excluding_unknown:
            excluded.append(Exclusion(host, tuple(undecided[host]), "unknown"))
    kept_unknown = () if excluding_unknown else tuple(
        f"{host} {reason}" for host in allocated if host in healthy for reason in undecided[host])
    return Decision(
        allocated=tuple(allocated),
        healthy=healthy,
        chosen=_fastest(healthy, fabric, wanted) if len(healthy) >= minimum else (),
        excluded=tuple(excluded),
        warnings=tuple(warnings),
        wanted=wanted,
        minimum=minimum,
        unknown=kept_unknown,
    )


def _fastest(healthy: tuple[str, ...], fabric: FabricReport | None, wanted: int) -> tuple[str, ...]:
    """The `wanted` nodes with the best measured busbw, in allocation order."""
    figure = {host: fabric.busbw_gbps(host) if fabric else None for host in healthy}
    ranked = sorted(healthy, key=lambda host: (figure[host] is None, -(figure[host] or 0.0)))
    keep = set(ranked[:wanted])
    return tuple(host for host in healthy if host in keep)


def _fabric_reason(text: str) -> Reason:
    """"straggler: slow against ..." folds as "fabric: straggler"."""
    kind, sep, detail = text.partition(": ")
    return Reason(f"fabric: {kind}", detail) if sep and " " not in kind else Reason("fabric", text)


def _compute_reason(text: str) -> Reason:
    """"compute fail-slow: GPU 5 (...): ..." folds as "compute fail-slow"."""
    cause, _, detail = text.partition(": ")
    return Reason(cause, detail)


def format_report(decision: Decision, fabric: FabricReport | None, compute: Sequence[GpuVerdict] = ()) -> str:
    """The gate report a user reads in the job's directory."""
    lines = [f"trainctl gate: {len(decision.healthy)} of {len(decision.allocated)} nodes healthy; "
             f"job wants {decision.wanted}, needs at least {decision.minimum}"]
    if decision.ok:
        lines.append(f"job runs on: {', '.join(decision.chosen)}")
    else:
        lines.append(f"job does not run: {decision.failure_line()}")
    for exclusion in decision.excluded:
        why = " (could not be checked: unknown)" if exclusion.status == "unknown" else ""
        lines.append(f"excluded {exclusion.host}{why}:")
        lines += [f"  - {reason}" for reason in exclusion.reasons]
    for warning in decision.warnings:
        lines.append(f"warning: {warning}")
    for unknown in decision.unknown:
        lines.append(f"unknown (kept by site policy): {unknown}")
    if fabric is not None:
        lines.append(f"fabric: {fabric.joined} of {fabric.world} joined, judged at "
                     f"{fabric.judged_size / (1 << 20):g} MiB, reference {_gbps(fabric.reference_gbps)}; "
                     f"per node: best busbw, then each partner's")
        for host, node in sorted(fabric.nodes.items(), key=lambda item: item[1].rank):
            figures = node.figures
            partners = ", ".join(f"{peer} {bw:.2f}" for peer, bw in sorted(figures.inter_busbw_gbps.items())) \
                if figures else ""
            best = _gbps(figures.busbw_gbps if figures else None)
            lines.append(f"  {host:<12} {node.status:<10} {best:>10}  {partners or '-'}")
    if compute:
        lines.append("compute (matmul TFLOPS, device-copy GB/s; x the job's median of the same model):")
        for verdict in compute:
            f = verdict.figures
            ratio = "" if verdict.tflops_ratio is None else f" {_ratio(verdict.tflops_ratio)} / {_ratio(verdict.copy_ratio)}"
            lines.append(f"  {f.host:<12} {f.label:<28} {verdict.status:<10} {f.tflops:.3g} TFLOPS "
                         f"{f.copy_gbps:.3g} GB/s{ratio}")
    return "\n".join(lines) + "\n"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GB/s"
