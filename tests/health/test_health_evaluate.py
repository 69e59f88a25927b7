"""The registry and the node verdict over snapshot directories written from recorded outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from health_fixtures import read

from trainctl.errors import UsageError
from trainctl.health.evaluate import evaluate
from trainctl.health.expectations import NodeExpectations
from trainctl.health.registry import all_checks, select_checks
from trainctl.health.snapshot import INPUTS, load_snapshot
from trainctl.health.status import CheckResult, NodeReport, Status

CHECKS = ["dcgm.diag", "gpu.clock_events", "gpu.count", "gpu.ecc", "gpu.fabric", "gpu.model",
          "gpu.persistence", "gpu.processes", "gpu.reset", "gpu.row_remap", "gpu.smi", "gpu.visible", "gpu.xid",
          "host.cpus", "host.defunct", "host.disk", "host.load", "host.memory", "host.shm", "ib.counters",
          "ib.mtu", "ib.netdev", "ib.ports", "net.links", "net.mtu", "node.versions", "nvlink.counters",
          "nvlink.links", "nvlink.topology", "nvswitch.sxid", "pcie.links", "topo.affinity"]
# `--query-compute-apps` with no process prints its header alone (recorded on the lent H100)
NO_COMPUTE_APPS = read("recorded/h100-vm-2026-11-23-gray/nvidia-smi-compute-apps-idle.csv")
META = {"host": "node2", "collected_at": "2025-02-23T16:31:00+00:00", "probes": {}}
HOST = {"memory": {"total_bytes": 2 << 40, "available_bytes": 1 << 40}, "load_avg": [4.0, 3.0, 2.0],
        "cpu_count": 224, "boot_time": "2025-02-20T08:00:00+00:00", "defunct_processes": [],
        "disks": [{"path": "/dev/shm", "total_bytes": 1 << 40, "free_bytes": 1 << 40},
                  {"path": "/", "total_bytes": 1 << 40, "free_bytes": 1 << 39}]}


def write_snapshot(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def gcm_sysfs_as_class_view(name: str) -> dict[str, str]:
    """gcm's PCI-device-view record rewritten to the snapshot's sys/class paths."""
    record = json.loads(read("infiniband/sysfs/" + name))
    files = {}
    for path, text in record.items():
        ib = re.fullmatch(r"/sys/bus/pci/devices/[^/]+/infiniband/([^/]+)/ports/(\d+)/(\w+)", path)
        if ib and ib[3] in ("state", "phys_state", "rate", "link_layer"):
            files[f"sys/class/infiniband/{ib[1]}/ports/{ib[2]}/{ib[3]}"] = text
    for path, text in record.items():
        net = re.fullmatch(r"(/sys/bus/pci/devices/[^/]+)/net/([^/]+)/(operstate|mtu|speed|dev_port)", path)
        if net:
            hca = next(p.split("/")[7] for p in record if p.startswith(net[1] + "/infiniband/"))
            files[f"sys/class/infiniband/{hca}/device/net/{net[2]}/{net[3]}"] = text
            files[f"sys/class/net/{net[2]}/{net[3]}"] = text
    return files


def healthy_node() -> dict[str, str]:
    """A node put together from healthy recorded outputs (of several machines)."""
    return {
        "meta.json": json.dumps(META), "host.json": json.dumps(HOST),
        "nvidia-smi-topo-m.txt": read("nvidia-smi/topo/h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"),
        "nvidia-smi-nvlink-s.txt": read("nvidia-smi/nvlink/h200-1gpu-18links-nvlink-s.txt"),
        "nvidia-smi-q.txt": read("nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt"),
        "ibstat.txt": read("infiniband/ibstat/gpud-a100-9hca-cx6-hdr200-all-active.txt"),
        "ibv_devinfo.txt": read("infiniband/ibv_devinfo/fdr-mlx4-2hca-port2-down.txt"),
        "ip-link.json": json.dumps(
            json.loads(read("net/gcm-ip-j-link-bond-mtu9192-healthy.json"))["intf_status"]),
        "lscpu.txt": read("cpu/utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt"),
        "dmesg.txt": read("recorded/h100-vm-2026-11-22/dmesg.txt"),
        "nvidia-smi-nvlink-e.txt": read("recorded/h100-vm-2026-11-22/nvidia-smi-nvlink-e.txt"),
        "nvidia-smi-compute-apps.csv": NO_COMPUTE_APPS,
        "perfquery.txt": read("infiniband/perfquery/treydock-perfquery-x-switch-2ports-healthy.txt"),
        **gcm_sysfs_as_class_view("gcm-a100-8hca-hdr200-healthy.json"),
        **gpu_pci_links(read("nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt")),
    }


def gpu_pci_links(smi_text: str, speed: str = "32.0 GT/s PCIe", width: str = "16") -> dict[str, str]:
    """sysfs PCI files for each GPU of an -q output: the H100's Gen5 x16 of the gpud lspci capture,
    written as sysfs writes them (node_exporter's fixture shows the format)."""
    files = {}
    for bus_id in re.findall(r"^GPU ([0-9A-F:.]+)$", smi_text, re.MULTILINE):
        address = bus_id.lower()[4:]
        for attr, value in (("vendor", "0x10de"), ("class", "0x030200"), ("current_link_speed", speed),
                            ("max_link_speed", "32.0 GT/s PCIe"), ("current_link_width", width),
                            ("max_link_width", "16")):
            files[f"sys/bus/pci/devices/{address}/{attr}"] = value + "\n"
    return files


def test_registry_lists_every_check_with_a_description_and_its_files():
    specs = all_checks()
    assert [s.name for s in specs] == CHECKS
    layout_files = {source.name for sources in INPUTS.values() for source in sources}
    for spec in specs:
        assert spec.description and "\n" not in spec.description and len(spec.description) < 140
        assert spec.files and set(spec.files) <= layout_files


def test_healthy_node_passes_every_check(tmp_path):
    report = evaluate(load_snapshot(write_snapshot(tmp_path, healthy_node())))
    assert report.host == "node2"
    assert [(c.name, c.status) for c in report.checks] == [(name, Status.OK) for name in CHECKS]
    assert report.status == Status.OK
    assert report.checks[CHECKS.index("ib.netdev")].reason == "8 HCA interface(s) up"


def test_node_with_an_inactive_nvlink_fails_naming_gpu(tmp_path):
    files = healthy_node() | {"nvidia-smi-nvlink-s.txt":
                              read("nvidia-smi/nvlink/azure-a100-sxm4-80gb-all-links-inactive.txt")}
    report = evaluate(load_snapshot(write_snapshot(tmp_path, files)))
    assert report.status == Status.FAIL
    failed = [c for c in report.checks if c.status != Status.OK]
    assert [(c.name, c.reason) for c in failed] == [
        ("nvlink.links", "GPU 6 (NVIDIA A100-SXM4-80GB): all NVLinks inactive")]
    as_json = report.to_json()
    assert (as_json["host"], as_json["status"]) == ("node2", "fail")
    assert as_json["checks"][CHECKS.index("nvlink.links")] == {
        "name": "nvlink.links", "status": "fail",
        "reason": "GPU 6 (NVIDIA A100-SXM4-80GB): all NVLinks inactive",
        "details": {"gpus": [{"index": 6, "state": "all_inactive", "link_speeds_gbps": []}],
                    "reference_speed_gbps": None}}
    json.dumps(as_json)     # serialisable as it stands


def test_ib_interface_down_in_the_snapshot_sysfs_fails(tmp_path):
    files = {k: v for k, v in healthy_node().items() if not k.startswith("sys/")}
    files |= gcm_sysfs_as_class_view("gcm-a100-8hca-ib4-operstate-down.json")
    report = evaluate(load_snapshot(write_snapshot(tmp_path, files)), only=["ib"])
    assert {c.name: (c.status, c.reason) for c in report.checks}["ib.netdev"] == (
        Status.FAIL, "mlx5_6 port 1 is Active but its interface ib4 is down")


def test_missing_files_are_unknown_and_say_why(tmp_path):
    meta = META | {"probes": {"nvidia-smi-q.xml": {
        "command": ["nvidia-smi", "-q", "-x"], "exit_code": None, "duration_s": 20.0, "timed_out": True,
        "missing": False, "error": "nvidia-smi: timed out after 20 s", "stderr_tail": ""}}}
    report = evaluate(load_snapshot(write_snapshot(tmp_path, {"meta.json": json.dumps(meta)})),
                      only=["gpu.count", "nvlink.links"])
    assert [(c.status, c.reason) for c in report.checks] == [
        (Status.UNKNOWN,
         "not collected: nvidia-smi-q.xml (nvidia-smi: timed out after 20 s); nvidia-smi-q.txt"),
        (Status.UNKNOWN, "not collected: nvidia-smi-nvlink-s.txt")]
    assert report.status == Status.UNKNOWN and report.status.exit_code == 3


def test_unreadable_input_is_unknown_naming_file_and_line(tmp_path):
    files = healthy_node() | {"nvidia-smi-topo-m.txt": read(
        "nvidia-smi/topo/h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt").replace("NV18", "NV?", 1)}
    report = evaluate(load_snapshot(write_snapshot(tmp_path, files)), only=["topo", "nvlink"])
    by_name = {c.name: c for c in report.checks}
    assert by_name["topo.affinity"].status == Status.UNKNOWN
    assert by_name["topo.affinity"].reason == (
        "unreadable: nvidia-smi-topo-m.txt:2: unknown link 'NV?' between GPU0 and GPU1")
    assert by_name["nvlink.links"].status == Status.OK


def test_unreadable_optional_input_is_named_and_the_check_judges_its_own_input(tmp_path):
    files = healthy_node() | {"meta.json": "{not json"}
    (xid,) = evaluate(load_snapshot(write_snapshot(tmp_path, files)), only=["gpu.xid"]).checks
    assert xid.status == Status.OK and xid.reason == "no Xid events since boot"
    assert xid.details["unreadable_inputs"] == {
        "meta": "unreadable: meta.json:1: not JSON: Expecting property name enclosed in double quotes"}


# Real text, from https://github.com/cpnr/computing/issues/73 (a node whose driver stopped
# answering). Its exit status (9: driver not loaded) is from nvidia-smi(1), RETURN VALUE; no
# recording of which stream nvidia-smi writes it to was found, so it is on stderr here.
SMI_NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                 "Make sure that the latest NVIDIA driver is installed and running.")
XID94_LOG = "kernel/xid/lambda-syslog-a100-xid63-xid64-xid94-contained-sm.txt"


def failed_smi_meta(exit_code: int, stderr: str, stdout_bytes: int = 0) -> str:
    error = f"nvidia-smi exited with status {exit_code}: {stderr}" if exit_code else None
    return json.dumps(META | {"probes": {"nvidia-smi-q.xml": {
        "command": ["nvidia-smi", "-q", "-x"], "exit_code": exit_code, "duration_s": 0.1, "timed_out": False,
        "error": error, "stderr_tail": stderr + "\n", "stdout_bytes": stdout_bytes, "truncated": False}}})


def test_failed_nvidia_smi_hides_neither_itself_nor_the_kernel_logs_xid(tmp_path):
    files = {k: v for k, v in healthy_node().items() if k != "nvidia-smi-q.txt"}
    files |= {"meta.json": failed_smi_meta(9, SMI_NO_DRIVER), "nvidia-smi-q.xml": "", "dmesg.txt": read(XID94_LOG)}
    report = evaluate(load_snapshot(write_snapshot(tmp_path, files)), only=["gpu"])
    by_name = {c.name: c for c in report.checks}
    assert report.status == Status.FAIL and report.status.exit_code == 2
    xid = by_name["gpu.xid"]
    assert xid.status == Status.FAIL
    # judged from the kernel log alone: the GPU is named by its PCI address
    assert "Xid 94 (Contained ECC error" in xid.reason and "on the GPU at PCI 0000:0b:00" in xid.reason
    assert xid.details["unreadable_inputs"]["smi"].startswith("unreadable: nvidia-smi-q.xml:1: malformed XML")
    smi = by_name["gpu.smi"]
    assert smi.status == Status.FAIL
    assert smi.reason == (f"nvidia-smi -q -x failed: nvidia-smi exited with status 9: {SMI_NO_DRIVER} "
                          "(status 9: the NVIDIA driver is not loaded)")
    assert smi.details["exit_code"] == 9 and SMI_NO_DRIVER in smi.details["stderr_tail"]
    # the checks that need the GPUs' answers cannot decide, and say why
    count = by_name["gpu.count"]
    assert count.status == Status.UNKNOWN
    assert count.reason.endswith(f"(nvidia-smi exited with status 9: {SMI_NO_DRIVER})")


def test_nvidia_smi_that_exits_0_with_no_output_fails(tmp_path):
    files = healthy_node() | {"meta.json": failed_smi_meta(0, ""), "nvidia-smi-q.xml": ""}
    (smi,) = evaluate(load_snapshot(write_snapshot(tmp_path, files)), only=["gpu.smi"]).checks
    assert (smi.status, smi.reason) == (Status.FAIL, "nvidia-smi -q -x exited 0 but printed nothing")


def test_nvidia_smi_judged_only_from_what_meta_recorded(tmp_path):
    (smi,) = evaluate(load_snapshot(write_snapshot(tmp_path, healthy_node())), only=["gpu.smi"]).checks
    assert smi.status == Status.OK and smi.details == {"recorded": False}


def test_site_without_gpus_or_ib_skips_those_checks(tmp_path):
    files = {"meta.json": json.dumps(META), "host.json": json.dumps(HOST)}
    report = evaluate(load_snapshot(write_snapshot(tmp_path, files)), NodeExpectations(gpus=0, ib_ports=()),
                      only=["gpu", "nvlink", "nvswitch", "topo", "ib", "host.memory"])
    assert all(c.status == Status.OK for c in report.checks)
    assert {c.name for c in report.checks if c.details.get("skipped")} == {
        n for n in CHECKS if n.split(".")[0] in ("gpu", "nvlink", "nvswitch", "topo", "ib")}
    assert report.checks[0].reason == "skipped: the site expects no gpu on this node"


def test_host_name_falls_back_to_the_directory(tmp_path):
    lscpu = read("cpu/xeon-e5-2695v4-2socket-lscpu-old-format.txt")
    snapshot = write_snapshot(tmp_path / "node7", {"lscpu.txt": lscpu})
    report = evaluate(load_snapshot(snapshot), only=["host.cpus"])
    assert (report.host, report.status) == ("node7", Status.OK)


def test_only_takes_names_and_families():
    assert [s.name for s in select_checks(["ib", "gpu.xid"])] == [
        "gpu.xid", "ib.counters", "ib.mtu", "ib.netdev", "ib.ports"]
    with pytest.raises(UsageError, match="unknown check\\(s\\): gpu.bogus"):
        select_checks(["gpu.bogus"])


def test_load_snapshot_reads_files_and_rejects_a_missing_directory(tmp_path):
    snapshot = load_snapshot(write_snapshot(tmp_path, {"sys/class/net/eth0/mtu": "9000\n", "lscpu.txt": "x"}))
    assert dict(snapshot.files) == {"lscpu.txt": "x", "sys/class/net/eth0/mtu": "9000\n"}
    with pytest.raises(UsageError, match="not found"):
        load_snapshot(tmp_path / "nope")


def test_node_status_is_the_worst_check_and_the_exit_code():
    def report(*statuses):
        return NodeReport("n", tuple(CheckResult(f"c{i}", s, "") for i, s in enumerate(statuses)))
    assert report(Status.OK, Status.WARN).status == Status.WARN
    assert report(Status.FAIL, Status.WARN, Status.OK).status == Status.FAIL
    # a failure is a fact about the node; a check that could not decide must not hide it
    assert report(Status.FAIL, Status.UNKNOWN).status == Status.FAIL
    assert report(Status.UNKNOWN, Status.WARN, Status.OK).status == Status.UNKNOWN
    assert report().status == Status.UNKNOWN
    assert sorted(Status) == [Status.OK, Status.WARN, Status.UNKNOWN, Status.FAIL]
    assert {s.label: s.exit_code for s in Status} == {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
    assert Status("warn") is Status.WARN
