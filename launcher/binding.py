"""Per-rank binding on one node, computed from its parsed topology (pure).

Local rank i drives GPU i (or the i-th GPU Slurm gave the job). What is per rank: the GPU,
the CPUs, the NUMA node to bind memory to. What is per node: NCCL_IB_HCA, one list for every
rank of the node (see `node_nccl_hcas`).

CPUs: ranks whose GPUs share a CPU affinity (the GPUs of one NUMA node) split it by whole
cores, as the node reports them (sysfs thread_siblings_list or `lscpu -p`), so a rank's
hyperthreads are never another rank's. Where the cores were not measured, those ranks share
the whole affinity instead of a guess.

The nearest NIC of each rank's GPU is kept as information for the job log; NCCL finds it
itself from the PCI topology.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainctl.health.affinity import GpuAffinity
from trainctl.health.parse.cpu_siblings import Cores
from trainctl.health.parse.cpulist import parse_cpu_list
from trainctl.health.parse.fabric import hca_port_key


@dataclass(frozen=True)
class RankBinding:
    local_rank: int
    gpu: int
    cpus: str               # CPU list notation, for taskset/numactl and sched_setaffinity
    numa_node: int | None
    nearest_nic: str | None  # information only, e.g. mlx5_0: NCCL_IB_HCA is the node's list

    def to_json(self) -> dict:
        return {"local_rank": self.local_rank, "gpu": self.gpu, "cpus": self.cpus,
                "numa_node": self.numa_node, "nearest_nic": self.nearest_nic}


def rank_bindings(gpus: list[GpuAffinity], ranks: int, allowed_nics: tuple[str, ...] = (),
                  job_gpus: list[int] | None = None, cores: Cores | None = None) -> list[RankBinding]:
    """Bindings for local ranks 0..ranks-1; `allowed_nics` limits the nearest NIC shown.

    Local rank i drives the i-th of `job_gpus` (the physical indices Slurm gave the job, as
    its CUDA_VISIBLE_DEVICES lists them), or GPU i when the job has the whole node. `cores`
    are the node's measured cores; None: ranks sharing a NUMA affinity share all of it.
    """
    by_index = {gpu.index: gpu for gpu in gpus}
    wanted = list(job_gpus if job_gpus is not None else range(ranks))[:ranks]
    used = [by_index[i] for i in wanted if i in by_index]
    if len(used) < ranks:
        raise ValueError(f"{ranks} ranks on GPUs {wanted} but the topology shows GPUs {sorted(by_index)}")
    bindings = []
    for local_rank, gpu in enumerate(used):
        sharers = [g.index for g in used if g.cpu_affinity == gpu.cpu_affinity]
        cpus = cpu_share(parse_cpu_list(gpu.cpu_affinity or ""), sharers.index(gpu.index), len(sharers), cores)
        bindings.append(RankBinding(local_rank, gpu.index, format_cpu_list(sorted(cpus)), gpu.numa_node,
                                    _pick_nic(gpu, used, allowed_nics)))
    return bindings


def cpu_share(affinity: frozenset[int], part: int, parts: int, cores: Cores | None) -> frozenset[int]:
    """The `part`-th of `parts` shares of `affinity`, in whole cores (all of it without `cores`).

    Cores are taken in order of their lowest CPU and dealt out in contiguous blocks of equal
    size (the first ones one core larger where they do not divide evenly). A CPU no core lists
    counts as a core of its own. With fewer cores than parts, ranks share cores round-robin.
    """
    if parts <= 1 or cores is None:
        return affinity
    inside = [core & affinity for core in cores if core & affinity]
    listed = frozenset().union(*inside) if inside else frozenset()
    units = sorted(inside + [frozenset({cpu}) for cpu in affinity - listed], key=min)
    if not units:
        return affinity
    if len(units) < parts:
        return units[part % len(units)]
    size, extra = divmod(len(units), parts)
    start = part * size + min(part, extra)
    return frozenset().union(*units[start:start + size + (1 if part < extra else 0)])


def node_nccl_hcas(hca_ports: tuple[str, ...], up_ports: frozenset[tuple[str, int]] | None,
                   drop_down: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(this node's NCCL_IB_HCA entries, the site's ports left out of them because they are down).

    Every rank of a node must see the same list (NVIDIA/nccl#1478): it is the site's compute
    ports, or with `drop_down` (site key hca_port_down = "drop-port") those of them that are
    up in `up_ports` (None: not known, so the whole list; NCCL itself skips a port that is not
    Active when it opens its devices).
    """
    if not drop_down or up_ports is None:
        return hca_ports, ()
    kept = tuple(port for port in hca_ports if hca_port_key(port) in up_ports)
    return kept, tuple(port for port in hca_ports if port not in kept)


def format_cpu_list(cpus: list[int]) -> str:
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in _contiguous_runs(sorted(cpus)))


def _contiguous_runs(cpus: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return runs


def _pick_nic(gpu: GpuAffinity, used: list[GpuAffinity], allowed: tuple[str, ...]) -> str | None:
    candidates = [nic for nic in gpu.nearest_nics if not allowed or nic in allowed]
    if not candidates:
        return None
    # GPUs behind one switch with two ports: the log names one port each (information only).
    sharing = [g.index for g in used if g.nearest_nics == gpu.nearest_nics]
    return candidates[sharing.index(gpu.index) % len(candidates)]
