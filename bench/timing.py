"""Side-by-side timing for benchmarks on a shared, noisy machine.

Commands are run in interleaved rounds (each round runs every command once, in a
shuffled order), so a burst of load from a neighbour hits all of them alike; we report
medians and ratios to a named floor, never absolute targets.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path


def time_once(argv: list[str], env: dict[str, str] | None = None, timeout_s: float = 120.0) -> float:
    # A blocking wait, with a timer to kill a hung command: subprocess's wait(timeout=...) polls
    # with sleeps of up to 50 ms, which rounds every sample up to the next ~50 ms step.
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    try:
        returncode = proc.wait()
    finally:
        killer.cancel()
    elapsed = time.perf_counter() - start
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, argv)
    return elapsed


def interleaved(keys, rounds: int):
    """Every key once a round, in an order shuffled anew each round (seeded, so that runs compare)."""
    rng = random.Random(0)
    for _ in range(rounds):
        order = list(keys)
        rng.shuffle(order)
        yield from order


def interleaved_medians(commands: dict[str, list[str]], rounds: int, warmup: int = 2,
                        env: dict[str, str] | None = None) -> dict[str, float]:
    """Median wall time in seconds of each named command over `rounds` interleaved rounds."""
    for _ in range(warmup):  # page cache, .pyc files
        for argv in commands.values():
            time_once(argv, env)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for name in interleaved(commands, rounds):
        samples[name].append(time_once(commands[name], env))
    return {name: statistics.median(values) for name, values in samples.items()}


def print_table(medians: dict[str, float], floor: str, targets: dict[str, float]) -> bool:
    """Print medians and ratios to `floor`; return whether every row in `targets` meets its ratio."""
    base = medians[floor]
    all_met = True
    print(f"{'command':<44} {'median ms':>10} {'ratio':>7}  target")
    for name, value in medians.items():
        ratio = value / base
        target = targets.get(name)
        note = ""
        if target is not None:
            met = ratio <= target
            all_met &= met
            note = f"<= {target} {'met' if met else 'MISSED'}"
        print(f"{name:<44} {value * 1e3:>10.1f} {ratio:>7.2f}  {note}")
    print(f"(ratio = median / median of {floor!r})")
    return all_met


def time_and_cpu_once(argv: list[str], env: dict[str, str] | None = None,
                      timeout_s: float = 120.0) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of `argv`. The CPU time leaves out
    the time the process waited for a core, which is most of the noise on a shared machine."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return elapsed, usage.ru_utime + usage.ru_stime


def paired_ratios(pairs: dict[str, tuple[list[str], list[str]]], rounds: int, warmup: int = 2,
                  env: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
    """For each named (floor argv, command argv) pair, the medians of: the floor's and the command's
    wall seconds, the rounds' wall ratios command/floor, and their CPU-time ratios. Every round
    runs each pair once, its two halves back to back in a shuffled order, so that a neighbour's
    burst of load lands on both halves of a ratio."""
    for _ in range(warmup):
        for floor, command in pairs.values():
            time_once(floor, env)
            time_once(command, env)
    samples: dict[str, list[tuple[tuple[float, float], tuple[float, float]]]] = {name: [] for name in pairs}
    rng = random.Random(0)
    for name in interleaved(pairs, rounds):
        halves = list(enumerate(pairs[name]))
        rng.shuffle(halves)
        measured = {which: time_and_cpu_once(argv, env) for which, argv in halves}
        samples[name].append((measured[0], measured[1]))
    return {name: {"floor_s": statistics.median(f[0] for f, _ in runs),
                   "command_s": statistics.median(c[0] for _, c in runs),
                   "ratio": statistics.median(c[0] / f[0] for f, c in runs),
                   "cpu_ratio": statistics.median(c[1] / f[1] for f, c in runs)}
            for name, runs in samples.items()}


@contextlib.contextmanager
def agent_stand_in(prefix: str):
    """A Unix datagram socket standing in for the node agent, drained by a thread, for benches of
    the progress API: yields (its path, a one-item list counting the datagrams it received).
    A rank claims itself beside the socket (a directory per rank and Slurm step, kept until the
    agent ends): a bench that starts several ranks gives each its own SLURM_STEP_ID
    (`fresh_step_id`), and the claims are removed here at the end."""
    folder = tempfile.mkdtemp(prefix=prefix)
    path = os.path.join(folder, "progress.sock")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    reader.settimeout(0.2)
    stop, received = threading.Event(), [0]

    def drain() -> None:
        while not stop.is_set():
            try:
                reader.recv(256)
                received[0] += 1
            except TimeoutError:
                continue

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        yield path, received
    finally:
        stop.set()
        thread.join()
        reader.close()
        os.unlink(path)
        for name in os.listdir(folder):   # the ranks' claims (trainctl.guest.wire.claim_path)
            if name.startswith(os.path.basename(path) + ".rank-"):
                os.rmdir(os.path.join(folder, name))
        os.rmdir(folder)


_step_ids = itertools.count()


def fresh_step_id() -> str:
    """A SLURM_STEP_ID no other rank of this bench has had: each process of rank 0 that a bench
    starts is then a rank's first process, which claims the rank and reports, as in a job."""
    return f"bench-{os.getpid()}-{next(_step_ids)}"


@contextlib.contextmanager
def work_dir(kept: str | None, prefix: str):
    """The bench's folder: `kept` (made if missing, left afterwards), else a temporary one, removed."""
    work = Path(kept or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if not kept:
            shutil.rmtree(work, ignore_errors=True)
