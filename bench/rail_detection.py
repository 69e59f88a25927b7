"""How often the fabric test names one slow rail of one node, how often it blames a healthy one,
and what measuring every rail costs in time (issue 13 item 2).

Run (root): flock /tmp/trainctl-heavy.lock .venv/bin/python bench/rail_detection.py [--runs 5]
Brings up a 4-node dev cluster ($TRAINCTL_DEVCLUSTER_INSTANCE) with two rails (eth0, eth1 on
bridges and subnets of their own) and makes the wire the bottleneck: every rail of every node is
shaped to --wire Mbit/s with tc tbf. Then, per run, in a shuffled order:

- shaped: node3's rail 1 at --slow x the wire; found when node3 is the only node excluded and its
  reason names rail 1 and not rail 0; false when any other node or rail is blamed;
- healthy: two rails, nothing else shaped; any exclusion is false;
- one rail: the same test without --rails (one rank per node over eth0), for the time ratio.

Times are the test's own duration (rank 0's `duration_s`, rendezvous to report) and srun's wall
time, compared healthy two-rail against one-rail runs taken side by side.
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
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
RAILS = ("eth0", "eth1")
SLOW_NODE, SLOW_RAIL = "node3", 1
ARGS = ["--site", "local-demo", "--no-intra", "--sizes", "1M,4M", "--passes", "2", "--timeout", "90"]


def fabric(cluster: DevCluster, out: Path, rails: bool) -> tuple[dict, float]:
    """The report and srun's wall time; a run without a report comes back as one that found nothing."""
    extra = ["--rails", ",".join(RAILS)] if rails else []
    start = time.monotonic()
    result = run(["srun", "-N4", "--ntasks-per-node=1", "--kill-on-bad-exit=0", TRAINCTL, "health", "fabric",
                  *ARGS, "--out", str(out), *extra], timeout=300, env=cluster.client_env())
    wall = time.monotonic() - start
    if not out.exists():
        print(f"no fabric report from {out.name}: {' '.join(result.stderr.split())[-500:]}", flush=True)
        return {"excluded": [], "nodes": {}, "duration_s": None}, wall
    return json.loads(out.read_text()), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind")
    parser.add_argument("--wire", type=int, default=500, metavar="MBIT", help="every rail's rate")
    parser.add_argument("--slow", type=float, default=0.35, help="the slow rail's rate, x the wire")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cluster = DevCluster(spec_for_instance())
    cluster.up(lock_wait_s=300)
    rng = random.Random(args.seed)
    found = false_shaped = false_healthy = 0
    durations: dict[str, list[float]] = {"two": [], "one": []}
    walls: dict[str, list[float]] = {"two": [], "one": []}
    load_start, started = os.getloadavg()[0], time.monotonic()
    wire, slow = f"{args.wire}mbit", f"{int(args.slow * args.wire)}mbit"
    try:
        cluster.set_rails(len(RAILS))
        for node in cluster.spec.node_names:
            for rail in range(len(RAILS)):
                cluster.set_rate(node, wire, rail)
        with tempfile.TemporaryDirectory() as tmp:
            fabric(cluster, Path(tmp) / "warm.json", True)  # page cache and .pyc files on every node
            for number in range(args.runs):
                kinds = ["shaped", "healthy", "one"]
                rng.shuffle(kinds)
                for kind in kinds:
                    out = Path(tmp) / f"{kind}-{number}.json"
                    if kind == "shaped":
                        cluster.set_rate(SLOW_NODE, slow, SLOW_RAIL)
                        try:
                            report, _ = fabric(cluster, out, True)
                        finally:
                            cluster.set_rate(SLOW_NODE, wire, SLOW_RAIL)
                        blamed = {item["host"]: item["reason"] for item in report["excluded"]}
                        reason = blamed.get(SLOW_NODE, "")
                        hit = set(blamed) == {SLOW_NODE} and f"rail {SLOW_RAIL} (" in reason and "rail 0" not in reason
                        found += hit
                        false_shaped += bool(set(blamed) - {SLOW_NODE}) or "rail 0" in reason
                        ratio = ((report["nodes"].get(SLOW_NODE) or {}).get("rails") or {}).get(RAILS[SLOW_RAIL], {})
                        print(f"run {number} shaped: excluded {sorted(blamed) or '-'}, {SLOW_NODE} rail "
                              f"{SLOW_RAIL} at {ratio.get('ratio')}x: {'found' if hit else 'MISSED'}", flush=True)
                    else:
                        report, wall = fabric(cluster, out, kind == "healthy")
                        key = "two" if kind == "healthy" else "one"
                        false_healthy += bool(report["excluded"]) if kind == "healthy" else 0
                        if report["duration_s"] is not None:
                            durations[key].append(report["duration_s"])
                        walls[key].append(wall)
                        print(f"run {number} {'healthy 2 rails' if key == 'two' else 'healthy 1 rail'}: "
                              f"excluded {[item['host'] for item in report['excluded']] or '-'}, "
                              f"test {report['duration_s']} s, srun {wall:.1f} s", flush=True)
    finally:
        cluster.down()
    runs = args.runs
    print(f"\nrail detection, 4 nodes x {len(RAILS)} rails, every rail at {wire}, {SLOW_NODE} rail {SLOW_RAIL} "
          f"at {slow} ({args.slow:g}x), {runs} runs of each kind, {(time.monotonic() - started) / 60:.1f} min, "
          f"load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| case | runs | found | false |")
    print("|---|---|---|---|")
    print(f"| {SLOW_NODE} rail {SLOW_RAIL} at {args.slow:g}x | {runs} | {found}/{runs} | {false_shaped}/{runs} |")
    print(f"| healthy, 2 rails | {runs} | - | {false_healthy}/{runs} |")
    two, one = statistics.median(durations["two"] or [0]), statistics.median(durations["one"] or [float("nan")])
    print(f"time, median: 2 rails {two:.1f} s, 1 rail {one:.1f} s in the test: {two / one:.2f}x; srun wall "
          f"{statistics.median(walls['two']):.1f} s vs {statistics.median(walls['one']):.1f} s: "
          f"{statistics.median(walls['two']) / statistics.median(walls['one']):.2f}x")
    print(json.dumps({"runs": runs, "found": found, "false_shaped": false_shaped, "false_healthy": false_healthy,
                      "two_rail_s": durations["two"], "one_rail_s": durations["one"],
                      "two_rail_wall_s": [round(w, 2) for w in walls["two"]],
                      "one_rail_wall_s": [round(w, 2) for w in walls["one"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
