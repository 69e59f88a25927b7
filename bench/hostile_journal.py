"""A hostile journal at the journal cap: what one fold of it costs (rows, time, memory).

Run: .venv/bin/python bench/hostile_journal.py [--mib 64] [--nodes 2000] [--rounds 3] [--dir DIR]

A user's job really held --nodes nodes (Slurm's accounting says so: a `sacct` on PATH answers
for it as sacct does), and the user wrote its journal by hand, up to --mib MiB (the cap a journal
is read to is 64 MiB), in the two shapes that multiplied rows:

- `steps`: a step on all the job's nodes, ended well, again and again (each step served every
  node: steps x nodes `served` rows, 900 million at 64 MiB);
- `detections`: a step, then detections that each name every node (detections x nodes rows).

Each is folded by `trainctl history ingest` into a history that holds the job's nodes, in
interleaved rounds (the rows removed again after each), beside the fold of an honest journal of
the same job: the ratio is to that floor. Printed: the rows each adds, the median wall seconds,
the peak RSS of the ingest process (wait4) and the history's size after.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_scale import write_sacct  # noqa: E402
from report_scale import run_measured  # noqa: E402
from timing import interleaved, work_dir  # noqa: E402

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))


def journal(job: str, start: float, hostlist: str, names: list[str], shape: str, cap: int) -> bytes:
    """A journal of `shape` up to `cap` bytes; `honest`: one step on every node, as a job writes it."""
    head = [{"t": start, "event": "job_start", "job": job, "site": "bench", "attempt": 1, "nodes": names},
            {"t": start + 1, "event": "training_start", "nodes": hostlist, "master_addr": names[0]}]
    step = (json.dumps({"t": start + 2, "event": "step_end", "status": 0, "cause": "completed"}) + "\n"
            + json.dumps({"t": start + 2, "event": "training_start", "nodes": hostlist, "master_addr": names[0]})
            + "\n").encode()
    detection = (json.dumps({"t": start + 2, "event": "detection", "kind": "hung", "suspects": names,
                             "evidence": "no step for 600 s", "details": {}, "note": "recorded"}) + "\n").encode()
    tail = (json.dumps({"t": start + 3, "event": "step_end", "status": 0, "cause": "completed"}) + "\n"
            + json.dumps({"t": start + 4, "event": "job_end", "status": 0}) + "\n").encode()
    text = "".join(json.dumps(event) + "\n" for event in head).encode()
    block = {"honest": b"", "steps": step, "detections": detection}[shape]
    if block:
        text += block * ((cap - len(text) - len(tail)) // len(block))
    return text + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="work here and keep the files (default: a temporary directory)")
    args = parser.parse_args()
    with work_dir(args.dir, "trainctl-hostile-journal-") as work:
        return run(args, work)


def run(args, work: Path) -> int:
    names = [f"gpu{n:05d}" for n in range(1, args.nodes + 1)]
    hostlist = f"gpu[00001-{args.nodes:05d}]"
    start, cap = time.time() - 3600, int(args.mib * 2**20) - 1
    calls = work / "sacct-calls"
    drops = {}
    for number, shape in enumerate(("honest", "steps", "detections"), start=1):
        drops[shape] = work / shape
        drops[shape].mkdir(exist_ok=True)
        (drops[shape] / f"{number}.jsonl").write_bytes(journal(str(number), start, hostlist, names, shape, cap))
    write_sacct(work / "bin", {str(n): (names, start) for n in range(1, 4)}, calls)
    db = work / "history.db"
    site = work / "bench.toml"
    site.write_text(f'name = "bench"\ndefault_partition = "gpu"\n[partitions.gpu]\ngpus_per_node = 8\n'
                    f'socket_ifname = "eth0"\n[sweep]\ndb = "{db}"\n')
    env = {**os.environ, "PATH": f"{work / 'bin'}:{os.environ['PATH']}"}
    samples: dict[str, list[tuple[float, float]]] = {shape: [] for shape in drops}
    rows, sizes = {}, {}
    for shape in interleaved(list(drops), args.rounds):
        db.unlink(missing_ok=True)
        samples[shape].append(run_measured([TRAINCTL, "history", "ingest", "--site", str(site), str(drops[shape])],
                                           env=env))
        with sqlite3.connect(db) as conn:
            rows[shape] = conn.execute("SELECT COUNT(*) FROM job_events").fetchone()[0]
        sizes[shape] = db.stat().st_size / 2**20
    floor = statistics.median(s for s, _ in samples["honest"])
    print(f"a job on {args.nodes} nodes; journals up to {args.mib:g} MiB; load average {os.getloadavg()[0]:.1f}")
    print(f"{'journal':<12} {'MiB':>6} {'rows':>8} {'median s':>9} {'peak MiB':>9} {'history MiB':>12} {'ratio':>7}")
    for number, shape in enumerate(drops, start=1):
        size = (drops[shape] / f"{number}.jsonl").stat().st_size / 2**20
        median = statistics.median(s for s, _ in samples[shape])
        print(f"{shape:<12} {size:>6.2f} {rows[shape]:>8} {median:>9.2f} {max(m for _, m in samples[shape]):>9.0f} "
              f"{sizes[shape]:>12.1f} {median / floor:>7.2f}")
    print("ratio: to the fold of the honest journal of the same job")
    bound = 2 * args.nodes   # service once per node; a hang strike once per node
    print(f"rows at most {bound} (each node's service and its one strike family): "
          f"{'met' if max(rows.values()) <= bound else 'MISSED'}")
    return 0 if max(rows.values()) <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
