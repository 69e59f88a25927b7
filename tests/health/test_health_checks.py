"""Check verdicts on the recorded outputs: healthy files pass, faulty files fail naming the fault."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from health_fixtures import parsed, read

from trainctl.health.checks.fabric import ib_mtu, ib_netdev, ib_ports, net_links, net_mtu
from trainctl.health.checks.gpu import (gpu_clock_events, gpu_count, gpu_ecc, gpu_fabric, gpu_model,
                                        gpu_persistence, gpu_reset, gpu_row_remap)
from trainctl.health.checks.host import host_cpus, host_defunct, host_disk, host_load, host_memory, host_shm
from trainctl.health.checks.kernel import gpu_xid, nvswitch_sxid
from trainctl.health.xid_catalog import xids_named
from trainctl.health.checks.nvlink import nvlink_links, nvlink_topology
from trainctl.health.checks.topo import topo_affinity
from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.kernel_log import parse_kernel_log
from trainctl.health.parse.smi_query import GpuQuery, SmiQuery
from trainctl.health.parse.snapshot_files import DefunctProcess, Filesystem, HostInfo, SnapshotMeta
from trainctl.health.status import Status

NONE = NodeExpectations()
GIB = 1 << 30


def _replace_gpu(smi: SmiQuery, index: int, **changes) -> SmiQuery:
    gpus = tuple(dataclasses.replace(g, **changes) if g.index == index else g for g in smi.gpus)
    return dataclasses.replace(smi, gpus=gpus)


# --- NVLink --------------------------------------------------------------------------------

def test_nvlink_all_links_inactive_fails_naming_the_gpu():
    result = nvlink_links(parsed("nvidia-smi/nvlink/azure-a100-sxm4-80gb-all-links-inactive.txt"), NONE)
    assert result.status == Status.FAIL
    assert result.reason == "GPU 6 (NVIDIA A100-SXM4-80GB): all NVLinks inactive"


def test_nvlink_inactive_links_fail_naming_gpu_and_links():
    gpus = parsed("local/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt")
    result = nvlink_links(gpus, NONE)
    assert result.status == Status.FAIL
    assert result.reason == "GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive"


@pytest.mark.parametrize("name, speed", [
    ("azure-a100-sxm4-80gb-1gpu-12links-25GBps-healthy.txt", "25"),
    ("h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt", "26.562"),
    ("h200-1gpu-18links-nvlink-s.txt", "26.562"),
])
def test_nvlink_healthy_links_pass(name, speed):
    result = nvlink_links(parsed("nvidia-smi/nvlink/" + name), NONE)
    assert (result.status, result.reason) == (Status.OK, f"all NVLinks up at {speed} GB/s")


def test_nvlink_below_expected_speed_or_count_fails():
    gpus = parsed("nvidia-smi/nvlink/azure-a100-sxm4-80gb-1gpu-12links-25GBps-healthy.txt")
    result = nvlink_links(gpus, NodeExpectations(nvlink_speed_gbps=26.562, nvlink_links_per_gpu=18))
    assert result.status == Status.FAIL
    assert "NVLink 0 (25 GB/s), 1 (25 GB/s)" in result.reason and "below 26.562 GB/s" in result.reason
    assert "12 NVLinks, the site expects 18" in result.reason


def test_nvlink_link_slower_than_its_peers_fails():
    (gpu,) = parsed("nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt")
    links = list(gpu.links)
    links[7] = dataclasses.replace(links[7], speed_gbps=13.281)
    result = nvlink_links((dataclasses.replace(gpu, links=tuple(links)),), NONE)
    assert (result.status, result.reason) == (
        Status.FAIL, "GPU 0 (NVIDIA H100 80GB HBM3): NVLink 7 (13.281 GB/s) below 26.562 GB/s")


def test_empty_nvlink_status_passes_unless_the_site_expects_nvlink():
    empty = parsed("recorded/h100-vm-2026-11-22-b/nvidia-smi-nvlink-s.txt")
    assert nvlink_links(empty, NONE).reason == "no NVLink on these GPUs"
    expected = nvlink_links(empty, NodeExpectations(nvlink_type="NV18"))
    assert (expected.status, expected.reason) == (
        Status.FAIL, "nvidia-smi nvlink -s lists no GPU; the site expects NVLink")


def test_nvlink_mig_is_unknown_and_no_nvlink_depends_on_the_site():
    mig = nvlink_links(parsed("nvidia-smi/nvlink/h100-mig-mode-nvlink-s-not-supported.txt"), NONE)
    assert (mig.status, mig.reason) == (
        Status.UNKNOWN, "GPU 0 (NVIDIA H100 80GB HBM3): NVLink state cannot be read in MIG mode")
    l40s = parsed("nvidia-smi/nvlink/l40s-nvlink-s-no-nvlink.txt")
    assert nvlink_links(l40s, NONE).status == Status.OK
    expected = nvlink_links(l40s, NodeExpectations(nvlink=True))
    assert (expected.status, expected.reason) == (
        Status.FAIL, "GPU 0 (NVIDIA L40S) has no NVLink; the site expects it")


def test_nvlink_topology_expected_type():
    h100 = parsed("nvidia-smi/topo/h100-8gpu-nv18-no-nic-spaces-no-legend.txt")
    assert nvlink_topology(h100, NodeExpectations(nvlink_type="NV18")).reason == "all 28 GPU pairs NV18"
    a100 = nvlink_topology(parsed("nvidia-smi/topo/dgx-a100-8gpu-12nic-nv12.txt"),
                           NodeExpectations(nvlink_type="NV18"))
    assert a100.status == Status.FAIL and a100.reason.startswith("28 GPU pair(s) not NV18: GPU 0-GPU 1: NV12")


def test_nvlink_topology_pcie_fallback_is_named():
    dgx1 = parsed("nvidia-smi/topo/dgx1-v100-8gpu-4nic-topo-mp-pcie-only.txt")
    result = nvlink_topology(dgx1, NodeExpectations(nvlink_type="NV1"))
    assert result.status == Status.FAIL and "GPU 0-GPU 1: PIX" in result.reason
    assert "GPU 3-GPU 4: SYS" in result.reason
    # no expectation: all-PCIe is a design, not a fault on its face
    assert nvlink_topology(dgx1, NONE).status == Status.OK
    # one H100 pair falling back to PCIe while the rest are NV18
    h100 = parsed("nvidia-smi/topo/h100-8gpu-nv18-no-nic-spaces-no-legend.txt")
    links = dict(h100.links) | {("GPU2", "GPU5"): "SYS", ("GPU5", "GPU2"): "SYS"}
    result = nvlink_topology(dataclasses.replace(h100, links=links), NONE)
    assert (result.status, result.reason) == (
        Status.WARN, "1 GPU pair(s) without NVLink while 27 have it: GPU 2-GPU 5: SYS")


def test_nvswitch_fabric_state():
    smi = parsed("nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt")
    assert gpu_fabric(smi, NONE).status == Status.OK
    stuck = gpu_fabric(_replace_gpu(smi, 2, fabric_state="In Progress"), NONE)
    assert (stuck.status, stuck.reason) == (
        Status.FAIL, "GPU 2 (00000000:3A:00.0): fabric state In Progress (fabric manager not ready?)")


# --- GPUs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["recorded/h100-vm-2026-11-22-b/nvidia-smi-q.xml",
                                  "nvidia-smi/query/a100-sxm4-80gb-1gpu-q-x-v12.xml",
                                  "nvidia-smi/query/a10g-1gpu-q-x-v11.xml",
                                  "nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt",
                                  "nvidia-smi/query/h100-80gb-hbm3-q-load.txt",
                                  "nvidia-smi/query/l40s-q-idle.txt"])
def test_healthy_gpus_pass_every_gpu_check(name):
    smi = parsed(name)
    for check in (gpu_count, gpu_model, gpu_ecc, gpu_row_remap, gpu_reset, gpu_fabric,
                  gpu_clock_events, gpu_persistence):
        result = check(smi, NONE)
        assert result.status == Status.OK, (check.__name__, result.reason)


def test_row_remap_pending_fails_naming_the_gpu():
    result = gpu_row_remap(parsed("nvidia-smi/query/a100-sxm4-4gpu-q.txt"), NONE)
    assert (result.status, result.reason) == (
        Status.FAIL, "GPU 1 (00000000:9E:00.0): row remapping pending (reset the GPU to apply it)")


def test_retired_pages_pending_fail():
    bad = parsed("nvidia-smi/query/azure-nd96-8gpu-q-d-page-retirement-ecc-bad.txt")
    result = gpu_row_remap(bad, NONE)
    assert result.status == Status.FAIL
    assert result.reason.split("; ") == [
        f"GPU {i} (0000000{i + 1}:00:00.0): retired pages pending (reset the GPU to retire them)"
        for i in (1, 3, 5, 7)]
    limited = gpu_row_remap(bad, NodeExpectations(max_retired_pages=60))
    assert "GPU 0 (00000001:00:00.0): 65 retired pages, the site allows 60" in limited.reason
    healthy = parsed("nvidia-smi/query/azure-nd96-8gpu-q-d-page-retirement-healthy.txt")
    assert gpu_row_remap(healthy, NodeExpectations(max_retired_pages=0)).status == Status.OK


def test_gpu_count_and_model_against_the_site():
    smi = parsed("nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt")
    assert gpu_count(smi, NodeExpectations(gpus=8)).reason == "8 GPUs, as expected"
    lost = gpu_count(dataclasses.replace(smi, gpus=smi.gpus[:7]), NodeExpectations(gpus=8))
    assert (lost.status, lost.reason) == (
        Status.FAIL, "7 of 8 expected GPUs visible (lost or fallen off the bus?)")
    nvl = gpu_model(parsed("nvidia-smi/query/h100-nvl-2gpu-q.txt"),
                    NodeExpectations(gpu_model="H100 80GB HBM3"))
    assert nvl.status == Status.FAIL
    assert nvl.reason.startswith("GPU 0 (00000000:AD:00.0) is NVIDIA H100 NVL, "
                                 "the site expects H100 80GB HBM3")


def test_uncorrectable_ecc_fails_and_lifetime_errors_warn():
    smi = parsed("nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt")
    volatile = gpu_ecc(_replace_gpu(smi, 3, ecc_uncorrectable_volatile=2), NONE)
    assert (volatile.status, volatile.reason) == (
        Status.FAIL, "GPU 3 (00000000:5D:00.0): 2 uncorrectable ECC errors since the last reset")
    lifetime = gpu_ecc(_replace_gpu(smi, 3, ecc_uncorrectable_aggregate=1), NONE)
    assert lifetime.status == Status.WARN


def test_reset_and_recovery_action_fail():
    smi = parsed("nvidia-smi/query/h100-80gb-hbm3-q-idle.txt")
    assert gpu_reset(smi, NONE).status == Status.OK        # "GPU Recovery Action : None"
    result = gpu_reset(_replace_gpu(smi, 0, recovery_action="GPU Reset", reset_required=True), NONE)
    assert result.status == Status.FAIL
    assert result.reason == ("GPU 0 (00000000:00:09.0) requires a reset; "
                             "GPU 0 (00000000:00:09.0): recovery action GPU Reset")


def test_clock_slowdowns():
    smi = parsed("nvidia-smi/query/h100-80gb-hbm3-q-idle.txt")
    hot = gpu_clock_events(
        _replace_gpu(smi, 0, clock_events_active=("hw_slowdown", "hw_thermal_slowdown")), NONE)
    assert (hot.status, hot.reason) == (Status.FAIL,
                                        "GPU 0 (00000000:00:09.0): hardware slowdown active; "
                                        "GPU 0 (00000000:00:09.0): hardware thermal slowdown active")
    soft = gpu_clock_events(_replace_gpu(smi, 0, clock_events_active=("sw_thermal_slowdown",)), NONE)
    assert soft.status == Status.WARN
    capped = gpu_clock_events(_replace_gpu(smi, 0, clock_events_active=("sw_power_cap", "gpu_idle")), NONE)
    assert capped.status == Status.OK


def test_persistence_mode_where_the_site_wants_it():
    smi = parsed("nvidia-smi/query/a100-sxm4-80gb-1gpu-q-x-v12.xml")
    assert gpu_persistence(smi, NONE).status == Status.OK
    result = gpu_persistence(smi, NodeExpectations(persistence_mode=True))
    assert (result.status, result.reason) == (Status.WARN, "persistence mode off on GPU 0 (00000000:01:00.0)")


# --- kernel log ------------------------------------------------------------------------------

def test_xid_119_fails_naming_xid_gsp_and_gpu():
    log = parsed("kernel/xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log")
    result = gpu_xid(log, None, None, None, NONE)
    assert result.status == Status.FAIL
    assert result.reason.startswith("Xid 119 (GSP RPC timeout (GPU System Processor not responding)) "
                                    "on the GPU at PCI 0000:9b:00: 5 event(s), last: Timeout after 6s")
    assert result.details["events"][0]["count"] == 5


def test_xid_names_the_gpu_index_through_nvidia_smi():
    log = parsed("kernel/xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log")
    smi = SmiQuery(driver_version=None, attached_gpus=8,
                   gpus=tuple(GpuQuery(index=i, pci_bus_id=bus) for i, bus in enumerate(
                       ["00000000:18:00.0", "00000000:9B:00.0"])))
    result = gpu_xid(log, smi, None, None, NONE)
    assert " on GPU 1 (PCI 0000:9b:00): " in result.reason and result.details["events"][0]["gpu"] == 1


def test_application_xids_warn():
    log = parsed("kernel/xid/gpud-dmesg-decode-iso-xid13-xid43-sm-exceptions.log")
    result = gpu_xid(log, None, None, None, NONE)
    assert result.status == Status.WARN
    assert [(e["xid"], e["count"]) for e in result.details["events"]] == [(13, 629), (43, 7)]
    assert result.reason.startswith("Xid 13 (Graphics Engine Exception (usually an application error))")


@pytest.mark.parametrize("name, xids", [
    ("gcm-dmesg-T-xid31-xid48-sm-exception.txt", [31, 48]),
    ("imbue-dmesg-xid64-row-remapper-all-rows-remapped.txt", [64]),
    ("ml-engineering-xid63-row-remapper-a100.txt", [63]),
])
def test_xids_that_need_action_fail(name, xids):
    result = gpu_xid(parsed("kernel/xid/" + name), None, None, None, NONE)
    assert result.status == Status.FAIL
    assert [e["xid"] for e in result.details["events"]] == xids
    # the fleet history files the failure by the Xids its reason names, read by the catalogue's reader
    assert xids_named(result.reason) == set(xids)


def test_no_xid_passes():
    log = parsed("kernel/syslog/imbue-dmesg-mlx5-pcie-link-degraded-x8.txt")
    assert gpu_xid(log, None, None, None, NONE).reason == "no Xid events since boot"


def _meta(at: datetime) -> SnapshotMeta:
    return SnapshotMeta(host="node", collected_at=at, probes={})


def _host(boot: datetime | None = None, **changes) -> HostInfo:
    host = HostInfo(memory_total_bytes=512 * GIB, memory_available_bytes=480 * GIB,
                    disks=(Filesystem("/dev/shm", 256 * GIB, 250 * GIB),
                           Filesystem("/", 100 * GIB, 40 * GIB)),
                    defunct_processes=(), load_average=(3.0, 2.0, 1.0), cpu_count=224, boot_time=boot)
    return dataclasses.replace(host, **changes)


def test_xid_window_in_hours():
    log = parsed("kernel/xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log")
    # dmesg -T prints local time: placed in the snapshot's own offset (UTC here)
    at = datetime(2025, 2, 23, 16, 31, tzinfo=timezone.utc)
    recent = gpu_xid(log, None, _meta(at), None, NodeExpectations(xid_window_hours=0.1))
    (event,) = recent.details["events"]   # 16:27:12 and 16:30:13 are within 6 minutes
    assert (event["count"], event["first_line"], event["last_line"]) == (2, 42, 43)
    later = gpu_xid(log, None, _meta(at + timedelta(hours=2)), None, NodeExpectations(xid_window_hours=1))
    assert (later.status, later.reason) == (
        Status.OK, "no Xid events in the 1 h before 2025-02-23T18:31:00+00:00")


def test_xid_window_seconds_since_boot_and_undated():
    log = parsed("kernel/xid/imbue-dmesg-xid64-row-remapper-all-rows-remapped.txt")
    boot = datetime(2025, 1, 1, tzinfo=timezone.utc)
    event_at = boot + timedelta(seconds=2397166.923949)
    window = NodeExpectations(xid_window_hours=24)
    assert gpu_xid(log, None, _meta(event_at + timedelta(hours=1)), _host(boot), window).status == Status.FAIL
    assert gpu_xid(log, None, _meta(event_at + timedelta(days=2)), _host(boot), window).status == Status.OK
    # without a boot time the event cannot be dated: it is counted, and said to be
    undated = gpu_xid(log, None, _meta(event_at + timedelta(days=2)), None, window)
    assert (undated.status, undated.details["undated_events"]) == (Status.FAIL, 1)


def test_xid_window_places_yearless_syslog_stamps():
    # journalctl -k prints no year: the Azure syslog prefix in front of a real Xid 63 line
    line = read("kernel/syslog/azure-syslog-ib6-lost-gained-carrier-flaps.txt").splitlines()[2]
    prefix = line[:line.index("systemd-networkd")] + "kernel: "
    log = parse_kernel_log(prefix + read("kernel/xid/ml-engineering-xid63-row-remapper-a100.txt"))
    january = _meta(datetime(2026, 1, 10, tzinfo=timezone.utc))      # "Aug 17" was in 2025
    days = NodeExpectations(xid_window_hours=24 * 150)
    assert gpu_xid(log, None, january, None, days).status == Status.FAIL
    days = NodeExpectations(xid_window_hours=24 * 140)
    assert gpu_xid(log, None, january, None, days).status == Status.OK


def test_sxid_nonfatal_warns():
    log = parsed("kernel/xid/imbue-dmesg-nvswitch-sxid12028-nonfatal.txt")
    result = nvswitch_sxid(log, None, None, NONE)
    assert (result.status, result.reason) == (
        Status.WARN, "SXid 12028 on nvidia-nvswitch2 (PCI 0000:85:00.0): Non-fatal, Link 61 egress "
                     "non-posted PRIV error (First)")


# --- InfiniBand / RoCE and interfaces --------------------------------------------------------

def test_down_and_disabled_ports_fail_naming_them():
    inventory = parsed("infiniband/ibstat/gpud-h100-12hca-roce-eth-400-some-down-disabled.txt")
    result = ib_ports(inventory, NONE)
    assert (result.status, result.reason) == (
        Status.FAIL, "mlx5_11 port 1 is Down/Disabled; mlx5_5 port 1 is Down/Disabled")


@pytest.mark.parametrize("name, summary", [
    ("gpud-h100-12hca-cx7-ndr400-ib-plus-cx6dx-eth-all-active.txt",
     "12 port(s) Active/LinkUp: 100 Gb/s Ethernet, 400 Gb/s Ethernet"),
    ("gpud-a100-9hca-cx6-hdr200-all-active.txt",
     "9 port(s) Active/LinkUp: 200 Gb/s Ethernet, 200 Gb/s InfiniBand"),
    ("fdr-mlx4-2hca-4ports-all-active.txt", "4 port(s) Active/LinkUp: 56 Gb/s InfiniBand"),
])
def test_healthy_ports_pass(name, summary):
    result = ib_ports(parsed("infiniband/ibstat/" + name), NONE)
    assert (result.status, result.reason) == (Status.OK, summary)


def test_initializing_port_and_ibpanic_fail():
    init = ib_ports(parsed("infiniband/ibstat/edr-connectx4-state-initializing-no-sm.txt"), NONE)
    assert (init.status, init.reason) == (Status.FAIL, "mlx5_0 port 1 is Initializing/LinkUp")
    panic = ib_ports(parsed("infiniband/ibstat/gpud-azure-a100-hdr200-ibpanic-stat-failed-exit255.txt"), NONE)
    assert panic.status == Status.FAIL
    assert panic.reason == ("ibstat failed: ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: "
                            "No such file or directory")


def test_degraded_rate_fails_against_the_site_rate():
    inventory = parsed("infiniband/sysfs/gcm-a100-8hca-rate-edr100-degraded.json")
    # every port trained down alike: nothing is wrong on its face ...
    assert ib_ports(inventory, NONE).status == Status.OK
    # ... but the site expects HDR
    result = ib_ports(inventory, NodeExpectations(ib_rate_gbps=200))
    assert result.status == Status.FAIL
    assert result.reason.split("; ")[0] == "mlx5_0 port 1 at 100 Gb/s, the site expects 200 Gb/s"
    assert len(result.reason.split("; ")) == 8


def test_a_port_slower_than_its_peers_fails():
    inventory = parsed("infiniband/sysfs/gcm-a100-8hca-hdr200-healthy.json")
    ports = tuple(dataclasses.replace(p, rate_gbps=100.0) if p.device == "mlx5_3" else p
                  for p in inventory.ports)
    result = ib_ports(dataclasses.replace(inventory, ports=ports), NONE)
    assert (result.status, result.reason) == (
        Status.FAIL, "mlx5_3 port 1 at 100 Gb/s while its peers run 200 Gb/s")


def test_expected_ports_and_link_layer():
    inventory = parsed("infiniband/ibstat/gpud-a100-9hca-cx6-hdr200-all-active.txt")
    expected = NodeExpectations(ib_ports=tuple(f"mlx5_{i}" for i in range(1, 10)), ib_link_layer="InfiniBand")
    result = ib_ports(inventory, expected)
    assert (result.status, result.reason) == (Status.FAIL, "mlx5_9 port 1 not found")
    roce = ib_ports(parsed("infiniband/ibstat/gpud-h100-12hca-roce-eth-400-some-down-disabled.txt"),
                    NodeExpectations(ib_ports=("mlx5_0", "mlx5_3:1"), ib_link_layer="InfiniBand"))
    assert roce.reason == ("mlx5_0 port 1 link layer Ethernet, the site expects InfiniBand; "
                           "mlx5_3 port 1 link layer Ethernet, the site expects InfiniBand")


def test_synthetic_phys_state_in_the_procfs_tree_is_flagged():
    result = ib_ports(parsed("infiniband/sysfs/procfs-hfi1-mlx4-mlx5-class-infiniband.ttar"), NONE)
    assert (result.status, result.reason) == (Status.FAIL, "mlx5_0 port 1 is Active/ACTIVE")


def test_ib_interface_down_fails_naming_port_and_interface():
    result = ib_netdev(parsed("infiniband/sysfs/gcm-a100-8hca-ib4-operstate-down.json"), NONE)
    assert (result.status, result.reason) == (
        Status.FAIL, "mlx5_6 port 1 is Active but its interface ib4 is down")
    healthy = ib_netdev(parsed("infiniband/sysfs/gcm-a100-8hca-hdr200-healthy.json"), NONE)
    assert (healthy.status, healthy.reason) == (Status.OK, "8 HCA interface(s) up")


def test_ib_mtu():
    devices = parsed("infiniband/ibv_devinfo/fdr-mlx4-2hca-port2-down.txt")
    assert ib_mtu(devices, None, NodeExpectations(ib_mtu=4096)).status == Status.OK
    small = tuple(dataclasses.replace(d, ports=tuple(dataclasses.replace(p, active_mtu=2048)
                                                     for p in d.ports)) for d in devices)
    assert ib_mtu(small, None, NONE).reason == ("mlx4_1 port 1: active MTU 2048 below the port's 4096; "
                                          "mlx4_0 port 1: active MTU 2048 below the port's 4096")
    assert ib_mtu(small, None, NodeExpectations(ib_mtu=4096)).status == Status.FAIL


def test_netdev_mtu_against_the_site():
    jumbo = NodeExpectations(netdev_mtu=9000)
    assert net_mtu(parsed("net/gcm-ip-j-link-bond-mtu9192-healthy.json"), jumbo).status == Status.OK
    result = net_mtu(parsed("net/gcm-ip-j-link-bond-mtu1500-bad.json"), jumbo)
    assert (result.status, result.reason) == (
        Status.FAIL, "enp97s0f0: MTU 1500, the site expects 9000; "
                     "enp225s0f0: MTU 1500, the site expects 9000; "
                     "front0: MTU 1500, the site expects 9000")
    # IPoIB interfaces are not Ethernet data interfaces: their 2044 is not judged
    with_ipoib = parsed("net/gcm-ip-j-link-bond-slave-down.json")
    assert net_mtu(with_ipoib, NodeExpectations(netdev_mtu=1500)).status == Status.OK


def test_bond_member_mtu_must_match_the_bond():
    netdevs = parsed("net/gcm-ip-j-link-bond-mtu9192-healthy.json")
    netdevs = tuple(dataclasses.replace(d, master="front0", mtu=1500) if d.name == "enp225s0f0" else d
                    for d in netdevs)
    result = net_mtu(netdevs, NONE)
    assert (result.status, result.reason) == (
        Status.FAIL, "enp225s0f0: MTU 1500 differs from its bond front0's 9192")


def test_interfaces_without_link():
    netdevs = parsed("net/gcm-ip-j-link-bond-slave-down.json")
    result = net_links(netdevs, NONE)
    assert result.status == Status.WARN
    assert result.reason.split("; ") == [f"{name} is brought up but has no link" for name in
                                         ("enp226s0", "enp97s0f1", "enp225s0f0", "enp225s0f1")]
    data = net_links(netdevs, NodeExpectations(data_interfaces=("enp97s0f0", "enp225s0f0", "bond1")))
    assert data.status == Status.FAIL
    assert data.reason.startswith("bond1 not found; enp225s0f0 is down; ")
    assert net_links(parsed("net/gcm-ip-j-link-bond-mtu9192-healthy.json"), NONE).status == Status.OK


# --- topology and host -----------------------------------------------------------------------

def test_topo_affinity_nic_per_gpu():
    h200 = topo_affinity(parsed("nvidia-smi/topo/h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"),
                         NodeExpectations(nic_per_gpu=True))
    assert h200.status == Status.OK and h200.reason.startswith("GPU 0: mlx5_0 (PXB), GPU 1: mlx5_3 (PXB)")
    no_nic = topo_affinity(parsed("nvidia-smi/topo/h100-8gpu-nv18-no-nic-spaces-no-legend.txt"),
                           NodeExpectations(nic_per_gpu=True))
    assert no_nic.status == Status.WARN
    assert no_nic.reason.split("; ")[0] == "GPU 0 has no NIC closer than SYS (no NIC)"
    assert topo_affinity(parsed("nvidia-smi/topo/h100-8gpu-nv18-no-nic-spaces-no-legend.txt"), NONE).status \
        == Status.OK


def test_host_checks_against_the_site():
    host = _host()
    assert [c(host, NONE).status for c in (host_memory, host_shm, host_disk, host_defunct, host_load)] \
        == [Status.OK] * 5
    strict = NodeExpectations(min_available_memory_gib=500, min_shm_gib=300,
                              min_free_disk_gib={"/": 50, "/scratch": 1}, max_load_per_cpu=0.01)
    assert host_memory(host, strict).reason == "480.0 GiB memory available, the site wants 500 GiB"
    assert host_shm(host, strict).reason == "/dev/shm is 256.0 GiB, the site wants 300 GiB"
    disk = host_disk(host, strict)
    # a failure outranks what could not be measured, and is named first
    assert (disk.status, disk.reason) == (Status.FAIL, "/: 40.0 GiB free, the site wants 50 GiB; "
                                                       "/scratch: not measured in host.json")
    assert host_load(host, strict).status == Status.WARN
    zombies = _host(defunct_processes=(DefunctProcess(9, 1, "python"),) * 3)
    assert host_defunct(zombies, NodeExpectations(max_defunct_processes=2)).reason == \
        "3 defunct processes (limit 2): python[9], python[9], python[9]"
    full = _host(disks=(Filesystem("/dev/shm", GIB, 0),))
    assert (host_shm(full, NONE).status, host_disk(full, NONE).reason) == (Status.FAIL, "/dev/shm is full")
    assert host_shm(_host(disks=()), NONE).status == Status.UNKNOWN


def test_host_cpus():
    x7550 = parsed("cpu/utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt")
    assert host_cpus(x7550, NONE).reason == "64 CPUs online, 3 NUMA node(s)"
    assert host_cpus(x7550, NodeExpectations(numa_nodes=4)).status == Status.FAIL
    offline = host_cpus(dataclasses.replace(x7550, online=x7550.online - {5, 6}), NONE)
    assert (offline.status, offline.reason) == (Status.WARN, "2 of 64 CPUs offline: 5, 6")
