"""The fabric test's verdict: from every rank's measurements to per-node status (pure).

Inputs are what the ranks sent back through the store (plain dicts, as JSON carried them)
and the roster rank 0 closed at the join deadline. Blame on the pairwise figures is the
pure `assign_blame`; this module adds what only the whole picture shows: nodes that never
joined, nodes that died before reporting, and intra-node figures far below their peers'.
Intra-node figures are judged only for NCCL on GPUs: the CPU stand-in (gloo over loopback)
measures the host's shared cores, which says nothing about a node's GPUs and, on the test
cluster, where all nodes share one machine, only measures the neighbours' load.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from trainctl.health.fabric.blame import BlameReport, Verdict, assign_blame
from trainctl.health.fabric.schedule import plan_retests
from trainctl.health.status import Status

Pair = tuple[int, int]


def pair_figures(results: Mapping[int, dict], positions: Mapping[str, int], size: int) -> dict[Pair, float]:
    """busbw of every measured pair at `size`, keyed by roster positions; failed pairs left out."""
    figures: dict[Pair, float] = {}
    for result in results.values():
        for m in result["inter"]:
            if m["size"] == size and m["error"] is None:
                a, b = (positions[h] for h in m["peers"])
                key = (min(a, b), max(a, b))
                # both sides time the same collective; the slower view is the pair's figure
                figures[key] = min(figures.get(key, m["busbw_gbps"]), m["busbw_gbps"])
    return figures


def retest_rounds(results: Mapping[int, dict], positions: Mapping[str, int], size: int,
                  straggler_factor: float, floor_gbps: float | None) -> list[list[Pair]]:
    """Pairs that tell which side of an unexplained slow pair is slow (known-good partners)."""
    figures = pair_figures(results, positions, size)
    if not figures:
        return []
    blame = assign_blame(figures, straggler_factor=straggler_factor, floor_gbps=floor_gbps)
    plan = plan_retests(blame.needs_retest, blame.known_good, measured=figures)
    return [list(r) for r in plan.rounds]


def build_report(*, results: Mapping[int, dict], roster: dict, world: int, sizes: tuple[int, ...],
                 rounds: int, retests: list[list[Pair]], straggler_factor: float,
                 floor_gbps: float | None, join_timeout_s: float, duration_s: float) -> dict[str, Any]:
    members = [int(r) for r in roster["joined"]]
    hosts = {int(rank): host for rank, host in roster["hosts"].items()}
    positions = {hosts[rank]: i for i, rank in enumerate(members)}
    judged_size = max(sizes)  # bandwidth problems show at the largest message
    nodes: dict[str, dict[str, Any]] = {}
    excluded: list[dict[str, str]] = []

    expected = roster.get("expected") or []
    for rank in roster["missing"]:
        label = expected[rank] if rank < len(expected) else f"rank {rank}"
        nodes[label] = _node(rank, Status.FAIL, f"did not join within {join_timeout_s:g} s")
    for rank in members:
        if rank not in results:
            nodes[hosts[rank]] = _node(rank, Status.FAIL, "joined but sent no results (died or hung mid-test)")

    figures = pair_figures(results, positions, judged_size)
    blame = assign_blame(figures, straggler_factor=straggler_factor, floor_gbps=floor_gbps) if figures else None
    intra = _intra_figures(results, judged_size)
    intra_reference = statistics.median(intra.values()) if len(intra) >= 2 else None

    for rank in members:
        host = hosts[rank]
        if host in nodes:
            continue
        status, reasons = Status.OK, []
        node_blame = _blame_for(blame, positions[host])
        if node_blame is not None and node_blame.verdict is Verdict.STRAGGLER:
            status, reasons = Status.FAIL, [f"straggler: {node_blame.reason}"]
        elif node_blame is not None and node_blame.verdict is Verdict.SUSPECT:
            status, reasons = Status.WARN, [f"suspect: {node_blame.reason}"]
        failed_pairs = _failed_pairs(results[rank])
        if failed_pairs:
            reasons += failed_pairs
            status = max(status, Status.WARN)
        if host in intra and intra_reference and results[rank]["backend"] == "nccl" \
                and intra[host] < straggler_factor * intra_reference:
            status = Status.FAIL
            reasons.append(f"intra-node busbw {intra[host]:.2f} GB/s < {straggler_factor:g} x "
                           f"peers' median {intra_reference:.2f} GB/s")
        if not figures and not failed_pairs and len(members) > 1:
            status = max(status, Status.UNKNOWN)
            reasons.append("no inter-node figures")
        nodes[host] = _node(rank, status, "; ".join(reasons) or "ok")
        nodes[host]["intra_busbw_gbps"] = intra.get(host)
        nodes[host]["inter_busbw_gbps"] = _partners(figures, positions[host], members, hosts)

    for host, node in nodes.items():
        if node["status"] == Status.FAIL.label:
            excluded.append({"host": host, "reason": node["reason"]})
    worst = max((Status[n["status"].upper()] for n in nodes.values()), default=Status.UNKNOWN)
    return {
        "status": worst.label,
        "world": world,
        "joined": len(members),
        "sizes": list(sizes),
        "judged_size": judged_size,
        "rounds": rounds,
        "retest_rounds": len(retests),
        "straggler_factor": straggler_factor,
        "floor_gbps": floor_gbps,
        "pair_reference_gbps": blame.pair_reference_gbps if blame else None,
        "duration_s": round(duration_s, 3),
        "nodes": nodes,
        "pairs": _pair_rows(results),
        "excluded": excluded,
    }


def _node(rank: int, status: Status, reason: str) -> dict[str, Any]:
    return {"rank": rank, "status": status.label, "reason": reason}


def _blame_for(blame: BlameReport | None, position: int):
    if blame is None:
        return None
    return next((n for n in blame.nodes if n.node == position), None)


def _failed_pairs(result: dict) -> list[str]:
    seen = []
    for m in result["inter"]:
        if m["error"] and m["error"] not in seen:
            seen.append(m["error"])
    return [f"pair failed {error}" for error in seen]


def _intra_figures(results: Mapping[int, dict], size: int) -> dict[str, float]:
    figures = {}
    for result in results.values():
        for m in result["intra"]:
            if m["size"] == size and m["error"] is None:
                figures[result["host"]] = m["busbw_gbps"]
    return figures


def _partners(figures: Mapping[Pair, float], position: int, members: list[int],
              hosts: Mapping[int, str]) -> dict[str, float]:
    out = {}
    for (a, b), busbw in figures.items():
        if position in (a, b):
            other = b if a == position else a
            out[hosts[members[other]]] = round(busbw, 4)
    return out


def _pair_rows(results: Mapping[int, dict]) -> list[dict[str, Any]]:
    rows, seen = [], set()
    for rank in sorted(results):
        for m in results[rank]["inter"]:
            key = (tuple(m["peers"]), m["size"])
            if key in seen:
                continue
            seen.add(key)
            rows.append({"a": m["peers"][0], "b": m["peers"][1], "size": m["size"],
                         "median_us": None if m["median_s"] is None else round(m["median_s"] * 1e6, 1),
                         "algbw_gbps": m["algbw_gbps"], "busbw_gbps": m["busbw_gbps"], "error": m["error"]})
    return rows
