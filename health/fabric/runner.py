"""The fabric test's I/O half: rendezvous, intra-node and pairwise inter-node all_reduce.

One process per node (started by `srun --ntasks-per-node=1`). Rank 0 hosts a c10d TCPStore;
every rank announces itself there, and rank 0 closes the roster at the join deadline, so a
node that never starts is reported instead of waited for. Pairs then measure over process
groups of their own (each built on a store its pair's first rank hosts, so no collective needs
every node and rank 0's store holds only three connections per node), in rounds from the pure
schedule; results go back through the store and rank 0 judges them with the pure blame logic.
Every blocking call has a deadline derived from one overall deadline, and a watchdog ends a
process that is stuck in native code past it.

A peer that is gone is not waited for: every rank sends a heartbeat through the store from a
thread with its own store connection, and a rank whose heartbeat has been silent for
`silence_s` is lost (killed, or hung: a SIGSTOPped process is alive but silent). Rank 0 then
stops waiting for it at barriers and for its results, and its pair partners abandon the pair
(gloo itself reports a killed peer at once: its connections reset). The report names it.

Rails: with R rails (`FabricOptions.rails`), the node's process starts one process per rail
(`run_node`), each a rank of its own (node n's rail r is rank n x R + r) with its own store
connections, bound to its rail: gloo to the rail's interface, NCCL to the rail's HCA and GPU r.
Rail r's ranks pair only with rail r's ranks, in the same rounds as one rail (every rail at
once), on store prefixes of their own; each rail is judged against its own pairs.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from queue import Empty

from trainctl.health.fabric.bandwidth import Collective, figures_from_timings
from trainctl.health.fabric.report import (FabricReport, build_report, rail_positions, rail_results,
                                           retest_rounds)
from trainctl.health.fabric.schedule import padded, rail_ranks, rail_schedules
from trainctl.errors import EXIT_EXTERNAL, UsageError
from trainctl.slurm import job_port, node_address, step_hosts, this_node_name

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy
# c10d warns on every connection when peers' hostnames do not resolve (namespace nodes); noise.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

EXIT_STUCK = 3
WATCHDOG_GRACE_S = 5.0
MIN_STEP_TIMEOUT_S = 1.0
ROSTER_POLL_S = 0.05
FINISH_WAIT_S = 10.0
HEARTBEAT_S = 0.5
JOIN_LOG = "join"  # one line per rank that announced itself, "rank<TAB>host"
PAIR_STORE = "pair_store"  # pair_store/<rank>: "address:port" of the store that rank hosts for its pairs
# Figures come from the fast quartile of the iteration times (the lower quartile of the times),
# not the median. Interference from neighbours (a shared host, other jobs' traffic) only ever
# makes an iteration slower, so the fast end shows what the path can do, while a rate-limited
# link cannot beat its limit however quiet the moment. On the 2-core dev cluster under load,
# 9 runs with one node shaped to 0.8x and 18 healthy runs (recorded iteration times, blame at
# factor 0.8): the fast decile found the node in 3 runs and blamed healthy nodes in 4, the
# fast quartile 2 and 0, the median 0 and 1. The decile, one or two iterations, is too noisy.
FAST_QUANTILE = 0.25


@dataclass(frozen=True)
class FabricOptions:
    sizes: tuple[int, ...] = (1 << 20, 64 << 20)
    iters: int = 5
    passes: int = 1                 # times the pairing rounds are run over, interleaved; iters per visit
    warmup: int = 2
    timeout_s: float = 120.0        # the whole test, rendezvous to report
    join_timeout_s: float = 30.0    # how long rank 0 waits for every rank to announce itself
    op_timeout_s: float = 30.0      # one pair's process group set-up or one collective
    local_procs: int = 0            # intra-node ranks; 0: one per GPU, or 2 CPU processes without GPUs
    socket_ifname: str | None = None
    intra: bool = True
    # Rail r's device: a netdev (eth1) gloo binds to, or an HCA port (mlx5_5:1) NCCL uses with
    # GPU r. Fewer than two: one process per node, over socket_ifname (no rails).
    rails: tuple[str, ...] = ()
    silence_s: float = 5.0          # a peer whose heartbeat is silent this long is lost


@dataclass(frozen=True)
class Identity:
    rank: int
    world: int
    host: str
    master_addr: str
    port: int
    expected_hosts: tuple[str, ...] = ()  # host of each rank when Slurm says (one task per node)


@dataclass
class Measurement:
    """One pair (or one node's local group) at one message size."""
    peers: tuple[str, ...]
    size: int
    ranks: int
    median_s: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    error: str | None = None
    fast_s: float | None = None   # the fast-quartile iteration time busbw is computed from
    rail: int = 0


@dataclass
class RankResult:
    rank: int
    host: str
    backend: str
    rail: int = 0
    intra: list[Measurement] = field(default_factory=list)
    inter: list[Measurement] = field(default_factory=list)


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self, cap: float | None = None) -> float:
        left = max(self.end - time.monotonic(), MIN_STEP_TIMEOUT_S)
        return min(left, cap) if cap else left

    def expired(self) -> bool:
        return time.monotonic() >= self.end


class PeerLost(Exception):
    """A peer stopped sending heartbeats: it died or hangs."""


class Heartbeat:
    """Bumps `alive/<rank>` in the store every HEARTBEAT_S, from a daemon thread.

    The thread has its own store connection: a TCPStore client serialises its operations, so
    a long `wait` on the main connection would otherwise hold the heartbeat back.
    """

    def __init__(self, identity: "Identity", timeout_s: float):
        self.store = dist.TCPStore(identity.master_addr, identity.port, None, False,
                                   datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self.key = f"alive/{identity.rank}"
        self.store.add(self.key, 1)
        threading.Thread(target=self._beat, daemon=True, name="fabric-heartbeat").start()

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                self.store.add(self.key, 1)
            except Exception:  # the store (rank 0) is gone: the main thread finds out itself
                return


LOST_LOG = "lost"  # one line per declaration, "rank<TAB>why": the first one for a rank is the reason


class PeerWatch:
    """Which peers are lost: heartbeat silent for `silence_s`, or declared lost by any rank.

    Reads go through a store connection of its own (see Heartbeat). `lost` maps rank to why.
    One check of any number of ranks is one store round trip: a `multi_get` of the shared lost
    log and their heartbeat counters (rank 0 waiting for 4,096 ranks used to make two round
    trips per rank per check; see docs/performance.md, "The gate at scale").
    """

    def __init__(self, identity: "Identity", silence_s: float, timeout_s: float):
        self.store = dist.TCPStore(identity.master_addr, identity.port, None, False,
                                   datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self.store.append(LOST_LOG, "")  # exists before this rank joins, so multi_get never waits on it
        self.silence_s = silence_s
        self.last: dict[int, tuple[int, float]] = {}
        self.lost: dict[int, str] = {}

    def check(self, rank: int, during: str) -> str | None:
        """Why `rank` is lost, or None while its heartbeat moves."""
        return self.check_many([rank], during).get(rank)

    def check_many(self, ranks: list[int], during: str) -> dict[int, str]:
        """Why each of `ranks` that is lost is lost; those whose heartbeat moves are left out.

        Every rank in the roster has its `alive/<rank>` counter (its Heartbeat starts before it
        joins), so the `multi_get` does not wait.
        """
        asked = [rank for rank in ranks if rank not in self.lost]
        if asked:
            now = time.monotonic()
            log, *counts = self.store.multi_get([LOST_LOG] + [f"alive/{rank}" for rank in asked])
            self._read_declarations(log.decode())
            declared = []
            for rank, count in zip(asked, (int(c) for c in counts)):
                if rank in self.lost:
                    continue
                seen, since = self.last.get(rank, (-1, now))
                if count != seen:
                    self.last[rank] = (count, now)
                elif now - since >= self.silence_s:
                    self.lost[rank] = f"no heartbeat for {self.silence_s:g} s during {during} (died or hung)"
                    declared.append(f"{rank}\t{self.lost[rank]}\n")
            if declared:  # so every rank agrees on why
                self.store.append(LOST_LOG, "".join(declared))
        return {rank: self.lost[rank] for rank in ranks if rank in self.lost}

    def _read_declarations(self, log: str) -> None:
        for line in log.splitlines():
            rank, _, why = line.partition("\t")
            self.lost.setdefault(int(rank), why)


def time_allreduce(group, tensor: torch.Tensor, iters: int, warmup: int) -> list[float]:
    """Seconds of each of `iters` timed all_reduce calls after `warmup` untimed ones."""
    cuda = tensor.is_cuda
    for _ in range(warmup):
        group.allreduce([tensor]).wait()
    if cuda:
        torch.cuda.synchronize(tensor.device)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        group.allreduce([tensor]).wait()
        if cuda:
            torch.cuda.synchronize(tensor.device)
        times.append(time.perf_counter() - start)
    return times


def measure_sizes(group, peers: tuple[str, ...], ranks: int, device: torch.device,
                  options: FabricOptions) -> list[Measurement]:
    results = []
    for size in options.sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        results.append(_measurement(peers, size, ranks, time_allreduce(group, tensor, options.iters,
                                                                       options.warmup)))
    return results


def _measurement(peers: tuple[str, ...], size: int, ranks: int, times: list[float], rail: int = 0) -> Measurement:
    figures = figures_from_timings(Collective.ALL_REDUCE, size, ranks, times, quantile=FAST_QUANTILE)
    return Measurement(peers, size, ranks, figures.median_seconds, figures.algbw_gbps, figures.busbw_gbps,
                       fast_s=figures.seconds, rail=rail)


def new_group(store, prefix: str, rank: int, size: int, timeout_s: float, device: torch.device,
              socket_ifname: str | None):
    """A process group of `size` ranks on its own store prefix: no global collective needed."""
    timeout = datetime.timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    if socket_ifname:
        options._devices = [dist.ProcessGroupGloo.create_device(interface=socket_ifname)]
    else:
        options._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(prefixed, rank, size, options)


# --- intra-node: one process per local GPU (NCCL), or CPU processes over loopback (gloo) ---

def intra_node(host: str, options: FabricOptions, deadline: Deadline) -> list[Measurement]:
    gpus = torch.cuda.device_count()
    procs = options.local_procs or (gpus if gpus else 2)
    if procs < 2:
        return [Measurement((host,), size, 1, error="one local rank: nothing to all_reduce")
                for size in options.sizes]
    # CUDA needs fresh interpreters; CPU ranks fork from this one and skip re-importing torch.
    context = multiprocessing.get_context("spawn" if gpus else "fork")
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=deadline.left()),
                          wait_for_workers=False)
    queue = context.Queue()
    workers = [context.Process(target=_intra_worker, daemon=True,
                               args=(store.port, local_rank, procs, gpus > 0, host, options,
                                     deadline.left(options.op_timeout_s), queue))
               for local_rank in range(procs)]
    for worker in workers:
        worker.start()
    try:
        measured = queue.get(timeout=deadline.left(options.op_timeout_s * 2))
    except Empty:
        measured = [Measurement((host,), size, procs, error="intra-node test did not finish in time")
                    for size in options.sizes]
    for worker in workers:
        worker.join(timeout=MIN_STEP_TIMEOUT_S)
        if worker.is_alive():
            worker.kill()
    return measured


def _intra_worker(port: int, local_rank: int, procs: int, use_gpus: bool, host: str,
                  options: FabricOptions, timeout_s: float, queue) -> None:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    torch.set_num_threads(1)
    device = torch.device("cuda", local_rank) if use_gpus else torch.device("cpu")
    if use_gpus:
        torch.cuda.set_device(device)
    try:
        store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=timeout_s))
        group = new_group(store, "intra", local_rank, procs, timeout_s, device,
                          None if use_gpus else "lo")
        measured = measure_sizes(group, (host,), procs, device, options)
    except Exception as exc:  # reported as data: the node's intra-node figure is missing
        measured = [Measurement((host,), size, procs, error=_one_line(exc)) for size in options.sizes]
    if local_rank == 0:
        queue.put(measured)


# --- inter-node: rendezvous, rounds of pairs, results to rank 0 ---

def run_rank(identity: Identity, options: FabricOptions, straggler_factor: float = 0.7,
             floor_gbps: float | None = None) -> FabricReport | None:
    """Run this rank's part of the test; rank 0 returns the report, the others None."""
    deadline = Deadline(options.timeout_s)
    _start_watchdog(deadline)
    started = time.monotonic()
    is_master = identity.rank == 0
    if is_master:
        raise_open_files_limit()
    connect_s = deadline.left(options.join_timeout_s)
    store = dist.TCPStore(identity.master_addr, identity.port, None, is_master,
                          datetime.timedelta(seconds=connect_s), wait_for_workers=False)
    Heartbeat(identity, connect_s)
    watch = PeerWatch(identity, options.silence_s, connect_s)
    pair_store = host_pair_store(identity, connect_s)  # referenced until this rank is done
    store.set(f"{PAIR_STORE}/{identity.rank}", pair_store.address)
    store.append(JOIN_LOG, f"{identity.rank}\t{identity.host}\n")
    if is_master:
        roster = _close_roster(store, identity.world, Deadline(options.join_timeout_s))
        roster["expected"] = list(identity.expected_hosts)
        store.set("roster", json.dumps(roster))
    else:
        store.wait(["roster"], datetime.timedelta(seconds=deadline.left(options.join_timeout_s + 5)))
        roster = json.loads(store.get("roster"))
    members = [int(r) for r in roster["joined"]]
    if identity.rank not in members:
        return None  # joined after the roster closed: rank 0 reports this rank as missing
    rail_count = max(len(options.rails), 1)
    rail = identity.rank % rail_count
    device = _inter_device(rail if rail_count > 1 else None)
    result = RankResult(identity.rank, identity.host, "nccl" if device.type == "cuda" else "gloo", rail)
    if options.intra and rail == 0:  # one intra-node test per node
        result.intra = intra_node(identity.host, options, deadline)
    hosts = roster["hosts"]
    # every rail pairs its own joined ranks; all rails run the same number of rounds, so the
    # round barriers (counted per rank, every rail's ranks together) line up
    rail_members = rail_ranks(members, rail, rail_count)
    position = rail_members.index(identity.rank)
    rounds = [[list(pair) for pair in r] for r in rail_schedules(members, rail_count)[rail]]
    test = _Test(identity, store, watch, members, rail_members, hosts, device, options, deadline, rail)
    test.run_rounds("round", rounds, position, result)
    test.send("result", result)

    if is_master:
        results = test.collect("result", members)
        retests_by_rail = [
            retest_rounds(rail_results(results, r, rail_count), rail_positions(members, hosts, r, rail_count),
                          max(options.sizes), straggler_factor, floor_gbps)
            for r in range(rail_count)]
        store.set("retests", json.dumps(retests_by_rail))
    else:
        store.wait(["retests"], datetime.timedelta(seconds=deadline.left()))
        retests_by_rail = json.loads(store.get("retests"))
    retest_count = max(map(len, retests_by_rail))
    if retest_count:
        test.run_rounds("retest", padded(retests_by_rail[rail], retest_count), position, result)
        test.send("final", result)
    if not is_master:
        store.add("finished", 1)  # after this, this rank needs nothing more from the store
        return None
    if retest_count:
        results.update(test.collect("final", [r for r in members if r in results]))
    report = build_report(results=results, roster=roster, rails=options.rails if rail_count > 1 else (),
                          world=None if rail_count > 1 else identity.world, sizes=options.sizes,
                          rounds=len(rounds), retests=retest_count, straggler_factor=straggler_factor,
                          floor_gbps=floor_gbps, join_timeout_s=options.join_timeout_s,
                          duration_s=time.monotonic() - started, lost=dict(watch.lost))
    others = len([r for r in members if r not in watch.lost]) - 1
    _wait_finished(store, others, Deadline(min(FINISH_WAIT_S, deadline.left())))
    return report


def run_node(identity: Identity, options: FabricOptions, straggler_factor: float = 0.7,
             floor_gbps: float | None = None) -> FabricReport | None:
    """This node's part of the test: its one rank, or with rails one process per rail.

    Each rail's rank is a process of its own, with its own store connections, heartbeat, pair
    groups and watchdog: nothing one rail waits on can hold another. This process only starts
    them and waits for them, never past the test's deadline plus the watchdog's grace.
    """
    if len(options.rails) < 2:
        return run_rank(identity, options, straggler_factor, floor_gbps)
    rail_count = len(options.rails)
    # CUDA needs fresh interpreters; without GPUs the rails fork from this one (no threads yet)
    context = multiprocessing.get_context("spawn" if torch.cuda.is_available() else "fork")
    receiver, sender = context.Pipe(duplex=False)
    processes = [context.Process(target=_rail_process, name=f"fabric-rail{rail}",
                                 args=(rail_identity(identity, rail, rail_count), options, straggler_factor,
                                       floor_gbps, sender))
                 for rail in range(rail_count)]
    for process in processes:
        process.start()
    sender.close()
    deadline = Deadline(options.timeout_s + WATCHDOG_GRACE_S + MIN_STEP_TIMEOUT_S)
    report = None
    if identity.rank == 0 and receiver.poll(deadline.left()):
        try:
            report = receiver.recv()
        except EOFError:  # rail 0's process ended without a report: said below
            pass
    for process in processes:
        process.join(deadline.left())
        if process.is_alive():
            process.kill()
            process.join(MIN_STEP_TIMEOUT_S)
    if identity.rank == 0 and report is None:
        codes = {process.name: process.exitcode for process in processes}
        raise dist.DistError(f"rank 0's rail processes ended without a report (exit codes {codes})")
    return report


def rail_identity(node: Identity, rail: int, rail_count: int) -> Identity:
    """Rail `rail` of node rank n is rank n x R + r of N x R; rank 0 is node 0's rail 0."""
    expected = tuple(host for host in node.expected_hosts for _ in range(rail_count))
    return Identity(node.rank * rail_count + rail, node.world * rail_count, node.host, node.master_addr,
                    node.port, expected)


def _rail_process(identity: Identity, options: FabricOptions, straggler_factor: float,
                  floor_gbps: float | None, sender) -> None:
    """One rail's rank, bound to its rail; rank 0 sends the report. Ends with os._exit (see end_process)."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    rail = identity.rank % len(options.rails)
    device = options.rails[rail]
    if torch.cuda.is_available():
        # NCCL_IB_HCA: a leading "=" selects exactly this HCA port, not every name it prefixes
        # (mlx5_1 would also match mlx5_10); NCCL_SOCKET_IFNAME stays the bootstrap interface.
        # https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html (NCCL_IB_HCA)
        os.environ["NCCL_IB_HCA"] = f"={device}"
        rail_options = options
    else:
        # gloo binds each pair group's device to the rail's interface, as GLOO_SOCKET_IFNAME binds
        # the default one (https://pytorch.org/docs/stable/distributed.html, "Common environment
        # variables"): rail r's traffic leaves by interface r, never by another rail's
        rail_options = replace(options, socket_ifname=device)
    code = 0
    try:
        report = run_rank(identity, rail_options, straggler_factor, floor_gbps)
        if report is not None:
            sender.send(report)
    except Exception as exc:  # the store gone or silent past the deadline: said, and the exit code shows it
        print(f"trainctl: error: fabric test, {identity.host} rail {rail}: {_one_line(exc)}", file=sys.stderr)
        code = EXIT_EXTERNAL
    end_process(code)


@dataclass
class _Test:
    """One rank's view of the running test: the store, its peers, and who is lost."""
    identity: Identity
    store: object
    watch: PeerWatch
    members: list[int]          # every rank in the test: barriers wait for all of them
    rail_members: list[int]     # this rank's rail's ranks: pair positions index these
    hosts: dict
    device: torch.device
    options: FabricOptions
    deadline: Deadline
    rail: int = 0
    pair_stores: dict[int, str] = field(default_factory=dict)

    def pair_store_of(self, rank: int) -> str:
        """"address:port" of the store `rank` hosts for its pairs (set before it joined)."""
        if rank not in self.pair_stores:
            self.pair_stores[rank] = self.store.get(f"{PAIR_STORE}/{rank}").decode()
        return self.pair_stores[rank]

    def run_rounds(self, name: str, rounds: list[list[list[int]]], position: int, result: RankResult) -> None:
        """All rounds, `options.passes` times over, interleaved: load that comes and goes hits every pair."""
        sessions: dict[tuple[int, int], _PairSession] = {}
        for visit in range(self.options.passes):
            for number, pairs in enumerate(rounds):
                self.barrier(f"{name}{number}.{visit}")
                for i, j in pairs:
                    if position in (i, j):
                        session = sessions.setdefault((i, j), _PairSession(i, j, position, self.rail_members,
                                                                           self.hosts, self.rail))
                        session.visit(self, pair_prefix(name, number, self.rail, i, j))
        result.inter += [m for session in sessions.values() for m in session.measurements(self.options.sizes)]

    def barrier(self, name: str) -> None:
        """Rank 0 opens it once every rank not lost has arrived, or at the step's cap."""
        self.store.append(f"barrier/{name}", f"{self.identity.rank},")
        step = Deadline(min(self.deadline.left(), self.options.op_timeout_s))
        if self.identity.rank != self.members[0]:
            try:
                self.store.wait([f"barrier/{name}/open"], datetime.timedelta(seconds=step.left()))
            except RuntimeError:
                pass  # late or lost ranks are judged by their results
            return
        # a rank that arrived and then died still counts as arrived: only timing suffers
        self.wait_for(f"barrier/{name}", self.members, f"barrier {name}", step)
        self.store.set(f"barrier/{name}/open", "1")

    def send(self, prefix: str, result: RankResult) -> None:
        """This rank's `prefix` result to rank 0: the result's own key, then its arrival."""
        self.store.set(f"{prefix}/{self.identity.rank}", json.dumps(asdict(result)))
        self.store.append(f"{prefix}/arrived", f"{self.identity.rank},")

    def collect(self, prefix: str, ranks: list[int]) -> dict[int, dict]:
        """Every rank's `prefix` result, not waiting for lost ranks; the deadline bounds it."""
        arrived = self.wait_for(f"{prefix}/arrived", ranks, f"waiting for {prefix}s", self.deadline)
        # a rank that stored its result but died before noting its arrival still counts
        late = [rank for rank in ranks if rank not in arrived and self.store.check([f"{prefix}/{rank}"])]
        present = [rank for rank in ranks if rank in arrived] + late
        values = self.store.multi_get([f"{prefix}/{rank}" for rank in present]) if present else []
        return {rank: json.loads(value) for rank, value in zip(present, values)}

    def wait_for(self, arrivals: str, ranks: list[int], during: str, step: Deadline) -> set[int]:
        """Which of `ranks` have noted themselves in the `arrivals` log, once every one not lost
        has or `step` expires. While it waits, the heartbeats of the ranks still missing are
        checked every HEARTBEAT_S; each poll is a constant number of store round trips, whatever
        the number of ranks (the barriers and result collection share this loop)."""
        checked = time.monotonic()
        while True:
            arrived = self._arrived(arrivals)
            waiting = [r for r in ranks if r not in arrived and r not in self.watch.lost]
            if not waiting or step.expired():
                return arrived
            if time.monotonic() - checked >= HEARTBEAT_S:
                checked = time.monotonic()
                self.watch.check_many(waiting, during)
            time.sleep(ROSTER_POLL_S)

    def _arrived(self, arrivals: str) -> set[int]:
        if not self.store.check([arrivals]):
            return set()
        return {int(rank) for rank in self.store.get(arrivals).decode().split(",") if rank}


def pair_prefix(name: str, number: int, rail: int, i: int, j: int) -> str:
    """The store prefix of one pair's process group: its own per round, pair and rail. Two gloo
    groups built on one prefix read each other's rendezvous keys: their connections cross, and
    they hang, fail with read errors or reduce with the wrong peer (bench/gloo_shared_prefix.py)."""
    return f"{name}{number}/rail{rail}/{i}-{j}"


class _PairSession:
    """One pair's process group, kept over the passes, and its timed iterations per size.

    Each visit runs in a thread that is abandoned as soon as the partner is lost (gloo may wait
    on a hung peer in native code); the group has a store connection of its own, so an
    abandoned visit cannot hold the main one. That connection goes to the store the pair's
    first rank hosts (`host_pair_store`), not to rank 0's: rank 0 would otherwise hold a socket
    per pair session (N a round) and serve every pair's rendezvous.
    """

    def __init__(self, i: int, j: int, position: int, members: list[int], hosts: dict, rail: int):
        self.rail = rail
        self.rank_in_pair = 0 if position == i else 1
        self.partner = members[j if position == i else i]
        self.store_host = members[i]
        self.partner_host = hosts[str(self.partner)]
        self.peers = (hosts[str(members[i])], hosts[str(members[j])])
        self.store = None
        self.group = None
        self.error: str | None = None
        self.times: dict[int, list[float]] = {}

    def visit(self, test: _Test, prefix: str) -> None:
        if self.error is not None:
            return
        options, deadline, during = test.options, test.deadline, f"pair {prefix}"

        def measure(store_address: str) -> None:
            first = self.group is None
            if first:
                self.store = self.open_store(store_address, deadline.left(options.op_timeout_s))
                self.group = new_group(self.store, prefix, self.rank_in_pair, 2,
                                       deadline.left(options.op_timeout_s), test.device, options.socket_ifname)
            # later visits warm up once: it lines the two sides up after the round's barrier
            warmup = options.warmup if first else min(options.warmup, 1)
            for size in options.sizes:
                tensor = torch.ones(size // 4, dtype=torch.float32, device=test.device)
                self.times.setdefault(size, []).extend(time_allreduce(self.group, tensor, options.iters, warmup))

        try:
            lost = test.watch.check(self.partner, during)
            if lost:
                raise PeerLost(lost)
            # looked up on the main connection, here: the measuring thread may be abandoned
            store_address = test.pair_store_of(self.store_host)
            _unless_lost(lambda: measure(store_address), lambda: test.watch.check(self.partner, during), deadline)
        except Exception as exc:  # the partner died, hung or never came: a result, not a crash
            self.error = f"with {self.partner_host} (rank {self.partner}): {_one_line(exc)}"

    @staticmethod
    def open_store(address: str, timeout_s: float):
        """A connection of this session's own to the pair's store at "address:port"."""
        host, _, port = address.rpartition(":")
        return dist.TCPStore(host, int(port), None, False, datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=False)

    def measurements(self, sizes: tuple[int, ...]) -> list[Measurement]:
        if self.error is not None:
            return [Measurement(self.peers, size, 2, error=self.error, rail=self.rail) for size in sizes]
        return [_measurement(self.peers, size, 2, self.times[size], self.rail) for size in sizes]


def _unless_lost(work, lost, deadline: Deadline):
    """`work()` in a thread; raise PeerLost as soon as `lost()` names a reason.

    The thread may be stuck in native code (gloo waiting on a hung peer) and cannot be
    interrupted: it is abandoned, and the watchdog bounds the process anyway.
    """
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="fabric-pair")
    thread.start()
    while True:
        thread.join(HEARTBEAT_S)
        if not thread.is_alive():
            if "error" in outcome:
                raise outcome["error"]
            return outcome["value"]
        why = lost()
        if why:
            raise PeerLost(why)
        if deadline.expired():
            raise TimeoutError("the fabric test's deadline passed")


def end_process(code: int) -> None:
    """End this process now that the test's output is written.

    A normal exit runs the process groups' and stores' destructors, which took 4-6 s per rank
    on the busy dev cluster, and wait for any pair thread abandoned inside gloo when its peer
    was lost (up to the op timeout). Nothing is left to clean up: every file is written.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def raise_open_files_limit() -> tuple[int, int]:
    """Rank 0's store holds a socket per connection: each rank keeps three (main, heartbeat,
    peer watch), 3 x N at once (pair sessions connect to their pair's own store). Slurm starts
    tasks with the submitting shell's limits (slurm.conf PropagateResourceLimits, default ALL), often a soft
    limit of 1,024, which 4,096 nodes pass at once; the soft limit may be raised to the hard
    limit without privilege (setrlimit(2)). Returns the (soft, hard) limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a hard limit of "unlimited" above the kernel's nr_open
            return soft, hard
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class _HostedStore:
    """A store server this rank hosts, and the address its partners reach it on."""

    def __init__(self, store, address: str):
        self.store, self.address = store, address


def host_pair_store(identity: Identity, timeout_s: float) -> _HostedStore:
    """A store on this node, on a free port, for the process groups of the pairs this rank is
    the first of. The address is the one this node's route to rank 0 leaves from (a UDP
    `connect` sends nothing; it only picks the route), so it is on the network the ranks share."""
    family, kind, _, _, target = socket.getaddrinfo(identity.master_addr, identity.port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as probe:
        probe.connect(target)
        address = probe.getsockname()[0]
    store = dist.TCPStore(address, 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return _HostedStore(store, f"{address}:{store.port}")


def _close_roster(store, world: int, join_deadline: Deadline) -> dict:
    """Wait for every rank to announce itself, or the join deadline; the roster is who came.

    Ranks announce themselves as lines of one log key, so a poll is one round trip whatever
    the world size."""
    while True:
        hosts = _joined(store)
        if len(hosts) >= world or join_deadline.expired():
            break
        time.sleep(ROSTER_POLL_S)
    joined = [rank for rank in range(world) if rank in hosts]
    return {"joined": joined, "missing": [r for r in range(world) if r not in hosts],
            "hosts": {str(rank): hosts[rank] for rank in joined}}


def _joined(store) -> dict[int, str]:
    """Rank -> host of every rank in the join log (rank 0 wrote its own line first)."""
    hosts = {}
    for line in store.get(JOIN_LOG).decode().splitlines():
        rank, _, host = line.partition("\t")
        hosts[int(rank)] = host
    return hosts


def _wait_finished(store, others: int, deadline: Deadline) -> None:
    """Rank 0 hosts the store: keep it up until every other rank has read what it needs."""
    while store.add("finished", 0) < others and not deadline.expired():
        time.sleep(ROSTER_POLL_S)


def _inter_device(rail: int | None = None) -> torch.device:
    """With rails, rail r's rank runs on GPU r (rail-aligned: GPU r's nearest HCA is rail r's);
    otherwise the task's Slurm local rank picks the GPU."""
    if torch.cuda.is_available():
        local = rail if rail is not None else int(os.environ.get("SLURM_LOCALID", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _start_watchdog(deadline: Deadline) -> None:
    """Native code (a gloo or NCCL call) can ignore Python's timeouts; never outlive the deadline."""
    def expire() -> None:
        os._exit(EXIT_STUCK)
    timer = threading.Timer(max(deadline.end - time.monotonic(), 0) + WATCHDOG_GRACE_S, expire)
    timer.daemon = True
    timer.start()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def identity_from_env(environ=os.environ, master_addr: str | None = None, port: int | None = None) -> Identity:
    """Rank and world from Slurm (or torchrun-style RANK/WORLD_SIZE)."""
    rank = int(environ.get("SLURM_PROCID", environ.get("RANK", "0")))
    world = int(environ.get("SLURM_NTASKS", environ.get("WORLD_SIZE", "1")))
    hosts = step_hosts(environ)
    # rank 0 runs on the step's first node; Slurm's NodeAddr need not resolve through DNS
    addr = master_addr or environ.get("MASTER_ADDR") or (node_address(hosts[0]) if hosts else None)
    if not addr:
        raise UsageError("no master address: pass --master-addr, set MASTER_ADDR, or run under srun")
    chosen_port = port or int(environ.get("TRAINCTL_FABRIC_PORT", "0")) or job_port(environ, offset=1)
    # with one task per node (block distribution), rank i runs on the step's i-th host
    expected = tuple(hosts) if len(hosts) == world else ()
    return Identity(rank, world, this_node_name(environ), addr, chosen_port, expected)
