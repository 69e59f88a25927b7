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
  and folded), each checked against Slurm's accounting: a `sacct` on PATH answers for the day's
  jobs as sacct does (its --parsable2 fields), and counts its calls; the new day's rows are
  removed again after each round;
- `ingest, new day, no accounting`: the same where sacct answers "accounting storage is
  disabled" and the site folds journals unverified (`[fleet] unverified_journals = true`): the
  ingest without Slurm's check;
- `ingest, nothing new`: the same with nothing new (the floor: the directory's stats);
- `report <fmt>`: `trainctl report --since <days>d` on this history, and on a copy of it without
  the job rows (what fleet memory adds to a report).

Each command is its own process (start-up included) with its own peak RSS (wait4). Targets
(the fleet memory work): the report <= 5 s, a day's ingest <= 10 s, and with Slurm's check at
most 2x the ingest without it, sacct asked once per batch of journals (FOLD_BATCH_JOBS).
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_scale import generate, run_measured  # noqa: E402
from timing import interleaved, work_dir  # noqa: E402

from trainctl.sweep.db import History  # noqa: E402
from trainctl.slurm import SACCT_FIELDS  # noqa: E402
from trainctl.sweep.fleet import FOLD_BATCH_JOBS, fold_journals, journal_paths  # noqa: E402

DAY = 86400.0
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
SIZES = ((1, 30), (2, 20), (4, 20), (8, 15), (16, 10), (64, 4), (256, 1))   # nodes, % of jobs
REASONS = ("gpu.nvlink: GPU 3 link 5 inactive", "ib.ports: mlx5_2/1 Down", "gpu.xid: Xid 79 on GPU 3",
           "fabric: straggler: best busbw 61 GB/s < 0.7 x 180")


def write_journals(drop: Path, hosts: list[str], days: int, per_day: int, now: float,
                   seed: int = 11) -> dict[str, tuple[list[str], float]]:
    """Every job's journal, as `trainctl job run` writes it; returns the last day's jobs: their nodes and start."""
    rng = random.Random(seed)
    lemons = rng.sample(hosts, 20)
    sizes = [size for size, share in SIZES for _ in range(share)]
    last_day = {}
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
                last_day[job] = (nodes, t)
    return last_day


def write_sacct(bin_dir: Path, jobs: dict[str, tuple[list[str], float]], calls: Path) -> None:
    """A `sacct` that answers `--jobs=...` for `jobs` in sacct's --parsable2 form (the header and fields
    trainctl asks for: tests/fixtures/sacct/ holds Slurm's own), each job this user's, still running;
    one line in `calls` per call. Started as its own process, as sacct is."""
    from trainctl.slurm import fold_hostlist

    bin_dir.mkdir(exist_ok=True)
    answers = bin_dir / "sacct.json"
    answers.write_text(json.dumps({job: f"{job}|{job}|{os.getuid()}|{fold_hostlist(nodes)}|{start:.0f}|Unknown|RUNNING"
                                   for job, (nodes, start) in jobs.items()}))
    script = bin_dir / "sacct"
    script.write_text(f"""#!{sys.executable}
import json, sys
lines = json.load(open({str(answers)!r}))
asked = next(arg for arg in sys.argv if arg.startswith("--jobs=")).split("=", 1)[1].split(",")
open({str(calls)!r}, "a").write(str(len(asked)) + chr(10))
print({"|".join(SACCT_FIELDS)!r})
print(chr(10).join(lines[job] for job in asked if job in lines))
""")
    script.chmod(0o755)
    disabled = bin_dir / "no-accounting" / "sacct"
    disabled.parent.mkdir(exist_ok=True)
    disabled.write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    disabled.chmod(0o755)


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
    with work_dir(args.dir, "trainctl-fleet-scale-") as work:
        return run(args, work)


def run(args, work: Path) -> int:
    db, bare, drop = work / "sweeps.db", work / "sweeps-without-jobs.db", work / "journals"
    drop.mkdir(exist_ok=True)
    now = time.time()
    start = time.perf_counter()
    facts = generate(db, args.nodes, args.days)
    hosts = [f"gpu{i:05d}" for i in range(1, args.nodes + 1)]
    shutil.copyfile(db, bare)
    new_jobs = write_journals(drop, hosts, args.days, args.jobs_per_day, now)
    calls = work / "sacct-calls"
    write_sacct(work / "bin", new_jobs, calls)
    with History.open(db, write=True) as history:   # every day but the last, folded in as the nights did
        old = [p for p in journal_paths(str(drop)) if Path(p).stem not in set(new_jobs)]
        # no Slurm accounting on a bench host: journals fold unverified ([fleet] unverified_journals)
        fold_journals(history, old, site="bench", now=now, unverified_journals=True)
    sites = {}
    for name, unverified in (("checked", "false"), ("unverified", "true")):
        sites[name] = work / f"bench-{name}.toml"
        sites[name].write_text(f'name = "bench"\ndefault_partition = "gpu"\n[partitions.gpu]\ngpus_per_node = 8\n'
                               f'socket_ifname = "eth0"\n[sweep]\ndb = "{db}"\n[fleet]\njournal_dir = "{drop}"\n'
                               f'unverified_journals = {unverified}\n')
    with sqlite3.connect(db) as conn:
        job_rows = conn.execute("SELECT COUNT(*) FROM job_events").fetchone()[0]
    setup = {"nodes": args.nodes, "days": args.days, "jobs_per_day": args.jobs_per_day,
             "journals": len(journal_paths(str(drop))), "job_event_rows": job_rows,
             "result_rows": facts["result_rows"], "db_mb": round(db.stat().st_size / 2**20),
             "setup_s": round(time.perf_counter() - start)}
    print(json.dumps(setup), flush=True)

    path = os.environ["PATH"]
    ingest = ([TRAINCTL, "history", "ingest", "--site", str(sites["checked"])], {"PATH": f"{work / 'bin'}:{path}"})
    unverified = ([TRAINCTL, "history", "ingest", "--site", str(sites["unverified"])],
                  {"PATH": f"{work / 'bin' / 'no-accounting'}:{path}"})
    commands = {"ingest, new day": ingest, "ingest, new day, no accounting": unverified, "ingest, nothing new": ingest}
    for fmt in args.formats.split(","):
        for label, path in (("", db), (" without jobs", bare)):
            commands[f"report {fmt}{label}"] = ([TRAINCTL, "report", "--db", str(path), "--since", f"{args.days}d",
                                                 "--format", fmt, "--out", str(work / f"report.{fmt}")], {})
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    sacct_calls = []
    for name in interleaved(commands, args.rounds):
        argv, env = commands[name]
        if name.startswith("ingest, new day"):
            unfold(db, list(new_jobs))
            calls.write_text("")
            samples[name].append(run_measured(argv, env={**os.environ, **env}))
            if name == "ingest, new day":
                sacct_calls.append(len(calls.read_text().splitlines()))
        elif name == "ingest, nothing new":
            run_measured(argv, env={**os.environ, **env})   # whatever is new is folded first; the timed run finds nothing
            samples[name].append(run_measured(argv, env={**os.environ, **env}))
        else:
            samples[name].append(run_measured(argv))
    print(f"{'command':<28} {'median s':>9} {'peak MiB':>9} {'ratio':>7}")
    medians = {name: statistics.median(s for s, _ in runs) for name, runs in samples.items()}
    for name, runs in samples.items():
        floor = ("ingest, new day, no accounting" if name == "ingest, new day" else
                 "ingest, nothing new" if name == "ingest, new day, no accounting" else
                 f"{name} without jobs" if name.startswith("report") and "without" not in name else None)
        ratio = f"{medians[name] / medians[floor]:>7.2f}" if floor else ""
        print(f"{name:<28} {medians[name]:>9.2f} {max(m for _, m in runs):>9.0f} {ratio}")
    report_s = max(medians[f"report {fmt}"] for fmt in args.formats.split(","))
    checked = medians["ingest, new day"] / medians["ingest, new day, no accounting"]
    batches = -(-len(new_jobs) // FOLD_BATCH_JOBS)
    met = report_s <= 5 and medians["ingest, new day"] <= 10 and checked <= 2 and set(sacct_calls) == {batches}
    print(f"ratios: new day with Slurm's check / without it; new day without it / nothing new; report / the same "
          f"report without job rows. load average {os.getloadavg()[0]:.1f}")
    print(f"sacct calls for the {len(new_jobs)} new journals, each round: {sacct_calls} (batches of {FOLD_BATCH_JOBS})")
    print(f"targets: report <= 5 s (slowest format {report_s:.2f} s), a day's ingest <= 10 s "
          f"({medians['ingest, new day']:.2f} s), with Slurm's check <= 2x without it ({checked:.2f}x), sacct once "
          f"per batch: {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
