"""Per-rank binding on one node, computed from its parsed topology (pure).

Local rank i drives GPU i (or the i-th GPU Slurm gave the job). Ranks whose GPUs share a CPU affinity (the GPUs of one NUMA
node) split those CPUs: each contiguous range is cut into equal slices and rank j of k gets
the j-th slice of every range, so on a node whose affinity reads `0-55,112-167` a rank's
physical cores come with their hyperthread siblings. Each rank also gets the NUMA node to
bind memory to and one of its GPU's nearest NICs, spreading ranks over tied NICs.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainctl.health.affinity import GpuAffinity
from trainctl.health.parse.cpulist import parse_cpu_list


@dataclass(frozen=True)
class RankBinding:
    local_rank: int
    gpu: int
    cpus: str               # CPU list notation, for taskset/numactl and sched_setaffinity
    numa_node: int | None
    nic: str | None         # device name, e.g. mlx5_0

    def to_json(self) -> dict:
        return {"local_rank": self.local_rank, "gpu": self.gpu, "cpus": self.cpus,
                "numa_node": self.numa_node, "nic": self.nic}


def rank_bindings(gpus: list[GpuAffinity], ranks: int, allowed_nics: tuple[str, ...] = (),
                  job_gpus: list[int] | None = None) -> list[RankBinding]:
    """Bindings for local ranks 0..ranks-1; `allowed_nics` limits NIC choice.

    Local rank i drives the i-th of `job_gpus` (the physical indices Slurm gave the job, as
    its CUDA_VISIBLE_DEVICES lists them), or GPU i when the job has the whole node.
    """
    by_index = {gpu.index: gpu for gpu in gpus}
    wanted = list(job_gpus if job_gpus is not None else range(ranks))[:ranks]
    used = [by_index[i] for i in wanted if i in by_index]
    if len(used) < ranks:
        raise ValueError(f"{ranks} ranks on GPUs {wanted} but the topology shows GPUs {sorted(by_index)}")
    bindings = []
    for local_rank, gpu in enumerate(used):
        sharers = [g.index for g in used if g.cpu_affinity == gpu.cpu_affinity]
        cpus = cpu_slice(gpu.cpu_affinity or "", sharers.index(gpu.index), len(sharers))
        bindings.append(RankBinding(local_rank, gpu.index, cpus, gpu.numa_node,
                                    _pick_nic(gpu, used, allowed_nics)))
    return bindings


def cpu_slice(cpu_list: str, part: int, parts: int) -> str:
    """The `part`-th of `parts` equal slices of every contiguous range of `cpu_list`."""
    chosen: list[int] = []
    for run in _contiguous_runs(sorted(parse_cpu_list(cpu_list))):
        size, extra = divmod(len(run), parts)
        start = part * size + min(part, extra)
        chosen += run[start:start + size + (1 if part < extra else 0)]
    return format_cpu_list(chosen)


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
    # GPUs with the same nearest NICs take turns, so two GPUs behind one switch use both ports.
    sharing = [g.index for g in used if g.nearest_nics == gpu.nearest_nics]
    return candidates[sharing.index(gpu.index) % len(candidates)]
