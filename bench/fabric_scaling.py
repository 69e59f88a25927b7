"""Fabric test wall time for 2, 3 and 4 nodes on the real test cluster, and rounds up to N = 1024.

Run (root): .venv/bin/python bench/fabric_scaling.py [--rounds 5]
Brings up its own 4-node dev cluster, runs `srun -N n trainctl health fabric` for n = 2, 3, 4
in interleaved rounds, and prints medians and the ratio to n = 2. Target (issue 5): the
4-node test takes less than 1.5x the 2-node test, because pairs of a round run at once.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fabric_schedule import schedule_rows  # noqa: E402

from trainctl.devcluster.cluster import ClusterSpec, DevCluster  # noqa: E402
from trainctl.proc import run_checked  # noqa: E402

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
TARGET = 1.5


def fabric_once(cluster: DevCluster, nodes: int, out: Path) -> tuple[float, float, int]:
    """(wall seconds of the srun step, seconds rank 0 spent from rendezvous to verdict, rounds)."""
    start = time.perf_counter()
    run_checked(["srun", f"-N{nodes}", "--ntasks-per-node=1", TRAINCTL, "health", "fabric",
                 "--site", "local-demo", "--out", str(out)], timeout=300, env=cluster.client_env())
    elapsed = time.perf_counter() - start
    report = json.loads(out.read_text())
    if report["excluded"]:
        raise SystemExit(f"healthy cluster reported exclusions: {report['excluded']}")
    return elapsed, report["duration_s"], report["rounds"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cluster = DevCluster(ClusterSpec(nodes=4))
    cluster.up(lock_wait_s=300)
    samples: dict[int, list[tuple[float, float, int]]] = {2: [], 3: [], 4: []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in samples:  # warm-up: page cache and .pyc files on every node
                fabric_once(cluster, n, Path(tmp) / "warm.json")
            rng = random.Random(0)
            for number in range(args.rounds):
                order = list(samples)
                rng.shuffle(order)
                for n in order:
                    samples[n].append(fabric_once(cluster, n, Path(tmp) / f"{n}-{number}.json"))
    finally:
        cluster.down()
    medians = {n: statistics.median(wall for wall, _, _ in values) for n, values in samples.items()}
    inside = {n: statistics.median(test for _, test, _ in values) for n, values in samples.items()}
    rounds = {n: values[0][2] for n, values in samples.items()}
    print(f"fabric test (sizes 1M,16M, local-demo site), {args.rounds} interleaved rounds, medians")
    print(f"{'nodes':>5} {'wall s':>7} {'ratio':>6} {'in-test s':>10} {'ratio':>6} {'rounds':>6} {'s/round':>8}")
    for n, value in medians.items():
        print(f"{n:>5} {value:>7.2f} {value / medians[2]:>6.2f} {inside[n]:>10.2f} {inside[n] / inside[2]:>6.2f}"
              f" {rounds[n]:>6} {inside[n] / max(rounds[n], 1):>8.2f}")
    print("(wall: the whole srun step, torch import included; in-test: rank 0, rendezvous to verdict)")
    ratio = medians[4] / medians[2]
    print(f"4 nodes / 2 nodes = {ratio:.2f} ({'meets' if ratio < TARGET else 'MISSES'} target < {TARGET})")
    print("\npairing schedule: rounds stay constant as N grows")
    print(f"{'N':>5} {'rounds':>6} {'pairs':>6} {'fewest partners':>15}")
    for row in schedule_rows():
        print(f"{row.node_count:>5} {row.rounds:>6} {row.pairs:>6} {row.fewest_partners:>15}")
    return 0 if ratio < TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
