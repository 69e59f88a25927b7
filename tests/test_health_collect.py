"""The snapshot collector: real processes, real timeouts, recorded outputs as probe binaries."""

import json
import os
import time

from trainctl.health.collect import PROBES, binary_paths, collect_snapshot, copy_sysfs

from support.replay import RECORDED, LIBRARY, write_replay

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
    # every nvidia-smi probe sleeps 1 s; run one after another they would take 5 s
    smi = nvidia_smi_replay(tmp_path / "bin", sleep_s=1)
    meta = collect_snapshot(tmp_path / "snap", binaries={"nvidia-smi": str(smi)}, timeout_s=20)
    slowest = max(p["duration_s"] for p in meta["probes"].values())
    nvidia_probes = sum(1 for p in PROBES if p.binary == "nvidia-smi")
    assert nvidia_probes == 5
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
    tree = json.loads((LIBRARY / "infiniband/sysfs/gcm-a100-8hca-ib4-operstate-down.json").read_text())
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
    wanted += [k for k in tree if k.endswith(("/hca_type", "/fw_ver"))]
    hca_devices = {k.split("/infiniband/")[0] for k in tree if "/infiniband/" in k}
    wanted += [k for k in tree if k.split("/net/")[0] in hca_devices and "/net/" in k
               and k.rsplit("/", 1)[-1] in ("operstate", "mtu", "dev_port")]
    port_netdev = snap / "sys/class/infiniband/mlx5_2/device/net/ib2/operstate"
    assert port_netdev.read_text() == tree["/sys/bus/pci/devices/0000:4b:00.0/net/ib2/operstate"]
    assert copied == len(wanted)


def test_cpu_siblings_are_copied_from_a_real_sysfs_dump(tmp_path):
    """The util-linux dump of a 4-socket X7550 (siblings 0,32) as the sysfs root."""
    import tarfile

    from trainctl.health.parse.cpu_siblings import parse_thread_siblings
    from trainctl.health.snapshot import load_snapshot

    dump = LIBRARY / "cpu" / "sysfs-dumps" / "utillinux-dump-xeon-x7550-4socket-thread-siblings-split-0-32.tar.gz"
    with tarfile.open(dump) as archive:
        cpu_tree = [m for m in archive.getmembers() if m.name.endswith("/topology/thread_siblings_list")]
        archive.extractall(tmp_path / "root", members=cpu_tree, filter="data")
    snap = tmp_path / "snap"
    copy_sysfs(tmp_path / "root" / "x86_64-64cpu", snap)
    assert (snap / "sys/devices/system/cpu/cpu32/topology/thread_siblings_list").read_text().strip() == "0,32"
    cores = parse_thread_siblings(load_snapshot(snap).files)
    assert len(cores) == 32 and cores[0] == {0, 32}


def test_sysfs_copy_takes_counters_pci_links_and_versions(tmp_path):
    """Real file contents (node_exporter's i40iw/mlx4 tree, its NVMe link figures) at the paths
    the collector walks; the NVMe device's vendor file is rewritten to NVIDIA's id so that it
    counts as a GPU's PCI device, and a uevent names it as mlx4_0's device."""
    from trainctl.health.parse.sysfs import parse_ttar

    root = tmp_path / "root"
    ib = parse_ttar((LIBRARY / "infiniband/sysfs/node-exporter-i40iw-no-pma-and-mlx4-class-infiniband.ttar")
                    .read_text() + "Mode: 644\n")
    pci = parse_ttar((LIBRARY / "pcie/node-exporter-sysfs-nvme-current-8GTs-max-16GTs-aer-counters.ttar")
                     .read_text())
    for path, text in {**ib, **pci}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    device = root / "sys/devices/pci0000:00/0000:00:02.1/0000:01:00.0"
    (device / "vendor").write_text("0x10de\n")
    (device / "uevent").write_text("DRIVER=mlx4_core\nPCI_SLOT_NAME=0000:01:00.0\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "sys/bus/pci/devices/0000:01:00.0").symlink_to(device)
    (root / "sys/class/infiniband/mlx4_0/device").symlink_to(device)
    (root / "sys/module/mlx5_core").mkdir(parents=True)
    (root / "sys/module/mlx5_core/version").write_text("24.10-1.1.4\n")
    snap = tmp_path / "snap"
    copy_sysfs(root, snap)
    assert (snap / "sys/class/infiniband/mlx4_0/ports/1/counters/port_xmit_discards").read_text() == "5\n"
    assert (snap / "sys/class/infiniband/i40iw0/ports/1/counters/link_downed").read_text() == "N/A (no PMA)\n"
    assert not (snap / "sys/class/infiniband/mlx4_0/ports/1/counters/port_rcv_data").exists()
    assert (snap / "sys/class/infiniband/mlx4_0/fw_ver").read_text() == "2.31.5050\n"
    assert (snap / "sys/class/infiniband/mlx4_0/device/uevent").exists()
    link = snap / "sys/bus/pci/devices/0000:01:00.0"
    assert (link / "current_link_speed").read_text() == "8.0 GT/s PCIe\n"
    assert (link / "max_link_speed").read_text() == "16.0 GT/s PCIe\n"
    assert not (link / "aer_dev_fatal").exists()
    assert (snap / "sys/module/mlx5_core/version").read_text() == "24.10-1.1.4\n"
