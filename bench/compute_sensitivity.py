"""How often the gate's compute test names a node at a 50% CPU quota, and how often it blames a healthy one.

Run (root): .venv/bin/python bench/compute_sensitivity.py [--runs 10] [--quota 0.5]
Brings up a 4-node dev cluster ($TRAINCTL_DEVCLUSTER_INSTANCE) and, interleaved, runs pairs of
gates (`srun -N4 trainctl gate node --no-fabric` on the site local-demo with the compute test on,
then `gate decide`):

1. healthy: nothing changed; any node the compute test excludes is a false exclusion;
2. slow: one node, picked at random, has every process in a cgroup v1 CFS quota of --quota of
   one core (`trainctl.devcluster.faults.cpu_quota`: a real fail-slow, its processes get less
   CPU); found when it is excluded as a compute fail-slow, false when another node is.

Prints one line per gate and a table: found/false counts and the slow node's matmul ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainctl.devcluster.cluster import DevCluster, spec_for_instance
from trainctl.devcluster.faults import cpu_quota
from trainctl.proc import run
from trainctl.site import load_site

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NODES = ("node1", "node2", "node3", "node4")


def site_with_compute(scratch: Path) -> str:
    text = Path(load_site("local-demo").path).read_text()
    path = scratch / "local-demo-compute.toml"
    path.write_text(text.replace("\ncompute = false", "\ncompute = true"))
    return str(path)


def gate(cluster: DevCluster, gate_dir: Path, site: str) -> dict:
    result = run(["srun", "-N4", "--ntasks-per-node=1", TRAINCTL, "gate", "node", "--site", site,
                  "--dir", str(gate_dir), "--no-fabric"], timeout=300, env=cluster.client_env())
    if result.returncode != 0:
        raise SystemExit(f"gate step failed: {result.stderr[-2000:]}")
    run([TRAINCTL, "gate", "decide", "--site", site, "--dir", str(gate_dir), "--nodes", "1",
         "--allocated", "node[1-4]"], timeout=120, env=cluster.client_env())
    return json.loads((gate_dir / "decision.json").read_text())


def compute_excluded(decision: dict) -> set[str]:
    return {e["host"] for e in decision["excluded"] if any(r.startswith("compute") for r in e["reasons"])}


def why(decision: dict) -> str:
    """The compute reasons of the excluded nodes, for the bench's line ('' when none)."""
    reasons = [r for e in decision["excluded"] for r in e["reasons"] if r.startswith("compute")]
    return f" ({'; '.join(reasons)})" if reasons else ""


def lowest_ratio(decision: dict) -> float:
    return min((v[key] for v in decision["compute"] for key in ("tflops_ratio", "copy_ratio")
                if v.get(key) is not None), default=float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="slow gates (each after a healthy one)")
    parser.add_argument("--healthy-extra", type=int, default=10, help="further healthy gates, interleaved")
    parser.add_argument("--quota", type=float, default=0.5, help="the slow node's share of one core")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    cluster = DevCluster(spec_for_instance())
    cluster.up(lock_wait_s=300)
    counts = {"slow": [0, 0, 0], "healthy": [0, 0, 0]}  # runs, found, false
    ratios: list[float] = []
    healthy_lowest: list[float] = []  # per healthy gate: its lowest matmul or copy ratio
    load_start, started = os.getloadavg()[0], time.monotonic()
    plan = ["pair"] * args.runs + ["healthy"] * args.healthy_extra
    rng.shuffle(plan)
    try:
        with tempfile.TemporaryDirectory() as scratch_dir:
            scratch = Path(scratch_dir)
            site = site_with_compute(scratch)
            gate(cluster, scratch / "warm", site)  # page cache and .pyc files on every node
            for number, kind in enumerate(plan):
                healthy_decision = gate(cluster, scratch / f"healthy{number}", site)
                healthy = compute_excluded(healthy_decision)
                healthy_lowest.append(lowest_ratio(healthy_decision))
                counts["healthy"][0] += 1
                counts["healthy"][2] += bool(healthy)
                line = f"gate {number} healthy: excluded {sorted(healthy) or '-'}{why(healthy_decision)}"
                if kind == "pair":
                    slow = rng.choice(NODES)
                    with cpu_quota(cluster, slow, args.quota):
                        decision = gate(cluster, scratch / f"slow{number}", site)
                    excluded = compute_excluded(decision)
                    counts["slow"][0] += 1
                    counts["slow"][1] += slow in excluded
                    counts["slow"][2] += bool(excluded - {slow})
                    ratios += [v["tflops_ratio"] for v in decision["compute"]
                               if v["host"] == slow and v.get("tflops_ratio") is not None]
                    line += f"; {slow} at {args.quota:g} core: excluded {sorted(excluded) or '-'}"
                print(line, flush=True)
    finally:
        cluster.down()
    print(f"\ncompute sensitivity, 4 nodes, local-demo with compute on, {(time.monotonic() - started) / 60:.1f} min, "
          f"load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| case | runs | found | false exclusions | slow node's matmul / median (median) |")
    print("|---|---|---|---|---|")
    runs, found, false = counts["slow"]
    ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
    print(f"| one node at {args.quota:g} of a core | {runs} | {found}/{runs} | {false}/{runs} | {ratio} |")
    runs, _, false = counts["healthy"]
    lowest = f"lowest ratio in a healthy gate: {min(healthy_lowest):.2f}, median of gates {statistics.median(healthy_lowest):.2f}"
    print(f"| healthy | {runs} | - | {false}/{runs} | {lowest} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
