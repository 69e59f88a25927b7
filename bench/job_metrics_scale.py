"""The job's metrics file as the job grows: what the supervisor does before each wait (job/driver.py,
`_publish`): the samples from the journal's events and the machine's state, the text, and the file
written into node_exporter's textfile directory. Target: under 50 ms a poll at 4,096 nodes.

Run: .venv/bin/python -P bench/job_metrics_scale.py [--nodes 4,512,4096] [--rounds 7] [--polls 20]

Each N's journal is written by the supervisor's own Journal (keep=True: the events the metrics
read): a chain of two jobs, each with a gate round over N nodes (a node verdict each, one in 20
left out), a training step with a checkpoint every 10 minutes for 16 hours, a hang and a restart
after a second gate round. The machine's state trains on N nodes, its watch holding MAX_SAMPLES
step-time samples (a run of more than an hour). The directory is a temporary folder on this
machine's disk. Printed per N: the median seconds per poll (samples, text, write), the file's
bytes and samples, and whether it meets the target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved  # noqa: E402
from trainctl.job import machine, metrics, watch  # noqa: E402
from trainctl.job.jobdir import Journal, Kind  # noqa: E402

TARGET_S = 0.05
HOURS = 16


def chain_journal(directory: str, job: str, nodes: list[str], start: float) -> list[dict]:
    clock = [start]
    journal = Journal(os.path.join(directory, f"{job}.jsonl"), clock=lambda: clock[0], keep=True)

    def at(t: float, event: Kind, **fields) -> None:
        clock[0] = t
        journal.add(event, **fields)

    at(start, Kind.JOB_START, job=job, nodes=nodes)
    at(start + 1, Kind.SUBMITTED, submitted_t=start - 600)
    t = start + 1
    for round_number in (1, 2):
        at(t, Kind.GATE_START)
        for index, node in enumerate(nodes):
            bad = index % 20 == 7
            at(t + 60, Kind.NODE_VERDICT, node=node, verdict="excluded" if bad else "chosen",
               reasons=["gpu.xid: Xid 79 on GPU 3 (fell off the bus)"] if bad else [])
        at(t + 61, Kind.GATE_END, status=0, chosen=nodes[:-1], master_addr=nodes[0])
        at(t + 70, Kind.TRAINING_START, nodes="node[0-9]", **({"restart": 1} if round_number == 2 else {}))
        saves = int(HOURS * 6 / 2)
        for save in range(1, saves + 1):
            at(t + 70 + 600 * save, Kind.CHECKPOINT, checkpoint_t=t + 69 + 600 * save)
        t += 70 + 600 * saves + 100
        if round_number == 1:
            at(t, Kind.DETECTION, kind="hung", suspects=[nodes[3]], evidence="no rank finished a step for 600 s")
            at(t + 30, Kind.STEP_END, status=143, training_start_t=start + 71, last_checkpoint_t=t - 100)
            t += 40
    return journal.events


def trained_state(nodes: list[str], now: float) -> machine.JobState:
    samples = tuple(watch.Sample(now - watch.MAX_SAMPLES + second, 0.5 + 0.01 * (second % 7), 2)
                    for second in range(watch.MAX_SAMPLES))
    watching = watch.WatchState(started_t=now - 3600, samples=samples, progress_t=now, progress_steps=123456)
    return machine.JobState(phase="train", chosen=tuple(nodes), restarts=1, watch=watching)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,512,4096")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--polls", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    identity = metrics.JobIdentity("123457", "123456", "alice", "llama-70b")
    with tempfile.TemporaryDirectory() as scratch:
        cases = {}
        for size in sizes:
            nodes = [f"node{index:05d}" for index in range(size)]
            first = chain_journal(scratch, f"a{size}", nodes, 1_000_000.0)
            second = chain_journal(scratch, f"b{size}", nodes, first[-1]["t"] + 900)
            now = second[-1]["t"] + 60
            textfile_dir = os.path.join(scratch, f"textfile-{size}")
            os.mkdir(textfile_dir)
            cases[size] = ([first, second], trained_state(nodes, now), now, textfile_dir)
        parts: dict[int, dict[str, list[float]]] = {size: {"samples": [], "text": [], "write": []} for size in sizes}

        def poll(size: int) -> None:
            attempts, state, now, textfile_dir = cases[size]
            for _ in range(args.polls):
                began = time.perf_counter()
                samples = metrics.job_samples(attempts, metrics.live_state(state, 60.0, now), now)
                sampled = time.perf_counter()
                text = metrics.render(identity, samples)
                rendered = time.perf_counter()
                metrics.publish(textfile_dir, identity.job_id, text)
                written = time.perf_counter()
                for name, seconds in (("samples", sampled - began), ("text", rendered - sampled),
                                      ("write", written - rendered)):
                    parts[size][name].append(seconds)

        for size in interleaved(sizes, args.rounds):
            poll(size)
        worst = 0.0
        for size in sizes:
            attempts, _, _, textfile_dir = cases[size]
            path = metrics.textfile_path(textfile_dir, identity.job_id)
            medians = {name: statistics.median(values) for name, values in parts[size].items()}
            total = sum(medians.values())
            worst = max(worst, total) if size == max(sizes) else worst
            print(json.dumps({"nodes": size, "events": sum(len(events) for events in attempts),
                              "poll_s": round(total, 5), **{f"{name}_s": round(v, 5) for name, v in medians.items()},
                              "file_bytes": os.path.getsize(path),
                              "samples": sum(1 for line in open(path) if not line.startswith("#"))}))
        met = worst < TARGET_S
        print(f"at {max(sizes)} nodes one poll's metrics take {worst * 1000:.1f} ms: "
              f"{'under' if met else 'OVER'} the {TARGET_S * 1000:.0f} ms target")
        return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
