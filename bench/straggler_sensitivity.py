"""How often the fabric test names a node rate-limited to 0.9/0.8/0.7/0.5 x of its peers, and two at 0.5 x.

Run (root): .venv/bin/python bench/straggler_sensitivity.py [--runs 5] [--factor F] [--cases 0.8x ...]
Brings up a 4-node dev cluster ($TRAINCTL_DEVCLUSTER_INSTANCE) and, in interleaved rounds with
the cases in a shuffled order, runs each case as a pair of fabric tests (`srun -N4 trainctl
health fabric --site local-demo --no-intra`):

1. healthy: nothing shaped. Its `reference_gbps`, the test's own figure for a healthy pair, is
   the healthy pair bandwidth of the moment; any node it excludes is a false exclusion.
2. shaped: the case's node(s), picked at random, limited with tc tbf (both directions) to
   factor x that bandwidth; found when every shaped node is excluded, false when another is.

Calibrating right before each shaped run follows the load of the shared machine, which moves
the CPU-bound gloo bandwidth by tens of percent within minutes. The load average is printed.

`--wire RATE` (Mbit/s) makes the wire the bottleneck, as it is for NCCL on a real fabric: every
node is limited to RATE (far below what the CPUs reach), the shaped node(s) to factor x RATE,
so what is measured is the test's sensitivity rather than the shared CPUs' noise.
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
from dataclasses import dataclass, field
from pathlib import Path

from trainctl.devcluster.cluster import DevCluster, spec_for_instance
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NODES = ("node1", "node2", "node3", "node4")
CASES = {"0.9x": (0.9, 1), "0.8x": (0.8, 1), "0.7x": (0.7, 1), "0.5x": (0.5, 1), "0.5x-two": (0.5, 2)}


@dataclass
class Tally:
    runs: int = 0
    found: int = 0
    false: int = 0
    ratios: list[float] = field(default_factory=list)  # shaped nodes' best / reference


def fabric(cluster: DevCluster, out: Path, extra: list[str]) -> dict:
    """The fabric test's report; a run without one (it crashed or timed out) is reported and
    comes back as a report that excluded nothing and found nothing, so the counts show it."""
    result = run(["srun", "-N4", "--ntasks-per-node=1", "--kill-on-bad-exit=0", TRAINCTL, "health", "fabric",
                  "--site", "local-demo", "--no-intra", "--out", str(out), *extra],
                 timeout=300, env=cluster.client_env())
    if not out.exists():
        print(f"no fabric report from {out.name}: {' '.join(result.stderr.split())[-500:]}", flush=True)
        return {"excluded": [], "nodes": {}, "reference_gbps": None, "duration_s": result.duration_s}
    return json.loads(out.read_text())


def excluded(report: dict) -> set[str]:
    return {item["host"] for item in report["excluded"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="shaped runs per case (each after a healthy one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--factor", type=float, default=None, help="straggler factor (default: the site's)")
    parser.add_argument("--wire", type=int, default=None, metavar="MBIT",
                        help="limit every node to MBIT Mbit/s and shape against that, not the calibration")
    parser.add_argument("--keep", type=Path, default=None, help="keep every fabric report in this directory")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), metavar="CASE",
                        help=f"cases to run (default all: {', '.join(CASES)})")
    args = parser.parse_args()
    extra = ["--factor", str(args.factor)] if args.factor else []
    cluster = DevCluster(spec_for_instance())
    cluster.up(lock_wait_s=300)
    rng = random.Random(args.seed)
    healthy, shaped = Tally(), {name: Tally() for name in args.cases}
    durations: list[float] = []
    load_start = os.getloadavg()[0]
    started = time.monotonic()
    base = f"{args.wire}mbit" if args.wire else None
    for node in NODES:
        cluster.set_rate(node, base)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = args.keep or scratch
            Path(tmp).mkdir(parents=True, exist_ok=True)
            fabric(cluster, Path(tmp) / "warm.json", extra)  # page cache and .pyc files on every node
            for number in range(args.runs):
                order = list(args.cases)
                rng.shuffle(order)
                for name in order:
                    factor, count = CASES[name]
                    calibration = fabric(cluster, Path(tmp) / f"healthy-{number}-{name}.json", extra)
                    healthy.runs += 1
                    healthy.false += bool(excluded(calibration))
                    reference = calibration["reference_gbps"] or 0.0
                    slow = sorted(rng.sample(NODES, count))
                    wire = args.wire or reference * 8000  # Mbit/s; GB/s of busbw -> Mbit/s
                    rate = f"{max(int(factor * wire), 1)}mbit"
                    for node in slow:
                        cluster.set_rate(node, rate)
                    try:
                        report = fabric(cluster, Path(tmp) / f"shaped-{number}-{name}.json", extra)
                    finally:
                        for node in slow:
                            cluster.set_rate(node, base)
                    tally = shaped[name]
                    tally.runs += 1
                    tally.found += set(slow) <= excluded(report)
                    tally.false += bool(excluded(report) - set(slow))
                    if report["reference_gbps"]:
                        tally.ratios += [report["nodes"][node]["busbw_gbps"] / report["reference_gbps"]
                                         for node in slow if report["nodes"][node].get("busbw_gbps")]
                    durations += [calibration["duration_s"], report["duration_s"]]
                    print(f"round {number} {name:<8} ref {reference:.2f} GB/s, {'+'.join(slow)} at {rate}: "
                          f"excluded {sorted(excluded(report)) or '-'} (healthy run: "
                          f"{sorted(excluded(calibration)) or '-'})", flush=True)
    finally:
        for node in NODES:
            cluster.set_rate(node, None)
        cluster.down()
    print(f"\nstraggler sensitivity, 4 nodes, site local-demo, factor {args.factor or 'of the site'}, "
          f"{args.runs} runs per case, wire {base or 'unlimited'}, "
          f"{(time.monotonic() - started) / 60:.1f} min, "
          f"load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"in-test median {statistics.median(durations):.1f} s")
    print("| case | runs | found | false exclusions | shaped node's best / reference (median) |")
    print("|---|---|---|---|---|")
    for name, tally in shaped.items():
        ratio = f"{statistics.median(tally.ratios):.2f}" if tally.ratios else "-"
        runs = tally.runs
        print(f"| {name} | {runs} | {tally.found}/{runs} | {tally.false}/{runs} | {ratio} |")
    print(f"| healthy | {healthy.runs} | - | {healthy.false}/{healthy.runs} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
