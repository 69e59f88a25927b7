"""What one `trainctl.progress.step()` costs a training loop, per call, in microseconds.

Four ways, each in its own process (the reporter is set up from the environment at import),
in interleaved rounds so the machine's load hits them alike:

  bare loop       the loop with no call (the floor, subtracted from the others)
  not under job   no TRAINCTL_PROGRESS_SOCKET: what a program pays when it runs without trainctl
  under job       a reader on the socket, a datagram at most every 0.05 s (the default)
  every call      a datagram on every call (interval 0): the worst case

Run: .venv/bin/python -P bench/progress_cost.py [--calls 200000] [--rounds 7]
Target: at most 10 us a call under the job.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import agent_stand_in, fresh_step_id  # noqa: E402

CHILD = r"""
import sys, time
mode, calls = sys.argv[1], int(sys.argv[2])
import trainctl.progress as progress
step = progress.step
started = time.perf_counter()
if mode == "bare":
    for _ in range(calls):
        pass
else:
    for _ in range(calls):
        step()
print((time.perf_counter() - started) / calls * 1e6)
"""


def measure(args: argparse.Namespace, path: str) -> dict[str, list[float]]:
    """Each mode's per-call cost, one sample a round, the modes interleaved."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_PROGRESS")}
    modes = {
        "bare loop": ("bare", base),
        "not under job": ("step", base),
        "under job": ("step", {**base, "TRAINCTL_PROGRESS_SOCKET": path, "RANK": "0"}),
        "every call": ("step", {**base, "TRAINCTL_PROGRESS_SOCKET": path, "RANK": "0",
                                "TRAINCTL_PROGRESS_INTERVAL_S": "0"}),
    }
    samples: dict[str, list[float]] = {name: [] for name in modes}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(modes)
        rng.shuffle(order)
        for name in order:
            mode, env = modes[name]
            env = {**env, "SLURM_STEP_ID": fresh_step_id()}   # each process a rank's first: claims it
            out = subprocess.run([sys.executable, "-P", "-c", CHILD, mode, str(args.calls)], env=env,
                                 capture_output=True, text=True, check=True, timeout=600)
            samples[name].append(float(out.stdout))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with agent_stand_in("trainctl-progress-") as (path, received):
        samples = measure(args, path)
    floor = statistics.median(samples["bare loop"])
    print(f"{args.calls:,} calls x {args.rounds} interleaved rounds; median per call, the bare loop subtracted")
    print(f"{'mode':<16} {'us/call':>8} {'spread (min-max)':>18}")
    for name, values in samples.items():
        if name == "bare loop":
            print(f"{name:<16} {floor:8.3f} {'(floor)':>18}")
            continue
        cost = [v - floor for v in values]
        print(f"{name:<16} {statistics.median(cost):8.3f} {min(cost):8.3f} - {max(cost):7.3f}")
    print(f"datagrams received: {received[0]:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
