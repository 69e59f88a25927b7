"""Fabric, CPU, kernel-log and snapshot-file parsers on every recorded output."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from health_fixtures import parsed, read

from trainctl.errors import ParseError
from trainctl.health.parse.cpulist import parse_cpu_list
from trainctl.health.parse.ibstat import parse_ibstat
from trainctl.health.parse.ibv_devinfo import parse_ibv_devinfo
from trainctl.health.parse.ip_link import parse_ip_link
from trainctl.health.parse.kernel_log import parse_kernel_log
from trainctl.health.parse.lscpu import parse_lscpu
from trainctl.health.parse.snapshot_files import parse_host, parse_meta
from trainctl.health.parse.sysfs import parse_ib_sysfs, parse_net_sysfs, parse_ttar

IBSTAT = "infiniband/ibstat/"


def _ports(inventory):
    return [(p.device, p.port, p.state, p.phys_state, p.rate_gbps, p.link_layer, p.kind)
            for p in inventory.ports]


def test_ibstat_fdr_dual_port_hcas():
    assert _ports(parsed(IBSTAT + "fdr-mlx4-2hca-4ports-all-active.txt")) == [
        (hca, port, "Active", "LinkUp", 56.0, "InfiniBand", "MT4099")
        for hca in ("mlx4_0", "mlx4_1") for port in (1, 2)]


def test_ibstat_initializing_port_without_ca_type():
    assert _ports(parsed(IBSTAT + "edr-connectx4-state-initializing-no-sm.txt")) == [
        ("mlx5_0", 1, "Initializing", "LinkUp", 100.0, "InfiniBand", None)]


def test_ibstat_h100_roce_some_down():
    inventory = parsed(IBSTAT + "gpud-h100-12hca-roce-eth-400-some-down-disabled.txt")
    ports = {p.device: p for p in inventory.ports}
    assert len(ports) == 12
    down = sorted(d for d, p in ports.items() if p.state != "Active")
    assert down == ["mlx5_11", "mlx5_5"]
    assert (ports["mlx5_5"].phys_state, ports["mlx5_5"].rate_gbps) == ("Disabled", 40.0)
    assert {(p.kind, p.rate_gbps) for d, p in ports.items() if d not in down} == {
        ("MT4129", 400.0), ("MT4125", 100.0)}
    assert {p.link_layer for p in ports.values()} == {"Ethernet"}


def test_ibstat_h100_all_active_is_roce_too():
    # SOURCES.md calls these CX-7 ports IB; the file says "Link layer: Ethernet" for all 12.
    inventory = parsed(IBSTAT + "gpud-h100-12hca-cx7-ndr400-ib-plus-cx6dx-eth-all-active.txt")
    assert {(p.kind, p.rate_gbps, p.link_layer, p.state) for p in inventory.ports} == {
        ("MT4129", 400.0, "Ethernet", "Active"), ("MT4125", 100.0, "Ethernet", "Active")}
    assert sum(p.kind == "MT4129" for p in inventory.ports) == 8


def test_ibstat_a100_one_ethernet_eight_ib():
    ports = parsed(IBSTAT + "gpud-a100-9hca-cx6-hdr200-all-active.txt").ports
    assert [p.link_layer for p in ports] == ["Ethernet"] + ["InfiniBand"] * 8
    assert {p.rate_gbps for p in ports} == {200.0}


def test_ibstat_ibpanic_is_kept_as_an_error():
    inventory = parsed(IBSTAT + "gpud-azure-a100-hdr200-ibpanic-stat-failed-exit255.txt")
    assert [p.device for p in inventory.ports] == [f"mlx5_{i}" for i in range(8)]
    assert inventory.errors == (
        "ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory",)
    assert {p.kind for p in inventory.ports} == {"MT4124"}


@pytest.mark.parametrize("find, cut_after, message", [
    (str.index, "Rate: 56", "declares 2 ports"),        # after the first port of mlx4_0
    (str.rindex, "\t\tState: Active", "lacks"),          # inside the last port
])
def test_ibstat_truncated(find, cut_after, message):
    text = read(IBSTAT + "fdr-mlx4-2hca-4ports-all-active.txt")
    text = text[:find(text, cut_after) + len(cut_after)]
    with pytest.raises(ParseError, match=message):
        parse_ibstat(text, source="ibstat.txt")


def test_ibv_devinfo_plain_and_verbose():
    devices = parsed("infiniband/ibv_devinfo/fdr-mlx4-2hca-port2-down.txt")
    assert [(d.hca_id, [(p.port, p.state, p.active_mtu, p.max_mtu, p.link_layer) for p in d.ports])
            for d in devices] == [
        (hca, [(1, "ACTIVE", 4096, 4096, "InfiniBand"), (2, "DOWN", 4096, 4096, "InfiniBand")])
        for hca in ("mlx4_1", "mlx4_0")]
    (verbose,) = parsed("infiniband/ibv_devinfo/fdr-mlx4-v-port2-down.txt")
    assert verbose.hca_id == "mlx4_1"
    assert [(p.port, p.state, p.phys_state) for p in verbose.ports] == [(2, "DOWN", "POLLING")]


def test_ibv_devinfo_rejects_a_truncated_port():
    text = read("infiniband/ibv_devinfo/fdr-mlx4-2hca-port2-down.txt")
    with pytest.raises(ParseError, match="lacks"):
        parse_ibv_devinfo(text[:text.index("max_mtu")])


SYSFS = "infiniband/sysfs/"
GCM_HCAS = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


@pytest.mark.parametrize("name, rate, down_netdev", [
    ("gcm-a100-8hca-hdr200-healthy.json", 200.0, None),
    ("gcm-a100-8hca-rate-edr100-degraded.json", 100.0, None),
    ("gcm-a100-8hca-ib4-operstate-down.json", 200.0, "ib4"),
])
def test_sysfs_gcm_pci_device_view(name, rate, down_netdev):
    ports = parsed(SYSFS + name).ports
    assert [p.device for p in ports] == GCM_HCAS
    assert {(p.port, p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports} == {
        (1, "Active", "LinkUp", rate, "InfiniBand")}
    # netdevs pair with HCAs through the PCI device they share: ib4 is mlx5_6's
    assert [p.netdev for p in ports] == [f"ib{i}" for i in range(8)]
    assert [p.netdev for p in ports if p.netdev_operstate != "up"] == ([down_netdev] if down_netdev else [])


def test_sysfs_gcm_netdevs():
    netdevs = parse_net_sysfs(json.loads(read(SYSFS + "gcm-a100-8hca-ib4-operstate-down.json")))
    assert [(d.name, d.mtu, d.operstate, d.speed_mbps) for d in netdevs][3:6] == [
        ("ib3", 2044, "up", 200000), ("ib4", 2044, "down", None), ("ib5", 2044, "up", 200000)]


def test_sysfs_ttar_class_view():
    ports = parsed(SYSFS + "procfs-hfi1-mlx4-mlx5-class-infiniband.ttar").ports
    assert [(p.device, p.port, p.state, p.phys_state, p.rate_gbps, p.link_layer, p.kind) for p in ports] == [
        ("hfi1_0", 1, "Active", "LinkUp", 100.0, "InfiniBand", None),
        ("mlx4_0", 1, "Active", "LinkUp", 40.0, "InfiniBand", "MT4099"),
        ("mlx4_0", 2, "Active", "LinkUp", 40.0, "InfiniBand", "MT4099"),
        # the procfs fixture is partly synthetic: this phys_state reads "4: ACTIVE"
        ("mlx5_0", 1, "Active", "ACTIVE", 25.0, "InfiniBand", "MT4118")]


def test_ttar_contents_and_no_newline_marker():
    files = parse_ttar(read(SYSFS + "procfs-hfi1-mlx4-mlx5-class-infiniband.ttar"))
    assert files["fixtures/sys/class/infiniband/mlx4_0/ports/2/link_layer"] == "InfiniBand\n\n"
    assert files["fixtures/sys/class/infiniband/mlx5_0/node_guid"] == "0a7f:bc12:45ef:d23b"
    with pytest.raises(ParseError, match="announced"):
        parse_ttar("Path: a/b\nLines: 3\nx\n")


def test_sysfs_class_view_pairs_netdevs_through_the_device_link():
    files = {"sys/class/infiniband/mlx5_0/ports/1/state": "4: ACTIVE\n",
             "sys/class/infiniband/mlx5_0/ports/1/phys_state": "5: LinkUp\n",
             "sys/class/infiniband/mlx5_0/device/net/ib0/operstate": "down\n",
             "sys/class/net/ib0/operstate": "down\n", "sys/class/net/eth0/operstate": "up\n"}
    (port,) = parse_ib_sysfs(files).ports
    assert (port.netdev, port.netdev_operstate, port.rate_gbps) == ("ib0", "down", None)
    assert [d.name for d in parse_net_sysfs(files)] == ["eth0", "ib0"]


@pytest.mark.parametrize("files, message", [
    ({"x/infiniband/mlx5_0/ports/1/state": "ACTIVE", "x/infiniband/mlx5_0/ports/1/phys_state":
      "5: LinkUp"}, "N: NAME"),
    ({"x/infiniband/mlx5_0/ports/1/phys_state": "5: LinkUp"}, "no state"),
    ({"x/infiniband/mlx5_0/ports/1/state": "4: ACTIVE", "x/infiniband/mlx5_0/ports/1/phys_state":
      "5: LinkUp", "x/infiniband/mlx5_0/ports/1/rate": "fast"}, "Gb/sec"),
])
def test_sysfs_rejects_unknown_values(files, message):
    with pytest.raises(ParseError, match=message):
        parse_ib_sysfs(files)


NET = "net/"


def test_ip_link_healthy_bond():
    netdevs = parsed(NET + "gcm-ip-j-link-bond-mtu9192-healthy.json")
    assert [(d.name, d.mtu, d.operstate, d.admin_up, d.carrier, d.link_type) for d in netdevs] == [
        ("enp97s0f0", 9192, "up", True, True, "ether"), ("enp225s0f0", 9192, "up", True, True, "ether"),
        ("front0", 9192, "up", True, True, "ether")]
    # gcm anonymised "master" to "main": the bond membership is not in these files
    assert {d.master for d in netdevs} == {None}


def test_ip_link_mtu_and_down_variants():
    assert {d.mtu for d in parsed(NET + "gcm-ip-j-link-bond-mtu1500-bad.json")} == {1500}
    netdevs = {d.name: d for d in parsed(NET + "gcm-ip-j-link-bond-slave-down.json")}
    assert len(netdevs) == 15
    no_link = sorted(n for n, d in netdevs.items() if d.carrier is False)
    assert no_link == ["enp225s0f0", "enp225s0f1", "enp226s0", "enp97s0f1"]
    assert (netdevs["lo"].operstate, netdevs["lo"].link_type) == ("unknown", "loopback")
    assert (netdevs["ib3"].mtu, netdevs["ib3"].link_type) == (2044, "infiniband")


@pytest.mark.parametrize("text, message", [
    ("[{\"ifname\": \"eth0\", \"mtu\": \"9000\"}]", "wrong type"),
    ("{\"ifname\": \"eth0\"}", "JSON list"),
    ("[{\"ifname\": \"eth0\",", "not JSON"),
    ("[{\"mtu\": 1500}]", "missing 'ifname'"),
])
def test_ip_link_rejects_wrong_shapes(text, message):
    with pytest.raises(ParseError, match=message):
        parse_ip_link(text)


# file -> (CPUs, online, sockets, CPUs per NUMA node)
LSCPU_VALUES = {
    "utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt": (96, 96, 2, {n: 12 for n in range(8)}),
    "utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt": (64, 64, 4, {0: 32, 2: 16, 3: 16}),
    "xeon-e5-2695v4-2socket-lscpu-old-format.txt": (36, 36, 2, {0: 18, 1: 18}),
    "recorded/h100-vm-2026-11-22-b/lscpu.txt": (16, 16, 1, {0: 16}),
    "utillinux-lscpu-opteron6328-2socket-4numa-smt-adjacent-siblings-with-parsable.txt":
        (16, 16, 2, {n: 4 for n in range(4)}),
    "princeton-della-h100-node-xeon8468-2socket-nosmt-numa-even-odd-interleaved-lscpu.txt": (96, 96, 2, {0: 48, 1: 48}),
    "princeton-tigergpu-p100-node-e5-2680v4-2socket-numa-even-odd-lscpu.txt": (28, 28, 2, {0: 14, 1: 14}),
    "princeton-stellar-a100-node-epyc7h12-2socket-nosmt-lscpu.txt": (128, 128, 2, {0: 64, 1: 64}),
}


@pytest.mark.parametrize("name", sorted(LSCPU_VALUES))
def test_lscpu_values(name):
    cpus, online, sockets, nodes = LSCPU_VALUES[name]
    info = parsed(name if name.startswith(("local/", "recorded/")) else "cpu/" + name)
    assert (info.cpus, len(info.online), info.sockets) == (cpus, online, sockets)
    assert {n: len(c) for n, c in info.numa_nodes.items()} == nodes


def test_lscpu_stride_ranges_and_node_lists():
    x7550 = parsed("cpu/utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt")
    assert x7550.numa_nodes[0] == frozenset(range(0, 63, 2))
    assert x7550.numa_nodes[2] == frozenset(range(1, 62, 4))
    epyc = parsed("cpu/utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt")
    assert epyc.numa_nodes[7] == frozenset(range(42, 48)) | frozenset(range(90, 96))
    assert epyc.model_name == "AMD EPYC 7451 24-Core Processor"


def test_della_h100_numa_nodes_interleave_even_and_odd_cpus():
    della = parsed("cpu/princeton-della-h100-node-xeon8468-2socket-nosmt-numa-even-odd-interleaved-lscpu.txt")
    assert della.numa_nodes == {0: frozenset(range(0, 96, 2)), 1: frozenset(range(1, 96, 2))}
    # Thread(s) per core: 1 is measured: every CPU is a core of its own
    assert della.threads_per_core == 1 and della.measured_cores() == tuple(frozenset({c}) for c in range(96))


# (lscpu output, the /proc+/sys dump util-linux produced it from, CPU 0's siblings, cores)
SIBLING_LAYOUTS = [
    ("utillinux-lscpu-opteron6328-2socket-4numa-smt-adjacent-siblings-with-parsable.txt",
     "utillinux-dump-opteron6328-2socket-thread-siblings-adjacent-0-1.tar.gz", {0, 1}, 8),
    ("utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt",
     "utillinux-dump-xeon-x7550-4socket-thread-siblings-split-0-32.tar.gz", {0, 32}, 32),
]


@pytest.mark.parametrize("lscpu, dump, cpu0, cores", SIBLING_LAYOUTS, ids=["adjacent", "split"])
def test_sysfs_siblings_and_lscpu_p_agree_on_the_same_machine(lscpu, dump, cpu0, cores):
    from_sysfs = parsed(f"cpu/sysfs-dumps/{dump}")
    from_lscpu = parsed(f"cpu/{lscpu}").measured_cores()
    assert from_sysfs == from_lscpu
    assert from_sysfs[0] == cpu0 and len(from_sysfs) == cores
    assert all(len(core) == 2 for core in from_sysfs)


def test_lscpu_reads_cores_from_the_first_p_table_only():
    # the Opteron output carries `lscpu -p` then `lscpu -p -y`, whose physical core IDs repeat
    # per die: CPU 0 and 4 would share "core 0" there
    opteron = parsed("cpu/utillinux-lscpu-opteron6328-2socket-4numa-smt-adjacent-siblings-with-parsable.txt")
    assert frozenset({0, 4}) not in opteron.cores and frozenset({0, 1}) in opteron.cores
    assert parsed("cpu/xeon-e5-2695v4-2socket-lscpu-old-format.txt").cores is None


def test_sibling_lists_that_disagree_are_refused():
    from trainctl.health.parse.cpu_siblings import parse_thread_siblings

    files = {"sys/devices/system/cpu/cpu0/topology/thread_siblings_list": "0-1\n",
             "sys/devices/system/cpu/cpu1/topology/thread_siblings_list": "1-2\n"}
    with pytest.raises(ParseError, match="cpu0 lists siblings 0,1 but cpu1 lists 1,2"):
        parse_thread_siblings(files)
    with pytest.raises(ParseError, match="not among its own siblings"):
        parse_thread_siblings({"sys/devices/system/cpu/cpu3/topology/thread_siblings_list": "0-1"})


def test_lscpu_rejects_missing_cpu_count_and_junk():
    with pytest.raises(ParseError, match="CPU\\(s\\)"):
        parse_lscpu("Model name: x\n")
    with pytest.raises(ParseError, match="Key: value"):
        parse_lscpu("CPU(s): 4\nOn-line CPU(s) list: 0-3\nthis is not lscpu\n")


@pytest.mark.parametrize("text, cpus", [
    ("0-55,112-167", set(range(56)) | set(range(112, 168))), ("0-62:2", set(range(0, 63, 2))),
    ("7", {7}), ("", set()), (" 0,2 ", {0, 2}),
])
def test_cpu_list(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["N/A", "3-1", "0-9:0", "0-99999", "1,,2", "²"])
def test_cpu_list_rejects(text):
    with pytest.raises(ParseError):
        parse_cpu_list(text)


XID = "kernel/xid/"


def test_kernel_log_xid119_dmesg_t():
    log = parsed(XID + "gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log")
    assert [(e.xid, e.pci, e.line) for e in log.xids] == [(119, "0000:9b:00", n) for n in (3, 38, 40, 42, 43)]
    assert log.xids[0].time.wall == datetime(2025, 2, 23, 16, 24, 18)
    assert "GPU4 GSP" in log.xids[0].message and log.sxids == ()


def test_kernel_log_decode_iso_xid13_xid43():
    log = parsed(XID + "gpud-dmesg-decode-iso-xid13-xid43-sm-exceptions.log")
    counts = {xid: sum(e.xid == xid for e in log.xids) for xid in {e.xid for e in log.xids}}
    assert counts == {13: 629, 43: 7}
    assert {e.pci for e in log.xids} == {"0000:38:00"}
    assert log.xids[0].time.wall == datetime(2025, 1, 21, 2, 21, 33, 498559, tzinfo=timezone.utc)
    assert log.xids[-1].message == "pid=2924364, name=pt_main_thread, Ch 00000008"


def test_kernel_log_other_forms():
    gcm = parsed(XID + "gcm-dmesg-T-xid31-xid48-sm-exception.txt")
    assert [(e.xid, e.pci) for e in gcm.xids] == [(31, "000d:00:00"), (48, "000d:00:00")]
    (xid64,) = parsed(XID + "imbue-dmesg-xid64-row-remapper-all-rows-remapped.txt").xids
    assert (xid64.xid, xid64.pci, xid64.time.since_boot_s) == (64, "0000:0f:00", 2397166.923949)
    (xid63,) = parsed(XID + "ml-engineering-xid63-row-remapper-a100.txt").xids
    assert (xid63.xid, xid63.pci, xid63.time) == (63, "0000:10:1c", None)
    (sxid,) = parsed(XID + "imbue-dmesg-nvswitch-sxid12028-nonfatal.txt").sxids
    assert (sxid.switch, sxid.pci, sxid.sxid, sxid.severity) == (
        "nvidia-nvswitch2", "0000:85:00.0", 12028, "Non-fatal")


@pytest.mark.parametrize("name", ["azure-syslog-ib6-lost-gained-carrier-flaps.txt",
                                  "imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"])
def test_kernel_log_without_gpu_events(name):
    assert parsed("kernel/syslog/" + name) == parse_kernel_log("")


def test_kernel_log_syslog_prefix_has_no_year():
    # the syslog prefix of the Azure file in front of the Xid 63 line of ml-engineering
    prefix = read("kernel/syslog/azure-syslog-ib6-lost-gained-carrier-flaps.txt").splitlines()[2]
    prefix = prefix[:prefix.index("systemd-networkd")] + "kernel: "
    line = read(XID + "ml-engineering-xid63-row-remapper-a100.txt")
    (event,) = parse_kernel_log(prefix + line).xids
    stamp = event.time
    assert (event.xid, stamp.wall.month, stamp.wall.day, stamp.year_known) == (63, 8, 17, False)


@pytest.mark.parametrize("text, message", [
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00", "unreadable Xid"),
    ("[Sun Feb 93 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.",
     "bad timestamp"),
    ("nvidia-nvswitch2: SXid (PCI:0000:85:00.0) 12028", "unreadable SXid"),
])
def test_kernel_log_rejects_unreadable_gpu_lines(text, message):
    with pytest.raises(ParseError, match=message) as error:
        parse_kernel_log(text, source="dmesg.txt")
    assert (error.value.source, error.value.line) == ("dmesg.txt", 1)


def test_meta_and_host_files():
    meta = parse_meta(json.dumps({
        "format": 1, "host": "node2", "collected_at": "2025-02-23T16:31:00+00:00",
        "probes": {"nvidia-smi-q.xml": {"command": ["nvidia-smi", "-q", "-x"], "exit_code": None,
                                        "duration_s": 10.0, "timed_out": True, "missing": False,
                                        "error": "nvidia-smi: timed out after 10 s",
                                        "stderr_tail": ""}}}))
    assert (meta.host, meta.collected_at.hour) == ("node2", 16)
    assert meta.probes["nvidia-smi-q.xml"].error == "nvidia-smi: timed out after 10 s"
    host = parse_host(json.dumps({
        "memory": {"total_bytes": 64 << 30, "available_bytes": 60 << 30}, "load_avg": [1, 2.5, 3],
        "cpu_count": 8, "boot_time": "2025-02-20T08:00:00+00:00",
        "disks": [{"path": "/dev/shm", "total_bytes": 32 << 30, "free_bytes": 32 << 30}],
        "defunct_processes": [{"pid": 7, "ppid": 1, "name": "python"}]}))
    assert (host.load_average, host.cpu_count, host.disks[0].path) == ((1.0, 2.5, 3.0), 8, "/dev/shm")
    assert host.defunct_processes[0].name == "python" and host.boot_time.day == 20


@pytest.mark.parametrize("text, message", [
    ('{"collected_at": "yesterday"}', "ISO 8601"),
    ('{"collected_at": "2025-02-23T16:31:00"}', "UTC offset"),
    ('{"probes": {"x": {"command": "nvidia-smi", "duration_s": 1, "timed_out": false}}}', "wrong type"),
])
def test_meta_rejects_wrong_values(text, message):
    with pytest.raises(ParseError, match=message):
        parse_meta(text)
