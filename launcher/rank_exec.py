"""`trainctl rank-exec`: one srun task becomes one torch.distributed rank, bound, then exec'd.

Run by the job script as `srun ... trainctl rank-exec --site S --partition P --master-addr A
-- PROGRAM ARGS`. Each task:

1. derives RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK from Slurm's task
   variables and MASTER_PORT from the job id (`trainctl.slurm.job_port`, offset 0);
2. binds local rank i to GPU i's CPUs (the i-th GPU of Slurm's CUDA_VISIBLE_DEVICES when the
   job has part of a node; its NUMA affinity, split among the ranks that share it), memory to that NUMA node (numactl --membind) and NCCL to its nearest HCA port, from
   the node's `nvidia-smi topo -m` (the gate's snapshot when there is one);
3. replaces itself with PROGRAM (os.execvp: no shell, no extra process).

Local rank 0 says once per node what the binding is, or why there is none.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainctl.errors import ParseError, UsageError
from trainctl.launcher.binding import RankBinding, format_cpu_list, rank_bindings
from trainctl.slurm import job_port

TOPO_SNAPSHOT = "nvidia-smi-topo-m.txt"   # the file name `gate node` writes under snapshots/<host>/
NUMA_SYSFS = "/sys/devices/system/node"
_TASKS_PER_NODE_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int


def placement_from_slurm(environ: Mapping[str, str]) -> RankPlacement:
    """Where this task sits in the step, from the variables srun gives each task."""
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID") if name not in environ]
    if missing:
        raise UsageError(f"rank-exec runs as an srun task, but {', '.join(missing)} is not set")
    world = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
    layout = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if not world or not layout:
        raise UsageError("rank-exec needs SLURM_NTASKS and SLURM_TASKS_PER_NODE (run it under srun)")
    node_rank = int(environ["SLURM_NODEID"])
    return RankPlacement(rank=int(environ["SLURM_PROCID"]), local_rank=int(environ["SLURM_LOCALID"]),
                         world_size=int(world), local_world_size=tasks_on_node(layout, node_rank),
                         node_rank=node_rank)


def tasks_on_node(tasks_per_node: str, node_index: int) -> int:
    """Tasks on the `node_index`-th node from Slurm's compressed layout, e.g. `8(x2),4`."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        match = _TASKS_PER_NODE_ITEM.fullmatch(item.strip())
        if not match:
            raise UsageError(f"cannot read the task layout {tasks_per_node!r}")
        counts += [int(match[1])] * int(match[2] or 1)
    if not 0 <= node_index < len(counts):
        raise UsageError(f"node index {node_index} is outside the task layout {tasks_per_node!r}")
    return counts[node_index]


def distributed_environment(placement: RankPlacement, master_addr: str, master_port: int) -> dict[str, str]:
    """The torch.distributed `env://` variables (as torchrun sets them)."""
    return {"RANK": str(placement.rank), "LOCAL_RANK": str(placement.local_rank),
            "WORLD_SIZE": str(placement.world_size), "LOCAL_WORLD_SIZE": str(placement.local_world_size),
            "NODE_RANK": str(placement.node_rank), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port)}


def hca_port_for(nic: str, hca_ports: tuple[str, ...]) -> str:
    """NCCL_IB_HCA for one rank: the site's `dev:port` entry for `nic`, exact-match ('=')."""
    port = next((entry for entry in hca_ports if entry.split(":")[0] == nic), nic)
    return "=" + port


def program_argv(program: tuple[str, ...], numa_node: int | None, numactl: str | None) -> list[str]:
    """PROGRAM, under `numactl --membind` when there is a NUMA node and numactl to bind to it."""
    if numa_node is None or numactl is None:
        return list(program)
    return [numactl, f"--membind={numa_node}", "--", *program]


def describe_bindings(host: str, bindings: list[RankBinding], source: str) -> str:
    """One line for the job log: every local rank's GPU, CPUs, NUMA node and NIC."""
    ranks = "; ".join(f"{b.local_rank}: GPU {b.gpu} CPUs {b.cpus or '-'} NUMA {_or_dash(b.numa_node)} "
                      f"NIC {b.nic or '-'}" for b in bindings)
    return f"{host}: local ranks {ranks} (topology from {source})"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


# ---------------------------------------------------------------- I/O


def node_names(environ: Mapping[str, str]) -> list[str]:
    """Names this node may be filed under in the gate's snapshots: Slurm's, then the host's."""
    hostname = socket.gethostname()
    names = [environ.get("SLURMD_NODENAME", ""), hostname, hostname.split(".")[0]]
    return list(dict.fromkeys(name for name in names if name))


def read_topology(gate_dir: str | None, names: list[str], nvidia_smi: str, timeout_s: float
                  ) -> tuple[str | None, str]:
    """(`topo -m` text or None, where it came from or why there is none)."""
    if gate_dir:
        for name in names:
            snapshot = Path(gate_dir) / "snapshots" / name / TOPO_SNAPSHOT
            if snapshot.is_file():
                failure = _gate_probe_failure(snapshot)
                if failure:
                    return None, f"`nvidia-smi topo -m` failed when the gate ran it: {failure}"
                return snapshot.read_text(errors="replace"), f"the gate's snapshot {snapshot}"
    from trainctl.proc import run

    result = run([nvidia_smi, "topo", "-m"], timeout=timeout_s)
    if result.missing:
        return None, f"no {nvidia_smi} on PATH and no gate snapshot of this node"
    if not result.ok:
        return None, result.describe_failure()
    return result.stdout, f"`{nvidia_smi} topo -m`"


def _gate_probe_failure(snapshot: Path) -> str | None:
    """The error meta.json recorded for the topology probe (its file is kept whatever the exit)."""
    import json

    try:
        record = json.loads((snapshot.parent / "meta.json").read_text())["probes"][TOPO_SNAPSHOT]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record.get("error")


def job_gpus(environ: Mapping[str, str]) -> list[int] | None:
    """Physical GPU indices Slurm gave this job (CUDA_VISIBLE_DEVICES), None when not a plain list."""
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    entries = [entry.strip() for entry in visible.split(",")] if visible else []
    return [int(entry) for entry in entries] if entries and all(e.isdigit() for e in entries) else None


def plan_bindings(topo_text: str, source: str, ranks: int, hca_ports: tuple[str, ...],
                  gpus_of_job: list[int] | None = None) -> tuple[list[RankBinding], str | None]:
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
        return rank_bindings(gpus, ranks, tuple(port.split(":")[0] for port in hca_ports), gpus_of_job), None
    except ValueError as exc:
        return [], str(exc)


def rank_exec(*, site_ref: str, partition_name: str | None, master_addr: str, gate_dir: str | None,
              bind: bool, program: tuple[str, ...], environ: Mapping[str, str] = os.environ) -> None:
    """Set up this rank and exec PROGRAM; returns only by raising."""
    from trainctl.health.parse.cpulist import parse_cpu_list
    from trainctl.launcher.site import load_site, partition

    if not program:
        raise UsageError("no PROGRAM given: put it after `--`")
    site = load_site(site_ref).config
    _, part = partition(site, partition_name)
    placement = placement_from_slurm(environ)
    env = dict(environ)
    env.update(distributed_environment(placement, master_addr, job_port(environ, offset=0)))
    host = node_names(environ)[0]
    speaks = placement.local_rank == 0   # one voice per node in the job log

    binding = None
    if not bind:
        _say(speaks, f"{host}: no binding (--no-bind: a job without GPUs)")
    else:
        nvidia_smi = site.probes.get("nvidia-smi", "nvidia-smi")
        topo, source = read_topology(gate_dir, node_names(environ), nvidia_smi, site.gate.probe_timeout_s)
        bindings, why_not = plan_bindings(topo, source, placement.local_world_size, part.hca_ports,
                                          job_gpus(environ)) if topo is not None else ([], source)
        if why_not:
            _say(speaks, f"{host}: ranks run unbound: {why_not}")
        else:
            binding = bindings[placement.local_rank]
            _say(speaks, describe_bindings(host, bindings, source))

    argv = list(program)
    if binding is not None:
        # Pinned before the exec, so the program and every thread it starts inherit it.
        allowed = frozenset(os.sched_getaffinity(0))
        usable = parse_cpu_list(binding.cpus) & allowed
        if usable:
            os.sched_setaffinity(0, usable)
        if usable != parse_cpu_list(binding.cpus):
            _say(speaks, f"{host}: Slurm gives this task CPUs {format_cpu_list(sorted(allowed))}, not all of "
                         f"{binding.cpus}: " + (f"bound to {format_cpu_list(sorted(usable))}" if usable
                                                 else "CPU affinity left as Slurm set it"))
        if binding.nic and part.hca_ports:
            env["NCCL_IB_HCA"] = hca_port_for(binding.nic, part.hca_ports)
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
