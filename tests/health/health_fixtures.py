"""The recorded outputs the health tests run on, and which parser reads each one.

`CASES` is the one list: the parser tests read their files from it, the property test
mutates every entry, and the coverage test fails when a file appears in a relevant
fixture folder without being here or in `NOT_PARSED`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainctl.health.parse.ibstat import parse_ibstat
from trainctl.health.parse.ibv_devinfo import parse_ibv_devinfo
from trainctl.health.parse.ip_link import parse_ip_link
from trainctl.health.parse.kernel_log import parse_kernel_log
from trainctl.health.parse.lscpu import parse_lscpu
from trainctl.health.parse.nvlink import parse_nvlink_status
from trainctl.health.parse.smi_query import parse_smi_text, parse_smi_xml
from trainctl.health.parse.sysfs import parse_ib_sysfs, parse_ttar
from trainctl.health.parse.topo import parse_topo

# tests/health/ -> the repository -> ../shared/fixtures beside it (as in CI).
SHARED = Path(__file__).parents[2] / ".." / "shared" / "fixtures"
LOCAL = Path(__file__).parent / "fixtures"
RECORDED = Path(__file__).parents[1] / "fixtures" / "recorded"


def read(relative: str) -> str:
    """A fixture's exact text (CRLF and all): `local/...` names a file of this repository."""
    if relative.startswith("recorded/"):
        path = RECORDED / relative.removeprefix("recorded/")
    elif relative.startswith("local/"):
        path = LOCAL / relative.removeprefix("local/")
    else:
        path = SHARED / relative
    return path.read_bytes().decode("utf-8")


@dataclass(frozen=True)
class Case:
    parse: Callable[[object], object]
    # The recorded file -> what the parser takes (the JSON wrappers gcm stores outputs in).
    extract: Callable[[str], object] = lambda text: text


def _gcm_ip_link(text: str) -> str:
    return json.dumps(json.loads(text)["intf_status"], indent=1)


CASES: dict[str, Case] = {
    **{f"nvidia-smi/topo/{name}": Case(parse_topo) for name in (
        "dgx-a100-8gpu-12nic-nv12.txt", "dgx1-v100-8gpu-4nic-topo-mp-pcie-only.txt",
        "h100-80gb-hbm3-1gpu-vm-ansi-underline.txt", "h100-8gpu-nv18-no-nic-spaces-no-legend.txt",
        "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt", "l40s-1gpu-pcie-ansi-underline.txt")},
    **{f"nvidia-smi/nvlink/{name}": Case(parse_nvlink_status) for name in (
        "azure-a100-sxm4-80gb-1gpu-12links-25GBps-healthy.txt",
        "azure-a100-sxm4-80gb-all-links-inactive.txt",
        "h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt", "h200-1gpu-18links-nvlink-s.txt",
        "h100-mig-mode-nvlink-s-not-supported.txt", "l40s-nvlink-s-no-nvlink.txt")},
    "local/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt": Case(parse_nvlink_status),
    # recorded by trainctl's tests on a real H100 VM (see fixtures/README.md)
    "recorded/h100-vm-2026-11-22-b/nvidia-smi-topo-m.txt": Case(parse_topo),
    "recorded/h100-vm-2026-11-22-b/nvidia-smi-nvlink-s.txt": Case(parse_nvlink_status),
    "recorded/h100-vm-2026-11-22-b/nvidia-smi-q.xml": Case(parse_smi_xml),
    "recorded/h100-vm-2026-11-22-b/nvidia-smi-q.txt": Case(parse_smi_text),
    "recorded/h100-vm-2026-11-22-b/lscpu.txt": Case(parse_lscpu),
    "recorded/h100-vm-2026-11-22/nvidia-smi-topo-m.txt": Case(parse_topo),
    "recorded/h100-vm-2026-11-22/nvidia-smi-nvlink-s.txt": Case(parse_nvlink_status),
    "recorded/h100-vm-2026-11-22/nvidia-smi-q.xml": Case(parse_smi_xml),
    "recorded/h100-vm-2026-11-22/nvidia-smi-q.txt": Case(parse_smi_text),
    "recorded/h100-vm-2026-11-22/lscpu.txt": Case(parse_lscpu),
    **{f"nvidia-smi/query/{name}": Case(parse_smi_xml) for name in (
        "a100-sxm4-80gb-1gpu-q-x-v12.xml", "a10g-1gpu-q-x-v11.xml")},
    **{f"nvidia-smi/query/{name}": Case(parse_smi_text) for name in (
        "a100-sxm4-4gpu-q.txt", "azure-nd96-8gpu-q-d-page-retirement-ecc-bad.txt",
        "azure-nd96-8gpu-q-d-page-retirement-healthy.txt", "h100-80gb-hbm3-q-idle.txt",
        "h100-80gb-hbm3-q-load.txt", "h100-mig-q-idle.txt", "h100-nvl-2gpu-q.txt",
        "h100-sxm5-80gb-8gpu-q.txt", "h800-sxm-q-i0.txt", "l40s-q-idle.txt")},
    **{f"infiniband/ibstat/{name}": Case(parse_ibstat) for name in (
        "edr-connectx4-state-initializing-no-sm.txt", "fdr-mlx4-2hca-4ports-all-active.txt",
        "gpud-a100-9hca-cx6-hdr200-all-active.txt",
        "gpud-azure-a100-hdr200-ibpanic-stat-failed-exit255.txt",
        "gpud-h100-12hca-cx7-ndr400-ib-plus-cx6dx-eth-all-active.txt",
        "gpud-h100-12hca-roce-eth-400-some-down-disabled.txt")},
    **{f"infiniband/ibv_devinfo/{name}": Case(parse_ibv_devinfo) for name in (
        "fdr-mlx4-2hca-port2-down.txt", "fdr-mlx4-v-port2-down.txt")},
    **{f"infiniband/sysfs/{name}": Case(parse_ib_sysfs, json.loads) for name in (
        "gcm-a100-8hca-hdr200-healthy.json", "gcm-a100-8hca-ib4-operstate-down.json",
        "gcm-a100-8hca-rate-edr100-degraded.json")},
    "infiniband/sysfs/procfs-hfi1-mlx4-mlx5-class-infiniband.ttar":
        Case(lambda text: parse_ib_sysfs(parse_ttar(text))),
    **{f"net/{name}": Case(parse_ip_link, _gcm_ip_link) for name in (
        "gcm-ip-j-link-bond-mtu9192-healthy.json", "gcm-ip-j-link-bond-mtu1500-bad.json",
        "gcm-ip-j-link-bond-slave-down.json")},
    **{f"cpu/{name}": Case(parse_lscpu) for name in (
        "utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt",
        "utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt",
        "xeon-e5-2695v4-2socket-lscpu-old-format.txt")},
    **{f"kernel/{name}": Case(parse_kernel_log) for name in (
        "xid/gcm-dmesg-T-xid31-xid48-sm-exception.txt",
        "xid/gpud-dmesg-decode-iso-xid13-xid43-sm-exceptions.log",
        "xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log",
        "xid/imbue-dmesg-nvswitch-sxid12028-nonfatal.txt",
        "xid/imbue-dmesg-xid64-row-remapper-all-rows-remapped.txt",
        "xid/ml-engineering-xid63-row-remapper-a100.txt",
        "syslog/azure-syslog-ib6-lost-gained-carrier-flaps.txt",
        "syslog/imbue-dmesg-mlx5-pcie-link-degraded-x8.txt")},
}

# Files in the folders below that no health parser reads, and why.
NOT_PARSED: dict[str, str] = {
    **{f"nvidia-smi/query/{name}": "nvidia-smi --query-gpu CSV: the snapshot records -q -x instead"
       for name in ("h100-80gb-hbm3-query-gpu-allfields-idle.csv",
                    "h100-80gb-hbm3-query-gpu-allfields-idle.csv.cmd",
                    "h200-query-gpu-allfields-load.csv", "h200-query-gpu-allfields-load.csv.cmd",
                    "l40s-query-gpu-allfields-idle.csv", "l40s-query-gpu-allfields-idle.csv.cmd")},
    "cpu/xeon-e5-2695v4-2socket-numactl-H.txt":
        "numactl -H is not in the snapshot; lscpu gives the NUMA CPU lists",
    "net/ibdev2netdev-mlx4-2ports-up.txt":
        "ibdev2netdev is not in the snapshot; sysfs infiniband/<hca>/device/net/ links port and netdev",
}

# The shared folders whose every file must be in CASES or NOT_PARSED.
RELEVANT_DIRS = ("nvidia-smi/topo", "nvidia-smi/nvlink", "nvidia-smi/query", "infiniband/ibstat",
                 "infiniband/ibv_devinfo", "infiniband/sysfs", "net", "cpu", "kernel/xid",
                 "kernel/syslog")


def parsed(relative: str) -> object:
    """The fixture `relative` through its parser."""
    case = CASES[relative]
    return case.parse(case.extract(read(relative)))
