"""Which nodes are slow, from the bus bandwidth each pair of nodes measured together.

A pair runs no faster than its slower node, so one slow node drags down every pair it is in,
while a good node is fast against every good partner: a node's speed shows in its *best*
figure, against whichever partner. Steps:

1. The reference: the upper median of the nodes' best figures (the slowest of the faster half)
   names the nodes that are fast for sure, and the reference is the median of the pairs among
   them. Slow nodes sink to the lower half, so they cannot drag the reference down as long as
   they are at most half of the nodes: on 4 nodes with 2 slow ones, the reference is the pair
   of the 2 fast ones.
   (The old reference, the median of a node's peers' pairs, fell to the slow nodes' speed as
   soon as two of four were slow: 5 of the 6 pairs then touch a slow node.)
2. A node whose best figure is below `straggler_factor` x the reference, or below the site's
   absolute floor, is *weak*: slow whoever it meets.
3. Every other node's pairs are judged against the median of the pairs between non-weak nodes.
   A slow pair with a weak partner is explained by that partner.

Verdicts:
- straggler: weak and slow against at least two partners, one of them not weak; or slow against
  two or more non-weak partners (the "more than one partner" rule).
- suspect: the figures cannot say. A weak node whose every partner is weak too, a node slow
  against one partner with nothing fast to show for itself, and both nodes of an N=2 pair
  under the floor. These need a re-test against a known-good node (`schedule.plan_retests`);
  run `assign_blame` again on all figures, old and new.
- not judged: two nodes and no floor. Their one pair has nothing to be compared with, so
  neither node is judged, and neither is called ok.
- ok: otherwise. A pair slow while both its nodes are fast elsewhere is listed in `slow_pairs`
  and blames neither node.

More slow nodes than fast ones pull the reference down with them (on 4 nodes, 3 slow ones hide);
the absolute floor (GB/s of busbw, from the site config) holds whatever the others measure.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Iterable, Mapping

from trainctl.health.fabric.schedule import Pair

DEFAULT_STRAGGLER_FACTOR = 0.7


class Verdict(StrEnum):
    OK = "ok"
    STRAGGLER = "straggler"
    SUSPECT = "suspect"
    NOT_JUDGED = "not judged"


NOT_JUDGED_TWO_NODES = "not judged: 2 nodes and no busbw floor"


@dataclass(frozen=True)
class NodeBlame:
    node: int
    verdict: Verdict
    best_busbw_gbps: float
    slow_partners: tuple[int, ...]  # partners whose pair with this node was slow, explained or not
    reason: str


@dataclass(frozen=True)
class BlameReport:
    nodes: tuple[NodeBlame, ...]         # sorted by node
    reference_gbps: float | None         # median busbw of the pairs among surely fast nodes
    pair_reference_gbps: float | None    # median busbw of pairs between non-weak nodes
    slow_pairs: tuple[Pair, ...]
    reference_pairs: tuple[Pair, ...] = ()  # the pairs among surely fast nodes

    def nodes_with(self, verdict: Verdict) -> tuple[int, ...]:
        return tuple(blame.node for blame in self.nodes if blame.verdict is verdict)

    @property
    def stragglers(self) -> tuple[int, ...]:
        return self.nodes_with(Verdict.STRAGGLER)

    @property
    def needs_retest(self) -> tuple[int, ...]:
        return self.nodes_with(Verdict.SUSPECT)

    @property
    def known_good(self) -> tuple[int, ...]:
        return self.nodes_with(Verdict.OK)

    def fastest_first(self, nodes: Iterable[int]) -> list[int]:
        """`nodes` ordered by their best figure, fastest first (ties in node order)."""
        best = {blame.node: blame.best_busbw_gbps for blame in self.nodes}
        return sorted(nodes, key=lambda node: -best[node])


def assign_blame(figures: Mapping[Pair, float], *, straggler_factor: float = DEFAULT_STRAGGLER_FACTOR,
                 floor_gbps: float | None = None) -> BlameReport:
    """Verdict per node from per-pair busbw (GB/s); a pair may be keyed either way round, once."""
    if not 0 < straggler_factor <= 1:
        raise ValueError(f"straggler_factor must be in (0, 1], got {straggler_factor}")
    if floor_gbps is not None and not (floor_gbps >= 0 and math.isfinite(floor_gbps)):
        raise ValueError(f"floor_gbps must be a non-negative number, got {floor_gbps}")
    pairs = _normalized(figures)
    if not pairs:
        return BlameReport(nodes=(), reference_gbps=None, pair_reference_gbps=None, slow_pairs=())
    by_node: dict[int, dict[int, float]] = defaultdict(dict)
    for (a, b), busbw in pairs.items():
        by_node[a][b] = busbw
        by_node[b][a] = busbw

    def below_floor(busbw: float) -> bool:
        return floor_gbps is not None and busbw < floor_gbps

    best = {node: max(partners.values()) for node, partners in by_node.items()}
    if len(by_node) == 2 and floor_gbps is None:
        unjudged = (NodeBlame(node, Verdict.NOT_JUDGED, best[node], (), NOT_JUDGED_TWO_NODES)
                    for node in sorted(by_node))
        return BlameReport(nodes=tuple(unjudged),
                           reference_gbps=None, pair_reference_gbps=None, slow_pairs=())
    # Seed: the upper median of the bests, which up to half of the nodes cannot drag down. The
    # reference is then the median of the pairs between the nodes the seed finds fast: compared
    # with a median of pairs, a healthy node's best (the max of 2-3 noisy pairs) has margin.
    seed = reference_speed(best.values())
    fast = {node for node in by_node if not below_floor(best[node]) and best[node] >= straggler_factor * seed}
    fast_pairs = {pair: busbw for pair, busbw in pairs.items() if fast.issuperset(pair)}
    reference = statistics.median(fast_pairs.values()) if fast_pairs else seed
    weak = {node for node in by_node
            if below_floor(best[node]) or best[node] < straggler_factor * reference}

    reference_pairs = [busbw for (a, b), busbw in pairs.items() if a not in weak and b not in weak]
    pair_reference = statistics.median(reference_pairs) if reference_pairs else None

    def slow(busbw: float) -> bool:
        return below_floor(busbw) or (pair_reference is not None
                                      and busbw < straggler_factor * pair_reference)

    # A weak node is slow against every partner, whatever the pair reference says.
    slow_pairs = tuple(pair for pair, busbw in pairs.items() if slow(busbw) or not weak.isdisjoint(pair))
    blames = tuple(_judge(node, by_node[node], best[node], weak, slow) for node in sorted(by_node))
    return BlameReport(nodes=blames, reference_gbps=reference, pair_reference_gbps=pair_reference,
                       reference_pairs=tuple(sorted(fast_pairs)),
                       slow_pairs=tuple(sorted(slow_pairs)))


def reference_speed(best_figures: Iterable[float]) -> float:
    """The upper median of the nodes' best figures: the slowest of the faster half.

    Up to half of the nodes can be slow without moving it, and being a median, one node's
    lucky figure does not raise it either.
    """
    ordered = sorted(best_figures)
    return ordered[len(ordered) // 2]


def _judge(node: int, partners: dict[int, float], best: float, weak: set[int],
           slow: Callable[[float], bool]) -> NodeBlame:
    if node in weak:
        slow_partners = tuple(sorted(partners))
        if len(partners) >= 2 and not weak.issuperset(partners):
            verdict, reason = Verdict.STRAGGLER, f"slow against all {len(partners)} partners"
        elif len(partners) >= 2:
            verdict, reason = Verdict.SUSPECT, "slow against every partner, and every partner is slow too"
        else:
            verdict, reason = Verdict.SUSPECT, "slow against its only partner"
        return NodeBlame(node, verdict, best, slow_partners, f"{reason} (best {best:.2f} GB/s)")

    slow_partners = tuple(sorted(p for p, busbw in partners.items() if slow(busbw) or p in weak))
    unexplained = [p for p in slow_partners if p not in weak]
    fast = len(partners) - len(slow_partners)
    if len(unexplained) >= 2:
        verdict, reason = Verdict.STRAGGLER, f"slow against partners {unexplained}, which are fast elsewhere"
    elif unexplained and not fast:
        verdict, reason = Verdict.SUSPECT, f"slow against {unexplained[0]}, and fast against no one"
    else:
        verdict, reason = Verdict.OK, f"fast against {fast} of {len(partners)} partners"
        if explained := [p for p in slow_partners if p in weak]:
            reason += f"; slow only with slow partners {explained}"
        if unexplained:
            reason += f"; slow with {unexplained[0]}, a pair slow on its own"
    return NodeBlame(node, verdict, best, slow_partners, reason)


def _normalized(figures: Mapping[Pair, float]) -> dict[Pair, float]:
    pairs: dict[Pair, float] = {}
    for (a, b), busbw in figures.items():
        if a == b:
            raise ValueError(f"node {a} cannot be paired with itself")
        if not (busbw >= 0 and math.isfinite(busbw)):
            raise ValueError(f"busbw of pair {(a, b)} must be a non-negative number, got {busbw}")
        key = (min(a, b), max(a, b))
        if key in pairs:
            raise ValueError(f"pair {key} is measured twice")
        pairs[key] = busbw
    return pairs
