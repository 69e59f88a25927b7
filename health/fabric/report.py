"""The fabric test's verdict: from every rank's measurements to per-node status (pure).

Inputs are what the ranks sent back through the store (plain dicts, as JSON carried them)
and the roster rank 0 closed at the join deadline. Blame on the pairwise figures is the
pure `assign_blame`; this module adds what only the whole picture shows: nodes that never
joined, nodes that died before reporting, and intra-node figures far below their peers'.
Every node named a straggler by the first rounds has its slow pairs with known-good partners
measured again (`retest_rounds`), and so has a reference that rests on one or two pairs; a
pair measured twice keeps its latest figure. A healthy node's dip under a neighbour's load
does not repeat, nor does one lucky pair that made two healthy nodes of four look slow, while
a slow link is slow every time.
Intra-node figures are judged only for NCCL on GPUs: the CPU stand-in (gloo over loopback)
measures the host's shared cores, which says nothing about a node's GPUs and, on the test
cluster, where all nodes share one machine, only measures the neighbours' load.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from typing import Any

from trainctl.health.fabric.blame import BlameReport, Verdict, assign_blame
from trainctl.health.fabric.schedule import disjoint_rounds, plan_retests, rail_ranks
from trainctl.health.status import Status

Pair = tuple[int, int]
NOT_JUDGED = Verdict.NOT_JUDGED.value  # a node and report status of its own, never "ok"


def exit_status(report: Mapping[str, Any]) -> Status:
    """The exit code's status: "not judged" exits like unknown (3), nothing was decided."""
    status = report["status"]
    return Status.UNKNOWN if status == NOT_JUDGED else Status(status)


def pair_figures(results: Mapping[int, dict], positions: Mapping[str, int], size: int) -> dict[Pair, float]:
    """busbw of every measured pair at `size`, keyed by roster positions; failed pairs left out.

    Both sides time the same collective: the slower view is that measurement's figure. A pair
    measured again (a re-test) keeps its latest measurement.
    """
    views: dict[tuple[Pair, int], list[float]] = {}
    for result in results.values():
        sessions: Counter[Pair] = Counter()  # each side lists a pair's measurements in the same order
        for m in result["inter"]:
            if m["size"] != size or not all(h in positions for h in m["peers"]):
                continue
            a, b = (positions[h] for h in m["peers"])
            key = (min(a, b), max(a, b))
            session = sessions[key]
            sessions[key] += 1
            if m["error"] is None:
                views.setdefault((key, session), []).append(m["busbw_gbps"])
    latest: dict[Pair, int] = {}
    for key, session in views:
        latest[key] = max(latest.get(key, session), session)
    return {key: min(views[(key, session)]) for key, session in latest.items()}


def retest_rounds(results: Mapping[int, dict], positions: Mapping[str, int], size: int,
                  straggler_factor: float, floor_gbps: float | None) -> list[list[Pair]]:
    """Re-test rounds: suspects against known-good partners they have not met (which side of a
    slow pair is slow), then every straggler's slow pairs with known-good partners once more,
    with the reference's own pairs where it rests on one or two (are they fast every time?)."""
    figures = pair_figures(results, positions, size)
    if not figures:
        return []
    blame = assign_blame(figures, straggler_factor=straggler_factor, floor_gbps=floor_gbps)
    good = set(blame.known_good)
    split = plan_retests(blame.needs_retest, blame.fastest_first(good), measured=figures)
    again = [(node.node, partner) for node in blame.nodes if node.verdict is Verdict.STRAGGLER
             for partner in node.slow_partners if partner in good]
    if again and len(blame.reference_pairs) <= 2:
        again += blame.reference_pairs
    confirm = disjoint_rounds(again)
    return [list(r) for r in split.rounds + confirm]


def build_report(*, results: Mapping[int, dict], roster: dict, world: int, sizes: tuple[int, ...],
                 rounds: int, retests: list[list[Pair]], straggler_factor: float,
                 floor_gbps: float | None, join_timeout_s: float, duration_s: float,
                 lost: Mapping[int, str] | None = None) -> dict[str, Any]:
    """`lost`: ranks whose heartbeat fell silent mid-test, and why; they are failures, marked lost."""
    lost = lost or {}
    members = [int(r) for r in roster["joined"]]
    hosts = {int(rank): host for rank, host in roster["hosts"].items()}
    positions = {hosts[rank]: i for i, rank in enumerate(members)}
    judged_size = max(sizes)  # bandwidth problems show at the largest message
    nodes: dict[str, dict[str, Any]] = {}
    excluded: list[dict[str, str]] = []

    expected = roster.get("expected") or []
    for rank in roster["missing"]:
        label = expected[rank] if rank < len(expected) else f"rank {rank}"
        nodes[label] = _node(rank, Status.FAIL, f"did not join within {join_timeout_s:g} s", lost=True)
    for rank in members:
        if rank in lost:
            nodes[hosts[rank]] = _node(rank, Status.FAIL, lost[rank], lost=True)
        elif rank not in results:
            nodes[hosts[rank]] = _node(rank, Status.FAIL, "joined but sent no results (died or hung mid-test)",
                                       lost=True)

    figures = pair_figures(results, positions, judged_size)
    blame = assign_blame(figures, straggler_factor=straggler_factor, floor_gbps=floor_gbps) if figures else None
    intra = _intra_figures(results, judged_size)
    intra_reference = statistics.median(intra.values()) if len(intra) >= 2 else None

    blame_by_node = {node.node: node for node in blame.nodes} if blame else {}
    partners = _partners_by_position(figures, members, hosts)
    for rank in members:
        host = hosts[rank]
        if host in nodes:
            continue
        status, reasons = Status.OK, []
        node_blame = blame_by_node.get(positions[host])
        not_judged = node_blame is not None and node_blame.verdict is Verdict.NOT_JUDGED
        if not_judged:
            reasons = [node_blame.reason]
        elif node_blame is not None and node_blame.verdict is Verdict.STRAGGLER:
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
        if not_judged and status is Status.OK:
            nodes[host]["status"] = NOT_JUDGED  # nothing to compare with: never "ok"
        nodes[host]["busbw_gbps"] = None if node_blame is None else round(node_blame.best_busbw_gbps, 4)
        nodes[host]["intra_busbw_gbps"] = intra.get(host)
        nodes[host]["inter_busbw_gbps"] = partners.get(positions[host], {})

    for host, node in nodes.items():
        if node["status"] == Status.FAIL.label:
            excluded.append({"host": host, "reason": node["reason"]})
    judged = [Status(n["status"]) for n in nodes.values() if n["status"] != NOT_JUDGED]
    worst = Status.worst(judged, default=Status.OK if nodes else Status.UNKNOWN)
    return {
        "status": NOT_JUDGED if worst is Status.OK and len(judged) < len(nodes) else worst.label,
        "world": world,
        "joined": len(members),
        "sizes": list(sizes),
        "judged_size": judged_size,
        "rounds": rounds,
        "retest_rounds": len(retests),
        "straggler_factor": straggler_factor,
        "floor_gbps": floor_gbps,
        "reference_gbps": blame.reference_gbps if blame else None,
        "pair_reference_gbps": blame.pair_reference_gbps if blame else None,
        "duration_s": round(duration_s, 3),
        "nodes": nodes,
        "pairs": _pair_rows(results),
        "excluded": excluded,
    }


def rail_label(rail: int, name: str) -> str:
    """How a report names a rail: "rail 1 (eth1)", "rail 5 (mlx5_5:1)"."""
    return f"rail {rail} ({name})"


def rail_results(results: Mapping[int, dict], rail: int, rail_count: int) -> dict[int, dict]:
    """The results of `rail`'s ranks: with R rails, node n's rail r is rank n x R + r."""
    return {rank: results[rank] for rank in rail_ranks(results, rail, rail_count)}


def rail_positions(members: list[int], hosts: Mapping[str, str], rail: int, rail_count: int) -> dict[str, int]:
    """Host -> its position among `rail`'s joined ranks: the index the rail's pairing rounds use."""
    return {hosts[str(rank)]: i for i, rank in enumerate(rail_ranks(members, rail, rail_count))}


def build_rails_report(*, results: Mapping[int, dict], roster: dict, rails: tuple[str, ...],
                       sizes: tuple[int, ...], rounds: int, retests: int, straggler_factor: float,
                       floor_gbps: float | None, join_timeout_s: float, duration_s: float,
                       lost: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The report of a test with one rank per rail (node n's rail r is rank n x R + r).

    Each rail is judged on its own, against the same rail's pairs across nodes, with the same
    blame as one rail; a node is as bad as its worst rail, and every reason names the rail.
    `rounds` and `retests` count rounds (every rail runs its rounds at the same time).
    """
    lost = lost or {}
    rail_count = len(rails)
    members = [int(r) for r in roster["joined"]]
    hosts = {int(rank): host for rank, host in roster["hosts"].items()}
    expected = roster.get("expected") or []
    world = len(expected) // rail_count if expected else None
    judged_size = max(sizes)

    def host_of(rank: int) -> str:
        return hosts.get(rank) or (expected[rank] if rank < len(expected) else f"node {rank // rail_count}")

    all_ranks = sorted(set(members) | set(roster["missing"]))
    order = list(dict.fromkeys(host_of(rank) for rank in all_ranks))
    first_rank = {host: min(r for r in all_ranks if host_of(r) == host) for host in order}
    statuses = {host: [Status.OK] for host in order}
    reasons: dict[str, list[str]] = {host: [] for host in order}
    lost_hosts: set[str] = set()
    not_judged: set[str] = set()
    per_rail: dict[str, dict[str, dict[str, Any]]] = {host: {} for host in order}

    def note(host: str, status: Status, reason: str) -> None:
        statuses[host].append(status)
        reasons[host].append(reason)

    for rank in roster["missing"]:
        lost_hosts.add(host_of(rank))
        note(host_of(rank), Status.FAIL, f"{rail_label(rank % rail_count, rails[rank % rail_count])}: "
                                         f"did not join within {join_timeout_s:g} s")
    for rank in members:
        label = rail_label(rank % rail_count, rails[rank % rail_count])
        if rank in lost:
            lost_hosts.add(host_of(rank))
            note(host_of(rank), Status.FAIL, f"{label}: {lost[rank]}")
        elif rank not in results:
            lost_hosts.add(host_of(rank))
            note(host_of(rank), Status.FAIL, f"{label}: joined but sent no results (died or hung mid-test)")

    references: dict[str, float | None] = {}
    for rail, name in enumerate(rails):
        label = rail_label(rail, name)
        ranks = rail_ranks(members, rail, rail_count)
        positions = rail_positions(members, roster["hosts"], rail, rail_count)
        measured = rail_results(results, rail, rail_count)
        figures = pair_figures(measured, positions, judged_size)
        blame = assign_blame(figures, straggler_factor=straggler_factor, floor_gbps=floor_gbps) if figures else None
        references[name] = blame.reference_gbps if blame else None
        blame_by_position = {node.node: node for node in blame.nodes} if blame else {}
        partners = _partners_by_position(figures, ranks, hosts)
        for rank in ranks:
            host = hosts[rank]
            if rank in lost or rank not in results:
                continue
            node_blame = blame_by_position.get(positions[host])
            ratio = (node_blame.best_busbw_gbps / blame.reference_gbps
                     if node_blame is not None and blame.reference_gbps else None)
            judged = f"{label}: {ratio:.2f}x the rail's reference {blame.reference_gbps:.2f} GB/s, " \
                if ratio is not None else f"{label}: "
            if node_blame is not None and node_blame.verdict is Verdict.NOT_JUDGED:
                not_judged.add(host)
                reasons[host].append(f"{label}: {node_blame.reason}")
            elif node_blame is not None and node_blame.verdict is Verdict.STRAGGLER:
                note(host, Status.FAIL, f"straggler: {judged}{node_blame.reason}")
            elif node_blame is not None and node_blame.verdict is Verdict.SUSPECT:
                note(host, Status.WARN, f"suspect: {judged}{node_blame.reason}")
            for failed in _failed_pairs(results[rank]):
                note(host, Status.WARN, f"{label}: {failed}")
            if not figures and len(ranks) > 1 and not _failed_pairs(results[rank]):
                note(host, Status.UNKNOWN, f"{label}: no inter-node figures")
            per_rail[host][name] = {
                "rank": rank, "busbw_gbps": None if node_blame is None else round(node_blame.best_busbw_gbps, 4),
                "ratio": None if ratio is None else round(ratio, 4),
                "inter_busbw_gbps": partners.get(positions[host], {})}

    intra_results = rail_results(results, 0, rail_count)
    intra = _intra_figures(intra_results, judged_size)
    intra_reference = statistics.median(intra.values()) if len(intra) >= 2 else None
    for result in intra_results.values():
        host = result["host"]
        if host in intra and intra_reference and result["backend"] == "nccl" \
                and intra[host] < straggler_factor * intra_reference:
            note(host, Status.FAIL, f"intra-node busbw {intra[host]:.2f} GB/s < {straggler_factor:g} x "
                                    f"peers' median {intra_reference:.2f} GB/s")

    nodes: dict[str, dict[str, Any]] = {}
    for host in order:
        status = Status.worst(statuses[host], default=Status.OK)
        nodes[host] = _node(first_rank[host], status, "; ".join(reasons[host]) or "ok", lost=host in lost_hosts)
        if host in not_judged and status is Status.OK:
            nodes[host]["status"] = NOT_JUDGED  # nothing to compare with: never "ok"
        figures_by_rail = per_rail[host]
        bests = [r["busbw_gbps"] for r in figures_by_rail.values() if r["busbw_gbps"] is not None]
        nodes[host]["busbw_gbps"] = min(bests) if bests else None  # a node is as fast as its slowest rail
        nodes[host]["intra_busbw_gbps"] = intra.get(host)
        slowest: dict[str, float] = {}
        for rail_figures in figures_by_rail.values():
            for peer, busbw in rail_figures["inter_busbw_gbps"].items():
                slowest[peer] = min(busbw, slowest.get(peer, busbw))
        nodes[host]["inter_busbw_gbps"] = slowest
        nodes[host]["rails"] = figures_by_rail
    excluded = [{"host": host, "reason": node["reason"]} for host, node in nodes.items()
                if node["status"] == Status.FAIL.label]
    judged = [Status(n["status"]) for n in nodes.values() if n["status"] != NOT_JUDGED]
    worst = Status.worst(judged, default=Status.OK if nodes else Status.UNKNOWN)
    known = [ref for ref in references.values() if ref is not None]
    return {
        "status": NOT_JUDGED if worst is Status.OK and len(judged) < len(nodes) else worst.label,
        "world": world if world is not None else len(order),
        "joined": len({hosts[rank] for rank in members}),
        "rails": list(rails),
        "sizes": list(sizes),
        "judged_size": judged_size,
        "rounds": rounds,
        "retest_rounds": retests,
        "straggler_factor": straggler_factor,
        "floor_gbps": floor_gbps,
        "reference_gbps": min(known) if known else None,  # the slowest rail's
        "rail_reference_gbps": references,
        "pair_reference_gbps": None,
        "duration_s": round(duration_s, 3),
        "nodes": nodes,
        "pairs": _pair_rows(results),
        "excluded": excluded,
    }


def _node(rank: int, status: Status, reason: str, lost: bool = False) -> dict[str, Any]:
    # "lost": the node left the test (never joined, died or hung), as opposed to measured bad
    return {"rank": rank, "status": status.label, "reason": reason, **({"lost": True} if lost else {})}


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


def _partners_by_position(figures: Mapping[Pair, float], members: list[int],
                          hosts: Mapping[int, str]) -> dict[int, dict[str, float]]:
    """Each roster position's partners and their pair's busbw (one pass over the pairs)."""
    out: dict[int, dict[str, float]] = {}
    for (a, b), busbw in figures.items():
        out.setdefault(a, {})[hosts[members[b]]] = round(busbw, 4)
        out.setdefault(b, {})[hosts[members[a]]] = round(busbw, 4)
    return out


def _pair_rows(results: Mapping[int, dict]) -> list[dict[str, Any]]:
    rows, seen = [], set()
    for rank in sorted(results):
        for m in results[rank]["inter"]:
            key = (tuple(m["peers"]), m["size"], m.get("rail", 0))
            if key in seen:
                continue
            seen.add(key)
            rail = {"rail": m["rail"]} if m.get("rail") else {}
            rows.append({"a": m["peers"][0], "b": m["peers"][1], "size": m["size"], **rail,
                         "median_us": _us(m["median_s"]), "fast_us": _us(m.get("fast_s")),
                         "algbw_gbps": m["algbw_gbps"], "busbw_gbps": m["busbw_gbps"], "error": m["error"]})
    return rows


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 1)
