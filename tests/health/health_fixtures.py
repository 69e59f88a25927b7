"""The recorded outputs the health tests run on, and which parser reads each one.

`CASES` is the one list: the parser tests read their files from it, the property test
mutates every entry, and the coverage test fails when a file appears in a relevant
fixture folder without being here or in `NOT_PARSED`.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainctl.health.parse.cpu_siblings import parse_thread_siblings
from trainctl.health.parse.counters import (parse_dcgm_nvlink_errors, parse_ib_counters, parse_nvlink_errors,
                                            parse_perfquery)
from trainctl.health.parse.dcgm import parse_dcgm_diag
from trainctl.health.parse.gpu_apps import parse_compute_apps
from trainctl.health.parse.ibstat import parse_ibstat
from trainctl.health.parse.ibv_devinfo import parse_ibv_devinfo
from trainctl.health.parse.ip_link import parse_ip_link
from trainctl.health.parse.kernel_log import parse_kernel_log
from trainctl.health.parse.lscpu import parse_lscpu
from trainctl.health.parse.nvlink import parse_nvlink_status
from trainctl.health.parse.pcie import parse_lspci, parse_pci_sysfs
from trainctl.health.parse.smi_query import parse_smi_text, parse_smi_xml
from trainctl.health.parse.sysfs import parse_ib_sysfs, parse_ttar
from trainctl.health.parse.topo import parse_topo

# The recorded outputs copied into the repository, each with its source in SOURCES.md.
SHARED = Path(__file__).parents[2] / "tests" / "fixtures" / "library"
LOCAL = Path(__file__).parent / "fixtures"
RECORDED = Path(__file__).parents[1] / "fixtures" / "recorded"


def read(relative: str) -> str:
    """A fixture's exact text (CRLF and all): `local/...` names a file of this repository.

    A `.tar.gz` sysfs dump reads as JSON {path: contents} of its CPU topology files."""
    if relative.endswith(".tar.gz"):
        return json.dumps(cpu_topology_files(SHARED / relative), indent=1)
    if relative.startswith("recorded/"):
        path = RECORDED / relative.removeprefix("recorded/")
    elif relative.startswith("local/"):
        path = LOCAL / relative.removeprefix("local/")
    else:
        path = SHARED / relative
    return path.read_bytes().decode("utf-8")


def cpu_topology_files(tarball: Path) -> dict[str, str]:
    """The `cpu*/topology/*_list` files of a util-linux /proc+/sys dump, path -> contents."""
    with tarfile.open(tarball) as archive:
        return {member.name: archive.extractfile(member).read().decode() for member in archive.getmembers()
                if member.isfile() and "/topology/" in member.name and member.name.endswith("_list")}


@dataclass(frozen=True)
class Case:
    parse: Callable[[object], object]
    # The recorded file -> what the parser takes (the JSON wrappers gcm stores outputs in).
    extract: Callable[[str], object] = lambda text: text


def _gcm_ip_link(text: str) -> str:
    return json.dumps(json.loads(text)["intf_status"], indent=1)


def _ttar_excerpt(text: str) -> dict[str, str]:
    # node_exporter's sys.ttar cut at a line range: the last record's "Mode: 644" line fell outside it
    return parse_ttar(text if text.rstrip().endswith(("Mode: 644", "Mode: 755")) else text + "Mode: 644\n")


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
        "h100-sxm5-80gb-8gpu-q.txt", "h800-sxm-q-i0.txt", "l40s-q-idle.txt",
        "princeton-della-h100-80gb-hbm3-slurm-1of8-q-560.35.03.txt")},
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
    "infiniband/sysfs/node-exporter-i40iw-no-pma-and-mlx4-class-infiniband.ttar":
        Case(parse_ib_counters, _ttar_excerpt),
    **{f"infiniband/perfquery/{name}": Case(parse_perfquery) for name in (
        "treydock-perfquery-E-rcverr-details.txt", "treydock-perfquery-x-switch-2ports-healthy.txt",
        "treydock-perfquery-x-switch-port-linkdowned1-xmitdiscards20046.txt")},
    **{f"dcgm/{name}": Case(parse_dcgm_nvlink_errors) for name in (
        "gcm-dcgmi-nvlink-e-j-all-zero.json", "gcm-dcgmi-nvlink-e-j-crc-data-error-12.json")},
    **{f"dcgm/{name}": Case(parse_dcgm_diag) for name in (
        "gcm-dcgmi-diag-j-pass.json", "gcm-dcgmi-diag-j-fail-persistence-mode.json")},
    **{f"pcie/{name}": Case(parse_lspci) for name in (
        "gpud-gb200-lspci-plain.txt", "gpud-h100-xe-lspci-vvv-gpu-cx7-cx6dx-switch-gen4-downgraded-excerpt.txt")},
    "pcie/node-exporter-sysfs-nvme-current-8GTs-max-16GTs-aer-counters.ttar": Case(parse_pci_sysfs, parse_ttar),
    "recorded/h100-vm-2026-11-22/nvidia-smi-nvlink-e.txt": Case(parse_nvlink_errors),
    "recorded/h100-vm-2026-11-23-gray/nvidia-smi-q.xml": Case(parse_smi_xml),
    "recorded/h100-vm-2026-11-23-gray/nvidia-smi-compute-apps.csv": Case(parse_compute_apps),
    "recorded/h100-vm-2026-11-23-gray/nvidia-smi-compute-apps-idle.csv": Case(parse_compute_apps),
    **{f"net/{name}": Case(parse_ip_link, _gcm_ip_link) for name in (
        "gcm-ip-j-link-bond-mtu9192-healthy.json", "gcm-ip-j-link-bond-mtu1500-bad.json",
        "gcm-ip-j-link-bond-slave-down.json")},
    **{f"cpu/{name}": Case(parse_lscpu) for name in (
        "utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt",
        "utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt",
        "xeon-e5-2695v4-2socket-lscpu-old-format.txt",
        "utillinux-lscpu-opteron6328-2socket-4numa-smt-adjacent-siblings-with-parsable.txt",
        "princeton-della-h100-node-xeon8468-2socket-nosmt-numa-even-odd-interleaved-lscpu.txt",
        "princeton-tigergpu-p100-node-e5-2680v4-2socket-numa-even-odd-lscpu.txt",
        "princeton-stellar-a100-node-epyc7h12-2socket-nosmt-lscpu.txt")},
    **{f"cpu/sysfs-dumps/{name}": Case(parse_thread_siblings, json.loads) for name in (
        "utillinux-dump-opteron6328-2socket-thread-siblings-adjacent-0-1.tar.gz",
        "utillinux-dump-xeon-x7550-4socket-thread-siblings-split-0-32.tar.gz")},
    **{f"kernel/{name}": Case(parse_kernel_log) for name in (
        "xid/gcm-dmesg-T-xid31-xid48-sm-exception.txt",
        "xid/gpud-dmesg-decode-iso-xid13-xid43-sm-exceptions.log",
        "xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log",
        "xid/imbue-dmesg-nvswitch-sxid12028-nonfatal.txt",
        "xid/imbue-dmesg-xid64-row-remapper-all-rows-remapped.txt",
        "xid/lambda-syslog-a100-xid63-xid64-xid94-contained-sm.txt",
        "xid/ml-engineering-xid63-row-remapper-a100.txt",
        "xid/lambda-syslog-a100-xid63-xid64-xid94-contained-sm.txt",
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
    **{f"nvidia-smi/default/{name}": "the default nvidia-smi table is for people; -q -x is read (the 525 file is "
       "the evidence for the 'ERR!' value in test_one_unexpected_value_is_that_field_not_reported...)"
       for name in ("gpud-525-geforce-fan-err-bang.txt", "gpud-550-h100-8gpu-default-table.txt")},
    "dcgm/gcm-dcgmi-diag-r4-text-all-pass.txt": "trainctl runs dcgmi diag -j; the text table is for people",
    "dcgm/gcm-dcgmi-nvlink-e-g0-text-head9-partial.txt":
        "cut by head -n 9; the JSON form (dcgmi nvlink -e -j) is what trainctl reads",
    "dcgm/gcm-dcgmi-nvlink-s-8gpu-12links-up-no-nvswitch.txt": "nvidia-smi nvlink -s gives the link states",
    "infiniband/ibstatus/gpud-azure-a100-8hca-hdr200-ibstatus-all-active.txt":
        "ibstatus repeats ibstat's port state and rate, which ibstat and sysfs give",
    "infiniband/ibnetdiscover/treydock-ibnetdiscover-p-edr-with-unlinked-and-sdr-ports.txt":
        "fabric-wide discovery from a management host, not a node-local check",
    "infiniband/ibdiagnet/ndr-quantum2-fabric-ibdiagnet2-log-fw-warnings.txt":
        "fabric-wide diagnostics from a management host, not a node-local check",
}

# The shared folders whose every file must be in CASES or NOT_PARSED.
RELEVANT_DIRS = ("nvidia-smi/topo", "nvidia-smi/nvlink", "nvidia-smi/query", "nvidia-smi/default",
                 "infiniband/ibstat", "infiniband/ibv_devinfo", "infiniband/sysfs", "infiniband/perfquery",
                 "infiniband/ibstatus", "infiniband/ibnetdiscover", "infiniband/ibdiagnet", "net", "cpu",
                 "cpu/sysfs-dumps", "kernel/xid", "kernel/syslog", "pcie", "dcgm")


def parsed(relative: str) -> object:
    """The fixture `relative` through its parser."""
    case = CASES[relative]
    return case.parse(case.extract(read(relative)))
