"""What counting optimizer steps without code (the guest room's hook) costs a training loop.

The hook is `trainctl.guest.hook.after_optimizer_step`, which the bootstrap registers as torch's
global optimizer step hook; the reporter is this process's rank (`trainctl.guest.rank.the_rank()`,
claimed at its making, beside a stand-in for the node agent's socket). The rank's first step
starts the activity sampler, so it runs in every timed block, as in a rank.

One process, a reader on the progress socket as under a job, and `optimizer.step()` of a real
torch optimizer (SGD over one parameter without a gradient: torch's step wrapper and its hooks,
almost nothing else) timed in blocks, in interleaved rounds (order shuffled each round), in
three ways:

  no hook           torch's global optimizer step hook not registered (the floor)
  hook              registered as the bootstrap registers it; a report is due at most every
                    0.05 s (the default), so nearly every step only adds to counters
  hook, own steps   registered, but the program calls progress.step() itself: the hook returns

A torch optimizer step costs tens of microseconds of its own, with a spread of microseconds
from block to block, more than the hook costs; so the hook is also timed alone, as torch calls
it (one Python call with the optimizer, args and kwargs), in interleaved blocks against the
same loop calling nothing:

  call nothing      the loop alone (the floor of this table)
  hook call         the registered function, no report due
  hook call, own    the registered function when the program reports its own steps

Target: the hook call under 1 us a step when no report is due.

Run: .venv/bin/python -P bench/guest_step.py [--steps 20000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import agent_stand_in, interleaved  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with agent_stand_in("trainctl-guest-step-") as (path, received):
        os.environ.update(TRAINCTL_PROGRESS_SOCKET=path, RANK="0", SLURM_STEP_ID="0")
        os.environ.pop("TRAINCTL_PROGRESS_INTERVAL_S", None)
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from trainctl.guest.hook import after_optimizer_step
        from trainctl.guest.rank import the_rank
        reporter = the_rank()
        if reporter is None:
            raise SystemExit("guest_step: this process could not claim rank 0 (see the warning above)")
        parameter = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([parameter], lr=0.1)
        step = optimizer.step

        def block(mode: str) -> float:
            handle = None
            if mode != "no hook":
                handle = register_optimizer_step_post_hook(after_optimizer_step)
            reporter.own_steps = mode == "hook, own steps"
            started = time.perf_counter()
            for _ in range(args.steps):
                step()
            elapsed = time.perf_counter() - started
            if handle is not None:
                handle.remove()
            return elapsed / args.steps * 1e6

        modes = ("no hook", "hook", "hook, own steps")
        for mode in modes:   # warm-up
            block(mode)
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        for mode in interleaved(modes, args.rounds):
            samples[mode].append(block(mode))
        hook = after_optimizer_step
        calls = args.steps * 10

        def call_block(mode: str) -> float:
            reporter.own_steps = mode == "hook call, own"
            no_args: tuple = ()
            no_kwargs: dict = {}
            started = time.perf_counter()
            if mode == "call nothing":
                for _ in range(calls):
                    pass
            else:
                for _ in range(calls):
                    hook(optimizer, no_args, no_kwargs)
            return (time.perf_counter() - started) / calls * 1e6

        call_modes = ("call nothing", "hook call", "hook call, own")
        for mode in call_modes:
            call_block(mode)
        call_samples: dict[str, list[float]] = {mode: [] for mode in call_modes}
        for mode in interleaved(call_modes, args.rounds):
            call_samples[mode].append(call_block(mode))
    floor = statistics.median(samples["no hook"])
    print(f"torch {torch.__version__}: {args.steps:,} optimizer steps x {args.rounds} interleaved rounds, "
          "median per step")
    print(f"{'mode':<18} {'us/step':>8} {'over the floor':>15}")
    for mode, values in samples.items():
        extra = "(floor)" if mode == "no hook" else f"{statistics.median(values) - floor:+.3f}"
        print(f"{mode:<18} {statistics.median(values):8.3f} {extra:>15}")
    spread = [max(v) - min(v) for v in samples.values()]
    print(f"(block-to-block spread of a mode: up to {max(spread):.3f} us)")
    call_floor = statistics.median(call_samples["call nothing"])
    print(f"\nthe hook alone: {calls:,} calls x {args.rounds} interleaved rounds, median per call")
    print(f"{'mode':<18} {'us/call':>8} {'over the floor':>15}")
    for mode, values in call_samples.items():
        extra = "(floor)" if mode == "call nothing" else f"{statistics.median(values) - call_floor:+.3f}"
        print(f"{mode:<18} {statistics.median(values):8.3f} {extra:>15}")
    print(f"reports received: {received[0]:,} (steps counted: {reporter.steps:,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
