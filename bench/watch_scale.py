"""The watch's cost as the job grows: one supervisor poll and one agent write, N nodes x R ranks.

Run: .venv/bin/python -P bench/watch_scale.py [--nodes 4,64,512,4096] [--ranks 8] [--rounds 7] [--polls 5]
     .venv/bin/python -P bench/watch_scale.py --profile 4096     (cProfile of the polls at one N, to stderr)

Each N has its own watch directory (a temporary folder on this machine's disk) holding one
real node file per node, written by the agent's own code: `Agent._write` (the node file of
trainctl.job.jobdir.node_file_json, json.dumps, write_atomically) on an agent whose ranks were folded
(agent.fold) from real progress datagrams (trainctl.progress RECORD, decoded). Between two polls
every node's file is rewritten with each rank 2 steps further on (about 0.5 s a step, a little
jitter per rank), as agents do every `agent_write_s`; that rewrite is timed per file (the
agent's write cost) and is not part of the poll.

The agents of each N run in one process, the supervisor of each N in another (forked before
anything big is built), as on a cluster: the supervisor's heap, which Python's garbage collector
walks, holds its own state and readings only. A poll is what the supervisor does every `poll_s`
(job/driver.py, each poll): read_node_files over every node, then watch.observe with the site
default [watch] limits and time.time(). Each N's WatchState starts from a history of MAX_SAMPLES
samples (one a second, as a run of more than an hour gives), built by observe itself over a
one-node job, so every poll drops the oldest sample and the baseline and slow windows are full;
one untimed poll then records every rank's counts. Each node's own-time samples (its slowest rank's
main thread time per step, taken a few times per slow window) are full likewise, and the agent
reads a real main thread's times for every rank (this process's: the ranks' pid in the datagrams).

The N values are interleaved: each round runs `--polls` polls of every N, in a shuffled order.
Printed per N: the median seconds per poll (its read and observe parts), that as a share of the
default poll_s (of one core: the supervisor is one Python thread), how often the supervisor then
polls (poll_s, or less often where a poll would take more than WATCH_SHARE of it), the part spent in
Python's cyclic garbage collector, the cost per node, the agent's write per node file and the
bytes of one. Then each N's poll cost against the smallest N's and the N's before it, next to
the ratio of their node counts. The files are read from the page cache of a local
disk: on a shared filesystem each open is a metadata round trip on top of these figures.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import gc
import multiprocessing
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved  # noqa: E402
from trainctl.job import agent, watch  # noqa: E402
from trainctl.job.driver import WATCH_SHARE  # noqa: E402
from trainctl.job.jobdir import JobPaths  # noqa: E402
from trainctl.job.watch_io import prepare_watch_dir, read_node_files  # noqa: E402
from trainctl.guest.wire import RECORD, VERSION, decode  # noqa: E402
from trainctl.site import WatchConfig  # noqa: E402

STEP_S = 0.5                   # the simulated training step
STEPS_PER_WRITE = 2            # steps each rank finishes between two writes of its agent
CHECKPOINT_EVERY = 100         # steps


def host_name(index: int) -> str:
    return f"gpu{index + 1:04d}"


def limits_from(config: WatchConfig) -> watch.WatchLimits:
    # as job/policy.py GatePolicy.watch_limits
    return watch.WatchLimits(config.slow_factor, config.slow_window_s, config.baseline_window_s,
                             config.warmup_s, config.hang_floor_s, config.hang_steps, config.agent_silence_s)


class NodeAgent:
    """The attributes `agent.Agent._write` reads: the agent's own write, without its socket and checks."""

    write = agent.Agent._write

    def __init__(self, folder: str, node: str, started_t: float, checks: agent.ChecksState):
        self.node = node
        self.paths = JobPaths(Path(folder).parent)
        self.node_path = self.paths.node_file(node)
        self.started_t = started_t
        self.ranks: dict[int, agent.RankProgress] = {}
        self.checks = checks
        self.last_write_error = ""

    def _say(self, line: str) -> None:
        raise SystemExit(f"watch_scale: the agent of {self.node}: {line}")


def healthy_checks(t: float) -> agent.ChecksState:
    """Checks run 4 times, nothing failed or unknown: a healthy node's `checks`."""
    return agent.ChecksState(runs=4, t=t)


class Collector:
    """The time Python's cyclic garbage collector runs (gc.callbacks), part of what a poll costs."""

    def __init__(self):
        self.spent = 0.0
        self.since = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.since = time.perf_counter()
        else:
            self.spent += time.perf_counter() - self.since


COLLECTOR = Collector()
FORK = multiprocessing.get_context("fork")   # the children are made before anything big exists
gc.callbacks.append(COLLECTOR)


class Agents:
    """N nodes' agents writing into one watch directory (in a process of their own)."""

    def __init__(self, gate_dir: str, nodes: int, ranks: int, seed: int):
        folder = prepare_watch_dir(gate_dir)
        self.ranks = ranks
        now = time.time()
        self.agents = [NodeAgent(folder, host_name(i), now, healthy_checks(now)) for i in range(nodes)]
        rng = random.Random(seed)
        # each rank's own step time: the job's 0.5 s within +-2 %
        self.step_s = [STEP_S * rng.uniform(0.98, 1.02) for _ in range(nodes * ranks)]
        self.steps = 0
        self.advance()

    def advance(self) -> tuple[float, int]:
        """Every rank STEPS_PER_WRITE steps on (progress datagrams folded as the agent does), then
        every agent writes its file: (seconds per node file written, bytes of one)."""
        self.steps += STEPS_PER_WRITE
        now = time.time()
        checkpoint = self.steps - self.steps % CHECKPOINT_EVERY if self.steps >= CHECKPOINT_EVERY else -1
        for index, node in enumerate(self.agents):
            for local in range(self.ranks):
                rank = index * self.ranks + local
                window = STEPS_PER_WRITE * self.step_s[rank]
                # the ranks' pid is this process's: the agent reads a real main thread's times for each
                datagram = RECORD.pack(VERSION, rank, os.getpid(), self.steps, now, STEPS_PER_WRITE,
                                       window, window / STEPS_PER_WRITE * 1.1, 0.8 * window, checkpoint, self.steps)
                node.ranks = agent.fold(node.ranks, decode(datagram))
        started = time.perf_counter()
        for node in self.agents:
            node.write()
        return (time.perf_counter() - started) / len(self.agents), os.path.getsize(self.agents[-1].node_path)


class Supervisor:
    """The supervisor's side: its WatchState over the N nodes' files, one poll at a time (in a
    process of its own, so that its heap, which the garbage collector walks, is a supervisor's)."""

    def __init__(self, gate_dir: str, nodes: int, limits: watch.WatchLimits,
                 history: tuple[watch.Sample, ...]):
        self.gate_dir = gate_dir
        self.nodes = tuple(host_name(i) for i in range(nodes))
        self.limits = limits
        # a run of more than an hour: MAX_SAMPLES samples, the last one a poll ago
        state = dataclasses.replace(watch.start(time.time() - len(history) - 1), samples=history,
                                    own=own_history(limits, self.nodes))
        self.state = watch.observe(limits, state, time.time(), read_node_files(gate_dir, self.nodes)).state

    def poll(self) -> tuple[float, float, float]:
        """(read_node_files seconds, observe seconds, of those in the garbage collector)."""
        COLLECTOR.spent = 0.0
        started = time.perf_counter()
        readings = read_node_files(self.gate_dir, self.nodes)
        read = time.perf_counter()
        seen = watch.observe(self.limits, self.state, time.time(), readings)
        done = time.perf_counter()
        spent = COLLECTOR.spent
        if seen.detection is not None or any(r is None for r in readings.values()):
            raise SystemExit(f"watch_scale: {len(self.nodes)} nodes: a healthy job read as "
                             f"{seen.detection or 'missing node files'}")
        if len(seen.state.samples) != watch.MAX_SAMPLES or seen.state.samples[-1] == self.state.samples[-1]:
            raise SystemExit(f"watch_scale: {len(self.nodes)} nodes: the poll took no sample")
        self.state = seen.state
        return read - started, done - read, spent


def serve(conn, make) -> None:
    """A child process: build `make()`, then call the method each message names until None."""
    try:
        target = make()
        conn.send("ready")
        while (method := conn.recv()) is not None:
            conn.send(getattr(target, method)())
    except BaseException as exc:
        conn.send(exc)
        raise


class Remote:
    def __init__(self, make):
        self.conn, child = FORK.Pipe()
        self.process = FORK.Process(target=serve, args=(child, make), daemon=True)
        self.process.start()
        self.recv()

    def recv(self):
        answer = self.conn.recv()
        if isinstance(answer, BaseException):
            raise SystemExit(f"watch_scale: a child failed: {answer}")
        return answer

    def call(self, method: str):
        self.conn.send(method)
        return self.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=60)


def own_history(limits: watch.WatchLimits, nodes: tuple[str, ...]) -> dict[str, tuple[watch.OwnSample, ...]]:
    """Each node's own-time samples over the baseline and slow windows, as a long run keeps them."""
    every_s = limits.slow_window_s / watch.OWN_SAMPLES_PER_WINDOW
    count = int((limits.slow_window_s + limits.baseline_window_s) / every_s)
    end = time.time() - every_s
    return {node: tuple(watch.OwnSample(end - every_s * (count - i), 0.4, 0.01, 0) for i in range(count))
            for node in nodes}


def build_history(limits: watch.WatchLimits, config: WatchConfig) -> tuple[watch.Sample, ...]:
    """MAX_SAMPLES samples, one per poll_s, as observe itself records them over a one-node job
    (the samples are the job's step time: they do not depend on its size)."""
    state = watch.start(0.0)
    for poll in range(watch.MAX_SAMPLES + 1):
        t = poll * config.poll_s
        steps = poll * STEPS_PER_WRITE
        ranks = tuple(watch.RankProgress(rank, steps, steps * STEP_S * (1 + 0.01 * rank), t)
                      for rank in range(8))
        state = watch.observe(limits, state, t, {"gpu0001": watch.NodeReading("gpu0001", t, ranks)}).state
    if len(state.samples) != watch.MAX_SAMPLES:
        raise SystemExit(f"watch_scale: the history holds {len(state.samples)} samples, "
                         f"not {watch.MAX_SAMPLES}")
    end = time.time() - config.poll_s
    last = state.samples[-1].t
    return tuple(watch.Sample(end - (last - s.t), s.step_s) for s in state.samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,64,512,4096", help="comma-separated node counts")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--polls", type=int, default=5, help="polls of each N per round")
    parser.add_argument("--profile", type=int, metavar="N",
                        help="cProfile the polls at N nodes (stderr) instead")
    parser.add_argument("--keep", action="store_true", help="keep the watch directories")
    args = parser.parse_args()
    counts = [args.profile] if args.profile else sorted({int(n) for n in args.nodes.split(",")})
    config = WatchConfig()
    limits = limits_from(config)
    root = tempfile.mkdtemp(prefix="trainctl-watch-scale-")
    print(f"command: {' '.join([os.path.relpath(sys.executable), '-P', *sys.argv])}")
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"watch dir on {root} (local disk, page cache)")
    print(f"site defaults: poll_s {config.poll_s:g}, agent_write_s {config.agent_write_s:g}; "
          f"MAX_SAMPLES {watch.MAX_SAMPLES}; {args.ranks} ranks per node")
    history = build_history(limits, config)
    agents: dict[int, Remote] = {}
    supervisors: dict[int, Remote] = {}
    try:
        for n in counts:
            gate_dir = os.path.join(root, f"n{n}")
            agents[n] = Remote(functools.partial(Agents, gate_dir, n, args.ranks, seed=n))
            if args.profile:
                return profile(agents[n], Supervisor(gate_dir, n, limits, history), args.rounds * args.polls)
            supervisors[n] = Remote(functools.partial(Supervisor, gate_dir, n, limits, history))
        polls: dict[int, list[tuple[float, float, float]]] = {n: [] for n in counts}
        writes: dict[int, list[tuple[float, int]]] = {n: [] for n in counts}
        for n in interleaved(counts, args.rounds):
            for _ in range(args.polls):
                writes[n].append(agents[n].call("advance"))
                polls[n].append(supervisors[n].call("poll"))
        report(polls, writes, config, args)
    finally:
        for remote in [*agents.values(), *supervisors.values()]:
            remote.close()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def report(polls: dict[int, list[tuple[float, float, float]]], writes: dict[int, list[tuple[float, int]]],
           config: WatchConfig, args: argparse.Namespace) -> None:
    print(f"{args.rounds} interleaved rounds x {args.polls} polls per N; medians")
    print(f"{'nodes':>6} {'ranks':>7} {'poll ms':>9} {'read ms':>9} {'observe ms':>10} {'gc ms':>7} "
          f"{'of poll_s':>9} {'polls every s':>13} {'us/node':>8} {'write us/file':>13} {'bytes/file':>10}")
    cost = {}
    for n, times in polls.items():
        cost[n] = statistics.median(read + observe for read, observe, _ in times)
        read, observe, collect = (statistics.median(column) for column in list(zip(*times)))
        write = statistics.median(seconds for seconds, _ in writes[n])
        print(f"{n:>6} {n * args.ranks:>7} {cost[n] * 1e3:>9.2f} {read * 1e3:>9.2f} {observe * 1e3:>10.2f} "
              f"{collect * 1e3:>7.2f} {cost[n] / config.poll_s:>9.2%} {max(config.poll_s, cost[n] / WATCH_SHARE):>13.1f} "
              f"{cost[n] / n * 1e6:>8.1f} "
              f"{write * 1e6:>13.1f} {writes[n][-1][1]:>10,}")
    counts = list(polls)
    smallest, largest = counts[0], counts[-1]
    print(f"poll cost against {smallest} nodes and against the N before "
          "(linear in nodes: the ratio of node counts)")
    for before, n in zip(counts, counts[1:]):
        print(f"  {n:>5} nodes: {cost[n] / cost[smallest]:7.1f}x {smallest} nodes' for {n / smallest:g}x "
              f"the nodes; {cost[n] / cost[before]:5.1f}x {before} nodes' for {n / before:g}x")
    rate = largest / config.agent_write_s
    print(f"at {largest} nodes the agents write {rate:,.0f} files a second "
          f"({rate * writes[largest][-1][1] / 1e6:.1f} MB/s) into the watch directory; the supervisor "
          f"reads them all every poll_s, or less often where a poll costs more than {WATCH_SHARE:.0%} of it "
          "('polls every s')")


def profile(agents: Remote, supervisor: Supervisor, polls: int) -> int:
    profiler = cProfile.Profile()
    times = []
    for _ in range(polls):
        agents.call("advance")
        profiler.enable()
        times.append(supervisor.poll())
        profiler.disable()
    read, observe, collect = (statistics.median(column) for column in list(zip(*times)))
    print(f"{len(supervisor.nodes)} nodes: {polls} polls under cProfile (its overhead included), medians: "
          f"read {read * 1e3:.1f} ms, observe {observe * 1e3:.1f} ms, of which in the garbage collector "
          f"{collect * 1e3:.1f} ms; the profile is on stderr")
    stats = pstats.Stats(profiler, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
