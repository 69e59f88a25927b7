"""Blame from synthetic pair measurements: a pair runs as fast as its slower node, give or take noise."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainctl.health.fabric.blame import Verdict, assign_blame
from trainctl.health.fabric.report import pair_figures, retest_rounds
from trainctl.health.fabric.schedule import pairing_schedule, plan_retests

HEALTHY = 100.0


def measure(node_count, slow=None, noise=0.0, seed=0):
    """busbw per scheduled pair: min of the two nodes' speeds, times uniform noise of +-`noise`."""
    rng = random.Random(seed)
    speed = {node: HEALTHY for node in range(node_count)} | (slow or {})
    return {(a, b): min(speed[a], speed[b]) * (1 + rng.uniform(-noise, noise))
            for pairs in pairing_schedule(node_count) for a, b in pairs}


@pytest.mark.parametrize("node_count", [3, 4, 5, 8, 16, 33])
@pytest.mark.parametrize("slowdown", [0.3, 0.5])
def test_one_slow_node_is_named_wherever_it_sits(node_count, slowdown):
    for slow in range(node_count):
        report = assign_blame(measure(node_count, {slow: HEALTHY * slowdown}, noise=0.05, seed=slow))
        assert report.stragglers == (slow,), (slow, report)
        assert report.needs_retest == ()
        assert set(report.known_good) == set(range(node_count)) - {slow}


def test_straggler_details():
    report = assign_blame(measure(8, {5: 30.0}))
    (blame,) = [b for b in report.nodes if b.verdict is Verdict.STRAGGLER]
    assert blame.node == 5 and blame.best_busbw_gbps == 30.0
    assert blame.slow_partners == (1, 4, 6)
    assert "all 3 partners" in blame.reason
    assert report.slow_pairs == ((1, 5), (4, 5), (5, 6))
    assert report.pair_reference_gbps == HEALTHY
    good = next(b for b in report.nodes if b.node == 4)
    assert good.verdict is Verdict.OK and good.slow_partners == (5,)


@pytest.mark.parametrize("node_count", [8, 16])
def test_two_slow_nodes_are_named_wherever_they_sit(node_count):
    for first, second in itertools.combinations(range(node_count), 2):
        figures = measure(node_count, {first: 30.0, second: 45.0}, noise=0.05, seed=first * 100 + second)
        report = assign_blame(figures)
        assert report.stragglers == (first, second), (first, second, report)
        assert report.needs_retest == ()


def test_a_node_whose_partners_are_all_slow_is_retested_then_cleared():
    # N=7: node 0 meets only 1 and 6. With both slow, its own figures cannot clear it.
    figures = measure(7, {1: 30.0, 6: 30.0})
    report = assign_blame(figures)
    assert report.stragglers == (1, 6)
    assert report.needs_retest == (0,)
    plan = plan_retests(report.needs_retest, report.known_good, measured=figures)
    assert plan.without_partner == () and len(plan.rounds) == 1
    ((pair,),) = plan.rounds
    retested = figures | {pair: HEALTHY}  # node 0 is fast against a good partner
    report = assign_blame(retested)
    assert report.stragglers == (1, 6) and report.needs_retest == ()


def test_two_nodes_can_only_be_split_by_a_known_good_third():
    slow_pair = {(0, 1): 25.0}
    unjudged = assign_blame(slow_pair)  # no peers, no floor: nothing to compare with
    assert unjudged.nodes_with(Verdict.NOT_JUDGED) == (0, 1) and unjudged.known_good == ()
    assert unjudged.nodes[0].reason == "not judged: 2 nodes and no busbw floor"
    report = assign_blame(slow_pair, floor_gbps=40.0)
    assert report.needs_retest == (0, 1) and report.stragglers == ()
    plan = plan_retests(report.needs_retest, known_good=[2], measured=slow_pair)
    assert plan.rounds == (((0, 2),), ((1, 2),))
    # Node 1 is the slow one: fast 0 meets fast spare 2 at full speed.
    report = assign_blame(slow_pair | {(0, 2): 45.0, (1, 2): 25.0}, floor_gbps=40.0)
    assert report.stragglers == (1,)
    assert report.known_good == (0, 2)


def test_a_slow_pair_of_nodes_fast_elsewhere_blames_neither():
    figures = measure(8)
    figures[(0, 4)] = 20.0
    report = assign_blame(figures)
    assert report.stragglers == () and report.needs_retest == ()
    assert report.slow_pairs == ((0, 4),)
    assert "slow on its own" in next(b for b in report.nodes if b.node == 0).reason


def test_slow_against_two_partners_is_a_straggler_even_if_fast_against_a_third():
    figures = measure(8)
    figures[(0, 1)] = figures[(0, 4)] = 40.0  # node 0's links towards 1 and 4 are slow, not to 7
    report = assign_blame(figures)
    assert report.stragglers == (0,)
    assert report.known_good == tuple(range(1, 8))


def test_floor_catches_a_node_the_relative_rule_tolerates():
    # A 45 GB/s fabric with node 3 at 38 GB/s: 84%, within the factor.
    figures = {pair: busbw * 45.0 / HEALTHY for pair, busbw in measure(8, {3: 38.0 / 45.0 * HEALTHY}).items()}
    assert assign_blame(figures).stragglers == ()
    assert assign_blame(figures, floor_gbps=40.0).stragglers == (3,)
    assert assign_blame(figures, floor_gbps=30.0).stragglers == ()


def test_whole_fabric_under_the_floor_blames_no_one_node():
    report = assign_blame(measure(4, {n: 30.0 for n in range(4)}), floor_gbps=40.0)
    assert report.needs_retest == (0, 1, 2, 3) and report.stragglers == ()


@settings(max_examples=300, deadline=None)
@given(node_count=st.integers(2, 64), nominal=st.floats(1.0, 1000.0), data=st.data())
def test_spread_within_the_factor_never_blames(node_count, nominal, data):
    """Figures anywhere in [0.7, 1] x nominal (+-17.6% around their middle) are all ok."""
    figures = {pair: nominal * data.draw(st.floats(0.7, 1.0))
               for pairs in pairing_schedule(node_count) for pair in pairs}
    report = assign_blame(figures, straggler_factor=0.7)
    assert report.stragglers == () and report.needs_retest == ()


@pytest.mark.parametrize("node_count", [4, 8, 16, 64])
def test_healthy_noise_of_25_percent_rarely_blames(node_count):
    """+-25% independent noise can put two pairs of one node 40% below the others; it rarely does.

    Measured over 3000 runs: N=4 0.3%, N=8 0.3%, N=16 0.13%, N=64 none.
    """
    runs = 1000
    flagged = sum(bool(assign_blame(measure(node_count, noise=0.25, seed=seed)).stragglers)
                  for seed in range(runs))
    assert flagged <= runs // 100


@pytest.mark.parametrize("figures, factor, floor", [
    ({(0, 0): 1.0}, 0.7, None),
    ({(0, 1): 1.0, (1, 0): 1.0}, 0.7, None),
    ({(0, 1): -1.0}, 0.7, None),
    ({(0, 1): float("nan")}, 0.7, None),
    ({(0, 1): 1.0}, 0.0, None),
    ({(0, 1): 1.0}, 1.5, None),
    ({(0, 1): 1.0}, 0.7, -1.0),
])
def test_impossible_inputs_are_refused(figures, factor, floor):
    with pytest.raises(ValueError):
        assign_blame(figures, straggler_factor=factor, floor_gbps=floor)


def test_two_slow_nodes_of_four_cannot_drag_the_reference_down():
    # Nodes 1 and 2 at half speed: 5 of the 6 pairs touch a slow node, only (0, 3) is fast.
    for first, second in itertools.combinations(range(4), 2):
        figures = measure(4, {first: 50.0, second: 50.0}, noise=0.05, seed=first * 10 + second)
        report = assign_blame(figures)
        assert report.stragglers == (first, second), (first, second, report)
        assert report.reference_gbps == pytest.approx(HEALTHY, rel=0.06)


def test_three_slow_nodes_of_four_hide_unless_the_floor_catches_them():
    figures = measure(4, {1: 50.0, 2: 50.0, 3: 50.0})
    assert assign_blame(figures).stragglers == ()  # the slow majority is the reference
    # under the floor all four: node 0 met only slow partners, so it cannot show it is fast
    report = assign_blame(figures, floor_gbps=80.0)
    assert report.needs_retest == (0, 1, 2, 3) and report.stragglers == ()


@pytest.mark.parametrize("node_count", [3, 4, 8])
def test_a_node_at_80_percent_is_found_with_a_factor_that_allows_for_the_noise(node_count):
    # With +-5% noise a factor of 0.9 separates an 80% node from its peers.
    for seed in range(50):
        slow = seed % node_count
        report = assign_blame(measure(node_count, {slow: 80.0}, noise=0.05, seed=seed), straggler_factor=0.9)
        assert report.stragglers == (slow,), (seed, report)
    # with the demo's factor 0.7 an 80% node is, by design, within the tolerance
    assert assign_blame(measure(4, {2: 80.0}, noise=0.05), straggler_factor=0.7).stragglers == ()


@pytest.mark.parametrize("node_count", [3, 4, 8])
def test_all_healthy_nodes_with_noise_are_never_blamed_by_the_fast_half_reference(node_count):
    # +-15% noise: a healthy node's best is at least 85 / 115 = 0.74 of any reference.
    for seed in range(200):
        report = assign_blame(measure(node_count, noise=0.15, seed=seed))
        assert report.stragglers == () and report.needs_retest == (), (seed, report)


def m(peers, busbw):
    return {"peers": list(peers), "size": 16, "busbw_gbps": busbw, "error": None}


def retested(first, retest_busbw):
    """Rank results of a 4-node test with `first` figures, then its re-test rounds at `retest_busbw`."""
    hosts = ["n1", "n2", "n3", "n4"]
    positions = {host: i for i, host in enumerate(hosts)}
    results = {rank: {"inter": [m(pair, bw) for pair, bw in first.items() if host in pair]}
               for rank, host in enumerate(hosts)}
    rounds = retest_rounds(results, positions, 16, 0.7, None)
    for pairs in rounds:
        for a, b in pairs:
            for host in (hosts[a], hosts[b]):  # each side lists a pair's measurements in order
                results[positions[host]]["inter"].append(m((hosts[a], hosts[b]), retest_busbw((a, b))))
    return rounds, pair_figures(results, positions, 16)


def test_a_retest_keeps_the_latest_figure_and_clears_a_healthy_dip():
    # n3 dipped (load from a neighbour) against every partner in the first rounds, so it is
    # named; the re-test of its slow pairs ran at full speed.
    first = {("n1", "n2"): 1.0, ("n3", "n4"): 0.5, ("n2", "n3"): 0.5, ("n1", "n4"): 1.0,
             ("n1", "n3"): 0.5, ("n2", "n4"): 1.0}
    assert assign_blame({(0, 1): 1.0, (2, 3): 0.5, (1, 2): 0.5, (0, 3): 1.0, (0, 2): 0.5, (1, 3): 1.0}
                        ).stragglers == (2,)
    rounds, figures = retested(first, lambda pair: 0.95)
    assert sorted(pair for r in rounds for pair in r) == [(0, 2), (1, 2), (2, 3)]
    assert figures[(1, 2)] == 0.95 and figures[(0, 1)] == 1.0
    assert assign_blame(figures).stragglers == ()


def test_one_lucky_pair_of_four_is_measured_again_before_it_blames_two_nodes():
    # Only n1-n4 ran fast: two slow nodes (n2, n3) or one lucky pair. The re-test tells.
    first = {("n1", "n2"): 0.3, ("n3", "n4"): 0.3, ("n2", "n3"): 0.3, ("n1", "n4"): 0.7,
             ("n1", "n3"): 0.3, ("n2", "n4"): 0.3}
    rounds, figures = retested(first, lambda pair: 0.3)  # n1-n4 was luck: 0.3 like the rest
    assert (0, 3) in [pair for r in rounds for pair in r]
    assert assign_blame(figures).stragglers == ()
    _, figures = retested(first, lambda pair: 0.7 if pair == (0, 3) else 0.3)  # n2, n3 are slow
    assert assign_blame(figures).stragglers == (1, 2)
