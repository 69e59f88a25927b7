"""The pairing schedule and re-test planning: pure functions, checked for every N the tests can afford."""

import pytest

from trainctl.health.fabric.schedule import RetestPlan, pairing_schedule, partners_by_node, plan_retests

MAX_ROUNDS = 3


def check_rounds_are_disjoint(rounds, node_count):
    for pairs in rounds:
        nodes = [node for pair in pairs for node in pair]
        assert len(nodes) == len(set(nodes)), pairs  # no node twice in a round
        assert all(0 <= node < node_count for node in nodes)
        assert all(a < b for a, b in pairs)


@pytest.mark.parametrize("node_count", range(2, 65))
def test_schedule_properties(node_count):
    rounds = pairing_schedule(node_count)
    check_rounds_are_disjoint(rounds, node_count)
    assert len(rounds) <= MAX_ROUNDS
    all_pairs = [pair for pairs in rounds for pair in pairs]
    assert len(all_pairs) == len(set(all_pairs))  # no pair measured twice
    partners = partners_by_node(rounds)
    assert set(partners) == set(range(node_count))  # nobody left out
    wanted = 1 if node_count == 2 else 2
    assert min(len(found) for found in partners.values()) >= wanted


@pytest.mark.parametrize("node_count", range(2, 65))
def test_rounds_are_full(node_count):
    """Every round keeps all nodes busy but the one an odd count must idle."""
    for pairs in pairing_schedule(node_count):
        assert len(pairs) == node_count // 2


def test_even_counts_give_three_partners_near_and_far():
    for node_count in range(4, 65, 2):
        partners = partners_by_node(pairing_schedule(node_count))
        assert all(len(found) == 3 for found in partners.values())
    assert partners[0] == {1, 63, 32}


def test_odd_counts_give_three_partners_to_all_but_three_nodes():
    for node_count in range(5, 64, 2):
        partners = partners_by_node(pairing_schedule(node_count))
        two = sorted(node for node, found in partners.items() if len(found) == 2)
        assert two == [0, (node_count - 1) // 2, node_count - 1]


def test_small_counts():
    assert pairing_schedule(2) == (((0, 1),),)
    assert pairing_schedule(3) == (((0, 1),), ((1, 2),), ((0, 2),))
    assert partners_by_node(pairing_schedule(4)) == {0: {1, 2, 3}, 1: {0, 2, 3}, 2: {0, 1, 3}, 3: {0, 1, 2}}


def test_round_count_is_constant_up_to_1024():
    for node_count in range(2, 1025):
        rounds = pairing_schedule(node_count)
        assert len(rounds) <= MAX_ROUNDS
    check_rounds_are_disjoint(pairing_schedule(1024), 1024)
    check_rounds_are_disjoint(pairing_schedule(1023), 1023)


def test_fewer_than_two_nodes_is_refused():
    with pytest.raises(ValueError):
        pairing_schedule(1)


def test_retest_pairs_each_suspect_with_a_fresh_known_good_node():
    # N=2, the pair was slow: a third node that passed elsewhere tells which side is slow.
    plan = plan_retests([0, 1], known_good=[7], measured=[(0, 1)])
    assert plan == RetestPlan(rounds=(((0, 7),), ((1, 7),)), without_partner=())
    # Two known-good nodes: both suspects are re-tested in one round.
    plan = plan_retests([0, 1], known_good=[7, 8], measured=[(0, 1)])
    assert plan.rounds == (((0, 7), (1, 8)),)


def test_retest_skips_partners_already_measured():
    plan = plan_retests([3], known_good=[2, 4, 5], measured=[(2, 3), (3, 4)])
    assert plan.rounds == (((3, 5),),)
    plan = plan_retests([3], known_good=[2, 4], measured=[(2, 3), (3, 4)])
    assert plan == RetestPlan(rounds=(), without_partner=(3,))


def test_retest_rounds_are_disjoint_and_cover_every_suspect():
    suspects = list(range(10))
    good = [20, 21, 22]
    plan = plan_retests(suspects, good)
    check_rounds_are_disjoint(plan.rounds, 23)
    tested = sorted(node for pairs in plan.rounds for pair in pairs for node in pair if node not in good)
    assert tested == suspects
    assert len(plan.rounds) == 4  # ceil(10 / 3)


def test_suspect_cannot_be_known_good():
    with pytest.raises(ValueError):
        plan_retests([1, 2], known_good=[2, 3])


def test_disjoint_rounds_never_put_a_node_in_two_pairs_at_once():
    from trainctl.health.fabric.schedule import disjoint_rounds

    # two stragglers (1, 2) re-measured with both known-good nodes (0, 3)
    rounds = disjoint_rounds([(1, 0), (1, 3), (2, 0), (2, 3), (3, 1)])
    assert rounds == (((0, 1), (2, 3)), ((1, 3), (0, 2)))
    assert disjoint_rounds([]) == ()
