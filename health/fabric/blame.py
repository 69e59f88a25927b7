"""Which nodes are slow, from the bus bandwidth each pair of nodes measured together.

A pair runs no faster than its slower node, so one slow node drags down every pair it is in,
while a good node is fast against every good partner. Two steps:

1. A node whose best figure, against every partner, is below `straggler_factor` x the median
   of its peers' figures (the pairs it is not in) is *weak*: slow whoever it meets. Leaving
   its own pairs out of its reference keeps a slow node from lowering its own bar (on 3 or 4
   nodes its pairs are half of all pairs).
2. Every other node's pairs are judged against the median of the pairs between non-weak nodes.
   A slow pair with a weak partner is explained by that partner.

Verdicts:
- straggler: weak and slow against at least two partners, one of them not weak; or slow against
  two or more non-weak partners (the "more than one partner" rule).
- suspect: the figures cannot say. A weak node whose every partner is weak too, a node slow
  against one partner with nothing fast to show for itself, and both nodes of an N=2 pair
  under the floor. These need a re-test against a known-good node (`schedule.plan_retests`);
  run `assign_blame` again on all figures, old and new.
- ok: otherwise. A pair slow while both its nodes are fast elsewhere is listed in `slow_pairs`
  and blames neither node.

The relative rule needs healthy pairs to be the majority of the pairs a node is not in: on
3 or 4 nodes it finds one slow node, not two. The absolute floor (GB/s of busbw, from the
site config) holds whatever the others measure.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Mapping

from trainctl.health.fabric.schedule import Pair

DEFAULT_STRAGGLER_FACTOR = 0.7


class Verdict(StrEnum):
    OK = "ok"
    STRAGGLER = "straggler"
    SUSPECT = "suspect"


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
    pair_reference_gbps: float | None    # median busbw of pairs between non-weak nodes
    slow_pairs: tuple[Pair, ...]

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


def assign_blame(figures: Mapping[Pair, float], *, straggler_factor: float = DEFAULT_STRAGGLER_FACTOR,
                 floor_gbps: float | None = None) -> BlameReport:
    """Verdict per node from per-pair busbw (GB/s); a pair may be keyed either way round, once."""
    if not 0 < straggler_factor <= 1:
        raise ValueError(f"straggler_factor must be in (0, 1], got {straggler_factor}")
    if floor_gbps is not None and not (floor_gbps >= 0 and math.isfinite(floor_gbps)):
        raise ValueError(f"floor_gbps must be a non-negative number, got {floor_gbps}")
    pairs = _normalized(figures)
    by_node: dict[int, dict[int, float]] = defaultdict(dict)
    for (a, b), busbw in pairs.items():
        by_node[a][b] = busbw
        by_node[b][a] = busbw

    def below_floor(busbw: float) -> bool:
        return floor_gbps is not None and busbw < floor_gbps

    best = {node: max(partners.values()) for node, partners in by_node.items()}
    weak: set[int] = set()
    for node in by_node:
        peers = [busbw for pair, busbw in pairs.items() if node not in pair]
        if below_floor(best[node]) or (peers and best[node] < straggler_factor * statistics.median(peers)):
            weak.add(node)

    reference_pairs = [busbw for (a, b), busbw in pairs.items() if a not in weak and b not in weak]
    reference = statistics.median(reference_pairs) if reference_pairs else None

    def slow(busbw: float) -> bool:
        return below_floor(busbw) or (reference is not None and busbw < straggler_factor * reference)

    # A weak node is slow against every partner, whatever the pair reference says.
    slow_pairs = tuple(pair for pair, busbw in pairs.items() if slow(busbw) or not weak.isdisjoint(pair))
    blames = tuple(_judge(node, by_node[node], best[node], weak, slow) for node in sorted(by_node))
    return BlameReport(nodes=blames, pair_reference_gbps=reference, slow_pairs=tuple(sorted(slow_pairs)))


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
