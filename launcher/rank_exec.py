"""`trainctl rank-exec`: one srun task becomes one torch.distributed rank, bound, then exec'd.

Run by the job script as `srun ... trainctl rank-exec --site S --partition P --master-addr A
-- PROGRAM ARGS`. Each task:

1. derives RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK from Slurm's task
   variables and MASTER_PORT from the job id (`trainctl.slurm.job_port`, offset 0);
2. binds local rank i to GPU i (the i-th GPU of Slurm's CUDA_VISIBLE_DEVICES when the job has
   part of a node), to that GPU's CPUs (its NUMA affinity, split in whole cores among the ranks
   that share it) and its memory to that NUMA node (numactl --membind), from the node's
   `nvidia-smi topo -m` and CPU siblings (the gate's snapshot when there is one);
3. sets NCCL_IB_HCA to the node's list of compute ports, the same for every rank of the node
   (NVIDIA/nccl#1478: "You should not set NCCL_IB_HCA differently on each rank"; NCCL picks
   each GPU's nearest port itself from the PCI topology);
4. in a step the supervisor watches (TRAINCTL_WATCH_DIR set), gives the program
   TRAINCTL_PROGRESS_SOCKET, the node agent's socket (`trainctl.progress`), and, unless the site
   (`watch.auto_steps`) or the job (TRAINCTL_AUTO_STEPS=0) turns it off, puts trainctl's
   bootstrap folder first on PYTHONPATH, so that a Python program's optimizer steps count as its
   training steps, and its saves are seen, with no change to it (`trainctl.guest.hook`,
   `trainctl.guest.save_hooks`); neither where the socket's
   directory is not the user's alone (`trainctl.private_dir`): local rank 0 says why;
5. replaces itself with PROGRAM (os.execvpe: no shell, no extra process; `submit` hands it
   the path its pre-submit check resolved, so no PATH search picks another file).

Local rank 0 says once per node what the binding is, or why there is none.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trainctl.guest.bootstrap
from trainctl.agent_socket import progress_environment
from trainctl.errors import ParseError, UsageError
from trainctl.guest.wire import AUTO_STEPS_ENV, SOCKET_ENV
from trainctl.health.parse.cpu_siblings import SIBLINGS_GLOB, Cores
from trainctl.launcher.binding import RankBinding, format_cpu_list, node_nccl_hcas, rank_bindings
from trainctl.launcher.plan import nccl_ib_hca
from trainctl.site import PartitionConfig
from trainctl.slurm import HOSTLIST_MAX_NODES, job_port, this_node_name

if TYPE_CHECKING:
    from trainctl.health.snapshot import SnapshotInputs

TOPO_SNAPSHOT = "nvidia-smi-topo-m.txt"   # the file name `gate node` writes under snapshots/<host>/
NUMA_SYSFS = "/sys/devices/system/node"
CPU_SYSFS_ROOT = "/"                        # live sysfs, where the gate's snapshot has no CPU siblings
_TASKS_PER_NODE_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int


# Slurm keeps task ids and counts in 32-bit fields; no step has more tasks than this.
MAX_TASKS = 2**31 - 1
SHOWN_CHARS = 40    # of a bad variable's value, in the error line


def placement_from_slurm(environ: Mapping[str, str]) -> RankPlacement:
    """Where this task sits in the step, from the variables srun gives each task.

    They are input like any other: a value that is not a number, or one that contradicts the
    others (a rank past the world size, a node past the layout), is a UsageError naming it.
    """
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID") if name not in environ]
    if missing:
        raise UsageError(f"rank-exec runs as an srun task, but {', '.join(missing)} is not set")
    world_name = "SLURM_STEP_NUM_TASKS" if environ.get("SLURM_STEP_NUM_TASKS") else "SLURM_NTASKS"
    layout_name = "SLURM_STEP_TASKS_PER_NODE" if environ.get("SLURM_STEP_TASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    if not environ.get(world_name) or not environ.get(layout_name):
        raise UsageError("rank-exec needs SLURM_NTASKS and SLURM_TASKS_PER_NODE (run it under srun)")
    job_port(environ)   # checks SLURM_JOB_ID with the others, before local rank 0 says anything
    world = slurm_number(environ, world_name, least=1)
    node_rank = slurm_number(environ, "SLURM_NODEID")
    local_world = tasks_on_node(environ[layout_name], node_rank)
    rank = slurm_number(environ, "SLURM_PROCID", below=(world, world_name))
    local_rank = slurm_number(environ, "SLURM_LOCALID", below=(local_world, f"the tasks of node {node_rank} "
                                                                            f"in {layout_name}"))
    return RankPlacement(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                         node_rank=node_rank)


def slurm_number(environ: Mapping[str, str], name: str, *, least: int = 0,
                 below: tuple[int, str] | None = None) -> int:
    """A task id or count from Slurm's environment: decimal digits, at least `least`, at most
    MAX_TASKS, and less than `below` (the count it indexes, and where that came from)."""
    text = environ[name].strip()
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_TASKS)):
        raise UsageError(f"{name}={_shown(environ[name])} is not a task number Slurm sets "
                         f"(decimal, at most {MAX_TASKS})")
    value = int(text)
    if not least <= value <= MAX_TASKS:
        raise UsageError(f"{name}={value} is outside {least}-{MAX_TASKS}")
    if below is not None and value >= below[0]:
        raise UsageError(f"{name}={value} is not below {below[0]}, the number of {below[1]}")
    return value


def tasks_on_node(tasks_per_node: str, node_index: int) -> int:
    """Tasks on the `node_index`-th node from Slurm's compressed layout, e.g. `8(x2),4`.

    Walked without expanding it: `8(x1000000000000)` names more nodes than a hostlist may
    hold (HOSTLIST_MAX_NODES) and is refused, as is a count of tasks no node runs.
    """
    nodes = 0
    found = None
    for item in tasks_per_node.split(","):
        match = _TASKS_PER_NODE_ITEM.fullmatch(item.strip())
        if not match or len(match[1]) > 10 or len(match[2] or "") > 18:
            raise UsageError(f"cannot read the task layout {_shown(tasks_per_node)}")
        count, repeat = int(match[1]), int(match[2] or 1)
        if not 1 <= count <= MAX_TASKS or repeat < 1:
            raise UsageError(f"the task layout {_shown(tasks_per_node)} has {count} tasks x {repeat} nodes")
        if found is None and node_index < nodes + repeat:
            found = count
        nodes += repeat
        if nodes > HOSTLIST_MAX_NODES:
            raise UsageError(f"the task layout {_shown(tasks_per_node)} names more than "
                             f"{HOSTLIST_MAX_NODES} nodes (Slurm's host range limit)")
    if found is None:
        raise UsageError(f"node index {node_index} is outside the task layout {_shown(tasks_per_node)}")
    return found


def _shown(value: str) -> str:
    return repr(value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "...")


def distributed_environment(placement: RankPlacement, master_addr: str, master_port: int) -> dict[str, str]:
    """The torch.distributed `env://` variables (as torchrun sets them)."""
    return {"RANK": str(placement.rank), "LOCAL_RANK": str(placement.local_rank),
            "WORLD_SIZE": str(placement.world_size), "LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "NODE_RANK": str(placement.node_rank), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port)}


def program_argv(program: tuple[str, ...], numa_node: int | None, numactl: str | None) -> list[str]:
    """PROGRAM, under `numactl --membind` when there is a NUMA node and numactl to bind to it."""
    if numa_node is None or numactl is None:
        return list(program)
    return [numactl, f"--membind={numa_node}", "--", *program]


@dataclass(frozen=True)
class NodeSetup:
    """What every rank of one node is given: its own binding, and the node's NCCL_IB_HCA."""
    bindings: list[RankBinding]     # one per local rank; [] when the ranks run unbound
    why_unbound: str | None
    topology_source: str
    cores_source: str               # where the CPU siblings came from, or why there are none
    nccl_ib_hca: str | None         # None: the partition has no HCA ports (NCCL_IB_DISABLE=1)
    dropped_ports: tuple[str, ...]  # compute ports left out because they are down (drop-port)


def plan_node(topo_text: str | None, topology_source: str, ranks: int, part: PartitionConfig,
              gpus_of_job: list[int] | None, cores: Cores | None, cores_source: str,
              up_ports: frozenset[tuple[str, int]] | None) -> NodeSetup:
    """The node's setup from what was read on it (pure: every rank computes the same one)."""
    entries, dropped = node_nccl_hcas(part.hca_ports, up_ports, part.hca_port_down == "drop-port")
    hca = nccl_ib_hca(entries) if part.hca_ports and part.link_layer != "none" else None
    bindings, why_not = (plan_bindings(topo_text, topology_source, ranks, part.hca_ports, gpus_of_job, cores)
                         if topo_text is not None else ([], topology_source))
    return NodeSetup(bindings, why_not, topology_source, cores_source, hca, dropped)


def rank_environment(environ: Mapping[str, str], placement: RankPlacement, master_addr: str,
                     setup: NodeSetup) -> dict[str, str]:
    """This rank's environment: torch.distributed's variables and the node's NCCL_IB_HCA."""
    env = dict(environ)
    env.update(distributed_environment(placement, master_addr, job_port(environ, offset=0)))
    if setup.nccl_ib_hca is not None:
        env["NCCL_IB_HCA"] = setup.nccl_ib_hca
    return env


BOOTSTRAP_DIR = os.path.dirname(os.path.abspath(trainctl.guest.bootstrap.__file__))
OFF_WORDS = ("0", "false", "no", "off")


def auto_steps_environment(environ: Mapping[str, str], progress_env: Mapping[str, str],
                           site_default: bool) -> dict[str, str]:
    """PYTHONPATH with the bootstrap folder first, in a watched step (the progress socket set)
    where neither the job (TRAINCTL_AUTO_STEPS=0|false|no|off) nor the site turns it off."""
    if SOCKET_ENV not in progress_env:
        return {}
    choice = environ.get(AUTO_STEPS_ENV, "").strip().lower()
    if (choice in OFF_WORDS) if choice else not site_default:
        return {}
    existing = environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": BOOTSTRAP_DIR + (os.pathsep + existing if existing else "")}


def describe_node(host: str, setup: NodeSetup) -> str:
    """One line for the job log: every local rank's GPU, CPUs, NUMA node and nearest NIC, and
    the one NCCL_IB_HCA they all use."""
    ranks = "; ".join(f"{b.local_rank}: GPU {b.gpu} CPUs {b.cpus or '-'} NUMA {_or_dash(b.numa_node)} "
                      f"nearest NIC {b.nearest_nic or '-'}" for b in setup.bindings)
    line = f"{host}: local ranks {ranks}"
    if setup.nccl_ib_hca is not None:
        line += f"; every rank NCCL_IB_HCA={setup.nccl_ib_hca}"
    if setup.dropped_ports:
        line += f" ({', '.join(setup.dropped_ports)} down, left out: hca_port_down = drop-port)"
    return line + f" (topology from {setup.topology_source}; CPU cores from {setup.cores_source})"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------- I/O


def gate_snapshot(gate_dir: str | None, names: list[str]) -> tuple[SnapshotInputs | None, str]:
    """(the gate's snapshot of this node, loaded once by the snapshot loader, or None; why there
    is none). A snapshot that cannot be read is no snapshot: this node is asked live instead."""
    from trainctl.health.snapshot import SnapshotInputs, load_snapshot

    for name in names if gate_dir else ():
        directory = Path(gate_dir) / "snapshots" / name
        if directory.is_dir():
            try:
                return SnapshotInputs(load_snapshot(directory)), ""
            except UsageError as exc:
                return None, f"the gate's snapshot is unreadable ({exc})"
    return None, "no gate snapshot of this node"


def read_topology(snapshot: SnapshotInputs | None, nvidia_smi: str, timeout_s: float,
                  no_snapshot: str = "no gate snapshot of this node") -> tuple[str | None, str]:
    """(`topo -m` text or None, where it came from or why there is none)."""
    if snapshot is not None and TOPO_SNAPSHOT in snapshot.snapshot.files:
        failure = _gate_probe_failure(snapshot)
        if failure:
            return None, f"`nvidia-smi topo -m` failed when the gate ran it: {failure}"
        return (snapshot.snapshot.files[TOPO_SNAPSHOT],
                f"the gate's snapshot {Path(snapshot.snapshot.path) / TOPO_SNAPSHOT}")
    from trainctl.proc import run

    result = run([nvidia_smi, "topo", "-m"], timeout=timeout_s)
    if result.missing:
        return None, f"no {nvidia_smi} on PATH and {no_snapshot}"
    if not result.ok:
        return None, result.describe_failure()
    return result.stdout, f"`{nvidia_smi} topo -m`"


def _gate_probe_failure(snapshot: SnapshotInputs) -> str | None:
    """The error meta.json recorded for the topology probe (its file is kept whatever the exit)."""
    from trainctl.health.snapshot import Unavailable

    meta = snapshot.get("meta")
    probe = None if isinstance(meta, Unavailable) else meta.probes.get(TOPO_SNAPSHOT)
    return probe.error if probe is not None else None


def job_gpus(environ: Mapping[str, str]) -> list[int] | None:
    """Physical GPU indices Slurm gave this job (CUDA_VISIBLE_DEVICES), None when not a plain list."""
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    entries = [entry.strip() for entry in visible.split(",")] if visible else []
    return [int(entry) for entry in entries] if entries and all(e.isdigit() for e in entries) else None


def plan_bindings(topo_text: str, source: str, ranks: int, hca_ports: tuple[str, ...],
                  gpus_of_job: list[int] | None = None, cores: Cores | None = None
                  ) -> tuple[list[RankBinding], str | None]:
    """(bindings for local ranks 0..ranks-1, or [] and the reason there are none)."""
    from trainctl.health.affinity import gpu_affinity
    from trainctl.health.parse.topo import parse_topo

    try:
        gpus = gpu_affinity(parse_topo(topo_text, source=source))
    except ParseError as exc:
        return [], f"unreadable topology: {exc}"
    if not gpus:
        return [], f"no GPUs in {source}"
    try:
        return rank_bindings(gpus, ranks, tuple(port.split(":")[0] for port in hca_ports), gpus_of_job,
                             cores), None
    except ValueError as exc:
        return [], str(exc)


def read_cores(snapshot: SnapshotInputs | None, sysfs_root: str = CPU_SYSFS_ROOT) -> tuple[Cores | None, str]:
    """(the node's cores, where they came from), or (None, why not): the gate's copy of sysfs
    thread_siblings_list, else its lscpu, else this node's live sysfs."""
    from trainctl.health.parse.cpu_siblings import parse_thread_siblings
    from trainctl.health.snapshot import Unavailable

    try:
        if snapshot is not None:
            where = f"the gate's snapshot {snapshot.snapshot.path}"
            siblings = {name: text for name, text in snapshot.snapshot.files.items()
                        if fnmatch.fnmatchcase(name, f"{SIBLINGS_GLOB}/thread_siblings_list")}
            cores = parse_thread_siblings(siblings) or None
            if cores:
                return cores, where
            lscpu = snapshot.get("lscpu")
            if isinstance(lscpu, Unavailable) and lscpu.unreadable:
                return None, f"not measured ({lscpu.reason})"
            cores = None if isinstance(lscpu, Unavailable) else lscpu.measured_cores()
            if cores:
                return cores, f"lscpu in {where}"
        live = Path(sysfs_root)
        cores = parse_thread_siblings(_siblings_files(live)) or None
    except (ParseError, OSError) as exc:
        return None, f"not measured ({exc})"
    if cores:
        return cores, str(live / "sys/devices/system/cpu")
    return None, "not measured (no thread_siblings_list): ranks sharing a NUMA node share its CPUs"


def _siblings_files(root: Path) -> dict[str, str]:
    """This node's live thread_siblings_list files, named as a snapshot names them."""
    return {f"{topology.relative_to(root)}/thread_siblings_list": (topology / "thread_siblings_list").read_text()
            for topology in sorted(root.glob(SIBLINGS_GLOB)) if (topology / "thread_siblings_list").is_file()}


def read_up_ports(snapshot: SnapshotInputs | None) -> frozenset[tuple[str, int]] | None:
    """HCA ports Active/LinkUp in the gate's snapshot of this node (ibstat or sysfs); None: not known."""
    from trainctl.health.checks.fabric import port_is_up
    from trainctl.health.snapshot import Unavailable

    inventory = snapshot.get("ib") if snapshot is not None else None
    if inventory is None or isinstance(inventory, Unavailable):
        return None
    return frozenset((port.device, port.port) for port in inventory.ports if port_is_up(port))


def rank_exec(*, site_ref: str, partition_name: str | None, master_addr: str, gate_dir: str | None,
              bind: bool, program: tuple[str, ...], environ: Mapping[str, str] = os.environ) -> None:
    """Set up this rank and exec PROGRAM; returns only by raising."""
    from trainctl.health.parse.cpulist import parse_cpu_list
    from trainctl.site import load_site, partition

    if not program:
        raise UsageError("no PROGRAM given: put it after `--`")
    site = load_site(site_ref).config
    _, part = partition(site, partition_name)
    placement = placement_from_slurm(environ)
    host = this_node_name(environ)  # the name the gate filed its snapshot under
    names = [host]
    speaks = placement.local_rank == 0   # one voice per node in the job log

    snapshot, no_snapshot = gate_snapshot(gate_dir, names)
    up_ports = read_up_ports(snapshot) if part.hca_port_down == "drop-port" else None
    if not bind:
        setup = plan_node(None, "--no-bind: a job without GPUs", placement.local_world_size, part, None,
                          None, "-", up_ports)
        _say(speaks, f"{host}: no binding (--no-bind: a job without GPUs)")
    else:
        nvidia_smi = site.probes.get("nvidia-smi", "nvidia-smi")
        topo, source = read_topology(snapshot, nvidia_smi, site.gate.probe_timeout_s, no_snapshot)
        cores, cores_source = read_cores(snapshot)
        setup = plan_node(topo, source, placement.local_world_size, part, job_gpus(environ), cores,
                          cores_source, up_ports)
        _say(speaks, f"{host}: ranks run unbound: {setup.why_unbound}" if setup.why_unbound
             else describe_node(host, setup))
    env = rank_environment(environ, placement, master_addr, setup)
    progress_env, refused = progress_environment(environ, host)   # the node agent's socket, in a watched step
    if refused:
        _say(speaks, f"{host}: the ranks report no progress (no TRAINCTL_PROGRESS_SOCKET, no automatic step "
                     f"counting): {refused}")
    env.update(progress_env)
    env.update(auto_steps_environment(environ, progress_env, site.watch.auto_steps))

    argv = list(program)
    if setup.bindings:
        binding = setup.bindings[placement.local_rank]
        # Pinned before the exec, so the program and every thread it starts inherit it.
        allowed = frozenset(os.sched_getaffinity(0))
        usable = parse_cpu_list(binding.cpus) & allowed
        if usable:
            os.sched_setaffinity(0, usable)
        if usable != parse_cpu_list(binding.cpus):
            _say(speaks, f"{host}: Slurm gives this task CPUs {format_cpu_list(sorted(allowed))}, not all of "
                         f"{binding.cpus}: " + (f"bound to {format_cpu_list(sorted(usable))}" if usable
                                                 else "CPU affinity left as Slurm set it"))
        numa_node = binding.numa_node
        if numa_node is not None and not os.path.isdir(f"{NUMA_SYSFS}/node{numa_node}"):
            _say(speaks, f"{host}: NUMA node {numa_node} is not in {NUMA_SYSFS}: memory not bound")
            numa_node = None
        numactl = shutil.which("numactl", path=env.get("PATH"))
        if numa_node is not None and numactl is None:
            _say(speaks, f"{host}: numactl not found on PATH: memory not bound to the GPUs' NUMA nodes")
        argv = program_argv(program, numa_node, numactl)

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise UsageError(f"cannot run {argv[0]!r}: {exc.strerror}") from exc


def _say(speaks: bool, message: str) -> None:
    if speaks:
        print(f"trainctl rank-exec: {message}", file=sys.stderr, flush=True)
