"""Collect a node's health snapshot: run every probe concurrently, each with its own timeout.

This is the only I/O half of the health checks. It writes a snapshot directory (the layout
in docs/reference/snapshot.md is a contract: tests and other tools write snapshots by hand) that the pure
parsers and checks read later. A probe that fails, hangs, floods its output, is missing or
cannot be executed is recorded in `meta.json`, never raised: a hung `nvidia-smi` becomes a
check result, not a hung sweep (`trainctl.proc.run` bounds each probe's time and output).
If collecting is interrupted (Ctrl-C, SIGTERM), every probe still running is killed before
the exception goes on.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from trainctl.errors import UsageError
from trainctl.health.parse.counters import IB_ERROR_COUNTERS
from trainctl.health.parse.cpu_siblings import SIBLINGS_GLOB
from trainctl.health.parse.gpu_apps import QUERY as COMPUTE_APPS_QUERY
from trainctl.health.parse.pcie import LINK_ATTRS, NVIDIA
from trainctl.proc import ProcResult, RunGroup, each_completed, run
from trainctl.signals import stop_deferred
from trainctl.slurm import this_node_name

SNAPSHOT_FORMAT = 1
DEFAULT_PROBE_TIMEOUT_S = 20.0
# TRAINCTL_BIN_NVIDIA_SMI=/opt/x/nvidia-smi points the `nvidia-smi` probes elsewhere.
BINARY_ENV_PREFIX = "TRAINCTL_BIN_"
STDERR_TAIL_CHARS = 500


@dataclass(frozen=True)
class Probe:
    output: str                 # file name inside the snapshot
    binary: str                 # logical name, the key for path overrides
    args: tuple[str, ...]
    fallback: "Probe | None" = None  # tried when the first command cannot run (dmesg restricted)


PROBES: tuple[Probe, ...] = (
    Probe("nvidia-smi-topo-m.txt", "nvidia-smi", ("topo", "-m")),
    Probe("nvidia-smi-nvlink-s.txt", "nvidia-smi", ("nvlink", "-s")),
    Probe("nvidia-smi-nvlink-e.txt", "nvidia-smi", ("nvlink", "-e")),
    Probe("nvidia-smi-q.xml", "nvidia-smi", ("-q", "-x")),
    Probe("ibstat.txt", "ibstat", ()),
    Probe("ibv_devinfo.txt", "ibv_devinfo", ("-v",)),
    Probe("ip-link.json", "ip", ("-j", "-d", "link")),
    Probe("lscpu.txt", "lscpu", ()),
    Probe("dmesg.txt", "dmesg", ("-T",),
          fallback=Probe("dmesg.txt", "journalctl", ("-k", "-b", "--no-pager"))),
    Probe("nvidia-smi-compute-apps.csv", "nvidia-smi", (f"--query-compute-apps={COMPUTE_APPS_QUERY}",
                                                        "--format=csv")),
)
DCGM_BINARY = "dcgmi"
NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def dcgm_probe(level: int) -> Probe:
    """`dcgmi diag -r LEVEL -j`, run only where the site enables it (it takes seconds to minutes)."""
    return Probe("dcgmi-diag.json", DCGM_BINARY, ("diag", "-r", str(level), "-j"))


# sysfs attributes copied under sys/ with their real paths (the layout in health/snapshot.py).
IB_PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
IB_HCA_ATTRS = ("hca_type", "fw_ver")
IB_HCA_DEVICE_ATTRS = ("uevent",)    # PCI_SLOT_NAME: the HCA's PCI address, for its link figures
PCI_ATTRS = ("vendor", "class", *LINK_ATTRS)
MODULE_VERSIONS = ("mlx5_core", "nvidia")   # sys/module/<m>/version: OFED's mlx5, the NVIDIA driver
IB_PORT_NETDEV_ATTRS = ("operstate", "mtu", "dev_port")  # ties an HCA port to its interface
NET_ATTRS = ("mtu", "operstate", "speed", "type")
CPU_TOPOLOGY_ATTRS = ("thread_siblings_list",)            # which CPUs share a core: rank binding


def binary_paths(overrides: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Logical binary name -> path; environment overrides site config, which overrides PATH."""
    paths = {probe.binary: probe.binary for probe in _all_probes()}
    paths[DCGM_BINARY] = DCGM_BINARY
    paths.update(overrides or {})
    for name in paths:
        env_value = environ.get(BINARY_ENV_PREFIX + name.upper().replace("-", "_"))
        if env_value:
            paths[name] = env_value
    return paths


def collect_snapshot(out_dir: str | Path, *, binaries: Mapping[str, str] | None = None,
                     timeout_s: float = DEFAULT_PROBE_TIMEOUT_S, sysfs_root: str | Path = "/",
                     disk_paths: tuple[str, ...] = ("/", "/tmp"),
                     env: Mapping[str, str] | None = None, dcgm_diag_level: int | None = None) -> dict:
    """Write a snapshot of this node into `out_dir`; return the meta record also saved as meta.json."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create snapshot directory {out}: {exc.strerror}") from exc
    paths = binary_paths(binaries, env if env is not None else os.environ)
    started = time.monotonic()
    # local time with its offset: `dmesg -T` prints local time, and Xid windows compare the two
    collected_at = datetime.datetime.now().astimezone()
    to_run = PROBES + ((dcgm_probe(dcgm_diag_level),) if dcgm_diag_level else ())
    pool = ThreadPoolExecutor(max_workers=len(to_run) + 1)
    probes = RunGroup()
    try:
        with stop_deferred():   # submit takes the pool's locks (see trainctl.signals)
            host_future = pool.submit(_host_facts, disk_paths)
            futures = [pool.submit(_run_probe, p, paths, timeout_s, env, probes) for p in to_run]
        for _ in each_completed([host_future, *futures]):  # all done, Ctrl-C seen while waiting
            pass
        results = [future.result() for future in futures]
        host = host_future.result()
    except BaseException:
        probes.abort()  # Ctrl-C or SIGTERM: no probe outlives us, and no thread waits for one
        raise
    finally:
        pool.shutdown(wait=True)
    probes_meta = {}
    for probe, result in results:
        probes_meta[probe.output] = _probe_record(result)
        if result.returncode is not None:   # it ran to completion, whatever its exit code
            (out / probe.output).write_text(result.stdout)
    (out / "host.json").write_text(json.dumps(host, indent=1) + "\n")
    sysfs_files = copy_sysfs(Path(sysfs_root), out)
    meta = {
        "format": SNAPSHOT_FORMAT,
        "host": this_node_name(),  # Slurm's name for it inside a job
        "collected_at": collected_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 3),
        "probe_timeout_s": timeout_s,
        "probes": probes_meta,
        "sysfs_files": sysfs_files,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def copy_sysfs(root: Path, out: Path) -> int:
    """Copy the IB port, netdev and CPU-sibling attributes that checks and binding read; return the count."""
    wanted = [(port, IB_PORT_ATTRS) for port in sorted(root.glob("sys/class/infiniband/*/ports/*"))]
    wanted += [(counters, IB_ERROR_COUNTERS)
               for counters in sorted(root.glob("sys/class/infiniband/*/ports/*/counters"))]
    wanted += [(device, IB_HCA_DEVICE_ATTRS) for device in sorted(root.glob("sys/class/infiniband/*/device"))]
    wanted += [(device, PCI_ATTRS) for device in _pci_devices_to_copy(root)]
    wanted += [(root / "sys/module" / module, ("version",)) for module in MODULE_VERSIONS]
    wanted += [(hca, IB_HCA_ATTRS) for hca in sorted(root.glob("sys/class/infiniband/*"))]
    wanted += [(netdev, IB_PORT_NETDEV_ATTRS)
               for netdev in sorted(root.glob("sys/class/infiniband/*/device/net/*"))]
    wanted += [(netdev, NET_ATTRS) for netdev in sorted(root.glob("sys/class/net/*"))]
    wanted += [(topology, CPU_TOPOLOGY_ATTRS) for topology in sorted(root.glob(SIBLINGS_GLOB))]
    return _copy_attrs(root, out, wanted)


def collect_counters(out_dir: str | Path, *, binaries: Mapping[str, str] | None = None,
                     timeout_s: float = DEFAULT_PROBE_TIMEOUT_S, sysfs_root: str | Path = "/",
                     env: Mapping[str, str] | None = None) -> None:
    """A second reading of the error counters alone (`nvidia-smi nvlink -e`, the IB port
    counters), as a snapshot directory: the gate's "after" around its fabric test."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    probe = next(p for p in PROBES if p.output == "nvidia-smi-nvlink-e.txt")
    paths = binary_paths(binaries, env if env is not None else os.environ)
    _, result = _run_probe(probe, paths, timeout_s, env, RunGroup())
    if not result.missing and not result.timed_out:
        (out / probe.output).write_text(result.stdout)
    root = Path(sysfs_root)
    _copy_attrs(root, out, [(counters, IB_ERROR_COUNTERS)
                            for counters in sorted(root.glob("sys/class/infiniband/*/ports/*/counters"))])
    meta = {"format": SNAPSHOT_FORMAT, "host": this_node_name(),
            "collected_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "probes": {probe.output: _probe_record(result)}}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def _copy_attrs(root: Path, out: Path, wanted: list[tuple[Path, tuple[str, ...]]]) -> int:
    copied = 0
    for directory, attrs in wanted:
        relative = directory.relative_to(root)
        for attr in attrs:
            try:
                value = (directory / attr).read_text()
            except OSError:  # e.g. `speed` of a down link reads as EINVAL
                continue
            target = out / relative / attr
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value)
            copied += 1
    return copied


def _pci_devices_to_copy(root: Path) -> list[Path]:
    """NVIDIA devices (GPUs: seeing every one, and their links) and the HCAs' PCI devices."""
    devices = set()
    for device in root.glob("sys/bus/pci/devices/*"):
        try:
            if int((device / "vendor").read_text().strip(), 16) == NVIDIA:
                devices.add(device)
        except (OSError, ValueError):
            continue
    for hca_device in root.glob("sys/class/infiniband/*/device"):
        devices.add(root / "sys/bus/pci/devices" / hca_device.resolve().name)
    return sorted(devices)


def _all_probes():
    for probe in PROBES:
        yield probe
        if probe.fallback:
            yield probe.fallback


def _run_probe(probe: Probe, paths: Mapping[str, str], timeout_s: float,
               env: Mapping[str, str] | None, group: RunGroup) -> tuple[Probe, ProcResult]:
    result = run([paths[probe.binary], *probe.args], timeout=timeout_s,
                 env=dict(env) if env is not None else None, group=group)
    if probe.fallback and (result.missing or result.exec_error or result.returncode not in (0, None)):
        fallback = run([paths[probe.fallback.binary], *probe.fallback.args], timeout=timeout_s,
                       env=dict(env) if env is not None else None, group=group)
        if fallback.ok:
            return probe.fallback, fallback
    return probe, result


def _probe_record(result: ProcResult) -> dict:
    return {
        "command": list(result.argv),
        "exit_code": result.returncode,
        "duration_s": round(result.duration_s, 3),
        "timed_out": result.timed_out,
        "missing": result.missing,
        "error": None if result.ok else result.describe_failure(),
        "stderr_tail": result.stderr[-STDERR_TAIL_CHARS:],
        "stdout_bytes": result.stdout_bytes,
        "truncated": result.truncated,
        "strays_killed": result.strays_killed,
    }


def _host_facts(disk_paths: tuple[str, ...]) -> dict:
    import psutil  # only on the node being checked; keeps login-node commands light

    memory = psutil.virtual_memory()
    facts = {
        "memory": {"total_bytes": memory.total, "available_bytes": memory.available},
        "load_avg": list(os.getloadavg()),
        "cpu_count": psutil.cpu_count(),
        "boot_time": datetime.datetime.fromtimestamp(psutil.boot_time(), datetime.timezone.utc)
        .isoformat(timespec="seconds"),
        "disks": [],
        "defunct_processes": [],
        "software": _software_versions(),
    }
    for path in ("/dev/shm", *disk_paths):
        try:
            usage = psutil.disk_usage(path)
        except OSError:
            continue
        facts["disks"].append({"path": path, "total_bytes": usage.total, "free_bytes": usage.free})
    for proc in psutil.process_iter(["pid", "ppid", "name", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            facts["defunct_processes"].append(
                {"pid": proc.info["pid"], "ppid": proc.info["ppid"], "name": proc.info["name"]})
    return facts


def _software_versions() -> dict[str, str]:
    """Kernel, torch and NCCL versions, for the odd-node-out comparison (no torch import: it is slow).

    NCCL is the `nvidia-nccl-cu*` wheel that torch's pip builds load; a torch built against another
    NCCL does not show here.
    """
    from importlib import metadata

    versions = {"kernel": platform.release()}
    for key, dists in (("torch", ("torch",)), ("nccl", NCCL_WHEELS)):
        for dist in dists:
            try:
                versions[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return versions
