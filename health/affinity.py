"""GPU -> CPU, NUMA and nearest-NIC affinity from the topology matrix: what binding uses.

`trainctl topo --json` prints `{"gpus": [a.to_json() for a in gpu_affinity(topo)]}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainctl.health.parse.topo import PCIE_PATHS, Topology


@dataclass(frozen=True)
class GpuAffinity:
    index: int
    cpu_affinity: str | None        # exactly as `topo -m` prints it
    numa_node: int | None
    nearest_nics: tuple[str, ...]   # device names (mlx5_N), every NIC tied at the closest path
    nic_path: str | None            # that closest path type (PIX ... SYS); None without NICs

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "cpu_affinity": self.cpu_affinity, "numa_node": self.numa_node,
                "nearest_nics": list(self.nearest_nics), "nic_path": self.nic_path}


def gpu_affinity(topo: Topology) -> list[GpuAffinity]:
    result = []
    for gpu in topo.gpus:
        paths = {nic: topo.link(gpu.label, nic) for nic in topo.nics}
        # A GPU-NIC cell is always a PCIe path type (the parser rejects anything else there).
        nearest_path = min(paths.values(), key=PCIE_PATHS.index, default=None)
        nearest = tuple(topo.nic_names[nic] for nic, path in paths.items() if path == nearest_path)
        result.append(GpuAffinity(index=gpu.index, cpu_affinity=gpu.cpu_affinity,
                                  numa_node=gpu.numa_node, nearest_nics=nearest,
                                  nic_path=nearest_path))
    return result
