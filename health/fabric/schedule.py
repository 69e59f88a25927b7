"""Who measures against whom: the pairing rounds of the fabric test, and re-test rounds.

Nodes are indices 0..N-1 in allocation order (Slurm's node list, which usually follows the
racks). All pairs of a round run at the same time, each on its own process group, so the
test takes a constant number of rounds whatever N:

    round 0: i <-> i+1 for even i           (0,1) (2,3) (4,5) ...
    round 1: i <-> i+1 for odd i, wrapping  (1,2) (3,4) ... (N-1,0)
    round 2: i <-> i+N/2                    a far partner, across the racks

Rounds 0 and 1 make a ring of near neighbours, round 2 adds a far one, so every node is
measured against up to three different partners, near and far. That is what gives blame its
power: a slow node is slow against all its partners, while a good node shares at most one
pair with any one slow node. With one straggler, a good node is slow against at most one
partner; with two, a good node's remaining partner still shows it is fine.

Odd N: the ring takes all three rounds (one ring edge closes it in round 2), and one node idles
per round. Round 2 pairs the others by i <-> i+(N-1)/2, so all but three nodes get a third
partner. N = 3: one pair per round, every node meets both others. N = 2: only one partner
exists, so one round; a slow pair of two cannot be split by measurement among themselves, and
needs a known-good third node (see `plan_retests`) or an absolute floor.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Collection, Iterable

Pair = tuple[int, int]
Round = tuple[Pair, ...]


def pairing_schedule(node_count: int) -> tuple[Round, ...]:
    """Rounds of disjoint pairs, each pair written (lower, higher); at most three rounds."""
    if node_count < 2:
        raise ValueError(f"the fabric test needs at least 2 nodes, got {node_count}")
    n = node_count
    if n == 2:
        return (((0, 1),),)
    near_even = tuple((i, i + 1) for i in range(0, n - 1, 2))
    near_odd = tuple((i, i + 1) for i in range(1, n - 1, 2))
    if n % 2 == 0:
        near_odd += ((0, n - 1),)
        far = tuple((i, i + n // 2) for i in range(n // 2))
        return near_even, near_odd, far
    # Odd: 0..n-2 paired in round 0 (n-1 idle), 1..n-1 in round 1 (0 idle); round 2 closes the
    # ring with (0, n-1) and pairs 1..n-2 by a half-ring stride, leaving node (n-1)//2 idle.
    half = (n - 1) // 2
    far = ((0, n - 1),) + tuple((i, i + half) for i in range(1, half))
    return near_even, near_odd, far


def rail_ranks(ranks: Iterable[int], rail: int, rail_count: int) -> list[int]:
    """`rail`'s ranks among `ranks`, in order: with R rails, node n's rail r is rank n x R + r."""
    return [rank for rank in ranks if rank % rail_count == rail]


def rail_schedules(ranks: Iterable[int], rail_count: int) -> tuple[tuple[Round, ...], ...]:
    """Per rail, the pairing rounds over that rail's ranks (pairs are positions among them), all
    padded with empty rounds to the same count.

    Rail r's rank pairs only with rail r's ranks of other nodes (rail-aligned, as NCCL's rings
    run on a rail-optimised fabric), and every rail runs round k at the same time, so the test
    keeps at most three rounds whatever the number of rails.
    """
    joined = list(ranks)
    per_rail = []
    for rail in range(rail_count):
        count = len(rail_ranks(joined, rail, rail_count))
        per_rail.append(pairing_schedule(count) if count > 1 else ())
    return tuple(padded(rounds, max(map(len, per_rail))) for rounds in per_rail)


def padded(rounds: Iterable[Round], count: int) -> tuple[Round, ...]:
    """`rounds` followed by empty rounds up to `count` (a rail with fewer rounds waits them out)."""
    rounds = tuple(tuple(tuple(pair) for pair in r) for r in rounds)
    return rounds + ((),) * (count - len(rounds))


def partners_by_node(rounds: Iterable[Round]) -> dict[int, frozenset[int]]:
    """Every node's distinct partners over `rounds`."""
    partners: dict[int, set[int]] = defaultdict(set)
    for pairs in rounds:
        for a, b in pairs:
            partners[a].add(b)
            partners[b].add(a)
    return {node: frozenset(found) for node, found in sorted(partners.items())}


@dataclass(frozen=True)
class RetestPlan:
    rounds: tuple[Round, ...]
    without_partner: tuple[int, ...]  # suspects every known-good node has already been measured against


def plan_retests(suspects: Iterable[int], known_good: Collection[int],
                 measured: Iterable[Pair] = ()) -> RetestPlan:
    """Pair each suspect with one known-good node it has not been measured against yet.

    The figure against a node known to be good tells which side of a slow pair is slow. A
    known-good node takes one suspect per round, so with G good nodes the plan needs about
    (suspects / G) rounds; with no good node left to try, the suspect is listed instead.
    Known-good nodes are tried in the order given (callers put the fastest first).
    """
    suspect_set = set(suspects)
    good = list(dict.fromkeys(known_good))
    if overlap := suspect_set.intersection(good):
        raise ValueError(f"nodes {sorted(overlap)} are both suspect and known good")
    already: dict[int, set[int]] = defaultdict(set)
    for a, b in measured:
        already[a].add(b)
        already[b].add(a)
    candidates = {node: [g for g in good if g not in already[node]] for node in sorted(suspect_set)}
    without_partner = tuple(node for node, found in candidates.items() if not found)
    pending = [node for node, found in candidates.items() if found]
    rounds: list[Round] = []
    while pending:
        busy: set[int] = set()
        pairs: list[Pair] = []
        deferred: list[int] = []
        for node in pending:
            partner = next((g for g in candidates[node] if g not in busy), None)
            if partner is None:
                deferred.append(node)
                continue
            busy.add(partner)
            pairs.append((min(node, partner), max(node, partner)))
        rounds.append(tuple(pairs))
        pending = deferred
    return RetestPlan(rounds=tuple(rounds), without_partner=without_partner)


def disjoint_rounds(pairs: Iterable[Pair]) -> tuple[Round, ...]:
    """`pairs` in rounds where no node is in two pairs at once (greedy, in the order given)."""
    pending = list(dict.fromkeys((min(a, b), max(a, b)) for a, b in pairs))
    rounds: list[Round] = []
    while pending:
        busy: set[int] = set()
        chosen: list[Pair] = []
        for pair in pending:
            if busy.isdisjoint(pair):
                busy.update(pair)
                chosen.append(pair)
        rounds.append(tuple(chosen))
        pending = [pair for pair in pending if pair not in chosen]
    return tuple(rounds)
