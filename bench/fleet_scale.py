"""Fleet memory at scale: folding a day's job journals into the history, and the report over it.

Run: .venv/bin/python bench/fleet_scale.py [--nodes 10000] [--days 30] [--jobs-per-day 1000] [--rounds 3]
         [--dir DIR]

The history holds N nodes x --days nightly sweeps (bench/report_scale.py's generator: every
check of the registry per checked node, 40 % of nodes allocated each night, 1.5 % failing an IB
port) and --days x --jobs-per-day job journals, written as the supervisor writes them into the
site's journal directory: jobs of 1 to 256 nodes (about 9 on average), 3 % with a gate
exclusion, 1 % with a watch detection, and 20 planted lemons left out by about one job a day.
The first days - 1 days are folded in once (setup); then, in interleaved rounds:

- `ingest, new day`: `trainctl history ingest` with the last day's journals new and every older
  one in the directory unchanged (the nightly case: one stat per old journal, the new ones read
  and folded); the new day's rows are removed again after each round;
- `ingest, nothing new`: the same with nothing new (the floor: the directory's stats);
- `report <fmt>`: `trainctl report --since <days>d` on this history, and on a copy of it without
  the job rows (what fleet memory adds to a report).

Each command is its own process (start-up included) with its own peak RSS (wait4). Targets
(the fleet memory work): the report <= 5 s, a day's ingest <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_scale import generate, run_measured  # noqa: E402
from timing import interleaved  # noqa: E402

from trainctl.sweep.db import History  # noqa: E402
from trainctl.sweep.fleet import fold_journals, journal_paths  # noqa: E402

DAY = 86400.0
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
SIZES = ((1, 30), (2, 20), (4, 20), (8, 15), (16, 10), (64, 4), (256, 1))   # nodes, % of jobs
REASONS = ("gpu.nvlink: GPU 3 link 5 inactive", "ib.ports: mlx5_2/1 Down", "gpu.xid: Xid 79 on GPU 3",
           "fabric: straggler: best busbw 61 GB/s < 0.7 x 180")


def write_journals(drop: Path, hosts: list[str], days: int, per_day: int, now: float, seed: int = 11) -> list[str]:
    """Every job's journal, as `trainctl job run` writes it; returns the last day's job ids."""
    rng = random.Random(seed)
    lemons = rng.sample(hosts, 20)
    sizes = [size for size, share in SIZES for _ in range(share)]
    last_day = []
    for day in range(days):
        for number in range(per_day):
            job = str(1_000_000 + day * per_day + number)
            t = now - (days - day) * DAY + number * (DAY / per_day) - 7200   # every job ended by now
            size = min(rng.choice(sizes), len(hosts) - 1)
            nodes = sorted(rng.sample(hosts, size + 1))
            excluded = {}
            if rng.random() < 0.03:
                excluded[nodes[-1]] = rng.choice(REASONS)
            lemon = lemons[number % len(lemons)]
            if number < len(lemons) and lemon not in nodes:   # each lemon left out by about one job a day
                nodes = sorted(nodes[:-1] + [lemon])
                excluded = {lemon: REASONS[0]}
            chosen = [n for n in nodes if n not in excluded][:size]
            events = [{"t": t, "event": "job_start", "job": job, "site": "bench", "attempt": 1, "nodes": nodes,
                       "batch_host": nodes[0], "slurm": "24.11.5"}]
            events += [{"t": t + 30, "event": "node_verdict", "node": n,
                        "verdict": "excluded" if n in excluded else "chosen" if n in chosen else "healthy, not needed",
                        "reasons": [excluded[n]] if n in excluded else []} for n in nodes]
            events.append({"t": t + 31, "event": "gate_end", "status": 0, "chosen": chosen, "master_addr": chosen[0]})
            events.append({"t": t + 32, "event": "training_start", "nodes": ",".join(chosen), "master_addr": chosen[0]})
            if rng.random() < 0.01:
                events.append({"t": t + 900, "event": "detection", "kind": "slow", "suspects": [chosen[-1]],
                               "evidence": f"{chosen[-1]} steps 1.8x the others' for 300 s", "details": {}})
                events.append({"t": t + 960, "event": "step_end", "status": 143, "cause": "ended by the watch (slow)"})
            else:
                events.append({"t": t + 3600, "event": "step_end", "status": 0, "cause": "completed"})
            events.append({"t": t + 3601, "event": "job_end", "status": 0})
            (drop / f"{job}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
            if day == days - 1:
                last_day.append(job)
    return last_day


def unfold(db: Path, jobs: list[str]) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM job_events WHERE job_id IN (SELECT value FROM json_each(?))", (json.dumps(jobs),))
        conn.execute("DELETE FROM jobs WHERE job_id IN (SELECT value FROM json_each(?))", (json.dumps(jobs),))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--jobs-per-day", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", default="text,json,html")
    parser.add_argument("--dir", help="work here and keep the files (default: a temporary directory)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; interpreter {sys.executable}")
    work = Path(args.dir or tempfile.mkdtemp(prefix="trainctl-fleet-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, work)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path) -> int:
    db, bare, drop = work / "sweeps.db", work / "sweeps-without-jobs.db", work / "journals"
    drop.mkdir(exist_ok=True)
    now = time.time()
    start = time.perf_counter()
    facts = generate(db, args.nodes, args.days)
    hosts = [f"gpu{i:05d}" for i in range(1, args.nodes + 1)]
    shutil.copyfile(db, bare)
    new_jobs = write_journals(drop, hosts, args.days, args.jobs_per_day, now)
    with History.open(db, write=True) as history:   # every day but the last, folded in as the nights did
        old = [p for p in journal_paths(str(drop)) if Path(p).stem not in set(new_jobs)]
        # no Slurm accounting on a bench host: journals fold unverified ([fleet] unverified_journals)
        fold_journals(history, old, site="bench", now=now, unverified_journals=True)
    site = work / "bench.toml"
    site.write_text(f'name = "bench"\ndefault_partition = "gpu"\n[partitions.gpu]\ngpus_per_node = 8\n'
                    f'socket_ifname = "eth0"\n[sweep]\ndb = "{db}"\n[fleet]\njournal_dir = "{drop}"\n'
                    'unverified_journals = true\n')
    with sqlite3.connect(db) as conn:
        job_rows = conn.execute("SELECT COUNT(*) FROM job_events").fetchone()[0]
    setup = {"nodes": args.nodes, "days": args.days, "jobs_per_day": args.jobs_per_day,
             "journals": len(journal_paths(str(drop))), "job_event_rows": job_rows,
             "result_rows": facts["result_rows"], "db_mb": round(db.stat().st_size / 2**20),
             "setup_s": round(time.perf_counter() - start)}
    print(json.dumps(setup), flush=True)

    ingest = [TRAINCTL, "history", "ingest", "--site", str(site)]
    commands = {"ingest, new day": ingest, "ingest, nothing new": ingest}
    for fmt in args.formats.split(","):
        for label, path in (("", db), (" without jobs", bare)):
            commands[f"report {fmt}{label}"] = [TRAINCTL, "report", "--db", str(path), "--since", f"{args.days}d",
                                                "--format", fmt, "--out", str(work / f"report.{fmt}")]
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for name in interleaved(commands, args.rounds):
        if name == "ingest, new day":
            unfold(db, new_jobs)
            samples[name].append(run_measured(commands[name]))
        elif name == "ingest, nothing new":
            run_measured(ingest)   # whatever is new is folded first; then the timed run finds nothing
            samples[name].append(run_measured(commands[name]))
        else:
            samples[name].append(run_measured(commands[name]))
    print(f"{'command':<28} {'median s':>9} {'peak MiB':>9} {'ratio':>7}")
    medians = {name: statistics.median(s for s, _ in runs) for name, runs in samples.items()}
    for name, runs in samples.items():
        floor = ("ingest, nothing new" if name == "ingest, new day" else
                 f"{name} without jobs" if name.startswith("report") and "without" not in name else None)
        ratio = f"{medians[name] / medians[floor]:>7.2f}" if floor else ""
        print(f"{name:<28} {medians[name]:>9.2f} {max(m for _, m in runs):>9.0f} {ratio}")
    report_s = max(medians[f"report {fmt}"] for fmt in args.formats.split(","))
    met = report_s <= 5 and medians["ingest, new day"] <= 10
    print(f"ratios: new day / nothing new; report / the same report without job rows. "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"targets: report <= 5 s (slowest format {report_s:.2f} s), a day's ingest <= 10 s "
          f"({medians['ingest, new day']:.2f} s): {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
