"""A tiny real DDP job: a few gloo steps on random data, then a check that every rank agrees.

Reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment (what
`trainctl rank-exec` sets, as torchrun does). Each rank trains the same small model on its
own random batch (fixed seeds); DDP averages the gradients, so after every step all ranks
must hold identical parameters. Prints one line per rank and exits 1 if they differ.

With `--checkpoint PATH` rank 0 saves the step, model and optimizer state to PATH every
`--checkpoint-every` steps and at the first step after SIGUSR1 (what `submit --signal USR1@120`
has Slurm send before the time limit), and every rank resumes from PATH when it exists
(`resumed from step K`): a successor job (`submit --retries`) continues where its predecessor
stopped. Each rank's data stream is replayed up to step K, so a resumed run ends with the
same parameters as one that was never interrupted. After each checkpoint it writes the step to
the file named by TRAINCTL_CHECKPOINT_FILE, when set: how trainctl's journal learns what work is safe.
A SIGUSR1 that arrives while a step sleeps (--step-time) ends the sleep, so the checkpoint is
written at once rather than a whole step later.

Each step, its compute section and each checkpoint are reported through `trainctl.progress` (what
trainctl's node agent reads to watch the training); without trainctl installed the calls do nothing. For the watch's
scenarios: `--work-matmuls N` computes N 256x256 matmuls a step (a CPU-bound step: a node given
less CPU slows every rank), `--grad-mb X` all_reduces an extra X MiB of float32 each step (the step waits on the
wire: a slow link slows every rank), and `--slow-from-step N --slow-step-time S` makes every rank
sleep S instead of --step-time from step N on (the program itself slows, on every node alike);
`--stall-every N` (an input stall), `--eval-every N` (an evaluation phase) add the noise of a
healthy program.

    trainctl submit --site local-demo --nodes 2 --spare 2 -- examples/train_ddp.py
    trainctl submit --site local-demo --nodes 2 --spare 1 --retries 1 --signal USR1@120 -- \
        examples/train_ddp.py --steps 200 --step-time 0.2 --checkpoint ckpt/train.pt
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import time
import sys
import warnings

# SIGUSR1 asks for a checkpoint at the next step; caught before torch loads (seconds), so an
# early signal never ends the program (Python's default for SIGUSR1 is to terminate).
WARNED: list[int] = []
signal.signal(signal.SIGUSR1, lambda signum, frame: WARNED.append(signum))
try:
    import trainctl.progress as progress   # standard library only: costs nothing without the job's socket
except ImportError:  # run without trainctl: report nothing
    import contextlib

    class progress:  # noqa: N801  (stands in for the module)
        step = staticmethod(lambda: None)
        checkpoint = staticmethod(lambda step: None)
        compute = staticmethod(contextlib.nullcontext)
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d warns when peer hostnames do not resolve
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

MODEL_SEED = 1234          # same initial model on every rank
DATA_SEED = 5678           # + rank: each rank sees its own batches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds for rendezvous and each collective")
    parser.add_argument("--checkpoint", default=None, help="save to and resume from this file (rank 0 writes)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="seconds each step sleeps (stands in for real work, so a run lasts long enough)")
    parser.add_argument("--work-matmuls", type=int, default=0,
                        help="256x256 matmuls each step also computes, on one thread (a CPU-bound step; 0: none)")
    parser.add_argument("--grad-mb", type=float, default=0.0,
                        help="MiB of float32 every step also all_reduces (a wire-bound step; 0: none)")
    parser.add_argument("--slow-from-step", type=int, default=None,
                        help="from this step on, every rank sleeps --slow-step-time instead of --step-time")
    parser.add_argument("--slow-step-time", type=float, default=0.0,
                        help="seconds each step sleeps from --slow-from-step on")
    parser.add_argument("--stall-every", type=int, default=0,
                        help="every this many steps the input stalls --stall-s seconds on every rank (0: never)")
    parser.add_argument("--stall-s", type=float, default=3.0)
    parser.add_argument("--eval-every", type=int, default=0,
                        help="every this many steps every rank evaluates for --eval-s seconds, no steps (0: never)")
    parser.add_argument("--eval-s", type=float, default=5.0)
    parser.add_argument("--desync-rank", type=int, default=None,
                        help="nudge this rank's parameters after training (shows the check can fail)")
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(MODEL_SEED)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(DATA_SEED + rank)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        for _ in range(start):  # replay this rank's data stream up to the checkpoint
            torch.randn(args.batch, 16, generator=data)
        print(f"resumed from step {start} ({args.checkpoint}) on rank {rank}", flush=True)
    loss = torch.zeros(())
    wire = torch.zeros(int(args.grad_mb * (1 << 20)) // 4) if args.grad_mb > 0 else None   # float32: 4 bytes
    if args.work_matmuls:   # one thread's work per rank, as torchrun's default OMP_NUM_THREADS=1 gives each
        torch.set_num_threads(1)
    work = torch.randn(256, 256, generator=torch.Generator().manual_seed(rank))
    for step in range(start, args.steps):
        if args.stall_every and step and step % args.stall_every == 0:
            pause(args.stall_s)   # the input pipeline falls behind
        inputs = torch.randn(args.batch, 16, generator=data)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if wire is not None:
            dist.all_reduce(wire)
        slow = args.slow_from_step is not None and step >= args.slow_from_step
        with progress.compute():   # the sleep stands in for the step's compute; the all_reduce is not in it
            for _ in range(args.work_matmuls):
                torch.mm(work, work)
            pause(args.slow_step_time if slow else args.step_time)
        progress.step()
        done = step + 1
        if args.eval_every and done % args.eval_every == 0:
            evaluate(ddp, args.eval_s)
        signalled = bool(WARNED)
        WARNED.clear()   # on every rank: a signal after this line asks again at the next step
        if args.checkpoint and rank == 0 and (done % args.checkpoint_every == 0 or signalled):
            save_checkpoint(args.checkpoint, done, model, optimizer)
            progress.checkpoint(done)
            print(f"checkpoint at step {done}{' (signalled)' if signalled else ''}", flush=True)

    if rank == args.desync_rank:
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    lowest, highest = params.clone(), params.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    agree = torch.equal(lowest, highest)
    dist.barrier()  # nobody tears gloo down while a peer is still in the last collective
    dist.destroy_process_group()

    local = os.environ.get("LOCAL_RANK", "?")
    print(f"rank {rank}/{world} (local {local}) on {socket.gethostname()}: {args.steps} steps "
          f"({args.steps - start} here), "
          f"last loss {loss.item():.4f}, parameters {'agree' if agree else 'DIFFER'} across ranks "
          f"(sum {params.sum().item():.6f})", flush=True)
    return 0 if agree else 1


def evaluate(model: torch.nn.Module, seconds: float) -> None:
    """An evaluation phase: forward passes without gradients for `seconds`, then every rank agrees."""
    deadline = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < deadline and not WARNED:
            model.module(torch.randn(256, 16))
            time.sleep(0.01)
    dist.barrier()


def pause(seconds: float) -> None:
    """Sleep `seconds`, or until SIGUSR1 asks for a checkpoint (time.sleep alone would finish its
    sleep after the handler runs: PEP 475)."""
    deadline = time.monotonic() + seconds
    while not WARNED and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


def save_checkpoint(path: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write to a temporary file, then rename: a rank killed mid-write never leaves half a checkpoint."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, temporary)
    os.replace(temporary, path)
    # Tell trainctl's supervisor: work up to here is safe (its journal and `trainctl job show`'s goodput).
    seen = os.environ.get("TRAINCTL_CHECKPOINT_FILE")
    if seen:
        with open(seen, "w") as handle:
            handle.write(f"step {step}\n")


if __name__ == "__main__":
    status = main()
    # The work is done and the process group destroyed, but torch 2.x's gloo can still abort in
    # C++ static destructors at interpreter exit ("terminate called without an active exception",
    # about 1 run in 10 across namespace nodes): flush and leave without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
