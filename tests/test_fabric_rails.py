"""Every rail measured: rail-aligned rounds, and each rail judged on its own (pure, no torch)."""

import json

import pytest
from hypothesis import given, strategies as st

from trainctl.health.fabric.report import FabricReport, build_report, rail_label
from trainctl.health.fabric.schedule import rail_schedules

SIZES = (1 << 20, 16 << 20)
HOSTS = ["n1", "n2", "n3", "n4"]
RING_AND_FAR = [("n1", "n2"), ("n3", "n4"), ("n2", "n3"), ("n4", "n1"), ("n1", "n3"), ("n2", "n4")]
DGX_RAILS = ("mlx5_0:1", "mlx5_3:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1", "mlx5_9:1", "mlx5_10:1", "mlx5_11:1")


def measurement(peers, size, busbw, rail):
    return {"peers": list(peers), "size": size, "ranks": 2, "median_s": size / (busbw * 1e9),
            "algbw_gbps": busbw, "busbw_gbps": busbw, "error": None, "fast_s": None, "rail": rail}


def rails_results(hosts, rail_count, busbw):
    """Rank n x R + r is node n's rail r; `busbw(pair, rail)` is that rail's pair's figure."""
    results = {}
    for node, host in enumerate(hosts):
        for rail in range(rail_count):
            inter = [measurement(pair, size, busbw(pair, rail), rail)
                     for pair in RING_AND_FAR if host in pair for size in SIZES]
            rank = node * rail_count + rail
            results[rank] = {"rank": rank, "host": host, "backend": "gloo", "rail": rail, "intra": [], "inter": inter}
    return results


def roster(hosts, rail_count, missing=()):
    ranks = range(len(hosts) * rail_count)
    joined = [r for r in ranks if r not in missing]
    return {"joined": joined, "missing": list(missing), "hosts": {str(r): hosts[r // rail_count] for r in joined},
            "expected": [hosts[r // rail_count] for r in ranks]}


def report(results, ros, rails):
    """The report as fabric.json holds it."""
    return build_report(results=results, roster=ros, rails=rails, sizes=SIZES, rounds=3, retests=0,
                        straggler_factor=0.7, floor_gbps=None, join_timeout_s=15, duration_s=1.0).to_json()


# --- schedule ---

@given(nodes=st.integers(2, 64), rail_count=st.integers(1, 8))
def test_rail_r_pairs_only_with_rail_r_of_other_nodes_in_at_most_three_rounds(nodes, rail_count):
    ranks = list(range(nodes * rail_count))
    schedules = rail_schedules(ranks, rail_count)
    assert len(schedules) == rail_count
    assert len({len(rounds) for rounds in schedules}) == 1 and len(schedules[0]) <= 3
    for rail, rounds in enumerate(schedules):
        own = [rank for rank in ranks if rank % rail_count == rail]
        for pairs in rounds:
            for i, j in pairs:
                a, b = own[i], own[j]
                assert a % rail_count == b % rail_count == rail   # rail-aligned
                assert a // rail_count != b // rail_count         # across nodes


def test_a_rail_with_a_missing_rank_pads_to_the_others_rounds():
    # node 2's rail 1 (rank 5) never joined: rail 1 pairs 3 nodes, rail 0 all 4, same round count
    schedules = rail_schedules([0, 1, 2, 3, 4, 6, 7], 2)
    assert schedules[0] == (((0, 1), (2, 3)), ((1, 2), (0, 3)), ((0, 2), (1, 3)))
    assert schedules[1] == (((0, 1),), ((1, 2),), ((0, 2),))


# --- report ---

def test_slow_rail_names_its_node_and_rail_and_nothing_else():
    results = rails_results(HOSTS, 2, lambda pair, rail: 0.2 if rail == 1 and "n3" in pair else 0.6)
    out = report(results, roster(HOSTS, 2), ("eth0", "eth1"))
    assert [e["host"] for e in out["excluded"]] == ["n3"]
    reason = out["nodes"]["n3"]["reason"]
    assert reason.startswith("straggler: rail 1 (eth1): 0.33x the rail's reference 0.60 GB/s") and "rail 0" not in reason
    assert {host: node["status"] for host, node in out["nodes"].items()} == \
        {"n1": "ok", "n2": "ok", "n3": "fail", "n4": "ok"}
    assert out["nodes"]["n3"]["rails"]["eth0"]["ratio"] == 1.0
    assert out["nodes"]["n3"]["busbw_gbps"] == 0.2  # a node is as fast as its slowest rail
    assert out["status"] == "fail" and out["rails"] == ["eth0", "eth1"] and out["world"] == 4


def test_each_rail_is_judged_against_the_same_rail_only():
    # rail 0 runs at 4 GB/s, rail 1 at 1 GB/s on every node (another NIC model): no rail is slow
    # against its own peers; node n4's rail 1 at half its peers is
    results = rails_results(HOSTS, 2, lambda pair, rail: 4.0 if rail == 0 else (0.5 if "n4" in pair else 1.0))
    out = report(results, roster(HOSTS, 2), ("eth0", "eth1"))
    assert [e["host"] for e in out["excluded"]] == ["n4"]
    assert out["nodes"]["n4"]["reason"].startswith("straggler: rail 1 (eth1): 0.50x")
    assert out["rail_reference_gbps"] == {"eth0": 4.0, "eth1": 1.0}


def test_healthy_rails_exclude_nothing():
    results = rails_results(HOSTS, 2, lambda pair, rail: 0.6)
    out = report(results, roster(HOSTS, 2), ("eth0", "eth1"))
    assert out["excluded"] == [] and out["status"] == "ok"
    assert all(set(node["rails"]) == {"eth0", "eth1"} for node in out["nodes"].values())


def test_eight_rails_name_the_hca():
    results = rails_results(HOSTS, 8, lambda pair, rail: 0.45 * 40 if rail == 3 and "n3" in pair else 40.0)
    out = report(results, roster(HOSTS, 8), DGX_RAILS)
    assert out["nodes"]["n3"]["reason"].startswith("straggler: rail 3 (mlx5_5:1): 0.45x")
    assert [e["host"] for e in out["excluded"]] == ["n3"]


def test_missing_and_silent_rail_ranks_name_their_rail():
    results = rails_results(HOSTS, 2, lambda pair, rail: 0.6)
    del results[5]  # n3's rail 1 joined but sent nothing
    out = report({r: v for r, v in results.items() if r != 3}, roster(HOSTS, 2, missing=(3,)), ("eth0", "eth1"))
    assert out["nodes"]["n2"]["reason"] == "rail 1 (eth1): did not join within 15 s" and out["nodes"]["n2"]["lost"]
    assert out["nodes"]["n3"]["reason"] == "rail 1 (eth1): joined but sent no results (died or hung mid-test)"
    assert {e["host"] for e in out["excluded"]} == {"n2", "n3"}


@pytest.mark.parametrize("rail, name, text", [(1, "eth1", "rail 1 (eth1)"), (5, "mlx5_9:1", "rail 5 (mlx5_9:1)")])
def test_rail_label(rail, name, text):
    assert rail_label(rail, name) == text


def test_pair_groups_of_two_rails_never_share_a_store_prefix():
    # one prefix for both rails crosses their gloo connections (bench/gloo_shared_prefix.py)
    from trainctl.health.fabric.runner import pair_prefix

    prefixes = {pair_prefix("round", number, rail, 0, 1) for number in range(3) for rail in range(8)}
    assert len(prefixes) == 3 * 8


def test_rail_identity_numbers_node_n_rail_r_as_rank_n_times_r_plus_r():
    from trainctl.health.fabric.runner import Identity, rail_identity

    node = Identity(rank=2, world=4, host="n3", master_addr="10.0.0.1", port=29500, expected_hosts=("a", "b", "n3", "d"))
    rail = rail_identity(node, 1, 2)
    assert (rail.rank, rail.world, rail.host) == (5, 8, "n3")
    assert rail.expected_hosts == ("a", "a", "b", "b", "n3", "n3", "d", "d")


def test_rails_come_from_the_site_unless_given():
    from trainctl.health.fabric.options import FabricOverrides, fabric_options, fabric_policy

    def rails(site, given=None):
        options, _, _ = fabric_options(fabric_policy(site, None), FabricOverrides(rails=given))
        return options.rails

    assert rails("dgx-h100") == DGX_RAILS
    assert rails("local-demo") == ()
    assert rails("local-demo", ("eth0", "eth1")) == ("eth0", "eth1")


def test_text_report_shows_every_rail_and_the_excluded_rail():
    from trainctl.health.cli import format_fabric_report

    results = rails_results(HOSTS, 2, lambda pair, rail: 0.2 if rail == 1 and "n3" in pair else 0.6)
    text = format_fabric_report(FabricReport.from_json(report(results, roster(HOSTS, 2), ("eth0", "eth1"))))
    assert "  n3 rail 1 (eth1): best 0.20 GB/s, 0.33x the rail's reference" in text
    assert "excluded: n3: straggler: rail 1 (eth1): 0.33x" in text


def test_one_rail_or_an_empty_device_is_a_usage_error_not_a_silent_single_rail():
    import subprocess
    import sys
    from pathlib import Path

    trainctl = str(Path(sys.executable).with_name("trainctl"))
    for rails in ("eth1", "eth0,,eth1", "eth0,"):
        out = subprocess.run([trainctl, "health", "fabric", "--rails", rails], capture_output=True, text=True,
                             timeout=60, env={**__import__("os").environ, "SLURM_PROCID": "0"})
        assert out.returncode == 2, (rails, out.stderr)
        assert "give two or more devices" in out.stderr and out.stderr.count("\n") == 1


def test_fabric_json_reads_back_as_the_same_typed_report():
    # gate decide reads rank 0's fabric.json back: with and without rails, lost nodes included
    results = rails_results(HOSTS, 2, lambda pair, rail: 0.2 if rail == 1 and "n3" in pair else 0.6)
    del results[7]  # n4's rail 1 sent nothing
    for rails, built in ((("eth0", "eth1"), report(results, roster(HOSTS, 2), ("eth0", "eth1"))),
                         ((), report(rails_results(HOSTS, 1, lambda pair, rail: 0.6), roster(HOSTS, 1, missing=(2,)),
                                     ()))):
        typed = FabricReport.from_json(json.loads(json.dumps(built)))
        assert typed.to_json() == built and typed.rails == rails
        assert any(node.lost for node in typed.nodes.values())
