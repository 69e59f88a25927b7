"""The fabric test's coordination at N = 64 ... 4,096 simulated nodes (issue 15 item 1).

Run: .venv/bin/python bench/gate_scale.py --nodes 64,1024,4096

Each N runs in a fresh set of processes. The coordinator holds rank 0 alone: the REAL
`health.fabric.runner.run_rank` with its c10d TCPStore (rendezvous, roster close, heartbeats,
barriers per round from health/fabric/schedule.py, result collection, re-test planning,
health/fabric/report.py build_report and blame), so its descriptors, memory and profile are
rank 0's. The other N-1 ranks are threads in `--workers` worker processes, each calling the
same real `run_rank` over loopback and holding only its own ranks' ends of their connections.
Replaced, and only these: the pair's all_reduce (a stand-in opens the pair session's own store
connection as the real session does, exchanges one key with its partner as gloo's rendezvous
does, sleeps STAND_IN_PAIR_S, and reports iteration times for a chosen bandwidth: 20 GB/s, 0.5x
for 5 % of the nodes), the CPU device choice, the intra-node test (off), the watchdog (one per
process here, it would end every simulated rank at once), and in the workers the heartbeat
threads (each rank still opens and keeps its heartbeat connection; one process of its own moves
every rank's counter with one multi_set a beat; see PumpedHeartbeat and pump). 1 % of the nodes
never start (named missing), 0.5 % die after joining: their heartbeat stops when the roster
closes and they do nothing past their first pair, as a hung node (named lost once silent for
the runner's silence_s).

One JSON line per N: nodes, seconds (rank 0 started to rank 0's report), join_timeout_s (the
roster waits that long for the missing nodes), silence_s (how long a dead node's heartbeat must
be silent before it is lost: a death costs that once), pairs_s (the stand-in pairs' own time,
rounds x STAND_IN_PAIR_S), coordination_s (seconds minus those three: what the coordination
itself costs), store_keys (rank 0's store at its fullest), rank0_fds (rank 0's process at its
peak: its store's server ends), peak_rss_mb (rank 0's process), workers_rss_mb (the workers'
peaks summed), rank0_store_calls (from cProfile of rank 0's thread), rounds (+ retest_rounds),
found (slow nodes excluded as stragglers / planted), false (other nodes excluded), missing and
died (planted nodes the report names as lost / planted). Then the exponent of coordination_s in
N, next to N log N's over the same range.

Before/after: `--baseline FILE` runs another version of health/fabric/runner.py (e.g.
`git show REV:health/fabric/runner.py > FILE`) for each N up to --baseline-upto, each N old then
new, and prints an exponent per runner. `--one N --profile` prints rank 0's cProfile to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import itertools
import json
import math
import os
import pstats
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

PAIR_GBPS = 20.0
SLOW_EVERY = 20      # 5 % of the nodes at 0.5x
MISSING_EVERY = 100  # 1 % never start
DYING_EVERY = 200    # 0.5 % die after joining
STAND_IN_PAIR_S = 0.002
RANKS_PER_WORKER = 256
MAX_WORKERS = 8      # each imports torch (~200 MB)
READY_TIMEOUT_S = 180.0  # workers importing torch at once on 2 cores
WORKER_EXIT_TIMEOUT_S = 60.0


def host_name(rank: int) -> str:
    return f"gpu{rank + 1:04d}"


def planted(nodes: int) -> dict[str, set[int]]:
    """Ranks planted slow, missing and dying: the same in every process of a run."""
    return {"slow": {r for r in range(nodes) if r % SLOW_EVERY == 5},
            "missing": {r for r in range(nodes) if r % MISSING_EVERY == 7},
            "dying": {r for r in range(nodes) if r % DYING_EVERY == 13}}


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


class Died(BaseException):
    """A planted death: ends the rank's thread past the runner's `except Exception`."""


def simulate(runner, nodes: int, pumped_heartbeats: bool) -> None:
    """Patch `runner` for simulated ranks (with `pumped_heartbeats`: their counters moved by `pump`)."""
    import datetime

    import torch
    import torch.distributed as dist

    plant = planted(nodes)
    slow_hosts = {host_name(r) for r in plant["slow"]}
    heartbeats: list = []  # the runner's heartbeat thread keeps its Heartbeat, and so its connection, for good

    def stand_in_visit(self, test, prefix: str) -> None:
        """The pair's all_reduce replaced: its store connection and a key exchange, bounded by
        the partner's heartbeat as the real visit, then times for the chosen bandwidth (two
        ranks: busbw = algbw = size / time)."""
        if self.error is not None:
            return
        rank, during = test.identity.rank, f"pair {prefix}"
        if rank in plant["dying"]:  # its heartbeat stopped when the roster closed (pump)
            raise Died()
        timeout = datetime.timedelta(seconds=test.options.op_timeout_s)
        try:
            lost = test.watch.check(self.partner, during)
            if lost:
                raise runner.PeerLost(lost)
            # the pair's store is on its first rank; with runners up to 1d39cd6, on rank 0
            address = test.pair_store_of(self.store_host) if hasattr(self, "store_host") else None

            def exchange() -> None:
                if self.store is None:
                    self.store = self.open_store(address, test.options.op_timeout_s) if address else \
                        dist.TCPStore(test.identity.master_addr, test.identity.port, None, False, timeout,
                                      wait_for_workers=False)
                self.store.set(f"{prefix}/{self.rank_in_pair}", "1")
                self.store.wait([f"{prefix}/{1 - self.rank_in_pair}"], timeout)
                time.sleep(STAND_IN_PAIR_S)

            runner._unless_lost(exchange, lambda: test.watch.check(self.partner, during), test.deadline)
            gbps = PAIR_GBPS * (0.5 if slow_hosts & set(self.peers) else 1.0)
            for size in test.options.sizes:
                self.times.setdefault(size, []).extend([size / (gbps * 1e9)] * test.options.iters)
        except Exception as exc:  # as the real session: a result, not a crash
            self.error = f"with {self.partner_host} (rank {self.partner}): {runner._one_line(exc)}"

    class PumpedHeartbeat(runner.Heartbeat):
        """The rank's heartbeat connection and counter as the runner's, without its thread: the
        `pump` process moves every rank's counter. A thread per rank (the runner's, right for
        one rank per node) made N threads wake twice a second in one interpreter: at 1,024 ranks
        850 threads queued for the GIL at once (gdb) and the heartbeats fell 5 s behind, so
        healthy ranks were declared lost; so did one pump thread per worker of 512 ranks."""

        def __init__(self, identity, timeout_s: float):
            self.store = dist.TCPStore(identity.master_addr, identity.port, None, False,
                                       datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
            self.key = f"alive/{identity.rank}"
            self.store.add(self.key, 1)
            heartbeats.append(self)

    if pumped_heartbeats:
        runner.Heartbeat = PumpedHeartbeat
    runner._PairSession.visit = stand_in_visit
    runner._start_watchdog = lambda deadline: None
    runner._inter_device = lambda rail=None: torch.device("cpu")


def options_for(runner, join_timeout_s: float):
    return runner.FabricOptions(sizes=(1 << 20, 16 << 20), iters=5, passes=1, timeout_s=600.0,
                                join_timeout_s=join_timeout_s, op_timeout_s=120.0, intra=False)


def identity_for(runner, rank: int, nodes: int, port: int):
    return runner.Identity(rank, nodes, host_name(rank), "127.0.0.1", port,
                           tuple(host_name(r) for r in range(nodes)))


class SharedParses:
    """`json` for the runner in a worker: a large document (the roster: ~1 MB parsed at 4,096
    nodes, read by every rank) is parsed once per worker and shared by its ranks, as each node
    holds one copy on a real cluster; 512 ranks of a worker each holding their own took 0.5 GB.
    The runner never changes what it read from the store."""

    SHARED_ABOVE = 4096  # bytes

    def __init__(self):
        self.parsed: dict[bytes, object] = {}
        self.lock = threading.Lock()

    dumps = staticmethod(json.dumps)

    def loads(self, text):
        if len(text) <= self.SHARED_ABOVE:
            return json.loads(text)
        with self.lock:
            if text not in self.parsed:
                self.parsed[text] = json.loads(text)
            return self.parsed[text]


def worker(nodes: int, port: int, first: int, last: int, join_timeout_s: float, runner_path: str | None) -> None:
    """Ranks first..last (rank 0 and the missing left out) as threads, once told "go" on stdin;
    then one JSON line: errors, died, rss_mb, cpu_s (after "go")."""
    # Every thread waiting for the GIL wakes each switch interval (5 ms by default) to ask for
    # it: with hundreds of simulated ranks returning from the store at once that was most of the
    # process's time, in the kernel (perf: futex waits). Each rank has its own interpreter on a
    # real cluster. 1,024 ranks in one process: 19.6 s at 5 ms, 13.5 s at 50 ms, 12.1 s at 0.5 s.
    sys.setswitchinterval(0.5)
    raise_nofile()  # a worker holds many simulated nodes' sockets; a real node holds a few
    runner = load_runner(runner_path)
    simulate(runner, nodes, pumped_heartbeats=True)
    runner.json = SharedParses()
    # every rank computes the whole schedule (3 rounds of N/2 pairs, ~0.5 MB at 4,096 nodes):
    # once per node on a cluster, once per worker here (512 ranks x 0.5 MB was 2 GB)
    from trainctl.health.fabric import schedule

    schedule.pairing_schedule = functools.lru_cache(maxsize=4)(schedule.pairing_schedule)  # rail_schedules' own
    if hasattr(runner, "pairing_schedule"):  # runners before the rails called it directly
        runner.pairing_schedule = schedule.pairing_schedule
    options = options_for(runner, join_timeout_s)
    plant = planted(nodes)
    out: dict = {"errors": [], "died": []}

    def rank_main(rank: int) -> None:
        try:
            runner.run_rank(identity_for(runner, rank, nodes, port), options, straggler_factor=0.7)
        except Died:
            out["died"].append(rank)
        except Exception as exc:
            out["errors"].append(f"rank {rank}: {runner._one_line(exc)}")

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        os._exit(1)
    cpu_at_go = cpu_seconds()
    threading.stack_size(256 << 10)
    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True)
               for rank in range(first, last + 1) if rank != 0 and rank not in plant["missing"]]
    for thread in threads:
        thread.start()
    end = time.monotonic() + options.timeout_s
    for thread in threads:
        thread.join(max(end - time.monotonic(), 0))
    out["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    out["cpu_s"] = cpu_seconds() - cpu_at_go
    print(json.dumps(out), flush=True)
    os._exit(0)  # as the runner's end_process: daemon threads inside c10d abort a normal exit


def pump(nodes: int, port: int, beat_s: float) -> None:
    """Every rank's heartbeat counter moved each `beat_s` by one `multi_set`, from this process
    of its own (the simulated ranks' GIL cannot hold it back), once told "go" on stdin; a
    dying rank's counter stops when the roster closes, so it is lost mid-test. Ends when the
    store does, or when stdin closes."""
    import datetime

    import torch.distributed as dist

    plant = planted(nodes)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        os._exit(1)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60), wait_for_workers=False)
    beating = [r for r in range(nodes) if r not in plant["missing"]]
    for count in itertools.count(2):
        time.sleep(beat_s)
        try:
            if plant["dying"] and store.check(["roster"]):
                beating = [r for r in beating if r not in plant["dying"]]
            store.multi_set([f"alive/{r}" for r in beating], [str(count)] * len(beating))
        except Exception:  # the store is gone: the run is over
            os._exit(0)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def coordinate(nodes: int, join_timeout_s: float, workers: int, profile: bool = False,
               runner_path: str | None = None) -> dict:
    """Rank 0 in this process, the other ranks in `workers` processes: one result row."""
    import datetime

    import torch.distributed as dist

    runner = load_runner(runner_path)
    simulate(runner, nodes, pumped_heartbeats=False)  # rank 0 keeps the runner's own heartbeat
    options = options_for(runner, join_timeout_s)
    plant = planted(nodes)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    per_worker = math.ceil((nodes - 1) / workers)
    argv = [sys.executable, __file__, "--worker", str(nodes), "--port", str(port),
            "--join-timeout", str(join_timeout_s)] + (["--runner", runner_path] if runner_path else [])
    procs = [subprocess.Popen(argv + ["--ranks", f"{1 + k * per_worker}-{min((k + 1) * per_worker, nodes - 1)}"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
             for k in range(workers)]
    heartbeats = subprocess.Popen([sys.executable, __file__, "--pump", str(nodes), "--port", str(port),
                                   "--beat", str(runner.HEARTBEAT_S)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env())
    ready_by = time.monotonic() + READY_TIMEOUT_S
    for proc in procs + [heartbeats]:  # torch imported in every process before the clock starts
        ready, _, _ = select.select([proc.stdout], [], [], max(ready_by - time.monotonic(), 0))
        if not ready or proc.stdout.readline().strip() != "ready":
            for other in procs + [heartbeats]:
                other.kill()
            raise RuntimeError("a worker did not start in time")
    out: dict = {}

    def rank0() -> None:
        # cProfile follows the thread that enabled it: rank 0's store calls
        profiler = cProfile.Profile()
        try:
            profiler.enable()
            out["report"] = runner.run_rank(identity_for(runner, 0, nodes, port), options, straggler_factor=0.7)
            out["end"] = time.monotonic()
        except Exception as exc:
            out["errors"] = [f"rank 0: {runner._one_line(exc)}"]
        profiler.disable()
        out["rank0_thread_cpu_s"] = time.thread_time()
        out["rank0_store_calls"] = store_calls(profiler)
        if profile:
            print_profile(profiler)

    started, cpu_at_start = time.monotonic(), cpu_seconds()
    rank0_thread = threading.Thread(target=rank0, daemon=True)
    rank0_thread.start()
    store_up_by = time.monotonic() + 60
    while time.monotonic() < store_up_by:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.01)
    for proc in [heartbeats] + procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    peak = {"keys": 0, "fds": 0}
    watcher_stop = threading.Event()

    def watch() -> None:
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60),
                              wait_for_workers=False)
        while not watcher_stop.wait(0.5):
            peak["fds"] = max(peak["fds"], len(os.listdir("/proc/self/fd")))
            try:
                peak["keys"] = max(peak["keys"], store.num_keys())
            except Exception:  # the store is gone
                return

    threading.Thread(target=watch, daemon=True).start()
    rank0_thread.join(options.timeout_s + 30)
    watcher_stop.set()
    heartbeats.communicate(timeout=WORKER_EXIT_TIMEOUT_S)  # stdin closed: it ends
    finished = []
    for proc in procs:
        try:
            line = proc.communicate(timeout=WORKER_EXIT_TIMEOUT_S)[0].strip().splitlines()
            finished.append(json.loads(line[-1]) if line else {"errors": ["a worker printed nothing"]})
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            finished.append({"errors": ["a worker did not finish in time"]})
    report = out.get("report")  # rank 0's FabricReport; None where it ended without one
    rounds = report.rounds + report.retest_rounds if report else 0
    seconds = out.get("end", time.monotonic()) - started
    silence_s = options.silence_s if plant["dying"] else 0.0
    hosts = {host_name(r): r for r in range(nodes)}
    excluded = {hosts[item.host] for item in report.excluded} if report else set()
    named_lost = {hosts[h] for h, n in report.nodes.items() if n.lost} if report else set()
    died = {rank for done in finished for rank in done.get("died", [])}
    errors = out.get("errors", []) + [e for done in finished for e in done.get("errors", [])]
    falsely = excluded - plant["slow"] - plant["missing"] - plant["dying"]
    false_reasons = Counter(report.nodes[host_name(r)].reason[:60] for r in falsely).most_common(3)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"nodes": nodes, "workers": workers, "seconds": round(seconds, 2), "join_timeout_s": join_timeout_s,
            "silence_s": silence_s, "pairs_s": round(rounds * STAND_IN_PAIR_S, 3),
            "coordination_s": round(seconds - join_timeout_s - silence_s - rounds * STAND_IN_PAIR_S, 2),
            "store_keys": peak["keys"], "rank0_fds": peak["fds"],
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "workers_rss_mb": round(sum(done.get("rss_mb", 0) for done in finished)),
            # CPU seconds: rank 0's thread; the rest of its process (the store's server thread,
            # rank 0's heartbeat and this bench's watcher); all the workers together
            "rank0_thread_cpu_s": round(out.get("rank0_thread_cpu_s", 0), 2),
            "rank0_process_other_cpu_s": round(cpu_seconds() - cpu_at_start - out.get("rank0_thread_cpu_s", 0), 2),
            "workers_cpu_s": round(sum(done.get("cpu_s", 0) for done in finished), 1),
            "rank0_store_calls": out.get("rank0_store_calls"),
            "rounds": report.rounds if report else None, "retest_rounds": report.retest_rounds if report else None,
            "found": f"{len(plant['slow'] & excluded)}/{len(plant['slow'])}",
            "false": len(falsely), "false_reasons": false_reasons,
            "missing": f"{len(plant['missing'] & named_lost)}/{len(plant['missing'])}",
            "died": f"{len(plant['dying'] & named_lost & died)}/{len(plant['dying'])}", "errors": errors[:3]}


def store_calls(profiler) -> int:
    """Calls rank 0's thread made into c10d (each store call is one round trip, a `wait` too)."""
    stats = pstats.Stats(profiler)
    return sum(calls for (_, _, name), (_, calls, *_) in stats.stats.items() if "_distributed_c10d" in name)


def print_profile(profiler) -> None:
    """Rank 0's thread only: where its time went, and how many store round trips each function
    made, to stderr."""
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("cumulative").print_stats(25)
    stats.print_callers(r"_distributed_c10d")


def raise_nofile() -> None:
    """Raise the soft open-files limit to the hard one (setrlimit(2): no privilege needed)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def child_env() -> dict:
    """c10d looks a name up for every store connection; where no DNS server answers (this VM:
    resolv.conf names one it cannot reach) each lookup that misses the cache waits out glibc's
    5 s resolver timeout, so about 3 % of connections took 5.0 s here. One 1 s try instead
    (glibc's RES_OPTIONS, resolv.conf(5)); a cluster with working DNS does not pay this.
    A worker runs hundreds of threads: glibc gives threads up to 8 malloc arenas per core, each
    keeping its own free memory; MALLOC_ARENA_MAX caps them (mallopt(3),
    https://man7.org/linux/man-pages/man3/mallopt.3.html)."""
    return dict(os.environ, RES_OPTIONS=os.environ.get("RES_OPTIONS", "timeout:1 attempts:1"),
                MALLOC_ARENA_MAX=os.environ.get("MALLOC_ARENA_MAX", "2"),
                TORCH_CPP_LOG_LEVEL=os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))


def default_workers(nodes: int) -> int:
    return max(1, min(MAX_WORKERS, math.ceil(nodes / RANKS_PER_WORKER)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,1024,4096", help="comma-separated N")
    parser.add_argument("--join-timeout", type=float, default=10.0,
                        help="seconds rank 0 waits for the missing nodes (the gate's: fabric_timeout_s / 4)")
    parser.add_argument("--workers", type=int, help=f"worker processes (default: N / {RANKS_PER_WORKER}, "
                                                    f"at most {MAX_WORKERS})")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one N: rank 0 in this process
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # N: some of its ranks
    parser.add_argument("--pump", type=int, help=argparse.SUPPRESS)  # N: their heartbeats
    parser.add_argument("--beat", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ranks", help=argparse.SUPPRESS)  # FIRST-LAST, with --worker
    parser.add_argument("--profile", action="store_true",
                        help="with --one: profile rank 0's thread (cProfile) and print it to stderr")
    parser.add_argument("--runner", help="with --one: this file in place of health/fabric/runner.py")
    parser.add_argument("--baseline", metavar="FILE",
                        help="also run this version of health/fabric/runner.py, interleaved with the current one")
    parser.add_argument("--baseline-upto", type=int, default=2048,
                        help="run the baseline only up to this N (commit 1d39cd6's runner held ~5.6 sockets "
                             "per node at rank 0: ~20,500 at 4,096 nodes, past this machine's hard limit of 20,000)")
    parser.add_argument("--keep-nofile", action="store_true",
                        help="with --one: leave rank 0's RLIMIT_NOFILE as it is (only the runner's own raise applies)")
    args = parser.parse_args()
    if args.pump:
        pump(args.pump, args.port, args.beat)
    if args.worker:
        first, last = (int(r) for r in args.ranks.split("-"))
        worker(args.worker, args.port, first, last, args.join_timeout, args.runner)
    if args.one:
        if not args.keep_nofile:
            raise_nofile()
        workers = args.workers or default_workers(args.one)
        print(json.dumps(coordinate(args.one, args.join_timeout, workers, args.profile, args.runner)), flush=True)
        os._exit(0)  # as the runner's end_process: daemon threads inside c10d abort a normal exit
    rows: dict[str, list[dict]] = {}
    for nodes in (int(n) for n in args.nodes.split(",")):
        runners = [("baseline", args.baseline)] if args.baseline and nodes <= args.baseline_upto else []
        for label, path in runners + [("current", None)]:
            argv = [sys.executable, __file__, "--one", str(nodes), "--join-timeout", str(args.join_timeout)]
            argv += ["--workers", str(args.workers)] if args.workers else []
            row = run_child(argv + (["--runner", path] if path else []), nodes)
            if row is None:
                continue
            row = {**({"runner": label} if args.baseline else {}), **row,
                   "load_avg_1m": round(os.getloadavg()[0], 1)}
            print(json.dumps(row), flush=True)
            rows.setdefault(label, []).append(row)
    for label, measured in rows.items():
        slope = exponent(measured)
        if slope is not None:
            sizes = [r["nodes"] for r in measured]
            print(json.dumps({**({"runner": label} if args.baseline else {}),
                              "exponent_of_coordination_s_in_N": slope,
                              "n_log_n_exponent_over_same_range": n_log_n_exponent(min(sizes), max(sizes))}))


def run_child(argv: list[str], nodes: int) -> dict | None:
    done = subprocess.run(argv, capture_output=True, text=True, env=child_env())
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not line.startswith("{"):
        print(json.dumps({"nodes": nodes, "error": done.returncode, "stderr": done.stderr[-500:]}), flush=True)
        return None
    return json.loads(line)


def exponent(rows: list[dict]) -> float | None:
    """Least-squares slope of log(coordination_s) against log N."""
    fit = [(math.log(r["nodes"]), math.log(max(r["coordination_s"], 1e-3))) for r in rows]
    if len({x for x, _ in fit}) < 2:
        return None
    mean_x, mean_y = sum(x for x, _ in fit) / len(fit), sum(y for _, y in fit) / len(fit)
    return round(sum((x - mean_x) * (y - mean_y) for x, y in fit) / sum((x - mean_x) ** 2 for x, _ in fit), 2)


def n_log_n_exponent(low: int, high: int) -> float:
    """The log-log slope of N log N from `low` to `high` nodes: a cost that grows no faster
    than N log N has an exponent at most this."""
    return round(math.log(high * math.log(high) / (low * math.log(low))) / math.log(high / low), 2)


if __name__ == "__main__":
    main()
