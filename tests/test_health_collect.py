"""The snapshot collector: real processes, real timeouts, recorded outputs as probe binaries."""

import json
import os
import time

from trainctl.health.collect import PROBES, binary_paths, collect_snapshot, copy_sysfs

from support.replay import RECORDED, SHARED_FIXTURES, write_replay

H100 = RECORDED / "h100-vm-2026-11-22"


def nvidia_smi_replay(bin_dir, **kwargs):
    return write_replay(bin_dir, "nvidia-smi", {
        "topo -m": H100 / "nvidia-smi-topo-m.txt",
        "nvlink -s": H100 / "nvidia-smi-nvlink-s.txt",
        "nvlink -e": H100 / "nvidia-smi-nvlink-e.txt",
        "-q -x": H100 / "nvidia-smi-q.xml",
    }, **kwargs)


def test_snapshot_holds_recorded_bytes_and_meta(tmp_path):
    smi = nvidia_smi_replay(tmp_path / "bin")
    meta = collect_snapshot(tmp_path / "snap", binaries={"nvidia-smi": str(smi)}, timeout_s=10)
    snap = tmp_path / "snap"
    assert (snap / "nvidia-smi-q.xml").read_bytes() == (H100 / "nvidia-smi-q.xml").read_bytes()
    assert (snap / "nvidia-smi-topo-m.txt").read_bytes() == (H100 / "nvidia-smi-topo-m.txt").read_bytes()
    on_disk = json.loads((snap / "meta.json").read_text())
    assert on_disk == meta
    record = meta["probes"]["nvidia-smi-topo-m.txt"]
    assert record["command"] == [str(smi), "topo", "-m"]
    assert record["exit_code"] == 0 and not record["timed_out"] and record["error"] is None
    host = json.loads((snap / "host.json").read_text())
    assert host["memory"]["available_bytes"] > 0
    assert any(d["path"] == "/dev/shm" for d in host["disks"])


def test_hung_probe_is_a_recorded_timeout_not_a_hang(tmp_path):
    smi = nvidia_smi_replay(tmp_path / "bin", sleep_s=60)
    start = time.monotonic()
    meta = collect_snapshot(tmp_path / "snap", binaries={"nvidia-smi": str(smi)}, timeout_s=2)
    elapsed = time.monotonic() - start
    assert elapsed < 2 + 2
    record = meta["probes"]["nvidia-smi-q.xml"]
    assert record["timed_out"] is True
    assert record["error"] == f"{smi}: timed out after 2 s"
    assert not (tmp_path / "snap" / "nvidia-smi-q.xml").exists()  # a partial output is no output


def test_missing_binary_names_the_binary_and_the_path_searched(tmp_path):
    meta = collect_snapshot(tmp_path / "snap", binaries={"ibstat": "ibstat-not-installed"},
                            env={"PATH": "/nonexistent/bin"}, timeout_s=5)
    record = meta["probes"]["ibstat.txt"]
    assert record["missing"] is True
    assert record["error"] == "ibstat-not-installed: not found on PATH=/nonexistent/bin"
    assert not (tmp_path / "snap" / "ibstat.txt").exists()


def test_probes_run_concurrently(tmp_path):
    # every nvidia-smi probe sleeps 1 s; run one after another they would take 4 s
    smi = nvidia_smi_replay(tmp_path / "bin", sleep_s=1)
    meta = collect_snapshot(tmp_path / "snap", binaries={"nvidia-smi": str(smi)}, timeout_s=20)
    slowest = max(p["duration_s"] for p in meta["probes"].values())
    nvidia_probes = sum(1 for p in PROBES if p.binary == "nvidia-smi")
    assert nvidia_probes == 4
    assert meta["duration_s"] < 2 * slowest


def test_environment_overrides_site_paths(monkeypatch):
    paths = binary_paths({"nvidia-smi": "/site/nvidia-smi"},
                         environ={"TRAINCTL_BIN_NVIDIA_SMI": "/env/nvidia-smi"})
    assert paths["nvidia-smi"] == "/env/nvidia-smi"
    assert binary_paths({"nvidia-smi": "/site/nvidia-smi"}, environ={})["nvidia-smi"] == "/site/nvidia-smi"
    assert binary_paths(None, environ={})["ibv_devinfo"] == "ibv_devinfo"


def test_sysfs_copy_follows_class_links_and_keeps_class_paths(tmp_path):
    # gcm's recorded sysfs of a real A100 node (ib4 operstate down): device paths -> contents.
    # Rebuild it as sysfs is laid out: files under /sys/bus/pci/devices, reached through the
    # /sys/class/{infiniband,net} symlinks that the collector walks.
    tree = json.loads((SHARED_FIXTURES / "infiniband/sysfs/gcm-a100-8hca-ib4-operstate-down.json").read_text())
    root = tmp_path / "root"
    for path, contents in tree.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(contents)
    for device in (root / "sys/bus/pci/devices").iterdir():
        for kind in ("infiniband", "net"):
            for entry in (device / kind).glob("*") if (device / kind).is_dir() else ():
                link = root / "sys/class" / kind / entry.name
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(entry)
                if kind == "infiniband":
                    (entry / "device").symlink_to(device)  # as sysfs links an HCA to its PCI device
    snap = tmp_path / "snap"
    copied = copy_sysfs(root, snap)
    state = snap / "sys/class/infiniband/mlx5_2/ports/1/state"
    expected = tree["/sys/bus/pci/devices/0000:4b:00.0/infiniband/mlx5_2/ports/1/state"]
    assert state.read_text() == expected
    operstate = snap / "sys/class/net/ib2/operstate"
    assert operstate.read_text() == tree["/sys/bus/pci/devices/0000:4b:00.0/net/ib2/operstate"]
    wanted = [k for k in tree if k.rsplit("/", 1)[-1] in ("state", "phys_state", "rate", "link_layer")
              and "/ports/" in k]
    wanted += [k for k in tree if "/net/" in k and k.rsplit("/", 1)[-1] in ("mtu", "operstate", "speed", "type")]
    wanted += [k for k in tree if k.endswith("/hca_type")]
    hca_devices = {k.split("/infiniband/")[0] for k in tree if "/infiniband/" in k}
    wanted += [k for k in tree if k.split("/net/")[0] in hca_devices and "/net/" in k
               and k.rsplit("/", 1)[-1] in ("operstate", "mtu", "dev_port")]
    port_netdev = snap / "sys/class/infiniband/mlx5_2/device/net/ib2/operstate"
    assert port_netdev.read_text() == tree["/sys/bus/pci/devices/0000:4b:00.0/net/ib2/operstate"]
    assert copied == len(wanted)
