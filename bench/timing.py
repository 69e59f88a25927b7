"""Side-by-side timing for benchmarks on a shared, noisy machine.

Commands are run in interleaved rounds (each round runs every command once, in a
shuffled order), so a burst of load from a neighbour hits all of them alike; we report
medians and ratios to a named floor, never absolute targets.
"""

from __future__ import annotations

import random
import statistics
import subprocess
import threading
import time


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
