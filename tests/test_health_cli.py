"""`trainctl health check/list` and `trainctl topo` as users run them: real processes, real exits."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.replay import RECORDED, LIBRARY, write_replay
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NVLINK = LIBRARY / "nvidia-smi" / "nvlink"
HEALTHY_NVLINK = NVLINK / "h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
# a V100 with links 3 and 5 inactive, from a public issue report (tests/health/fixtures/README.md)
INACTIVE_LINKS = Path(__file__).parent / "health/fixtures/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt"


def trainctl(*args, env=None, timeout=60):
    return subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_check_on_a_recorded_snapshot_prints_json_and_exits_with_the_node_status():
    out = trainctl("health", "check", "--snapshot", str(RECORDED / "h100-vm-2026-11-22"), "--only", "gpu,nvlink",
                   "--json")
    report = json.loads(out.stdout)
    # the recording predates the compute-apps probe: that one check cannot decide, all others pass
    assert out.returncode == 3, out.stderr
    assert {c["name"]: c["reason"] for c in report["checks"] if c["status"] != "ok"} == {
        "gpu.processes": "not collected: nvidia-smi-compute-apps.csv"}
    names = {c["name"] for c in report["checks"]}
    assert {"gpu.ecc", "gpu.xid", "nvlink.links", "nvlink.topology"} <= names
    assert all(not n.startswith(("host.", "ib.")) for n in names)


def test_site_expectation_turns_a_recording_into_a_failure(tmp_path):
    # the recorded H100 VM has one GPU and no NVLink; the DGX site expects eight
    out = trainctl("health", "check", "--snapshot", str(RECORDED / "h100-vm-2026-11-22"), "--site", "dgx-h100",
                   "--only", "gpu.count", "--json")
    assert out.returncode == 2
    (result,) = json.loads(out.stdout)["checks"]
    assert result["status"] == "fail" and "8" in result["reason"]


def test_a_failing_check_beside_unknown_ones_makes_the_node_fail_exit_2(tmp_path):
    # ibstat with Down/Disabled ports; nothing else collected, so the GPU checks cannot decide
    ibstat = LIBRARY / "infiniband/ibstat/gpud-h100-12hca-roce-eth-400-some-down-disabled.txt"
    (tmp_path / "ibstat.txt").write_bytes(ibstat.read_bytes())
    out = trainctl("health", "check", "--snapshot", str(tmp_path), "--only", "ib.ports,gpu", "--json")
    report = json.loads(out.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["ib.ports"] == "fail" and statuses["gpu.count"] == "unknown"
    assert (report["status"], out.returncode) == ("fail", 2)


def test_nvidia_smi_that_fails_is_a_failure_and_the_kernel_logs_xid_still_counts(tmp_path):
    # nvidia-smi stand-in: the real message of a node whose driver stopped answering
    # (github.com/cpnr/computing/issues/73), exit 9 as nvidia-smi(1) documents; dmesg: a real
    # log with an Xid 94
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho \"{message}\" >&2\nexit 9\n")
    dmesg = tmp_path / "dmesg"
    xid_log = LIBRARY / "kernel/xid/lambda-syslog-a100-xid63-xid64-xid94-contained-sm.txt"
    dmesg.write_text(f"#!/bin/sh\ncat {xid_log}\n")
    smi.chmod(0o755)
    dmesg.chmod(0o755)
    out = trainctl("health", "check", "--only", "gpu", "--json",
                   env={"TRAINCTL_BIN_NVIDIA_SMI": str(smi), "TRAINCTL_BIN_DMESG": str(dmesg)})
    report = json.loads(out.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert (report["status"], out.returncode) == ("fail", 2)
    assert by_name["gpu.smi"]["status"] == "fail" and "status 9" in by_name["gpu.smi"]["reason"]
    assert message in by_name["gpu.smi"]["reason"]
    assert by_name["gpu.xid"]["status"] == "fail"
    assert "Xid 94" in by_name["gpu.xid"]["reason"] and "PCI 0000:0b:00" in by_name["gpu.xid"]["reason"]
    assert by_name["gpu.count"]["status"] == "unknown"


def test_hung_nvidia_smi_is_a_timed_out_check_not_a_hang(tmp_path):
    smi = write_replay(tmp_path / "bin", "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK}, sleep_s=60)
    start = time.monotonic()
    out = trainctl("health", "check", "--only", "nvlink.links", "--timeout", "2", "--json",
                   env={"TRAINCTL_BIN_NVIDIA_SMI": str(smi)})
    elapsed = time.monotonic() - start
    (result,) = json.loads(out.stdout)["checks"]
    assert result["status"] == "unknown"
    assert f"{smi}: timed out after 2 s" in result["reason"]
    assert out.returncode == 3
    assert elapsed < 2 + 2 + 1.5  # the probe's timeout, the allowance, and interpreter start-up


def test_missing_binary_names_it_and_the_path(tmp_path):
    out = trainctl("health", "check", "--only", "nvlink.links", "--json",
                   env={"TRAINCTL_BIN_NVIDIA_SMI": "nvidia-smi-not-here", "PATH": f"{tmp_path}:/usr/bin:/bin"})
    (result,) = json.loads(out.stdout)["checks"]
    assert result["status"] == "unknown"
    assert "(nvidia-smi-not-here not found)" in result["reason"]
    # The PATH searched is said once, on stderr, not in every check that needed the probe.
    (line,) = out.stderr.splitlines()
    assert line.startswith("trainctl: probes not found: ") and "nvidia-smi-not-here" in line
    assert f"(looked on PATH={tmp_path}:/usr/bin:/bin)" in line


def test_unknown_check_name_is_a_usage_error():
    out = trainctl("health", "check", "--snapshot", str(RECORDED / "h100-vm-2026-11-22"), "--only", "gpu.nope")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "gpu.nope" in out.stderr


def test_list_names_every_registered_check():
    out = trainctl("health", "list", "--json")
    listed = json.loads(out.stdout)
    names = [c["name"] for c in listed]
    assert names == sorted(names) and len(names) >= 20
    assert all(c["description"] and c["files"] for c in listed)


def test_topo_json_from_a_snapshot(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "nvidia-smi-topo-m.txt").write_bytes(
        (LIBRARY / "nvidia-smi/topo/h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt").read_bytes())
    out = trainctl("topo", "--snapshot", str(snap), "--json")
    gpus = json.loads(out.stdout)["gpus"]
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[0] == {"index": 0, "cpu_affinity": "0-55,112-167", "numa_node": 0,
                       "nearest_nics": ["mlx5_0"], "nic_path": "PXB"}
    assert [g["nearest_nics"] for g in gpus[1:4]] == [["mlx5_3"], ["mlx5_4"], ["mlx5_5"]]


@pytest.mark.cluster
def test_srun_health_check_names_the_node_with_an_inactive_nvlink(devcluster):
    replays = {"node2": INACTIVE_LINKS}
    made = []
    for node in ("node1", "node2", "node3", "node4"):
        made.append(write_replay(devcluster.node_bin_dir(node), "nvidia-smi",
                                 {"nvlink -s": replays.get(node, HEALTHY_NVLINK)}))
    try:
        result = run(["srun", "-N4", "--ntasks-per-node=1", "-l", TRAINCTL, "health", "check",
                      "--site", "local-demo", "--json"], timeout=120, env=devcluster.client_env())
    finally:
        for script in made:
            script.unlink()
    reports = {}
    for line_group in _split_by_task(result.stdout).values():
        report = json.loads(line_group)
        reports[report["host"]] = report
    assert sorted(reports) == ["node1", "node2", "node3", "node4"]
    assert reports["node2"]["status"] == "fail"
    links = next(c for c in reports["node2"]["checks"] if c["name"] == "nvlink.links")
    assert links["status"] == "fail"
    assert links["reason"] == "GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive"
    for node in ("node1", "node3", "node4"):
        assert reports[node]["status"] == "ok", reports[node]


def _split_by_task(stdout: str) -> dict[str, str]:
    """`srun -l` prefixes each line with its task number; regroup each task's JSON."""
    tasks: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        task, _, text = line.partition(": ")
        tasks.setdefault(task.strip(), []).append(text)
    return {task: "\n".join(lines) for task, lines in tasks.items()}


def test_snapshot_that_trainctl_took_on_a_real_h100_judges_as_it_did_there():
    # `trainctl health snapshot` ran on a lent H100 VM with no InfiniBand; the snapshot predates
    # the PCIe link copies and the compute-apps probe, which are the only things it cannot tell
    out = trainctl("health", "check", "--snapshot", str(RECORDED / "h100-vm-2026-11-22-snapshot"), "--json")
    report = json.loads(out.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert report["host"] == "vm" and out.returncode == 3
    assert {name for name, status in statuses.items() if status != "ok"} == {"pcie.links", "gpu.processes"}
    reasons = {c["name"]: c["reason"] for c in report["checks"]}
    assert reasons["gpu.model"] == "GPU model: NVIDIA H100 80GB HBM3"
    assert reasons["ib.ports"] == "skipped: no InfiniBand device on this node"


def non_ib_gpu_node(tmp_path: Path) -> Path:
    """A whole snapshot of a healthy 1-GPU H100 VM without InfiniBand: the recorded snapshot, plus
    what the same VM shape's later lease recorded for the checks added since (the idle
    compute-apps query and the GPU's PCI link files). Every byte is recorded; only the
    assembling is staged."""
    snapshot = tmp_path / "h100-vm"
    shutil.copytree(RECORDED / "h100-vm-2026-11-22-snapshot", snapshot)
    gray = RECORDED / "h100-vm-2026-11-23-gray"
    shutil.copy(gray / "nvidia-smi-compute-apps-idle.csv", snapshot / "nvidia-smi-compute-apps.csv")
    for line in (gray / "pci-nvidia.txt").read_text().splitlines():
        if line.startswith("/sys/"):
            path, value = line.split("\t")
            (snapshot / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (snapshot / path.lstrip("/")).write_text(value + "\n")
    return snapshot


def test_a_healthy_gpu_node_without_infiniband_is_ok_with_no_site(tmp_path):
    out = trainctl("health", "check", "--snapshot", str(non_ib_gpu_node(tmp_path)), "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout
    assert report["status"] == "ok"
    ib = {c["name"]: c["reason"] for c in report["checks"] if c["name"].startswith("ib.")}
    assert set(ib) == {"ib.ports", "ib.netdev", "ib.mtu", "ib.counters"}
    assert set(ib.values()) == {"skipped: no InfiniBand device on this node"}


def test_no_infiniband_device_where_the_site_declares_hca_ports_is_a_failure(tmp_path):
    out = trainctl("health", "check", "--snapshot", str(non_ib_gpu_node(tmp_path)), "--site", "dgx-h100",
                   "--only", "ib", "--json")
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert out.returncode == 2
    assert {c["status"] for c in checks.values()} == {"fail"}
    assert "the driver did not load" in checks["ib.ports"]["reason"]
    assert "mlx5_0:1" in checks["ib.ports"]["reason"]


def test_a_snapshot_that_did_not_copy_sysfs_cannot_tell_whether_infiniband_is_there(tmp_path):
    snapshot = non_ib_gpu_node(tmp_path)
    meta = json.loads((snapshot / "meta.json").read_text())
    del meta["sysfs_files"]
    (snapshot / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(snapshot / "sys")
    out = trainctl("health", "check", "--snapshot", str(snapshot), "--only", "ib.ports", "--json")
    (check,) = json.loads(out.stdout)["checks"]
    assert out.returncode == 3 and check["status"] == "unknown"
    assert check["reason"].startswith("not collected")

def test_an_ib_tool_that_lists_ports_is_believed_over_an_empty_sysfs(tmp_path):
    # ibstat reads the devices the kernel knows: its recorded ports mean there is InfiniBand here
    snapshot = non_ib_gpu_node(tmp_path)
    shutil.copy(LIBRARY / "infiniband/ibstat/gpud-h100-12hca-roce-eth-400-some-down-disabled.txt",
                snapshot / "ibstat.txt")
    out = trainctl("health", "check", "--snapshot", str(snapshot), "--only", "ib.ports", "--json")
    (check,) = json.loads(out.stdout)["checks"]
    assert check["status"] == "fail" and "skipped" not in check["reason"]
