"""The watch's per-rank evidence on a GPU: what it costs a CUDA training loop, and what it shows
when that rank's GPU slows against its own baseline.

Run on a GPU machine, from the repository root, with trainctl installed (the wheel):

    python3 -P bench/gpu_own_time.py [--rounds 10] [--block-s 2] [--phase-s 20] [--width 4096] [--batch 256]

The rank is this process: a small MLP trained on the GPU in bf16, `loss.item()` each step as
training loops log (the step's one synchronisation, as a DDP rank's is its all_reduce). The
per-rank evidence is read outside the rank, as the node agent reads it: another process reads
the rank's main-thread schedstat (`trainctl.job.agent.main_thread_times`).

1. Cost. Blocks of steps in interleaved rounds (order shuffled each round), in four modes:
     alone          nothing reads the rank
     agent 1 Hz     the reader reads it once a second, as the agent does
     agent 1 kHz    a thousand times a second (magnified, to see any cost at all)
     hook + 1 Hz    as agent 1 Hz, and trainctl's optimizer step hook registered as the guest
                    room's bootstrap registers it, the rank claimed beside a stand-in agent socket
   Printed: each mode's median step time and its ratio to `alone`, and the spread of blocks.

2. A slowed GPU. PHASE_S of steps at the GPU's own pace, then PHASE_S slowed, by the GPU's
   application clock locked low (`nvidia-smi -lgc`) where the machine allows it, else by a
   competing process running matrix products on the same GPU. The reader samples the rank's
   own time once a second. Printed: the step time and the rank's own time per step (on a CPU,
   waiting for one) before and while slowed, and the share of the step's rise that the own time
   rose by, against the watch's `OWN_SHARE`. `--blocking-sync` sets the CUDA context's
   synchronisations to sleep instead of spin (CU_CTX_SCHED_BLOCKING_SYNC, through the driver,
   before torch makes the context); `--no-cost` runs part 2 alone.

`--device cpu` runs the script's mechanics where there is no GPU (the slowdown is then a competing
process on the same CPUs), to try it before a GPU machine's time is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import agent_stand_in, interleaved  # noqa: E402

# The reader: a separate process, as the node agent is. It prints one JSON line per sample.
READER = r"""
import json, sys, time
from trainctl.job.agent import main_thread_times
pid, period, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + seconds
samples = []
while time.monotonic() < end:
    t = main_thread_times(pid)
    samples.append((time.monotonic(), t.cpu_s if t else None, t.runq_s if t else None))
    time.sleep(period)
print(json.dumps(samples))
"""
# The competitor, where the clocks cannot be locked: matrix products on the same GPU, nonstop.
COMPETITOR = r"""
import sys, time, torch
device, size, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        a @ a
    if device == "cuda":
        torch.cuda.synchronize()
"""


def reader(pid: int, period_s: float, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-P", "-c", READER, str(pid), str(period_s), str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def samples_of(proc: subprocess.Popen) -> list[tuple[float, float | None, float | None]]:
    out, _ = proc.communicate(timeout=120)
    return [tuple(s) for s in json.loads(out)]


def make_model(torch, width: int, batch_size: int, device: str):
    model = torch.nn.Sequential(*[layer for _ in range(4) for layer in
                                  (torch.nn.Linear(width, width), torch.nn.GELU())]).to(device, torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = torch.randn(batch_size, width, device=device, dtype=torch.bfloat16)

    def step() -> None:
        loss = model(batch).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return step


def run_for(step, seconds: float, marks: list | None = None) -> tuple[int, float]:
    """Steps for `seconds`: (steps, seconds taken). `marks` gets (time, steps so far) after each
    step, its count going on from its last mark."""
    started = time.perf_counter()
    steps = 0
    done = marks[-1][1] if marks else 0
    while time.perf_counter() - started < seconds:
        step()
        steps += 1
        if marks is not None:
            marks.append((time.monotonic(), done + steps))
    return steps, time.perf_counter() - started


def cost(step, args) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from trainctl.guest.hook import after_optimizer_step
    from trainctl.guest.rank import the_rank
    if the_rank() is None:
        print("cost: this process could not claim rank 0; the hook mode runs without a reporter")
    modes = ("alone", "agent 1 Hz", "agent 1 kHz", "hook + 1 Hz")
    per_step: dict[str, list[float]] = {m: [] for m in modes}
    run_for(step, args.block_s)   # warm-up
    for mode in interleaved(modes, args.rounds):
        proc = None
        if mode != "alone":
            proc = reader(os.getpid(), 0.001 if mode == "agent 1 kHz" else 1.0, args.block_s + 0.5)
            time.sleep(0.3)   # the reader's interpreter started before the block
        handle = register_optimizer_step_post_hook(after_optimizer_step) if mode == "hook + 1 Hz" else None
        steps, elapsed = run_for(step, args.block_s)
        if handle is not None:
            handle.remove()
        per_step[mode].append(elapsed / steps * 1e3)
        if proc is not None:
            read = samples_of(proc)
            if mode == "agent 1 kHz" and not any(s[1] is not None for s in read):
                print("cost: the reader got no schedstat (this kernel keeps none)")
    floor = statistics.median(per_step["alone"])
    print(f"\n1. cost: {args.rounds} interleaved rounds of {args.block_s:g} s blocks, median ms per step")
    print(f"{'mode':<14} {'ms/step':>9} {'ratio':>7} {'blocks min-max':>16}")
    for mode, values in per_step.items():
        print(f"{mode:<14} {statistics.median(values):9.4f} {statistics.median(values) / floor:7.4f} "
              f"{min(values):7.3f}-{max(values):<7.3f}")


def lock_clocks() -> str | None:
    """Lock the GPU's clock to its lowest supported graphics clock; None where not allowed."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run([smi, "--query-supported-clocks=graphics", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    clocks = sorted(int(c) for c in out.stdout.split() if c.strip().isdigit())
    if out.returncode != 0 or not clocks:
        print(f"slowdown: no supported clocks listed ({(out.stderr or out.stdout).strip()[:200]})")
        return None
    low = clocks[0]
    locked = subprocess.run([smi, "-lgc", f"{low},{low}"], capture_output=True, text=True, timeout=30)
    if locked.returncode != 0:
        print(f"slowdown: nvidia-smi -lgc refused: {(locked.stderr or locked.stdout).strip()[:200]}")
        return None
    return f"graphics clock locked at {low} MHz (nvidia-smi -lgc)"


def unlock_clocks() -> None:
    subprocess.run(["nvidia-smi", "-rgc"], capture_output=True, timeout=30)


def own_per_step(marks: list[tuple[float, int]], samples: list, since: float, until: float
                 ) -> tuple[float, float, float] | None:
    """(step s, on a CPU s, waiting s) per step between the first and last sample in [since, until]."""
    inside = [s for s in samples if since <= s[0] <= until and s[1] is not None]
    if len(inside) < 2:
        return None
    (t0, cpu0, runq0), (t1, cpu1, runq1) = inside[0], inside[-1]

    def steps_at(t: float) -> int:
        done = [n for (when, n) in marks if when <= t]
        return done[-1] if done else 0
    steps = steps_at(t1) - steps_at(t0)
    if steps <= 0:
        return None
    return (t1 - t0) / steps, (cpu1 - cpu0) / steps, (runq1 - runq0) / steps


def slowed(step, args) -> None:
    from trainctl.job.watch import OWN_SHARE
    marks: list[tuple[float, int]] = []
    # once a second, as the agent reads; more often where a phase is short (a smoke run)
    proc = reader(os.getpid(), min(1.0, args.phase_s / 5), 2 * args.phase_s + 6)
    time.sleep(0.5)
    before_from = time.monotonic()
    run_for(step, args.phase_s, marks)
    before_until = time.monotonic()
    how = lock_clocks() if args.device == "cuda" else None
    competitor = None
    if how is None:
        size = 8192 if args.device == "cuda" else 512
        competitor = subprocess.Popen([sys.executable, "-P", "-c", COMPETITOR, args.device, str(size),
                                       str(args.phase_s + 3)])
        how = f"a competing process's {size}^3 bf16 matrix products on the same {args.device}"
        time.sleep(2.0)   # its CUDA context made, its products running
    slow_from = time.monotonic()
    run_for(step, args.phase_s, marks)
    slow_until = time.monotonic()
    if competitor is not None:
        competitor.wait(timeout=60)
    else:
        unlock_clocks()
    samples = samples_of(proc)
    print(f"\n2. a slowed GPU: {how}")
    before = own_per_step(marks, samples, before_from, before_until)
    now = own_per_step(marks, samples, slow_from, slow_until)
    if not any(sample[1] is not None for sample in samples):
        print("the reader got no schedstat: this kernel keeps none; nothing to show")
        return
    if before is None or now is None:
        print("fewer than 2 readings in a phase: a longer --phase-s")
        return
    print(f"{'':<14} {'step s':>9} {'on a CPU s':>11} {'waiting s':>10} {'own s':>9}")
    for name, (step_s, cpu_s, runq_s) in (("at its pace", before), ("slowed", now)):
        print(f"{name:<14} {step_s:9.5f} {cpu_s:11.5f} {runq_s:10.5f} {cpu_s + runq_s:9.5f}")
    step_rise = now[0] - before[0]
    own_rise = (now[1] + now[2]) - (before[1] + before[2])
    share = own_rise / step_rise if step_rise > 0 else float("nan")
    print(f"step rose {step_rise * 1e3:.3f} ms ({now[0] / before[0]:.2f}x); the rank's own time rose "
          f"{own_rise * 1e3:.3f} ms: {share:.0%} of the step's rise (the rule names a rank at "
          f"{OWN_SHARE:.0%} or more, if its peers' stayed flat)")


def blocking_sync() -> str:
    """Make the primary CUDA context's synchronisations sleep instead of spin (the driver's
    CU_CTX_SCHED_BLOCKING_SYNC), before torch makes it; returns what was done."""
    import ctypes
    driver = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int()
    for call in (lambda: driver.cuInit(0), lambda: driver.cuDeviceGet(ctypes.byref(device), 0),
                 lambda: driver.cuDevicePrimaryCtxSetFlags(device, 0x04)):
        if call() != 0:
            raise SystemExit("blocking sync: the driver refused")
    return "synchronisations sleep (CU_CTX_SCHED_BLOCKING_SYNC)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block-s", type=float, default=2.0)
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--no-cost", action="store_true", help="only the slowed GPU")
    parser.add_argument("--blocking-sync", action="store_true",
                        help="the CUDA context's synchronisations sleep rather than spin (the default: spin)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script where there is no GPU")
    args = parser.parse_args()
    with agent_stand_in("trainctl-gpu-own-") as (path, _received):
        os.environ.update(TRAINCTL_PROGRESS_SOCKET=path, RANK="0", SLURM_STEP_ID="0")
        import torch
        sync = blocking_sync() if args.blocking_sync else "synchronisations as CUDA's default schedules them"
        name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
        print(f"torch {torch.__version__}, {name}, kernel {os.uname().release}; width {args.width}, "
              f"batch {args.batch}; {sync}")
        step = make_model(torch, args.width, args.batch, args.device)
        if not args.no_cost:
            cost(step, args)
        slowed(step, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
