"""What trainctl's bootstrap costs a rank's start-up: fresh interpreters with and without it.

In a watched step, rank-exec puts the bootstrap folder (`trainctl.launcher.rank_exec.BOOTSTRAP_DIR`)
first on the rank's PYTHONPATH, and Python's `site` imports its `sitecustomize` at start-up. This
bench runs three programs, each without and with it, as fresh interpreters:

  pass          python -c pass: a process that never imports torch (the bootstrap only puts
                its finder on sys.meta_path, which then looks at every import's name)
  import torch  python -c "import torch": torch's imports pass the finder; torch.optim.optimizer
                loads the guest room and registers the optimizer step hook
  torch step    imports torch and steps an SGD optimizer once: the hook's first step also makes
                the rank (its claim beside the socket), starts the activity sampler, sends a
                report, and stops the sampler at exit

"with the bootstrap" is the rank's environment in a watched step: PYTHONPATH=BOOTSTRAP_DIR,
TRAINCTL_PROGRESS_SOCKET a socket in a temporary folder with a reader on it (a stand-in for the
node agent), RANK=0; "without" has none of them. Every round runs each mode once, `pass` and its
pair --pass-repeats times, in an order shuffled anew each round. Each run of "torch step" with
the bootstrap must leave its claim (checked, then removed, outside the timing), or the bench
fails: the room really ran.

Printed per mode: the median wall time and CPU time (user + system, which leaves out the time
the process waited for one of the shared cores), and the spread (the middle half of the runs,
25th-75th percentile); per program, with minus without, of the medians, in ms.

Target: the bootstrap costs at most 5 ms on `python -c pass`.

Run: .venv/bin/python -P bench/guest_startup.py [--rounds 30] [--pass-repeats 10] [--programs pass,torch,step]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import agent_stand_in, interleaved, time_and_cpu_once  # noqa: E402

PROGRAMS = {
    "pass": "pass",
    "torch": "import torch",
    "step": ("import torch\n"
             "parameter = torch.nn.Parameter(torch.zeros(1))\n"
             "optimizer = torch.optim.SGD([parameter], lr=0.1)\n"
             "parameter.grad = torch.ones(1)\n"
             "optimizer.step()\n"),
}
LABELS = {"pass": "pass", "torch": "import torch", "step": "torch step"}
TARGET_PASS_MS = 5.0
STEP_ID = "startup-bench"


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pass-repeats", type=int, default=10,
                        help="runs of each `pass` mode per round (a run is short, its noise large)")
    parser.add_argument("--programs", default="pass,torch,step",
                        help="which of pass, torch, step (comma-separated)")
    args = parser.parse_args()
    programs = [name for name in args.programs.split(",") if name]
    unknown = set(programs) - set(PROGRAMS)
    if unknown:
        parser.error(f"unknown programs: {', '.join(sorted(unknown))}")
    from trainctl.launcher.rank_exec import BOOTSTRAP_DIR
    from trainctl.guest.wire import claim_path

    base = {k: v for k, v in os.environ.items()
            if not k.startswith("TRAINCTL_") and k not in ("PYTHONPATH", "RANK", "SLURM_STEP_ID")}
    with agent_stand_in("trainctl-guest-startup-") as (path, received), \
            tempfile.TemporaryDirectory(prefix="trainctl-guest-startup-cwd-") as cwd:
        with_bootstrap = {**base, "PYTHONPATH": BOOTSTRAP_DIR, "TRAINCTL_PROGRESS_SOCKET": path,
                          "RANK": "0", "SLURM_STEP_ID": STEP_ID}
        claim = claim_path(path, 0, STEP_ID)
        modes = {}   # (program, bootstrap) -> (argv, env)
        for program in programs:
            argv = [sys.executable, "-c", PROGRAMS[program]]
            modes[(program, False)] = (argv, base)
            modes[(program, True)] = (argv, with_bootstrap)

        def run(mode: tuple[str, bool]) -> tuple[float, float]:
            argv, env = modes[mode]
            measured = time_and_cpu_once(argv, env)
            program, bootstrap = mode
            if bootstrap and program == "step":
                if not os.path.isdir(claim):
                    raise SystemExit("guest_startup: the torch step with the bootstrap made no claim: "
                                     "the guest room did not run")
                os.rmdir(claim)   # the next run is a rank's first process again
            elif os.path.isdir(claim):
                raise SystemExit(f"guest_startup: {mode} claimed the rank, which only a step should")
            return measured

        os.chdir(cwd)   # `-c` puts the working directory first on sys.path: an empty one
        for mode in modes:   # warm-up: page cache, .pyc files
            run(mode)
        keys = []
        for mode in modes:
            keys += [mode] * (args.pass_repeats if mode[0] == "pass" else 1)
        samples: dict[tuple[str, bool], list[tuple[float, float]]] = {mode: [] for mode in modes}
        for mode in interleaved(keys, args.rounds):
            samples[mode].append(run(mode))
        time.sleep(0.3)   # the stand-in's reader takes the last report
        reports = received[0]
    load = [f"{value:.2f}" for value in os.getloadavg()]
    print(f"{args.rounds} interleaved rounds ({args.pass_repeats} runs of each `pass` mode a round); "
          f"load average {' '.join(load)}")
    print(f"{'program':<14} {'bootstrap':<10} {'runs':>5} {'wall ms':>9} {'(25-75%)':>17} "
          f"{'CPU ms':>9} {'(25-75%)':>17}")
    medians = {}
    for (program, bootstrap), values in samples.items():
        wall = [w * 1e3 for w, _ in values]
        cpu = [c * 1e3 for _, c in values]
        medians[(program, bootstrap)] = (statistics.median(wall), statistics.median(cpu))
        wq, cq = quartiles(wall), quartiles(cpu)
        print(f"{LABELS[program]:<14} {'with' if bootstrap else 'without':<10} {len(values):>5} "
              f"{statistics.median(wall):9.2f} {wq[0]:8.2f}-{wq[1]:8.2f} "
              f"{statistics.median(cpu):9.2f} {cq[0]:8.2f}-{cq[1]:8.2f}")
    print("\nthe bootstrap's cost: with minus without, of the medians")
    print(f"{'program':<14} {'wall ms':>9} {'CPU ms':>9}")
    over = False
    for program in programs:
        wall = medians[(program, True)][0] - medians[(program, False)][0]
        cpu = medians[(program, True)][1] - medians[(program, False)][1]
        note = ""
        if program == "pass":
            met = wall <= TARGET_PASS_MS
            over = not met
            note = f"  target <= {TARGET_PASS_MS:g} ms: {'met' if met else 'MISSED'}"
        print(f"{LABELS[program]:<14} {wall:+9.2f} {cpu:+9.2f}{note}")
    print(f"reports received: {reports} (one a run of `torch step` with the bootstrap, at least)")
    if "step" in programs and reports < args.rounds + 1:
        print("guest_startup: fewer reports than runs of `torch step` with the bootstrap", file=sys.stderr)
        return 1
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
