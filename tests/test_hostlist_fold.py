"""fold_hostlist's fast path (one RangeSet per prefix) folds exactly as ClusterShell's NodeSet.fromlist."""

import random

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet
from hypothesis import given, settings
from hypothesis import strategies as st

from trainctl.slurm import expand_hostlist, fold_hostlist

NAMES = st.builds(lambda prefix, number, pad: f"{prefix}{number:0{pad}d}",
                  st.sampled_from(["gpu", "node", "n", "a100-", "x.y", "", "dgx_"]),
                  st.integers(0, 20_000), st.integers(0, 6))
OTHER = st.sampled_from(["login", "rack1-n3", "rack2-n1", "gpu01b", "head"])


def reference(hosts):
    return str(NodeSet.fromlist(hosts, resolver=RESOLVER_NOGROUP))


@settings(max_examples=150, deadline=None)
@given(st.lists(NAMES | OTHER, max_size=60))
def test_fold_matches_clustershell(hosts):
    folded = fold_hostlist(hosts)
    assert folded == reference(hosts)
    assert sorted(expand_hostlist(folded)) == sorted(set(hosts)) if hosts else folded == ""


def test_forty_thousand_scattered_nodes_fold_the_same():
    hosts = random.Random(3).sample([f"gpu{i:05d}" for i in range(1, 100_001)], 40_000)
    assert fold_hostlist(hosts) == reference(hosts)
