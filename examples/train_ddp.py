"""A tiny real DDP job: a few gloo steps on random data, then a check that every rank agrees.

Reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the environment (what
`trainctl rank-exec` sets, as torchrun does). Each rank trains the same small model on its
own random batch (fixed seeds); DDP averages the gradients, so after every step all ranks
must hold identical parameters. Prints one line per rank and exits 1 if they differ.

    trainctl submit --site local-demo --nodes 2 --spare 2 -- examples/train_ddp.py
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import warnings

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
    for _ in range(args.steps):
        inputs = torch.randn(args.batch, 16, generator=data)
        targets = inputs.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

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
    print(f"rank {rank}/{world} (local {local}) on {socket.gethostname()}: {args.steps} steps, "
          f"last loss {loss.item():.4f}, parameters {'agree' if agree else 'DIFFER'} across ranks "
          f"(sum {params.sum().item():.6f})", flush=True)
    return 0 if agree else 1


if __name__ == "__main__":
    status = main()
    # The work is done and the process group destroyed, but torch 2.x's gloo can still abort in
    # C++ static destructors at interpreter exit ("terminate called without an active exception",
    # about 1 run in 10 across namespace nodes): flush and leave without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
