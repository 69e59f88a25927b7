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
The verdict is one typed `FabricReport`, from one builder whether the test ran one rank per
node or one per rail; `to_json` is what `health fabric --json` prints and the gate's
fabric.json holds, and `from_json` reads that back.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainctl.health.fabric.blame import Verdict, assign_blame
from trainctl.health.fabric.schedule import disjoint_rounds, plan_retests, rail_ranks
from trainctl.health.status import Status

Pair = tuple[int, int]
NOT_JUDGED = Verdict.NOT_JUDGED.value  # a node and report status of its own, never "ok"


@dataclass(frozen=True)
class RailFigures:
    """One rail of a node: its rank, its best pair's busbw, that over the rail's reference, its partners."""
    rank: int
    busbw_gbps: float | None
    ratio: float | None
    inter_busbw_gbps: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "busbw_gbps": self.busbw_gbps, "ratio": self.ratio,
                "inter_busbw_gbps": dict(self.inter_busbw_gbps)}


@dataclass(frozen=True)
class NodeFigures:
    """What was measured of a node: its slowest rail's best busbw, intra-node busbw, each partner's pair."""
    busbw_gbps: float | None
    intra_busbw_gbps: float | None
    inter_busbw_gbps: Mapping[str, float]
    rails: Mapping[str, RailFigures] | None = None  # by rail device; None: a test without rails


@dataclass(frozen=True)
class NodeResult:
    rank: int
    status: str  # a Status label, or NOT_JUDGED
    reason: str
    lost: bool = False  # the node left the test (never joined, died or hung), as opposed to measured bad
    figures: NodeFigures | None = None  # None: it left a one-rail test before it was measured

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "status": self.status, "reason": self.reason}
        if self.lost:
            out["lost"] = True
        if self.figures is not None:
            out.update(busbw_gbps=self.figures.busbw_gbps, intra_busbw_gbps=self.figures.intra_busbw_gbps,
                       inter_busbw_gbps=dict(self.figures.inter_busbw_gbps))
            if self.figures.rails is not None:
                out["rails"] = {name: rail.to_json() for name, rail in self.figures.rails.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeResult:
        figures = None
        if "inter_busbw_gbps" in data:
            rails = data.get("rails")
            figures = NodeFigures(
                busbw_gbps=data["busbw_gbps"], intra_busbw_gbps=data["intra_busbw_gbps"],
                inter_busbw_gbps=dict(data["inter_busbw_gbps"]),
                rails=None if rails is None else {name: RailFigures(**rail) for name, rail in rails.items()})
        return cls(rank=data["rank"], status=data["status"], reason=data["reason"],
                   lost=bool(data.get("lost", False)), figures=figures)


@dataclass(frozen=True)
class Excluded:
    host: str
    reason: str


@dataclass(frozen=True)
class FabricReport:
    """Rank 0's verdict on the whole test; `to_json` is the fabric.json and `--json` shape."""
    status: str  # the worst judged node's Status label, or NOT_JUDGED
    world: int  # nodes expected
    joined: int  # nodes that joined
    rails: tuple[str, ...]  # the rail devices; empty: one rank per node
    sizes: tuple[int, ...]
    judged_size: int
    rounds: int
    retest_rounds: int
    straggler_factor: float
    floor_gbps: float | None
    reference_gbps: float | None  # with rails, the slowest rail's
    rail_reference_gbps: Mapping[str, float | None] | None  # by rail device; None without rails
    pair_reference_gbps: float | None
    duration_s: float
    nodes: Mapping[str, NodeResult]  # by host
    pairs: tuple[Mapping[str, Any], ...]  # one row per measured pair and size, as measured
    excluded: tuple[Excluded, ...]

    def to_json(self) -> dict[str, Any]:
        head: dict[str, Any] = {"status": self.status, "world": self.world, "joined": self.joined}
        if self.rails:
            head["rails"] = list(self.rails)
        head.update(sizes=list(self.sizes), judged_size=self.judged_size, rounds=self.rounds,
                    retest_rounds=self.retest_rounds, straggler_factor=self.straggler_factor,
                    floor_gbps=self.floor_gbps, reference_gbps=self.reference_gbps)
        if self.rails:
            head["rail_reference_gbps"] = dict(self.rail_reference_gbps or {})
        return {**head, "pair_reference_gbps": self.pair_reference_gbps, "duration_s": self.duration_s,
                "nodes": {host: node.to_json() for host, node in self.nodes.items()},
                "pairs": [dict(row) for row in self.pairs],
                "excluded": [{"host": item.host, "reason": item.reason} for item in self.excluded]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FabricReport:
        """The report as `to_json` wrote it (a gate's fabric.json)."""
        rails = tuple(data.get("rails") or ())
        return cls(status=data["status"], world=data["world"], joined=data["joined"], rails=rails,
                   sizes=tuple(data["sizes"]), judged_size=data["judged_size"], rounds=data["rounds"],
                   retest_rounds=data["retest_rounds"], straggler_factor=data["straggler_factor"],
                   floor_gbps=data["floor_gbps"], reference_gbps=data["reference_gbps"],
                   rail_reference_gbps=dict(data["rail_reference_gbps"]) if rails else None,
                   pair_reference_gbps=data["pair_reference_gbps"], duration_s=data["duration_s"],
                   nodes={host: NodeResult.from_json(node) for host, node in data["nodes"].items()},
                   pairs=tuple(data["pairs"]),
                   excluded=tuple(Excluded(item["host"], item["reason"]) for item in data["excluded"]))

    def busbw_gbps(self, host: str) -> float | None:
        """`host`'s best measured busbw (its slowest rail's); None where it was not measured."""
        node = self.nodes.get(host)
        return node.figures.busbw_gbps if node is not None and node.figures is not None else None

    @property
    def exit_status(self) -> Status:
        """The exit code's status: "not judged" exits like unknown (3), nothing was decided."""
        return Status.UNKNOWN if self.status == NOT_JUDGED else Status(self.status)


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


def rail_label(rail: int, name: str) -> str:
    """How a report names a rail: "rail 1 (eth1)", "rail 5 (mlx5_5:1)"."""
    return f"rail {rail} ({name})"


def rail_results(results: Mapping[int, dict], rail: int, rail_count: int) -> dict[int, dict]:
    """The results of `rail`'s ranks: with R rails, node n's rail r is rank n x R + r."""
    return {rank: results[rank] for rank in rail_ranks(results, rail, rail_count)}


def rail_positions(members: list[int], hosts: Mapping[str, str], rail: int, rail_count: int) -> dict[str, int]:
    """Host -> its position among `rail`'s joined ranks: the index the rail's pairing rounds use."""
    return {hosts[str(rank)]: i for i, rank in enumerate(rail_ranks(members, rail, rail_count))}


def build_report(*, results: Mapping[int, dict], roster: dict, sizes: tuple[int, ...], rounds: int,
                 retests: int, straggler_factor: float, floor_gbps: float | None, join_timeout_s: float,
                 duration_s: float, rails: tuple[str, ...] = (), world: int | None = None,
                 lost: Mapping[int, str] | None = None) -> FabricReport:
    """The report of a test with one rank per node, or with `rails` one rank per rail (node n's
    rail r is rank n x R + r).

    Each rail is judged on its own, against the same rail's pairs across nodes; a node is as
    bad as its worst rail, and with rails every reason names the rail. `rounds` and `retests`
    count rounds (every rail runs its rounds at the same time). `world`: the nodes expected;
    None takes the roster's expected hosts, else the hosts seen. `lost`: ranks whose heartbeat
    fell silent mid-test, and why; they are failures, marked lost.
    """
    lost = lost or {}
    rail_count = max(len(rails), 1)
    members = [int(r) for r in roster["joined"]]
    hosts = {int(rank): host for rank, host in roster["hosts"].items()}
    expected = roster.get("expected") or []
    judged_size = max(sizes)  # bandwidth problems show at the largest message

    def host_of(rank: int) -> str:
        if rank in hosts:
            return hosts[rank]
        if rank < len(expected):
            return expected[rank]
        return f"node {rank // rail_count}" if rails else f"rank {rank}"

    def rail_prefix(rank: int) -> str:
        return f"{rail_label(rank % rail_count, rails[rank % rail_count])}: " if rails else ""

    departed = {rank: f"did not join within {join_timeout_s:g} s" for rank in roster["missing"]}
    for rank in members:
        if rank in lost:
            departed[rank] = lost[rank]
        elif rank not in results:
            departed[rank] = "joined but sent no results (died or hung mid-test)"
    # one rail lists the nodes that left first; with rails, every node in rank order
    ranks_in_order = sorted(set(members) | set(roster["missing"])) if rails else \
        [*departed, *(rank for rank in members if rank not in departed)]
    order = list(dict.fromkeys(host_of(rank) for rank in ranks_in_order))
    first_rank = {host: min(r for r in ranks_in_order if host_of(r) == host) for host in order}
    statuses = {host: [Status.OK] for host in order}
    reasons: dict[str, list[str]] = {host: [] for host in order}
    lost_hosts = {host_of(rank) for rank in departed}
    not_judged: set[str] = set()
    per_rail: dict[str, dict[str, RailFigures]] = {host: {} for host in order}

    def note(host: str, status: Status, reason: str) -> None:
        statuses[host].append(status)
        reasons[host].append(reason)

    for rank, why in departed.items():
        note(host_of(rank), Status.FAIL, f"{rail_prefix(rank)}{why}")

    references: dict[str, float | None] = {}
    pair_reference = None
    for rail in range(rail_count):
        name = rails[rail] if rails else ""
        ranks = rail_ranks(members, rail, rail_count)
        positions = rail_positions(members, roster["hosts"], rail, rail_count)
        figures = pair_figures(rail_results(results, rail, rail_count), positions, judged_size)
        blame = assign_blame(figures, straggler_factor=straggler_factor, floor_gbps=floor_gbps) if figures else None
        references[name] = blame.reference_gbps if blame else None
        if not rails and blame:
            pair_reference = blame.pair_reference_gbps
        blame_by_position = {node.node: node for node in blame.nodes} if blame else {}
        partners = _partners_by_position(figures, ranks, hosts)
        for rank in ranks:
            host = hosts[rank]
            if rank in departed:
                continue
            prefix = rail_prefix(rank)
            node_blame = blame_by_position.get(positions[host])
            ratio = (node_blame.best_busbw_gbps / blame.reference_gbps
                     if node_blame is not None and blame.reference_gbps else None)
            judged = f"{prefix}{ratio:.2f}x the rail's reference {blame.reference_gbps:.2f} GB/s, " \
                if rails and ratio is not None else prefix
            if node_blame is not None and node_blame.verdict is Verdict.NOT_JUDGED:
                not_judged.add(host)
                reasons[host].append(f"{prefix}{node_blame.reason}")
            elif node_blame is not None and node_blame.verdict is Verdict.STRAGGLER:
                note(host, Status.FAIL, f"straggler: {judged}{node_blame.reason}")
            elif node_blame is not None and node_blame.verdict is Verdict.SUSPECT:
                note(host, Status.WARN, f"suspect: {judged}{node_blame.reason}")
            failed_pairs = _failed_pairs(results[rank])
            for failed in failed_pairs:
                note(host, Status.WARN, f"{prefix}{failed}")
            if not figures and len(ranks) > 1 and not failed_pairs:
                note(host, Status.UNKNOWN, f"{prefix}no inter-node figures")
            per_rail[host][name] = RailFigures(
                rank=rank, busbw_gbps=None if node_blame is None else round(node_blame.best_busbw_gbps, 4),
                ratio=None if ratio is None else round(ratio, 4), inter_busbw_gbps=partners.get(positions[host], {}))

    # intra-node figures: rail 0's rank runs the node's one intra-node test
    intra_results = rail_results(results, 0, rail_count)
    intra = _intra_figures(intra_results, judged_size)
    intra_reference = statistics.median(intra.values()) if len(intra) >= 2 else None
    for result in intra_results.values():
        host = result["host"]
        if not rails and host in lost_hosts:
            continue  # one rail: a node that left the test is judged by its leaving alone
        if host in intra and intra_reference and result["backend"] == "nccl" \
                and intra[host] < straggler_factor * intra_reference:
            note(host, Status.FAIL, f"intra-node busbw {intra[host]:.2f} GB/s < {straggler_factor:g} x "
                                    f"peers' median {intra_reference:.2f} GB/s")

    nodes: dict[str, NodeResult] = {}
    for host in order:
        status = Status.worst(statuses[host], default=Status.OK)
        label = NOT_JUDGED if host in not_judged and status is Status.OK else status.label  # never "ok"
        figures_by_rail = per_rail[host]
        measured = None
        if rails or host not in lost_hosts:
            bests = [r.busbw_gbps for r in figures_by_rail.values() if r.busbw_gbps is not None]
            slowest: dict[str, float] = {}
            for rail_figures in figures_by_rail.values():
                for peer, busbw in rail_figures.inter_busbw_gbps.items():
                    slowest[peer] = min(busbw, slowest.get(peer, busbw))
            measured = NodeFigures(busbw_gbps=min(bests) if bests else None,  # as fast as its slowest rail
                                   intra_busbw_gbps=intra.get(host), inter_busbw_gbps=slowest,
                                   rails=figures_by_rail if rails else None)
        nodes[host] = NodeResult(first_rank[host], label, "; ".join(reasons[host]) or "ok",
                                 lost=host in lost_hosts, figures=measured)
    excluded = tuple(Excluded(host, node.reason) for host, node in nodes.items() if node.status == Status.FAIL.label)
    judged = [Status(n.status) for n in nodes.values() if n.status != NOT_JUDGED]
    worst = Status.worst(judged, default=Status.OK if nodes else Status.UNKNOWN)
    known = [ref for ref in references.values() if ref is not None]
    if world is None:
        world = len(expected) // rail_count if expected else len(order)
    return FabricReport(
        status=NOT_JUDGED if worst is Status.OK and len(judged) < len(nodes) else worst.label,
        world=world, joined=len({hosts[rank] for rank in members}), rails=rails, sizes=tuple(sizes),
        judged_size=judged_size, rounds=rounds, retest_rounds=retests, straggler_factor=straggler_factor,
        floor_gbps=floor_gbps, reference_gbps=min(known) if known else None,  # the slowest rail's
        rail_reference_gbps=references if rails else None, pair_reference_gbps=pair_reference,
        duration_s=round(duration_s, 3), nodes=nodes, pairs=tuple(_pair_rows(results)), excluded=excluded)


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
