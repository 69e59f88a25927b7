"""The fabric test's I/O half: rendezvous, intra-node and pairwise inter-node all_reduce.

One process per node (started by `srun --ntasks-per-node=1`). Rank 0 hosts a c10d TCPStore;
every rank announces itself there, and rank 0 closes the roster at the join deadline, so a
node that never starts is reported instead of waited for. Pairs then measure over process
groups of their own (built directly on a prefix of the store, so no collective needs every
node), in rounds from the pure schedule; results go back through the store and rank 0 judges
them with the pure blame logic. Every blocking call has a deadline derived from one overall
deadline, and a watchdog ends a process that is stuck in native code past it.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import socket
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from queue import Empty

from trainctl.health.fabric.bandwidth import Collective, figures_from_timings
from trainctl.health.fabric.report import build_report, retest_rounds
from trainctl.health.fabric.schedule import pairing_schedule
from trainctl.errors import UsageError
from trainctl.slurm import job_port, node_address, step_hosts

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


@dataclass(frozen=True)
class FabricOptions:
    sizes: tuple[int, ...] = (1 << 20, 64 << 20)
    iters: int = 5
    warmup: int = 2
    timeout_s: float = 120.0        # the whole test, rendezvous to report
    join_timeout_s: float = 30.0    # how long rank 0 waits for every rank to announce itself
    op_timeout_s: float = 30.0      # one pair's process group set-up or one collective
    local_procs: int = 0            # intra-node ranks; 0: one per GPU, or 2 CPU processes without GPUs
    socket_ifname: str | None = None
    intra: bool = True


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


@dataclass
class RankResult:
    rank: int
    host: str
    backend: str
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
        figures = figures_from_timings(Collective.ALL_REDUCE, size, ranks,
                                       time_allreduce(group, tensor, options.iters, options.warmup))
        results.append(Measurement(peers, size, ranks, figures.median_seconds, figures.algbw_gbps,
                                   figures.busbw_gbps))
    return results


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
             floor_gbps: float | None = None) -> dict | None:
    """Run this rank's part of the test; rank 0 returns the report, the others None."""
    deadline = Deadline(options.timeout_s)
    _start_watchdog(deadline)
    started = time.monotonic()
    is_master = identity.rank == 0
    store = dist.TCPStore(identity.master_addr, identity.port, None, is_master,
                          datetime.timedelta(seconds=deadline.left(options.join_timeout_s)),
                          wait_for_workers=False)
    store.set(f"join/{identity.rank}", identity.host)
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
    device = _inter_device()
    result = RankResult(identity.rank, identity.host, "nccl" if device.type == "cuda" else "gloo")
    if options.intra:
        result.intra = intra_node(identity.host, options, deadline)
    hosts = roster["hosts"]
    position = members.index(identity.rank)
    rounds = [list(r) for r in pairing_schedule(len(members))] if len(members) > 1 else []
    _run_rounds(store, "round", rounds, position, members, hosts, device, options, deadline, result)
    store.set(f"result/{identity.rank}", json.dumps(asdict(result)))

    if is_master:
        results = _collect(store, "result", members, deadline)
        positions = {hosts[str(rank)]: i for i, rank in enumerate(members)}
        retests = retest_rounds(results, positions, max(options.sizes), straggler_factor, floor_gbps)
        store.set("retests", json.dumps(retests))
    else:
        store.wait(["retests"], datetime.timedelta(seconds=deadline.left()))
        retests = json.loads(store.get("retests"))
    if retests:
        _run_rounds(store, "retest", retests, position, members, hosts, device, options, deadline, result)
        store.set(f"final/{identity.rank}", json.dumps(asdict(result)))
    if not is_master:
        store.add("finished", 1)  # after this, this rank needs nothing more from the store
        return None
    if retests:
        results.update(_collect(store, "final", [r for r in members if r in results], deadline))
    report = build_report(results=results, roster=roster, world=identity.world, sizes=options.sizes,
                          rounds=len(rounds), retests=retests, straggler_factor=straggler_factor,
                          floor_gbps=floor_gbps, join_timeout_s=options.join_timeout_s,
                          duration_s=time.monotonic() - started)
    _wait_finished(store, len(members) - 1, Deadline(min(FINISH_WAIT_S, deadline.left())))
    return report


def _run_rounds(store, name: str, rounds: list[list[list[int]]], position: int, members: list[int],
                hosts: dict, device: torch.device, options: FabricOptions, deadline: Deadline,
                result: RankResult) -> None:
    for number, pairs in enumerate(rounds):
        _barrier(store, f"{name}{number}", len(members), deadline, options.op_timeout_s)
        for i, j in pairs:
            if position in (i, j):
                result.inter += _pair(store, f"{name}{number}/{i}-{j}", position, i, j, members, hosts,
                                      device, options, deadline)


def _pair(store, prefix: str, position: int, i: int, j: int, members: list[int], hosts: dict,
          device: torch.device, options: FabricOptions, deadline: Deadline) -> list[Measurement]:
    partner = members[j if position == i else i]
    peers = (hosts[str(members[i])], hosts[str(members[j])])
    try:
        group = new_group(store, prefix, 0 if position == i else 1, 2,
                          deadline.left(options.op_timeout_s), device, options.socket_ifname)
        return measure_sizes(group, peers, 2, device, options)
    except Exception as exc:  # the partner died, hung or never came: a result, not a crash
        reason = f"with {hosts[str(partner)]} (rank {partner}): {_one_line(exc)}"
        return [Measurement(peers, size, 2, error=reason) for size in options.sizes]


def _close_roster(store, world: int, join_deadline: Deadline) -> dict:
    """Wait for every rank to announce itself, or the join deadline; the roster is who came."""
    keys = [f"join/{rank}" for rank in range(world)]
    while not join_deadline.expired() and not store.check(keys):
        time.sleep(ROSTER_POLL_S)
    joined = [rank for rank in range(world) if store.check([f"join/{rank}"])]
    hosts = {str(rank): store.get(f"join/{rank}").decode() for rank in joined}
    return {"joined": joined, "missing": [r for r in range(world) if r not in joined], "hosts": hosts}


def _wait_finished(store, others: int, deadline: Deadline) -> None:
    """Rank 0 hosts the store: keep it up until every other rank has read what it needs."""
    while store.add("finished", 0) < others and not deadline.expired():
        time.sleep(ROSTER_POLL_S)


def _barrier(store, name: str, count: int, deadline: Deadline, cap: float) -> bool:
    """Wait until `count` ranks arrive or the step times out; late ranks are judged by results."""
    if store.add(f"barrier/{name}", 1) == count:
        store.set(f"barrier/{name}/open", "1")
    try:
        store.wait([f"barrier/{name}/open"], datetime.timedelta(seconds=deadline.left(cap)))
        return True
    except RuntimeError:
        return False


def _collect(store, prefix: str, members: list[int], deadline: Deadline) -> dict[int, dict]:
    keys = {rank: f"{prefix}/{rank}" for rank in members}
    while not deadline.expired() and not store.check(list(keys.values())):
        time.sleep(ROSTER_POLL_S)
    return {rank: json.loads(store.get(key)) for rank, key in keys.items() if store.check([key])}


def _inter_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("SLURM_LOCALID", "0"))
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
    return Identity(rank, world, socket.gethostname(), addr, chosen_port, expected)
