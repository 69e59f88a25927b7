"""Collect a node's health snapshot: run every probe concurrently, each with its own timeout.

This is the only I/O half of the health checks. It writes a snapshot directory (the layout
in the README is a contract: tests and other tools write snapshots by hand) that the pure
parsers and checks read later. A probe that fails, hangs or is missing is recorded in
`meta.json`, never raised: a hung `nvidia-smi` becomes a check result, not a hung sweep.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from trainctl.errors import UsageError
from trainctl.proc import ProcResult, run

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
)

# sysfs attributes copied under sys/ with their real paths (the layout in health/snapshot.py).
IB_PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
IB_HCA_ATTRS = ("hca_type",)
IB_PORT_NETDEV_ATTRS = ("operstate", "mtu", "dev_port")  # ties an HCA port to its interface
NET_ATTRS = ("mtu", "operstate", "speed", "type")


def binary_paths(overrides: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Logical binary name -> path; environment overrides site config, which overrides PATH."""
    paths = {probe.binary: probe.binary for probe in _all_probes()}
    paths.update(overrides or {})
    for name in paths:
        env_value = environ.get(BINARY_ENV_PREFIX + name.upper().replace("-", "_"))
        if env_value:
            paths[name] = env_value
    return paths


def collect_snapshot(out_dir: str | Path, *, binaries: Mapping[str, str] | None = None,
                     timeout_s: float = DEFAULT_PROBE_TIMEOUT_S, sysfs_root: str | Path = "/",
                     disk_paths: tuple[str, ...] = ("/", "/tmp"),
                     env: Mapping[str, str] | None = None) -> dict:
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
    with ThreadPoolExecutor(max_workers=len(PROBES) + 1) as pool:
        host_future = pool.submit(_host_facts, disk_paths)
        results = list(pool.map(lambda p: _run_probe(p, paths, timeout_s, env), PROBES))
        host = host_future.result()
    probes_meta = {}
    for probe, result in results:
        probes_meta[probe.output] = _probe_record(result)
        if not result.missing and not result.timed_out:
            (out / probe.output).write_text(result.stdout)
    (out / "host.json").write_text(json.dumps(host, indent=1) + "\n")
    sysfs_files = copy_sysfs(Path(sysfs_root), out)
    meta = {
        "format": SNAPSHOT_FORMAT,
        "host": socket.gethostname(),
        "collected_at": collected_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 3),
        "probe_timeout_s": timeout_s,
        "probes": probes_meta,
        "sysfs_files": sysfs_files,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def copy_sysfs(root: Path, out: Path) -> int:
    """Copy the IB port and netdev attributes the checks read; return how many files were copied."""
    wanted = [(port, IB_PORT_ATTRS) for port in sorted(root.glob("sys/class/infiniband/*/ports/*"))]
    wanted += [(hca, IB_HCA_ATTRS) for hca in sorted(root.glob("sys/class/infiniband/*"))]
    wanted += [(netdev, IB_PORT_NETDEV_ATTRS)
               for netdev in sorted(root.glob("sys/class/infiniband/*/device/net/*"))]
    wanted += [(netdev, NET_ATTRS) for netdev in sorted(root.glob("sys/class/net/*"))]
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


def _all_probes():
    for probe in PROBES:
        yield probe
        if probe.fallback:
            yield probe.fallback


def _run_probe(probe: Probe, paths: Mapping[str, str], timeout_s: float,
               env: Mapping[str, str] | None) -> tuple[Probe, ProcResult]:
    result = run([paths[probe.binary], *probe.args], timeout=timeout_s,
                 env=dict(env) if env is not None else None)
    if probe.fallback and (result.missing or result.returncode not in (0, None)):
        fallback = run([paths[probe.fallback.binary], *probe.fallback.args], timeout=timeout_s,
                       env=dict(env) if env is not None else None)
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
