"""Sweep ingest: the real sweep writer taking N node results into the SQLite history.

Run: .venv/bin/python bench/sweep_ingest.py [--nodes 10000] [--rounds 3]

Node results are real: the recorded H100 snapshot (tests/fixtures/recorded/h100-vm-2026-11-22-snapshot)
judged by every registered check, and the same snapshot with each recorded ibstat and kernel log of
tests/fixtures/library overlaid (ports down, Xids), so rows carry real reasons and details. 97 % of nodes
are the recorded snapshot, 3 % the variants. Each round writes two sweeps into a fresh history with
`record_sweep` (the writer `trainctl sweep` uses): the first has no earlier sweep, the second judges
the error counters by their growth since the first, as a nightly sweep does. Every result arrives at
once, as when a Slurm job's nodes all finish together: the worst case for the writer.

Two writers, interleaved, each in a fresh process (so its peak RSS is its own):
  per-node   one transaction per node (batch_max=1, how sweeps committed before)
  batched    what is ready is committed together, at most `BATCH_MAX` nodes per transaction
Target (issue 15): 10,000 nodes in <= 5 s. Wall seconds depend on the machine's load (printed);
CPU seconds (the whole process: collector and writer thread) much less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / "tests" / "fixtures" / "library"
BASE_SNAPSHOT = REPO / "tests" / "fixtures" / "recorded" / "h100-vm-2026-11-22-snapshot"
OVERLAYS = {"infiniband/ibstat": "ibstat.txt", "kernel/xid": "dmesg.txt"}
VARIANT_SHARE = 0.03
WRITERS = {"per-node": 1, "batched": None}   # None: the writer's own batch limit


def node_reports() -> list[dict]:
    """Health reports (JSON, as a node task prints them) of the base snapshot and its variants."""
    import shutil

    from trainctl.health.node import check_node, policy_for

    policy = policy_for(None, None, None)
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        variants = [None] + [(folder, path) for folder in OVERLAYS if (SHARED / folder).is_dir()
                             for path in sorted((SHARED / folder).iterdir())]
        for number, variant in enumerate(variants):
            root = Path(tmp) / str(number)
            shutil.copytree(BASE_SNAPSHOT, root)
            if variant is not None:
                folder, path = variant
                shutil.copyfile(path, root / OVERLAYS[folder])
            reports.append(check_node(root, policy, collect=False).to_json())
    return reports


def outcomes(reports: list[dict], nodes: int) -> list:
    from trainctl.sweep.collect import outcome_from_envelope

    base, variants = reports[0], reports[1:]
    every = max(1, round(1 / VARIANT_SHARE))
    made = []
    for i in range(nodes):
        host = f"gpu{i:05d}"
        report = variants[(i // every) % len(variants)] if variants and i % every == 0 else base
        made.append(outcome_from_envelope(host, {"outcome": "checked", "duration_s": 2.0,
                                                 "report": {**report, "host": host}}))
    return made


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_run(nodes: int, writer: str) -> dict:
    """Child process: build the outcomes, then time two sweeps written by the real writer."""
    import inspect

    from trainctl.sweep.db import History
    from trainctl.sweep.runner import record_sweep

    made = outcomes(node_reports(), nodes)
    before = rss_mb()
    options = {}
    if WRITERS[writer] is not None and "batch_max" in inspect.signature(record_sweep).parameters:
        options["batch_max"] = WRITERS[writer]
    seconds, cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweeps.db"
        with History.open(path, write=True) as history:
            for night in range(2):
                sweep_id = history.start_sweep(kind="sweep", started_at=time.time(), site="bench", via="slurm",
                                               target="gpu", checks="all")
                start, start_cpu = time.perf_counter(), time.process_time()
                record_sweep(history, sweep_id=sweep_id, not_swept=[], outcomes=iter(made),
                             progress=lambda line: None, **options)
                seconds.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
        size = path.stat().st_size + sum(p.stat().st_size for p in Path(tmp).glob("sweeps.db-*"))
    checks = len(made[0].checks)
    return {"writer": writer, "nodes": nodes, "checks_per_node": checks, "first_sweep_s": round(seconds[0], 3),
            "second_sweep_s": round(seconds[1], 3), "first_cpu_s": round(cpu[0], 3),
            "second_cpu_s": round(cpu[1], 3), "load_avg_1m": round(os.getloadavg()[0], 1), "peak_rss_mb": round(rss_mb()),
            "rss_before_ingest_mb": round(before), "db_mb_two_sweeps": round(size / 2**20, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", default="per-node,batched", help="comma-separated: per-node, batched")
    parser.add_argument("--one", choices=sorted(WRITERS), help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.nodes, args.one)))
        return 0
    writers = args.writers.split(",")
    runs: dict[str, list[dict]] = {w: [] for w in writers}
    for number in range(args.rounds):
        for writer in writers if number % 2 == 0 else reversed(writers):  # interleaved, order alternating
            out = subprocess.run([sys.executable, __file__, "--nodes", str(args.nodes), "--one", writer],
                                 capture_output=True, text=True, check=True).stdout
            runs[writer].append(json.loads(out.splitlines()[-1]))
    medians = {}
    for writer, samples in runs.items():
        line = {key: statistics.median(s[key] for s in samples) if isinstance(samples[0][key], (int, float))
                else samples[0][key] for key in samples[0]}
        medians[writer] = line
        print(json.dumps(line))
    if len(medians) == 2:
        slow, fast = (medians[w]["second_sweep_s"] for w in writers)
        print(f"second sweep: {writers[0]} / {writers[1]} = {slow / fast:.2f}x (medians of {args.rounds})")
    met = all(m["second_sweep_s"] <= 5.0 and m["first_sweep_s"] <= 5.0 for m in medians.values()
              if m["writer"] == "batched" and m["nodes"] >= 10_000)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
