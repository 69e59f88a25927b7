"""Gray failures on one node: error counters as growth, PCIe links, seeing every GPU, versions, DCGM."""

from __future__ import annotations

import json

import pytest
from health_fixtures import parsed, read
from test_health_evaluate import HOST, META, NO_COMPUTE_APPS, gpu_pci_links, healthy_node, write_snapshot

from trainctl.errors import ParseError
from trainctl.health.counters import judge_growth
from trainctl.health.evaluate import evaluate
from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.counters import parse_ib_counters, parse_nvlink_errors
from trainctl.health.parse.gpu_apps import parse_compute_apps
from trainctl.health.parse.pcie import parse_pci_sysfs, parse_pcie_kernel_lines
from trainctl.health.parse.sysfs import parse_ttar
from trainctl.health.snapshot import load_snapshot
from trainctl.health.status import Status
from trainctl.health.versions import odd_nodes_out

PERFQUERY = "infiniband/perfquery/"
I40IW_TTAR = "infiniband/sysfs/node-exporter-i40iw-no-pma-and-mlx4-class-infiniband.ttar"
H100_Q = "nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt"


def check(files: dict[str, str], name: str, expected: NodeExpectations = NodeExpectations(), tmp_path=None):
    """One check over a fresh snapshot directory holding `files`."""
    root = tmp_path / f"snapshot{len(list(tmp_path.iterdir()))}"
    (result,) = evaluate(load_snapshot(write_snapshot(root, files)), expected, only=[name]).checks
    return result


# ---------------------------------------------------------------- 3. error counters

def test_ib_counters_from_sysfs_with_a_no_pma_port():
    reading = parsed(I40IW_TTAR)
    assert reading.without_counters == ("i40iw0:1",)        # every counter reads "N/A (no PMA)"
    assert reading.counters["mlx4_0:1"]["port_xmit_discards"] == 5
    assert reading.counters["mlx4_0:1"]["link_downed"] == 0
    procfs = parse_ib_counters(parse_ttar(read("infiniband/sysfs/procfs-hfi1-mlx4-mlx5-class-infiniband.ttar")))
    assert sorted(procfs.counters) == ["hfi1_0:1", "mlx4_0:1", "mlx4_0:2", "mlx5_0:1"]
    assert len(procfs.counters["mlx5_0:1"]) == 12


def test_perfquery_counters():
    flapped = parsed(PERFQUERY + "treydock-perfquery-x-switch-port-linkdowned1-xmitdiscards20046.txt")
    port = flapped.counters["lid 2052 port 1"]
    assert (port["link_downed"], port["port_xmit_discards"], port["port_rcv_switch_relay_errors"]) == (1, 20046, 7)
    assert "PortXmitData" not in port and "port_xmit_wait" not in port      # traffic, not errors
    healthy = parsed(PERFQUERY + "treydock-perfquery-x-switch-2ports-healthy.txt")
    assert sorted(healthy.counters) == ["lid 1719 port 1", "lid 1719 port 2"]
    assert set(healthy.counters["lid 1719 port 2"].values()) == {0}
    details = parsed(PERFQUERY + "treydock-perfquery-E-rcverr-details.txt")
    assert details.counters["lid 1719 port 1"]["PortMalformedPktErrors"] == 0


def test_link_downed_growth_is_a_flap_and_other_growth_warns():
    """The same port read twice: clean (the healthy capture's values), then as the flapped capture
    reads (LinkDowned 1, XmitDiscards 20046). The two captures are of different switch ports;
    they stand here for one port's before and after."""
    clean = parsed(PERFQUERY + "treydock-perfquery-x-switch-2ports-healthy.txt").to_json()
    before = {"counters": {"lid 2052 port 1": clean["counters"]["lid 1719 port 1"]}}
    after = parsed(PERFQUERY + "treydock-perfquery-x-switch-port-linkdowned1-xmitdiscards20046.txt").to_json()
    result = judge_growth("ib.counters", before, after, "during the fabric test")
    assert result.status == Status.FAIL
    assert result.reason == ("lid 2052 port 1 link_downed +1 during the fabric test: link flapped (went down "
                             "and came back); lid 2052 port 1 port_rcv_switch_relay_errors +7, "
                             "port_xmit_discards +20046 during the fabric test")
    assert result.details["growth"] == {"lid 2052 port 1": {"link_downed": 1, "port_rcv_switch_relay_errors": 7,
                                                            "port_xmit_discards": 20046}}
    # the other way round the counters went down: reset (reboot), not judged
    reset = judge_growth("ib.counters", after, before, "since sweep #3")
    assert reset.status == Status.OK and "lid 2052 port 1 link_downed" in reset.details["reset"]


def test_absolute_counts_alone_pass_and_are_recorded(tmp_path):
    files = {"meta.json": json.dumps(META), "perfquery.txt": read(
        PERFQUERY + "treydock-perfquery-x-switch-port-linkdowned1-xmitdiscards20046.txt")}
    result = check(files, "ib.counters", tmp_path=tmp_path)
    assert result.status == Status.OK       # 20046 discards since boot say nothing about today
    assert result.details["counters"]["lid 2052 port 1"]["port_xmit_discards"] == 20046
    same = judge_growth("ib.counters", result.details, result.details, "since sweep #1")
    assert (same.status, same.reason) == (Status.OK, "no error counter grew since sweep #1 (1 link(s) compared)")


def test_dcgm_nvlink_crc_growth_warns():
    zero = parsed("dcgm/gcm-dcgmi-nvlink-e-j-all-zero.json").to_json()
    twelve = parsed("dcgm/gcm-dcgmi-nvlink-e-j-crc-data-error-12.json")
    assert twelve.counters["GPU 0 link 0"] == {"CRC Data Error": 12, "CRC FLIT Error": 0, "Recovery Error": 0,
                                               "Replay Error": 0}
    result = judge_growth("nvlink.counters", zero, twelve.to_json(), "since sweep #7")
    assert (result.status, result.reason) == (Status.WARN, "GPU 0 link 0 CRC Data Error +12 since sweep #7")
    recovered = {"counters": {"GPU 0 link 1": {"Recovery Error": 2}}}
    assert judge_growth("nvlink.counters", zero, recovered, "x").status == Status.FAIL


# No complete real `nvidia-smi nvlink -e` output is public. This sample follows NVIDIA's
# example as stas00/ml-engineering quotes it (compute/accelerator/nvidia/debug.md), with two
# links written out in place of its "[...]"; the GB300 form prints the GPU line without UUID.
NVLINK_E = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-abcdefab-cdef-abdc-abcd-abababababab)
         Link 0: Replay Errors: 0
         Link 0: Recovery Errors: 0
         Link 0: CRC Errors: 0

         Link 17: Replay Errors: 3
         Link 17: Recovery Errors: 0
         Link 17: CRC Errors: 41
GPU 1: NVIDIA GB300
\t Link 0: Replay Errors: 0
"""


def test_nvlink_e_documented_format():
    reading = parse_nvlink_errors(NVLINK_E)
    assert reading.counters["GPU 0 link 17"] == {"Replay Errors": 3, "Recovery Errors": 0, "CRC Errors": 41}
    assert reading.counters["GPU 1 link 0"] == {"Replay Errors": 0}
    assert parse_nvlink_errors(read("recorded/h100-vm-2026-11-22/nvidia-smi-nvlink-e.txt")).counters == {}
    # the sentence the L40S printed for `nvlink -s`: a GPU without NVLink has no counters
    assert parse_nvlink_errors(read("nvidia-smi/nvlink/l40s-nvlink-s-no-nvlink.txt")).counters == {}


@pytest.mark.parametrize("text, message", [
    ("Link 0: Replay Errors: 0\n", "unexpected line"),                      # no GPU line first
    ("GPU 0: X (UUID: U)\n  Link 0: Replay Errors: many\n", "not an integer"),
    ("GPU 0: X (UUID: U)\n  Link 0 Replay Errors 0\n", "unexpected line"),
])
def test_nvlink_e_parser_is_strict(text, message):
    with pytest.raises(ParseError, match=message):
        parse_nvlink_errors(text)


# ---------------------------------------------------------------- 4. PCIe links

def test_pcie_figures_from_sysfs_lspci_and_the_kernel():
    nvme = parsed("pcie/node-exporter-sysfs-nvme-current-8GTs-max-16GTs-aer-counters.ttar")["0000:01:00.0"]
    assert (nvme.current_speed_gts, nvme.max_speed_gts, nvme.current_width, nvme.max_width) == (8.0, 16.0, 4, 4)
    lspci = parsed("pcie/gpud-h100-xe-lspci-vvv-gpu-cx7-cx6dx-switch-gen4-downgraded-excerpt.txt")
    gpu, cx7, port = lspci["0000:19:00.0"], lspci["0000:1a:00.0"], lspci["0000:17:03.0"]
    assert gpu.is_gpu and (gpu.current_speed_gts, gpu.current_width) == (32.0, 16)
    assert (cx7.vendor, cx7.device_class, cx7.max_speed_gts) == (0x15b3, 0x0200, 32.0)
    assert (port.current_speed_gts, port.max_speed_gts) == (16.0, 32.0)    # lspci: "16GT/s (downgraded)"
    gb200 = parsed("pcie/gpud-gb200-lspci-plain.txt")
    assert sum(d.is_gpu for d in gb200.values()) == 4 and gb200["0008:01:00.0"].is_gpu
    (limit,) = parse_pcie_kernel_lines(read("kernel/syslog/imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"))
    assert (limit.device, limit.width, limit.capable_width, limit.at) == ("0000:9c:00.0", 8, 16, "0000:97:01.0")


def test_gpu_below_its_pcie_maximum_fails_naming_it(tmp_path):
    files = healthy_node() | gpu_pci_links(read(H100_Q))
    # GPU 2 trained as node_exporter's NVMe did: 8.0 GT/s of 16 (the sysfs text as recorded), and x8
    files |= {"sys/bus/pci/devices/0000:3a:00.0/current_link_speed": "8.0 GT/s PCIe\n",
              "sys/bus/pci/devices/0000:3a:00.0/current_link_width": "8\n"}
    result = check(files, "pcie.links", tmp_path=tmp_path)
    assert (result.status, result.reason) == (Status.FAIL, "GPU 2 (0000:3a:00.0): PCIe link at 8 GT/s of 32, x8 of x16")
    lowered = check(files, "pcie.links", NodeExpectations(pcie_below_max_warns=True), tmp_path=tmp_path)
    assert lowered.status == Status.WARN


def test_kernel_limited_by_line_fails_the_hca(tmp_path):
    """The NIC's own link reads x16 in sysfs; the kernel line shows the upstream port at x8."""
    nic = "sys/bus/pci/devices/0000:9c:00.0/"
    files = healthy_node() | {"dmesg.txt": read("kernel/syslog/imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"),
                              "sys/class/infiniband/mlx5_4/device/uevent": "DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:9c:00.0\n",
                              nic + "vendor": "0x15b3\n", nic + "class": "0x020700\n",
                              nic + "current_link_speed": "32.0 GT/s PCIe\n", nic + "max_link_speed": "32.0 GT/s PCIe\n",
                              nic + "current_link_width": "16\n", nic + "max_link_width": "16\n"}
    result = check(files, "pcie.links", tmp_path=tmp_path)
    assert (result.status, result.reason) == (
        Status.FAIL, "mlx5_4 (0000:9c:00.0): kernel says limited by a 32 GT/s x8 link at 0000:97:01.0 "
                     "(capable of 32 GT/s x16; dmesg line 1)")


def test_lspci_snapshot_judges_gpu_and_nics_but_not_switch_ports(tmp_path):
    files = {"meta.json": json.dumps(META), "lspci.txt": read(
        "pcie/gpud-h100-xe-lspci-vvv-gpu-cx7-cx6dx-switch-gen4-downgraded-excerpt.txt")}
    result = check(files, "pcie.links", tmp_path=tmp_path)
    # the downgraded 17:03.0 is a switch port: its Gen4 ConnectX-6 Dx behind it is at its own maximum
    assert (result.status, result.reason) == (Status.OK, "1 GPU/HCA link(s) at their maximum speed and width")


# ---------------------------------------------------------------- 6. seeing every GPU

def test_attached_but_not_listed_fails(tmp_path):
    # telegraf's real A100 capture: "<attached_gpus>4" and one <gpu> section
    files = {"meta.json": json.dumps(META), "nvidia-smi-q.xml": read("nvidia-smi/query/a100-sxm4-80gb-1gpu-q-x-v12.xml")}
    result = check(files, "gpu.visible", tmp_path=tmp_path)
    assert (result.status, result.reason) == (Status.FAIL, "nvidia-smi says 4 GPU(s) attached but lists 1")
    ok = check(healthy_node(), "gpu.visible", tmp_path=tmp_path)
    assert (ok.status, ok.reason) == (Status.OK, "8 GPU(s) listed, 8 on the PCI bus")


def test_gpu_on_the_pci_bus_missing_from_nvidia_smi_fails(tmp_path):
    files = healthy_node() | {"sys/bus/pci/devices/0000:ff:00.0/vendor": "0x10de\n",
                              "sys/bus/pci/devices/0000:ff:00.0/class": "0x030200\n",
                              # an NVSwitch (bridge class) is NVIDIA's too, and no GPU
                              "sys/bus/pci/devices/0000:05:00.0/vendor": "0x10de\n",
                              "sys/bus/pci/devices/0000:05:00.0/class": "0x068000\n"}
    result = check(files, "gpu.visible", tmp_path=tmp_path)
    assert result.status == Status.FAIL
    assert result.reason.startswith("1 NVIDIA GPU(s) on the PCI bus not listed by nvidia-smi: 0000:ff:00.0")
    # a job holding part of the node sees its own GPUs only: where the site's count is met, a warning
    hidden = check(files, "gpu.visible", NodeExpectations(gpus=8), tmp_path=tmp_path)
    assert hidden.status == Status.WARN


def test_unreadable_field_is_named_by_the_check_that_needs_it(tmp_path):
    text = read(H100_Q).replace("Pending                           : No", "Pending                           : ERR!", 1)
    files = healthy_node() | {"nvidia-smi-q.txt": text}
    report = evaluate(load_snapshot(write_snapshot(tmp_path, files)), only=["gpu"])
    by_name = {c.name: c for c in report.checks}
    assert (by_name["gpu.row_remap"].status, by_name["gpu.row_remap"].reason) == (
        Status.UNKNOWN, "GPU 0 (00000000:18:00.0): Remapped Rows/Pending not reported ('ERR!'): not judged")
    assert by_name["gpu.ecc"].status == Status.OK and by_name["gpu.count"].status == Status.OK


GRAY = "recorded/h100-vm-2026-11-23-gray/"


def test_compute_apps_parse():
    (app,) = parse_compute_apps(read(GRAY + "nvidia-smi-compute-apps.csv"))
    assert (app.gpu_uuid, app.pid, app.used_memory_mib, app.name) == (
        "GPU-e3c17299-de0a-7645-af44-295c757a41b3", 587, 1542, "python3")
    assert parse_compute_apps(NO_COMPUTE_APPS) == ()
    # the recorded row with a name that has ", " in it and memory the driver cannot tell: the
    # name comes last, so it stays whole
    (odd,) = parse_compute_apps(NO_COMPUTE_APPS + "GPU-e3c17299-de0a-7645-af44-295c757a41b3, 587, [N/A], "
                                                  "python3, -m, vllm\n")
    assert (odd.used_memory_mib, odd.name) == (None, "python3, -m, vllm")
    with pytest.raises(ParseError, match="header"):     # other fields: a different query
        parse_compute_apps(read(GRAY + "compute-apps-busy-busid.csv"))


def test_processes_on_a_gpu_fail_the_gate_and_warn_in_sweeps(tmp_path):
    """Recorded on the lent H100 while a Python process held a CUDA context (-q -x at the same moment)."""
    files = {"meta.json": json.dumps(META), "nvidia-smi-q.xml": read(GRAY + "nvidia-smi-q.xml"),
             "nvidia-smi-compute-apps.csv": read(GRAY + "nvidia-smi-compute-apps.csv")}
    sweep = check(files, "gpu.processes", tmp_path=tmp_path)
    assert (sweep.status, sweep.reason) == (Status.WARN, "1 process(es) already on the GPUs: GPU 0: pid 587 python3, "
                                                         "1542 MiB")
    gate = check(files, "gpu.processes", NodeExpectations(gpu_processes_fail=True), tmp_path=tmp_path)
    assert gate.status == Status.FAIL
    assert check(healthy_node(), "gpu.processes", tmp_path=tmp_path).status == Status.OK


def recorded_pci(text: str) -> dict[str, str]:
    """pci-nvidia.txt (`PATH<TAB>contents` lines) back into snapshot files."""
    return {line.split("\t")[0].lstrip("/"): line.split("\t")[1] + "\n"
            for line in text.splitlines() if "\t" in line}


def test_recorded_h100_sees_its_gpu_at_full_pcie_link(tmp_path):
    files = {"meta.json": json.dumps(META), "nvidia-smi-q.xml": read(GRAY + "nvidia-smi-q.xml"),
             **recorded_pci(read(GRAY + "pci-nvidia.txt"))}
    visible = check(files, "gpu.visible", tmp_path=tmp_path)
    assert (visible.status, visible.reason) == (Status.OK, "1 GPU(s) listed, 1 on the PCI bus")
    links = check(files, "pcie.links", tmp_path=tmp_path)
    assert (links.status, links.details["links"]) == (Status.OK, [
        {"device": "GPU 0 (0000:00:06.0)", "speed_gts": 32.0, "max_speed_gts": 32.0, "width": 16, "max_width": 16}])


# ---------------------------------------------------------------- 5. versions, the odd node out

def test_node_versions_and_site_pins(tmp_path):
    host = HOST | {"software": {"kernel": "5.15.0-112-generic", "torch": "2.13.0", "nccl": "2.28.9"}}
    files = healthy_node() | {"host.json": json.dumps(host), "sys/class/infiniband/mlx5_0/fw_ver": "28.39.1002\n",
                              "sys/class/infiniband/mlx5_0/hca_type": "MT4129\n",
                              "sys/module/mlx5_core/version": "24.10-1.1.4\n"}
    result = check(files, "node.versions", tmp_path=tmp_path)
    assert result.details["versions"] == {
        "cuda": "12.7", "driver": "565.57.01", "hca_firmware MT4129": "28.39.1002", "kernel": "5.15.0-112-generic",
        "nccl": "2.28.9", "ofed": "24.10-1.1.4", "torch": "2.13.0", "vbios": "96.00.74.00.01"}
    assert result.status == Status.OK
    pinned = check(files, "node.versions", NodeExpectations(pinned_versions={"driver": "570.86.15", "nccl": "2.28.9"}),
                   tmp_path=tmp_path)
    assert (pinned.status, pinned.reason) == (Status.FAIL, "driver 565.57.01, the site pins 570.86.15")
    # a second adapter of the same model on older firmware
    files |= {"sys/class/infiniband/mlx5_1/fw_ver": "28.36.1010\n", "sys/class/infiniband/mlx5_1/hca_type": "MT4129\n"}
    mixed = check(files, "node.versions", tmp_path=tmp_path)
    assert (mixed.status, mixed.reason) == (
        Status.WARN, "hca_firmware MT4129 differs within this node: 28.36.1010, 28.39.1002")


def test_odd_node_out_against_the_majority():
    base = {"driver": "565.57.01", "nccl": "2.21.5", "hca_firmware MT4129": "28.39.1002"}
    nodes = {f"node{i}": dict(base) for i in range(1, 6)}
    nodes["node3"]["driver"] = "560.35.03"
    nodes["node5"]["hca_firmware MT4129"] = "28.36.1010"
    odd = odd_nodes_out(nodes)
    assert [(o.host, o.describe()) for o in odd] == [
        ("node3", "driver 560.35.03, while 4 of 5 nodes have 565.57.01"),
        ("node5", "hca_firmware MT4129 28.36.1010, while 4 of 5 nodes have 28.39.1002")]
    # no strict majority (2 against 2), or fewer than 3 nodes: nobody is named
    assert odd_nodes_out({"a": {"nccl": "1"}, "b": {"nccl": "1"}, "c": {"nccl": "2"}, "d": {"nccl": "2"}}) == []
    assert odd_nodes_out({"a": {"nccl": "1"}, "b": {"nccl": "2"}}) == []


# ---------------------------------------------------------------- 7. DCGM

def test_dcgm_diag_parse_and_judge(tmp_path):
    tests = parsed("dcgm/gcm-dcgmi-diag-j-fail-persistence-mode.json")
    assert [(t.name, t.statuses) for t in tests if t.statuses != ("Pass",)] == [
        ("Persistence Mode", ("Fail",)), ("Environment Variables", ("Warn",))]
    enabled = NodeExpectations(dcgm_diag_level=1)
    files = {"meta.json": json.dumps(META), "dcgmi-diag.json": read("dcgm/gcm-dcgmi-diag-j-fail-persistence-mode.json")}
    failed = check(files, "dcgm.diag", enabled, tmp_path=tmp_path)
    assert (failed.status, failed.reason) == (
        Status.FAIL, "Deployment / Persistence Mode: Fail; Deployment / Environment Variables: Warn")
    files["dcgmi-diag.json"] = read("dcgm/gcm-dcgmi-diag-j-pass.json")
    passed = check(files, "dcgm.diag", enabled, tmp_path=tmp_path)
    assert (passed.status, passed.reason) == (Status.OK, "DCGM diag -r 1: all 9 tests passed")
    skipped = json.loads(read("dcgm/gcm-dcgmi-diag-j-pass.json"))
    skipped["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][8]["results"] = [{"status": "Skip"}]
    files["dcgmi-diag.json"] = json.dumps(skipped)
    not_passed = check(files, "dcgm.diag", enabled, tmp_path=tmp_path)
    assert (not_passed.status, not_passed.reason) == (Status.WARN,
                                                      "Deployment / Inforom: Skip (did not run: not a pass)")
    assert check(files, "dcgm.diag", tmp_path=tmp_path).reason == "skipped: the site does not enable DCGM diagnostics"


def test_dcgm_enabled_but_not_installed_or_failed(tmp_path):
    probe = {"command": ["dcgmi", "diag", "-r", "1", "-j"], "exit_code": None, "duration_s": 0.0,
             "timed_out": False, "missing": True, "error": "dcgmi: not found on PATH=/usr/bin", "stderr_tail": ""}
    files = {"meta.json": json.dumps(META | {"probes": {"dcgmi-diag.json": probe}})}
    enabled = NodeExpectations(dcgm_diag_level=1)
    assert check(files, "dcgm.diag", enabled, tmp_path=tmp_path).reason == "skipped: dcgmi is not installed on this node"
    probe |= {"missing": False, "timed_out": True, "error": "dcgmi: timed out after 20 s"}
    files = {"meta.json": json.dumps(META | {"probes": {"dcgmi-diag.json": probe}})}
    result = check(files, "dcgm.diag", enabled, tmp_path=tmp_path)
    assert (result.status, result.reason) == (Status.UNKNOWN,
                                              "dcgmi diag -r 1: not collected (dcgmi: timed out after 20 s)")


def test_pci_sysfs_rejects_damaged_values():
    with pytest.raises(ParseError, match="GT/s"):
        parse_pci_sysfs({"sys/bus/pci/devices/0000:01:00.0/current_link_speed": "fast\n"})
    assert parse_pci_sysfs({"x/0000:01:00.0/max_link_speed": "Unknown\n"})["0000:01:00.0"].max_speed_gts is None
