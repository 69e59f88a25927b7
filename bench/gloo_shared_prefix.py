"""Why every rail's pair groups need a store prefix of their own (issue 13 item 2's old hang).

Run: .venv/bin/python bench/gloo_shared_prefix.py [--trials 5]   (loopback only, no cluster)

Two processes stand for two nodes with two rails each; every rail builds a 2-rank gloo group in a
thread of its own, at the same time, as one process measuring both rails would. With one store
prefix for both rails, both groups publish and read the same rendezvous keys: a rail connects to
the other rail's listener, and the groups hang (the thread never returns), fail with gloo read
errors, or all_reduce with the other rail (sum 3 where 2 or 4 is right). One prefix per rail
(what the fabric test's `pair_prefix` gives) never does. Prints the failures per layout.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import threading
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

GROUP_TIMEOUT_S = 5.0
THREAD_WAIT_S = 15.0


def node(rank: int, port: int, shared: bool, trial: int, queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, None, rank == 0, datetime.timedelta(seconds=10),
                          wait_for_workers=False)
    outcome: dict[int, str] = {}

    def rail(number: int) -> None:
        prefix = f"t{trial}/pair" if shared else f"t{trial}/rail{number}/pair"
        try:
            options = dist.ProcessGroupGloo._Options()
            options._timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
            options._devices = [dist.ProcessGroupGloo.create_device(interface="lo")]
            group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, options)
            tensor = torch.full((1024,), float(number + 1))
            group.allreduce([tensor]).wait()
            outcome[number] = "ok" if tensor[0].item() == 2 * (number + 1) else f"sum {tensor[0].item():g}"
        except Exception as exc:  # what the crossing did, reported
            outcome[number] = f"{type(exc).__name__}: {str(exc).splitlines()[0][-60:]}"

    threads = [threading.Thread(target=rail, args=(number,), daemon=True) for number in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_WAIT_S)
    queue.put((rank, {number: outcome.get(number, "hung") for number in (0, 1)}))
    time.sleep(1)  # rank 0 hosts the store: let rank 1 finish with it
    os._exit(0)


def trial_failures(shared: bool, trials: int, base_port: int) -> int:
    context = multiprocessing.get_context("fork")
    failed = 0
    for trial in range(trials):
        queue = context.Queue()
        processes = [context.Process(target=node, args=(rank, base_port + trial, shared, trial, queue))
                     for rank in (0, 1)]
        for process in processes:
            process.start()
        outcome = dict(queue.get(timeout=THREAD_WAIT_S * 3) for _ in processes)
        for process in processes:
            process.join(THREAD_WAIT_S)
        bad = any(result != "ok" for rails in outcome.values() for result in rails.values())
        failed += bad
        if bad:
            print(f"{'shared' if shared else 'per-rail'} prefix, trial {trial}: {outcome}", flush=True)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--port", type=int, default=29900)
    args = parser.parse_args()
    shared = trial_failures(True, args.trials, args.port)
    per_rail = trial_failures(False, args.trials, args.port + args.trials)
    print(f"two rails building gloo groups at once, {args.trials} trials: one shared store prefix failed "
          f"{shared}/{args.trials}, a prefix per rail {per_rail}/{args.trials}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
