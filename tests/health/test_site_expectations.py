"""Site keys reach the checks: each key below changes a verdict on a real recorded output."""

from __future__ import annotations

import dataclasses

import pytest
from health_fixtures import parsed

from trainctl.health.checks.fabric import ib_mtu, ib_ports
from trainctl.health.checks.gpu import gpu_row_remap
from trainctl.health.checks.host import host_cpus, host_disk
from trainctl.health.checks.nvlink import nvlink_links
from trainctl.health.evaluate import evaluate
from trainctl.health.expectations import NodeExpectations, from_site
from trainctl.health.parse.fabric import IbInventory, IbPort
from trainctl.health.parse.snapshot_files import Filesystem, HostInfo
from trainctl.health.snapshot import Snapshot
from trainctl.health.status import Status
from trainctl.site import load_site, partition

GIB = 1 << 30


def expectations(tmp_path, partition_keys: str = "", gate_keys: str = "") -> NodeExpectations:
    """What a minimal site file with these extra keys expects of a node."""
    path = tmp_path / "keys.toml"
    path.write_text(f'name = "keys"\ndefault_partition = "p"\n[gate]\n{gate_keys}\n'
                    f'[partitions.p]\ngpus_per_node = 8\nsocket_ifname = "eth0"\n{partition_keys}\n')
    config = load_site(str(path)).config
    return from_site(partition(config, None)[1], config.gate)


def test_nvlink_speed_gbps(tmp_path):
    h100 = parsed("nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt")
    assert nvlink_links(h100, expectations(tmp_path)).status == Status.OK
    strict = nvlink_links(h100, expectations(tmp_path, "nvlink_speed_gbps = 50.0"))
    assert strict.status == Status.FAIL and "below 50 GB/s" in strict.reason


def test_nvlink_links_per_gpu(tmp_path):
    a100 = parsed("nvidia-smi/nvlink/azure-a100-sxm4-80gb-1gpu-12links-25GBps-healthy.txt")
    assert nvlink_links(a100, expectations(tmp_path, "nvlink_links_per_gpu = 12")).status == Status.OK
    result = nvlink_links(a100, expectations(tmp_path, "nvlink_links_per_gpu = 18"))
    assert (result.status, result.reason) == (
        Status.FAIL, "GPU 7 (NVIDIA A100-SXM4-80GB): 12 NVLinks, the site expects 18")


def test_nvlink_required_and_none(tmp_path):
    l40s = parsed("nvidia-smi/nvlink/l40s-nvlink-s-no-nvlink.txt")
    assert nvlink_links(l40s, expectations(tmp_path)).status == Status.OK
    assert nvlink_links(l40s, expectations(tmp_path, 'nvlink = "required"')).status == Status.FAIL
    # "none": a PCIe partition skips NVLink checks, even on a node whose links read as inactive
    inactive = Snapshot("node", {"nvidia-smi-nvlink-s.txt": open_fixture(
        "nvidia-smi/nvlink/azure-a100-sxm4-80gb-all-links-inactive.txt")})
    judged = {mode: evaluate(inactive, expectations(tmp_path, f'nvlink = "{mode}"'), ["nvlink.links"]).checks[0]
              for mode in ("auto", "none")}
    assert (judged["auto"].status, judged["none"].status) == (Status.FAIL, Status.OK)
    assert judged["none"].reason == "skipped: the site expects no nvlink on this node"


def test_max_retired_pages(tmp_path):
    bad = parsed("nvidia-smi/query/azure-nd96-8gpu-q-d-page-retirement-ecc-bad.txt")
    assert gpu_row_remap(bad, expectations(tmp_path)).status == Status.FAIL   # pending retirement
    healthy = parsed("nvidia-smi/query/azure-nd96-8gpu-q-d-page-retirement-healthy.txt")
    retired = dataclasses.replace(healthy, gpus=(dataclasses.replace(healthy.gpus[0], retired_pages_sbe=3),
                                                 *healthy.gpus[1:]))
    assert gpu_row_remap(retired, expectations(tmp_path)).status == Status.OK
    limited = gpu_row_remap(retired, expectations(tmp_path, gate_keys="max_retired_pages = 2"))
    assert limited.status == Status.FAIL and "3 retired pages, the site allows 2" in limited.reason


def test_min_free_disk_gib(tmp_path):
    host = HostInfo(memory_total_bytes=GIB, memory_available_bytes=GIB,
                    disks=(Filesystem("/", 100 * GIB, 40 * GIB), Filesystem("/scratch", 900 * GIB, 800 * GIB)),
                    defunct_processes=(), load_average=(0.0, 0.0, 0.0), cpu_count=8, boot_time=None)
    assert host_disk(host, expectations(tmp_path)).status == Status.OK
    keys = '[gate.min_free_disk_gib]\n"/" = 50\n"/scratch" = 500'
    result = host_disk(host, expectations(tmp_path, gate_keys=keys))
    assert (result.status, result.reason) == (Status.FAIL, "/: 40.0 GiB free, the site wants 50 GiB")


def test_numa_nodes(tmp_path):
    della = parsed("cpu/princeton-della-h100-node-xeon8468-2socket-nosmt-numa-even-odd-interleaved-lscpu.txt")
    assert host_cpus(della, expectations(tmp_path, "numa_nodes = 2")).status == Status.OK
    result = host_cpus(della, expectations(tmp_path, "numa_nodes = 8"))
    assert (result.status, result.reason) == (Status.FAIL, "2 NUMA nodes with CPUs, the site expects 8")


# --- RoCE MTU -----------------------------------------------------------------------------
# No real `ibv_devinfo` of a RoCE port is among the fixtures: these tests take the real FDR
# output and change only the fields a RoCE port differs in (link layer, active MTU).

def _as_roce(active_mtu: int):
    devices = parsed("infiniband/ibv_devinfo/fdr-mlx4-2hca-port2-down.txt")
    return tuple(dataclasses.replace(d, ports=tuple(dataclasses.replace(p, link_layer="Ethernet",
                                                                         active_mtu=active_mtu)
                                                    for p in d.ports)) for d in devices)


def _netdevs(mtu: int) -> IbInventory:
    return IbInventory(ports=tuple(IbPort(hca, 1, "Active", "LinkUp", 100.0, "Ethernet", netdev=ifname,
                                          netdev_operstate="up", netdev_mtu=mtu)
                                   for hca, ifname in (("mlx4_0", "ens1f0np0"), ("mlx4_1", "ens2f0np0"))))


def test_roce_port_at_1024_fails_against_the_sites_4096_naming_its_interface(tmp_path):
    expected = expectations(tmp_path, "ib_mtu = 4096\nnetdev_mtu = 9000")
    result = ib_mtu(_as_roce(1024), _netdevs(1500), expected)
    assert result.status == Status.FAIL
    assert result.reason.split("; ")[:2] == [
        "mlx4_1 port 1 (RoCE): active MTU 1024, the site expects 4096 (its interface ens2f0np0 has MTU 1500)",
        "mlx4_1 port 1 (RoCE): its interface ens2f0np0 has MTU 1500, the site expects 9000"]
    assert ib_mtu(_as_roce(4096), _netdevs(9000), expected).status == Status.OK
    # without the sysfs copy the port's own MTU is still judged
    assert ib_mtu(_as_roce(1024), None, expected).reason.startswith(
        "mlx4_1 port 1 (RoCE): active MTU 1024, the site expects 4096; ")


def test_roce_port_below_its_max_warns_without_a_site():
    assert ib_mtu(_as_roce(1024), None, NodeExpectations()).status == Status.WARN


# --- a compute port down: the site decides ------------------------------------------------

ROCE_SOME_DOWN = "infiniband/ibstat/gpud-h100-12hca-roce-eth-400-some-down-disabled.txt"


def _down_ports() -> list[str]:
    return [p.name for p in parsed(ROCE_SOME_DOWN).ports if p.state != "Active"]


@pytest.mark.parametrize("policy, status", [("exclude-node", Status.FAIL), ("drop-port", Status.WARN)])
def test_a_listed_port_down_fails_or_warns_as_the_site_says(tmp_path, policy, status):
    inventory = parsed(ROCE_SOME_DOWN)
    up = [f"{p.device}:{p.port}" for p in inventory.ports if p.state == "Active"][:3]
    down = _down_ports()[0].replace(" port ", ":")
    ports = ", ".join(f'"{p}"' for p in [*up, down])
    result = ib_ports(inventory, expectations(tmp_path, f'link_layer = "Ethernet"\nhca_ports = [{ports}]\n'
                                                            f'hca_port_down = "{policy}"'))
    assert result.status == status
    assert _down_ports()[0] in result.reason


def test_drop_port_with_no_listed_port_up_still_fails(tmp_path):
    down = ", ".join(f'"{name.replace(" port ", ":")}"' for name in _down_ports()[:2])
    result = ib_ports(parsed(ROCE_SOME_DOWN), expectations(tmp_path, f'link_layer = "Ethernet"\n'
                                                                     f'hca_ports = [{down}]\n'
                                                                     'hca_port_down = "drop-port"'))
    assert result.status == Status.FAIL
    assert "none of the site's HCA ports is up" in result.reason


def open_fixture(relative: str) -> str:
    from health_fixtures import read

    return read(relative)


def test_no_site_judges_with_the_site_models_gate_defaults_and_expects_no_hardware(tmp_path):
    from trainctl.health.node import node_policy, policy_for

    bare = policy_for(None, None, None)
    expectations(tmp_path)  # writes keys.toml: a site with an empty [gate]
    site = load_site(str(tmp_path / "keys.toml"))
    _, part = partition(site.config, None)
    with_site = node_policy(site.config, part, None)
    gate_fields = ("max_retired_pages", "min_free_disk_gib", "xid_window_hours", "min_available_memory_gib",
                   "min_shm_gib", "max_defunct_processes", "max_load_per_cpu", "pcie_below_max_warns",
                   "dcgm_diag_level", "pinned_versions")
    assert {f: getattr(bare.expectations, f) for f in gate_fields} == \
        {f: getattr(with_site.expectations, f) for f in gate_fields}
    assert bare.probe_timeout_s == with_site.probe_timeout_s and bare.only is None
    # no partition: nothing of the node's hardware is expected, nor said to be absent
    assert bare.expectations.gpus is None and bare.expectations.ib_ports is None
    assert not any(bare.expectations.lacks(kind) for kind in ("gpu", "nvlink", "ib"))
