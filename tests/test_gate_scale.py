"""Smoke test of bench/gate_scale.py: simulated ranks through the real fabric runner (its store
rendezvous, rounds, collection, re-tests and blame; the all_reduce is a stand-in), at a size
above the process's soft open-files limit: rank 0 raises it to the hard limit (runner)."""

import json
import resource
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gate_scale.py"
SOFT_LIMIT = 64  # rank 0's process: ~35 descriptors of its own and 3 per node, ~100 at 24 nodes


def low_soft_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, hard))


def test_simulated_ranks_above_the_soft_open_files_limit_find_the_slow_and_missing_nodes():
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        raise AssertionError("this test needs a hard RLIMIT_NOFILE of at least 1024")
    sys.path.insert(0, str(BENCH.parent))
    import gate_scale

    done = subprocess.run([sys.executable, str(BENCH), "--one", "24", "--join-timeout", "3", "--keep-nofile"],
                          capture_output=True, text=True, timeout=240, preexec_fn=low_soft_limit,
                          env=gate_scale.child_env())
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["errors"] == []
    assert row["rounds"] == 3
    assert row["found"] == "1/1" and row["false"] == 0   # gpu0006 at 0.5x
    assert row["missing"] == "1/1"   # gpu0008 never started; the report names it
