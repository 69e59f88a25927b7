"""What a site expects of a node. Every default means "no expectation".

With no expectations a check still flags what is wrong on its face (an inactive link,
a Down port, mixed rates, uncorrectable ECC); an expectation adds the comparison
against the site's hardware. The site-config loader fills this in from TOML.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainctl.site import GateConfig, PartitionConfig


@dataclass(frozen=True)
class NodeExpectations:
    # GPUs. gpus=0 says the node has none: GPU and NVLink checks are skipped.
    gpus: int | None = None
    gpu_model: str | None = None            # a substring of the product name: "H100 80GB HBM3"
    persistence_mode: bool | None = None    # True: every GPU must have persistence mode on
    max_retired_pages: int | None = None    # per GPU, single + double bit
    # NVLink. nvlink=False says the GPUs have none (PCIe cards): NVLink checks are skipped.
    nvlink: bool | None = None
    nvlink_type: str | None = None          # every GPU pair in topo -m: "NV18"
    nvlink_links_per_gpu: int | None = None
    nvlink_speed_gbps: float | None = None  # per link, as nvlink -s prints it (GB/s)
    # InfiniBand / RoCE. ib_ports=() says the node has none: fabric port checks are skipped.
    ib_ports: tuple[str, ...] | None = None     # "mlx5_0" (port 1) or "mlx5_0:2"
    # True: the site runs a node with some of ib_ports down, those ports left out of its
    # NCCL_IB_HCA (site key hca_port_down = "drop-port"): a down port warns, none up fails.
    ib_ports_may_drop: bool = False
    ib_rate_gbps: float | None = None
    ib_link_layer: str | None = None        # "InfiniBand" or "Ethernet"
    ib_mtu: int | None = None               # active MTU from ibv_devinfo, bytes: 4096
    # Ethernet / IP interfaces that carry data, and their MTU (9000 for jumbo frames).
    data_interfaces: tuple[str, ...] | None = None
    netdev_mtu: int | None = None
    # Topology: each GPU should have a NIC closer than SYS (a rail-optimised node).
    nic_per_gpu: bool = False
    # Kernel log: count Xid events of the last N hours; None counts everything since boot.
    xid_window_hours: float | None = None
    # Host.
    min_available_memory_gib: float | None = None
    min_shm_gib: float | None = None
    min_free_disk_gib: dict[str, float] = field(default_factory=dict)   # path -> GiB
    max_defunct_processes: int | None = None
    max_load_per_cpu: float | None = None
    numa_nodes: int | None = None
    # PCIe: a GPU or HCA link below its maximum speed or width fails (the site may say warn).
    pcie_below_max_warns: bool = False
    # Processes already holding a GPU: the gate fails the node (its job would share the GPU),
    # sweeps only warn (a node between jobs may still be tearing one down).
    gpu_processes_fail: bool = False
    # `dcgmi diag -r LEVEL` where the site enables it (None: not run).
    dcgm_diag_level: int | None = None
    # Versions the site pins ("driver", "cuda", "vbios", "hca_firmware MT4129", "ofed", "kernel",
    # "torch", "nccl"): a node that differs fails node.versions.
    pinned_versions: dict[str, str] = field(default_factory=dict)

    def lacks(self, hardware: str) -> bool:
        """True where the site says this node has no such hardware, so its checks skip."""
        if hardware == "gpu":
            return self.gpus == 0
        if hardware == "nvlink":
            return self.gpus == 0 or self.nvlink is False
        if hardware == "ib":
            return self.ib_ports == ()
        raise ValueError(f"unknown hardware kind {hardware!r}")


def from_site(part: PartitionConfig | None, gate: GateConfig) -> NodeExpectations:
    """What a site's partition and gate policy expect of one node.

    Without a site there is no partition: nothing of the node's hardware is expected, and the
    gate's limits are the site model's defaults (`GateConfig()`), never typed again here.
    """
    judged = NodeExpectations(
        max_retired_pages=None if gate.max_retired_pages < 0 else gate.max_retired_pages,
        min_free_disk_gib=dict(gate.min_free_disk_gib),
        xid_window_hours=gate.xid_window_hours or None,
        min_available_memory_gib=gate.min_available_memory_gib or None,
        min_shm_gib=gate.min_shm_gib or None,
        max_defunct_processes=None if gate.max_defunct_processes < 0 else gate.max_defunct_processes,
        max_load_per_cpu=gate.max_load_per_cpu or None,
        pcie_below_max_warns=gate.pcie_below_max == "warn",
        dcgm_diag_level=gate.dcgm_diag_level or None,
        pinned_versions=dict(gate.pinned_versions),
    )
    if part is None:
        return judged
    no_fabric = part.link_layer == "none"
    return replace(
        judged,
        gpus=part.gpus_per_node,
        gpu_model=part.gpu_model or None,
        persistence_mode=True if part.gpu_persistence else None,
        nvlink={"auto": None, "required": True, "none": False}[part.nvlink],
        nvlink_type=part.nvlink_type or None,
        nvlink_links_per_gpu=part.nvlink_links_per_gpu or None,
        nvlink_speed_gbps=part.nvlink_speed_gbps or None,
        numa_nodes=part.numa_nodes or None,
        ib_ports_may_drop=part.hca_port_down == "drop-port",
        ib_ports=() if no_fabric else (tuple(part.hca_ports) or None),
        ib_rate_gbps=part.port_rate_gbps or None,
        ib_link_layer=None if no_fabric else part.link_layer,
        ib_mtu=part.ib_mtu or None,
        netdev_mtu=part.netdev_mtu or None,
        data_interfaces=tuple(part.data_interfaces),
        nic_per_gpu=part.nic_per_gpu,
    )
