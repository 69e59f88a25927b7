"""The fabric test's coordination at N = 64 ... 4,096 simulated nodes (issue 15 item 1).

Run: .venv/bin/python bench/gate_scale.py --nodes 64,1024,4096

Each N runs in a fresh process: N threads, one per simulated rank, each calling the REAL
`health.fabric.runner.run_rank` (rendezvous and roster close on rank 0's c10d TCPStore, the
heartbeat and peer-watch connections, barriers per round from health/fabric/schedule.py,
result collection, re-test planning, health/fabric/report.py build_report and blame) over
loopback. Replaced, and only these: the pair's all_reduce (a stand-in opens the pair's own
store connection as the real pair session does, exchanges one key with its partner, and
reports iteration times for a chosen bandwidth: 20 GB/s, 0.5x for 5 % of the nodes), the CPU
device choice, the intra-node test (off), the watchdog (one per process here, it would end
every simulated rank at once), and the heartbeat threads (each rank still opens its heartbeat
connection; one thread moves every rank's counter with one multi_set a beat). The GIL's switch
interval is 0.5 s. Both because N threads in one interpreter are not N nodes: see
PumpedHeartbeat and main(). 1 % of the nodes never start (they are named missing).

One JSON line per N: nodes, seconds (first rank started to rank 0's report), join_timeout_s
(the roster waits that long for the missing nodes), store_keys (rank 0's store at its
fullest), peak_rss_mb (the process's own, all ranks together), rounds (+ retest_rounds),
found (slow nodes excluded as stragglers / planted), false (other nodes excluded), missing
(never-started nodes the report names), rank0_store_calls (store calls rank 0's thread made,
from cProfile). Then the exponent of (seconds - join_timeout_s) in N.

Before/after: `--baseline FILE` runs another version of health/fabric/runner.py (e.g.
`git show REV:health/fabric/runner.py > FILE`) for each N up to --baseline-upto, each N old then
new, and prints an exponent per runner. `--one N --profile` prints rank 0's cProfile to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import math
import os
import pstats
import resource
import socket
import subprocess
import sys
import threading
import time

PAIR_GBPS = 20.0
SLOW_EVERY = 20     # 5 % of the nodes at 0.5x
MISSING_EVERY = 100  # 1 % never start
STAND_IN_PAIR_S = 0.002


def host_name(rank: int) -> str:
    return f"gpu{rank + 1:04d}"


def load_runner(path: str | None):
    """The runner under test: the package's, or another version of health/fabric/runner.py
    (e.g. `git show REV:health/fabric/runner.py > FILE`) loaded in its place."""
    if not path:
        from trainctl.health.fabric import runner
        return runner
    import importlib.util

    spec = importlib.util.spec_from_file_location("trainctl.health.fabric.runner", path)
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner
    spec.loader.exec_module(runner)
    return runner


def run_one(nodes: int, join_timeout_s: float, profile: bool = False, runner_path: str | None = None) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    runner = load_runner(runner_path)

    hosts = [host_name(r) for r in range(nodes)]
    slow = {hosts[r] for r in range(nodes) if r % SLOW_EVERY == 5}
    missing = {hosts[r] for r in range(nodes) if r % MISSING_EVERY == 7}

    def stand_in_visit(self, test, prefix: str) -> None:
        """The pair's all_reduce replaced: its store connection and a key exchange, then times
        for the chosen bandwidth (two ranks: busbw = algbw = size / time)."""
        if self.error is not None:
            return
        try:
            lost = test.watch.check(self.partner, f"pair {prefix}")
            if lost:
                raise runner.PeerLost(lost)
            if self.store is None:
                self.store = dist.TCPStore(test.identity.master_addr, test.identity.port, None, False,
                                           datetime.timedelta(seconds=test.options.op_timeout_s),
                                           wait_for_workers=False)
            self.store.set(f"{prefix}/{self.rank_in_pair}", "1")
            self.store.wait([f"{prefix}/{1 - self.rank_in_pair}"],
                            datetime.timedelta(seconds=test.options.op_timeout_s))
            time.sleep(STAND_IN_PAIR_S)
            gbps = PAIR_GBPS * (0.5 if slow & set(self.peers) else 1.0)
            for size in test.options.sizes:
                self.times.setdefault(size, []).extend([size / (gbps * 1e9)] * test.options.iters)
        except Exception as exc:  # as the real session: a result, not a crash
            self.error = f"with {self.partner_host} (rank {self.partner}): {runner._one_line(exc)}"

    beats: list = []
    beats_lock = threading.Lock()

    class PumpedHeartbeat(runner.Heartbeat):
        """The rank's heartbeat connection and counter as the runner's; the counters of all
        ranks are then moved every HEARTBEAT_S by one `multi_set` from one shared thread. A
        thread per rank (the runner's, right for one rank per node) made N threads wake twice
        a second in this one interpreter: at 1,024 ranks 850 threads queued for the GIL at
        once (gdb) and the heartbeats fell 5 s behind, so healthy ranks were declared lost. A
        pump looping over N `add`s queued the same way. The store's own cost of N adds per
        beat (its C++ event loop, ~0.04 ms per add here) is not what this bench can measure."""

        def __init__(self, identity, timeout_s: float):
            self.store = dist.TCPStore(identity.master_addr, identity.port, None, False,
                                       datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
            self.key = f"alive/{identity.rank}"
            self.store.add(self.key, 1)
            with beats_lock:
                beats.append(self.key)

    def pump() -> None:
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60),
                              wait_for_workers=False)
        for count in itertools.count(2):
            time.sleep(runner.HEARTBEAT_S)
            with beats_lock:
                keys = list(beats)
            try:
                if keys:
                    store.multi_set(keys, [str(count)] * len(keys))
            except Exception:  # the store is gone: the run is over
                return

    runner.Heartbeat = PumpedHeartbeat
    runner._PairSession.visit = stand_in_visit
    runner._start_watchdog = lambda deadline: None
    runner._inter_device = lambda rail=None: torch.device("cpu")
    options = runner.FabricOptions(sizes=(1 << 20, 16 << 20), iters=5, passes=1, timeout_s=600.0,
                                   join_timeout_s=join_timeout_s, op_timeout_s=120.0, intra=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out: dict = {}

    def rank_main(rank: int) -> None:
        identity = runner.Identity(rank, nodes, hosts[rank], "127.0.0.1", port, tuple(hosts))
        # rank 0's thread only (cProfile follows the thread that enabled it): its store calls
        profiler = cProfile.Profile() if rank == 0 else None
        try:
            if profiler:
                profiler.enable()
            report = runner.run_rank(identity, options, straggler_factor=0.7)
        except Exception as exc:
            out.setdefault("errors", []).append(f"rank {rank}: {runner._one_line(exc)}")
            return
        if rank == 0:
            out["report"], out["end"] = report, time.monotonic()
        if profiler:
            profiler.disable()
            out["rank0_store_calls"] = store_calls(profiler)
            if profile:
                print_profile(profiler)

    threading.stack_size(256 << 10)
    started = time.monotonic()
    threads = [threading.Thread(target=rank_main, args=(0,), daemon=True)]
    threads[0].start()
    # a client's constructor holds the GIL while it retries connecting: start the others once
    # rank 0's store accepts connections, or rank 0's thread never gets to create it
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.01)
    keys = {"max": 0}
    watcher_stop = threading.Event()

    def watch_keys() -> None:
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60),
                              wait_for_workers=False)
        while not watcher_stop.wait(0.5):
            try:
                keys["max"] = max(keys["max"], store.num_keys())
            except Exception:
                return

    threading.Thread(target=watch_keys, daemon=True).start()
    threading.Thread(target=pump, daemon=True, name="heartbeats").start()
    for rank in range(1, nodes):
        if hosts[rank] not in missing:
            thread = threading.Thread(target=rank_main, args=(rank,), daemon=True)
            thread.start()
            threads.append(thread)
    threads[0].join()
    watcher_stop.set()
    report = out.get("report") or {}
    excluded = {item["host"] for item in report.get("excluded", [])}
    named_missing = {h for h, n in report.get("nodes", {}).items() if n.get("lost")}
    return {"nodes": nodes, "seconds": round(out.get("end", time.monotonic()) - started, 2),
            "join_timeout_s": join_timeout_s, "store_keys": keys["max"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rank0_store_calls": out.get("rank0_store_calls"), "rounds": report.get("rounds"), "retest_rounds": report.get("retest_rounds"),
            "found": f"{len(slow & excluded)}/{len(slow)}", "false": len(excluded - slow - missing),
            "missing": f"{len(missing & named_missing)}/{len(missing)}", "errors": out.get("errors", [])[:3]}


def store_calls(profiler) -> int:
    """Calls rank 0's thread made into c10d (each store call is one round trip, a `wait` too)."""
    stats = pstats.Stats(profiler)
    return sum(calls for (_, _, name), (_, calls, *_) in stats.stats.items() if "_distributed_c10d" in name)


def print_profile(profiler) -> None:
    """Rank 0's thread only (cProfile follows the thread that enabled it): where its time went,
    and how many store round trips each function made, to stderr."""
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(25)
    stats.print_callers(r"_distributed_c10d")


def raise_nofile() -> None:
    """N ranks in one process hold about 6 sockets each, both ends: raise the limit (root only
    beyond the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 17
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def child_env() -> dict:
    """c10d looks a name up for every store connection; where no DNS server answers (this VM:
    resolv.conf names one it cannot reach) each lookup that misses the cache waits out glibc's
    5 s resolver timeout, so about 3 % of connections took 5.0 s here. One 1 s try instead
    (glibc's RES_OPTIONS, resolv.conf(5)); a cluster with working DNS does not pay this."""
    return dict(os.environ, RES_OPTIONS=os.environ.get("RES_OPTIONS", "timeout:1 attempts:1"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,1024,4096", help="comma-separated N")
    parser.add_argument("--join-timeout", type=float, default=10.0,
                        help="seconds rank 0 waits for the missing nodes (the gate's: fabric_timeout_s / 4)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one N, in this process
    parser.add_argument("--profile", action="store_true",
                        help="with --one: profile rank 0's thread (cProfile) and print it to stderr")
    parser.add_argument("--runner", help="with --one: this file in place of health/fabric/runner.py")
    parser.add_argument("--baseline", metavar="FILE",
                        help="also run this version of health/fabric/runner.py, interleaved with the current one")
    parser.add_argument("--baseline-upto", type=int, default=1024,
                        help="run the baseline only up to this N (the old runner was quadratic)")
    parser.add_argument("--keep-nofile", action="store_true",
                        help="leave RLIMIT_NOFILE as it is (only the runner's own raise applies)")
    args = parser.parse_args()
    if args.one:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        # Every thread waiting for the GIL wakes each switch interval (5 ms by default) to ask
        # for it: with hundreds of simulated ranks returning from the store at once that was
        # most of the process's time, in the kernel (perf: futex waits). Each rank has its own
        # interpreter on a real cluster. 1,024 ranks: 19.6 s at 5 ms, 13.5 s at 50 ms, 12.1 s at 0.5 s.
        sys.setswitchinterval(0.5)
        if not args.keep_nofile:
            raise_nofile()
        print(json.dumps(run_one(args.one, args.join_timeout, args.profile, args.runner)), flush=True)
        os._exit(0)  # as the runner's end_process: daemon threads inside c10d abort a normal exit
    rows: dict[str, list[dict]] = {}
    for nodes in (int(n) for n in args.nodes.split(",")):
        runners = [("baseline", args.baseline)] if args.baseline and nodes <= args.baseline_upto else []
        for label, path in runners + [("current", None)]:
            argv = [sys.executable, __file__, "--one", str(nodes), "--join-timeout", str(args.join_timeout)]
            row = run_child(argv + (["--runner", path] if path else []), nodes)
            if row is None:
                continue
            row = {"runner": label, **row, "load_avg_1m": round(os.getloadavg()[0], 1)} if args.baseline else \
                {**row, "load_avg_1m": round(os.getloadavg()[0], 1)}
            print(json.dumps(row), flush=True)
            rows.setdefault(label, []).append(row)
    for label, measured in rows.items():
        slope = exponent(measured)
        if slope is not None:
            print(json.dumps({**({"runner": label} if args.baseline else {}),
                              "exponent_of_seconds_beyond_join_timeout_in_N": slope}))


def run_child(argv: list[str], nodes: int) -> dict | None:
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env())
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not line.startswith("{"):
        print(json.dumps({"nodes": nodes, "error": done.returncode, "stderr": done.stderr[-500:]}), flush=True)
        return None
    return json.loads(line)


def exponent(rows: list[dict]) -> float | None:
    """Least-squares slope of log(seconds beyond the join deadline) against log N."""
    fit = [(math.log(r["nodes"]), math.log(max(r["seconds"] - r["join_timeout_s"], 1e-3))) for r in rows]
    if len({x for x, _ in fit}) < 2:
        return None
    mean_x, mean_y = sum(x for x, _ in fit) / len(fit), sum(y for _, y in fit) / len(fit)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in fit) / sum((x - mean_x) ** 2 for x, _ in fit), 2)

if __name__ == "__main__":
    main()
