"""What the guest room's activity sampler costs a running rank: work timed in blocks with the
sampler running and not running, interleaved.

The sampler (`trainctl.guest.activity`) is a thread that looks four times a second where the
rank's main thread is, a few more times when it finds it where it was, and sends a report at
most every second when the rank takes no steps. Each round runs two fresh processes, in an order
shuffled anew each round:

  watched rank  TRAINCTL_PROGRESS_SOCKET (a reader on it, a stand-in for the node agent) and
                RANK=0 set; `trainctl.progress.step()` once makes the rank and starts the
                sampler (checked). Its blocks run with the sampler running and stopped
                (`Sampler.stop()`, started again as after a fork), the two in an order shuffled
                anew for each pair of blocks: "sampler" and "stopped"
  not watched   the same program with TRAINCTL_PROGRESS_SOCKET unset: the call does nothing,
                no sampler ever runs: "no job"

The workloads, each timed in --blocks blocks per state:

  python loop   a CPU-bound pure-Python loop (the sampler's looks take the GIL from it)
  torch forward a small MLP's forward pass on the CPU, no gradient, on one torch thread (the
                sampler's looks take the GIL between torch's calls)

No step is taken inside the blocks, so the sampler sends its activity reports as in a phase
without steps (evaluation, a long save): the most it does. Each block is timed in wall time
and in the process's CPU time (all its threads, the sampler's included; not the time spent
waiting for a core, most of the noise on a shared machine). Printed per workload: the median
block of each state (the median over the rounds of each process's median), and the ratios
sampler / stopped (the same process, blocks side by side: the cost) and sampler / no job (two
processes), each as the median of the rounds' ratios and their range. Last, the sampler
thread's own CPU time (/proc/self/task/TID/schedstat), as a share of one core, while the main
thread runs the first workload as long again: what the blocks' ratios cannot resolve on a noisy
machine.

Run: .venv/bin/python -P bench/guest_sampler.py [--rounds 10] [--blocks 8] [--loop 3000000] [--forwards 400]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import agent_stand_in, fresh_step_id, interleaved  # noqa: E402

CHILD = r"""
import json, os, random, statistics, sys, time
blocks, loop, forwards = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
workloads = sys.argv[4].split(",")
import trainctl.progress as progress
import trainctl.guest.rank as rank
progress.step()   # a watched rank's first step: makes the rank, starts the sampler
sampler = rank._sampler
watched = sampler is not None and sampler.running
if "torch" in workloads:
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)   # one thread of torch's own: on a few shared cores, more only add noise
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    batch = torch.randn(64, 256)


def python_loop():
    total = 0
    for i in range(loop):
        total += i * i
    return total


def torch_forward():
    with torch.no_grad():
        for _ in range(forwards):
            model(batch)


def set_sampler(on):
    if on and not sampler.running:
        sampler._resume()          # as after a fork: the thread again, every signal blocked
    elif not on and sampler.running:
        sampler.stop()
    if sampler.running != on:
        raise SystemExit(f"the sampler did not {'start' if on else 'stop'}")


work = {"python": python_loop, "torch": torch_forward}
for name in workloads:   # warm-up
    work[name]()
states = ("sampler", "stopped") if watched else ("no job",)
times = {(name, state): [] for name in workloads for state in states}
rng = random.Random(0)
for _ in range(blocks):
    for name in workloads:
        order = list(states)
        rng.shuffle(order)
        for state in order:
            if watched:
                set_sampler(state == "sampler")
            wall, cpu = time.perf_counter(), time.process_time()
            work[name]()
            times[(name, state)].append((time.perf_counter() - wall, time.process_time() - cpu))
thread_cpu = None
if watched:
    # The sampler thread's own CPU time (schedstat: nanoseconds on a CPU), while the main thread
    # runs the first workload for as long as the sampler's blocks took.
    set_sampler(False)
    tasks = set(os.listdir("/proc/self/task"))
    set_sampler(True)
    (tid,) = set(os.listdir("/proc/self/task")) - tasks


    def on_cpu_ns():
        with open(f"/proc/self/task/{tid}/schedstat") as stat:
            return int(stat.read().split()[0])


    try:
        cpu, wall = on_cpu_ns(), time.perf_counter()
        for _ in range(blocks):
            work[workloads[0]]()
        thread_cpu = (on_cpu_ns() - cpu) / (time.perf_counter() - wall) / 1e9
    except (OSError, ValueError):   # no schedstat in this kernel
        thread_cpu = None
print(json.dumps({"watched": watched, "activity": rank._reporter.activity if rank._reporter else 0,
                  "thread_cpu": thread_cpu,
                  "times": {f"{name}/{state}": [statistics.median(w for w, _ in values),
                                                 statistics.median(c for _, c in values)]
                            for (name, state), values in times.items()}}))
"""
LABELS = {"python": "python loop", "torch": "torch forward"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=8, help="blocks of each workload per process")
    parser.add_argument("--loop", type=int, default=3_000_000, help="iterations of the Python loop per block")
    parser.add_argument("--forwards", type=int, default=400, help="forward passes per block")
    parser.add_argument("--workloads", default="python,torch",
                        help="which of python, torch (comma-separated)")
    args = parser.parse_args()
    workloads = [name for name in args.workloads.split(",") if name]
    if not workloads or set(workloads) - set(LABELS):
        parser.error("--workloads: python, torch or both")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_") and k not in ("RANK",)}
    with agent_stand_in("trainctl-guest-sampler-") as (path, received):
        envs = {"watched rank": {**base, "TRAINCTL_PROGRESS_SOCKET": path, "RANK": "0"}, "not watched": base}

        def run(mode: str) -> dict:
            env = {**envs[mode], "SLURM_STEP_ID": fresh_step_id()}   # each process a rank's first
            out = subprocess.run([sys.executable, "-P", "-c", CHILD, str(args.blocks), str(args.loop),
                                  str(args.forwards), ",".join(workloads)],
                                 env=env, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise SystemExit(f"guest_sampler: the {mode} process failed:\n{out.stderr[-2000:]}")
            result = json.loads(out.stdout.splitlines()[-1])
            if result["watched"] != (mode == "watched rank"):
                raise SystemExit(f"guest_sampler: the {mode} process's sampler running: {result['watched']}")
            return result

        times: dict[str, list[list[float]]] = {}   # "workload/state" -> each round's [wall, cpu]
        activity, thread_cpu = [], []
        for mode in interleaved(envs, args.rounds):
            result = run(mode)
            for key, value in result["times"].items():
                times.setdefault(key, []).append(value)
            if mode == "watched rank":
                activity.append(result["activity"])
                if result["thread_cpu"] is not None:
                    thread_cpu.append(result["thread_cpu"])
        reports = received[0]
    load = [f"{value:.2f}" for value in os.getloadavg()]
    print(f"{args.rounds} interleaved rounds, a process per mode each; {args.blocks} blocks of each workload "
          f"and state per process; load average {' '.join(load)}")
    print(f"{'workload':<14} {'clock':<5} {'sampler':>9} {'stopped':>9} {'no job':>9} "
          f"{'sampler/stopped (range)':>26} {'sampler/no job (range)':>26}")
    for name in workloads:
        for index, clock in enumerate(("wall", "CPU")):
            column = {state: [v[index] * 1e3 for v in times[f"{name}/{state}"]]
                      for state in ("sampler", "stopped", "no job")}
            cells = []
            for other in ("stopped", "no job"):
                ratios = [a / b for a, b in zip(column["sampler"], column[other])]
                cells.append(f"{statistics.median(ratios):.4f} ({min(ratios):.3f}-{max(ratios):.3f})")
            print(f"{LABELS[name]:<14} {clock:<5} " + " ".join(f"{statistics.median(column[s]):9.2f}"
                                                            for s in ("sampler", "stopped", "no job"))
                  + f" {cells[0]:>26} {cells[1]:>26}")
    print(f"(ms per block, medians; a block: {args.loop:,} loop iterations, or {args.forwards} "
          "forward passes of a 256-512-256 MLP on a batch of 64, one torch thread)")
    if thread_cpu:
        print(f"the sampler thread's own CPU time, the main thread running {LABELS[workloads[0]]}: "
              f"{statistics.median(thread_cpu) * 100:.4f} % of a core (median; "
              f"{min(thread_cpu) * 100:.4f}-{max(thread_cpu) * 100:.4f})")
    print(f"the sampler saw the main thread move {statistics.median(activity):g} times a process (median); "
          f"reports received: {reports:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
