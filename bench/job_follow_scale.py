"""The live view's cost (`trainctl job show --follow`): one redraw of a training job's chain, N nodes x R ranks.

Run: .venv/bin/python -P bench/job_follow_scale.py [--nodes 4,512,4096] [--ranks 8] [--redraws 7]

Each N has its own job directory (a temporary folder on this machine's disk): the node files are
written by the agents' own code, as in bench/watch_scale.py (its `Agents`, in a process of their
own: every node's file rewritten with each rank 2 steps further on between two redraws, untimed);
the journal by the supervisor's own Journal: the job's start, the gate's verdict on each node, its
choice of all of them, the training step's start, then a checkpoint seen between two redraws.

A redraw is what the live view does at each poll (`trainctl.job.follow`): the chain's links
(attempt.json, retry.json), the journal's new lines, every training node's file, the view and
its lines. The first redraw reads the whole journal (a verdict per node); each later one only
what was added. Printed per N: the first redraw and the median of the others, in seconds, their
cost per node, the median's CPU time (this process's: what the redraw itself costs, whatever else
the machine runs), and whether the median is under the target (0.5 s at 4,096 nodes). The load
average is printed at the start and the end: on a shared machine the wall time grows with it.
Every node's file changes between two redraws, so none is skipped as unchanged: the live view's
worst case (where agents write less often than it redraws, or have gone silent, it reads less).
The files are read from the page cache of a local disk: on a shared filesystem each open is a
metadata round trip on top of these figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from watch_scale import Agents, Remote, host_name  # noqa: E402
from trainctl.job.follow import Follower, site_watch, view_lines  # noqa: E402
from trainctl.job.jobdir import JobPaths, Journal, Kind  # noqa: E402

TARGET_S = 0.5          # one redraw at 4,096 nodes, on this machine
JOB_ID = "7"


def start_journal(paths: JobPaths, nodes: list[str]) -> Journal:
    journal = Journal(paths.journal)
    journal.add(Kind.JOB_START, job=JOB_ID, site="", attempt=1, nodes=nodes, batch_host=nodes[0])
    journal.add(Kind.GATE_START)
    for node in nodes:
        journal.add(Kind.NODE_VERDICT, node=node, verdict="chosen", reasons=[])
    journal.add(Kind.GATE_END, status=0, chosen=nodes, master_addr="10.0.0.1")
    journal.add(Kind.TRAINING_START, nodes=f"{nodes[0]}-{nodes[-1]}", master_addr="10.0.0.1")
    return journal


def redraw(follower: Follower, nodes: int) -> tuple[float, float, int]:
    started, cpu = time.perf_counter(), time.process_time()
    view = follower.read(time.time())
    lines = view_lines(view)
    spent, cpu = time.perf_counter() - started, time.process_time() - cpu
    if view.phase != "training" or len(view.nodes) != nodes or any(n.steps is None for n in view.nodes):
        raise SystemExit(f"job_follow_scale: {len(view.nodes)} nodes read as {view.phase}: {lines[:4]}")
    return spent, cpu, len(lines)


def measure(root: str, nodes: int, ranks: int, redraws: int) -> dict:
    paths = JobPaths.of(root, JOB_ID)
    names = [host_name(i) for i in range(nodes)]
    agents = Remote(functools.partial(Agents, str(paths.root), nodes, ranks, seed=nodes))
    try:
        journal = start_journal(paths, names)
        follower = Follower(str(paths.root), JOB_ID, site_watch)
        first, _, lines = redraw(follower, nodes)
        times, cpu_times = [], []
        for index in range(redraws):
            agents.call("advance")
            if index % 2:
                journal.add(Kind.CHECKPOINT, checkpoint_t=time.time(), note=f"step {index}")
            seconds, cpu, lines = redraw(follower, nodes)
            times.append(seconds)
            cpu_times.append(cpu)
    finally:
        agents.close()
    median = statistics.median(times)
    return {"nodes": nodes, "ranks": nodes * ranks, "first_s": round(first, 4), "redraw_s": round(median, 4),
            "redraw_cpu_s": round(statistics.median(cpu_times), 4),
            "us_per_node": round(median / nodes * 1e6, 1), "lines": lines, "journal_bytes": paths.journal.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,512,4096", help="comma-separated node counts")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--redraws", type=int, default=7, help="timed redraws per N, after the first (1 or more)")
    args = parser.parse_args()
    counts = sorted({int(n) for n in args.nodes.split(",")})
    if args.redraws < 1:
        parser.error("--redraws: 1 or more")
    print(f"command: {' '.join([os.path.relpath(sys.executable), '-P', *sys.argv])}")
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.stdout.flush()
    rows = []
    for n in counts:
        root = tempfile.mkdtemp(prefix="trainctl-follow-scale-")
        try:
            rows.append(measure(root, n, args.ranks, args.redraws))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'nodes':>6} {'ranks':>7} {'first s':>8} {'redraw s':>9} {'cpu s':>7} {'us/node':>8} {'lines':>6} "
          f"{'journal B':>10}")
    for row in rows:
        print(f"{row['nodes']:>6} {row['ranks']:>7} {row['first_s']:>8.3f} {row['redraw_s']:>9.3f} "
              f"{row['redraw_cpu_s']:>7.3f} "
              f"{row['us_per_node']:>8.1f} {row['lines']:>6} {row['journal_bytes']:>10,}")
    for row in rows:
        print(json.dumps(row))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    largest = rows[-1]
    verdict = "met" if largest["redraw_s"] < TARGET_S else "MISSED"
    print(f"target: one redraw < {TARGET_S} s at 4,096 nodes; at {largest['nodes']} nodes the median redraw took "
          f"{largest['redraw_s']:.3f} s: {verdict if largest['nodes'] >= 4096 else 'not judged below 4,096 nodes'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
