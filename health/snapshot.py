"""A snapshot directory, and the parsed inputs the checks take from it.

Layout (a contract: other tools and tests write snapshots by hand; a missing file means
"not collected"):

    meta.json                 host, time, and how each probe went (see parse/snapshot_files.py)
    host.json                 memory, filesystems, defunct processes, load (ditto)
    nvidia-smi-topo-m.txt     nvidia-smi topo -m
    nvidia-smi-nvlink-s.txt   nvidia-smi nvlink -s
    nvidia-smi-nvlink-e.txt   nvidia-smi nvlink -e (or dcgmi-nvlink-e/<gpu>.json: dcgmi nvlink -e -g N -j)
    nvidia-smi-q.xml          nvidia-smi -q -x   (or nvidia-smi-q.txt: nvidia-smi -q)
    nvidia-smi-compute-apps.csv  nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv
    dcgmi-diag.json           dcgmi diag -r LEVEL -j (only where the site enables it)
    ibstat.txt                ibstat
    ibv_devinfo.txt           ibv_devinfo -v
    ip-link.json              ip -j -d link
    lscpu.txt                 lscpu
    dmesg.txt                 dmesg -T, or journalctl -k where dmesg is restricted
    sys/class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,link_layer}, <hca>/hca_type
    sys/class/infiniband/<hca>/device/net/<if>/{operstate,mtu,dev_port}   (the port's netdev)
    sys/class/net/<if>/{mtu,operstate,speed,type}
    sys/devices/system/cpu/cpu<N>/topology/thread_siblings_list   (which CPUs share a core)
    sys/class/infiniband/<hca>/ports/<n>/counters/<error counter>, <hca>/fw_ver, <hca>/device/uevent
    sys/bus/pci/devices/<addr>/{vendor,class,current_link_speed,current_link_width,max_link_speed,
                                max_link_width}   (NVIDIA devices and the HCAs)
    sys/module/{mlx5_core,nvidia}/version
    (a hand-written snapshot may hold perfquery.txt: perfquery -x, and lspci.txt: lspci -vvv)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainctl.errors import ParseError, UsageError
from trainctl.proc import OUTPUT_CAP_BYTES
from trainctl.health.parse.counters import (parse_dcgm_nvlink_tree, parse_ib_counters, parse_nvlink_errors,
                                            parse_perfquery)
from trainctl.health.parse.dcgm import parse_dcgm_diag
from trainctl.health.parse.gpu_apps import parse_compute_apps
from trainctl.health.parse.ibstat import parse_ibstat
from trainctl.health.parse.ibv_devinfo import parse_ibv_devinfo
from trainctl.health.parse.ip_link import parse_ip_link
from trainctl.health.parse.kernel_log import parse_kernel_log
from trainctl.health.parse.lscpu import parse_lscpu
from trainctl.health.parse.nvlink import parse_nvlink_status
from trainctl.health.parse.pcie import (parse_hca_pci_addresses, parse_lspci, parse_pci_sysfs,
                                        parse_pcie_kernel_lines)
from trainctl.health.parse.smi_query import parse_smi_text, parse_smi_xml
from trainctl.health.parse.snapshot_files import parse_host, parse_meta
from trainctl.health.parse.sysfs import parse_ib_sysfs, parse_net_sysfs
from trainctl.health.parse.topo import parse_topo
from trainctl.health.parse.versions import parse_software_sysfs


@dataclass(frozen=True)
class Snapshot:
    path: str
    files: Mapping[str, str]    # path relative to the snapshot ("sys/class/...") -> contents
    oversized: Mapping[str, int] = field(default_factory=dict)   # known files too large to read -> bytes


# A snapshot is read by name, each file within a cap: only the files an input below names
# (a stray file, however large, is never opened), and no file larger than any probe writes.
FILE_CAP_BYTES = OUTPUT_CAP_BYTES + (1 << 20)  # probe output is cut to OUTPUT_CAP_BYTES; meta/host.json are KBs
SYSFS_FILE_CAP_BYTES = 64 << 10   # a sysfs attribute is at most one page (4 KiB) as the kernel shows it
SNAPSHOT_CAP_BYTES = 512 << 20    # all files together: a few MB on a real node


def load_snapshot(path: str | os.PathLike) -> Snapshot:
    """Read the known files of a snapshot directory, each within its cap; nothing is run or parsed here."""
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"snapshot directory not found: {root}")
    files: dict[str, str] = {}
    oversized: dict[str, int] = {}
    total = 0
    try:
        for file in _known_files(root):
            name = file.relative_to(root).as_posix()
            data, size = _read_capped(file, SYSFS_FILE_CAP_BYTES if name.startswith("sys/") else FILE_CAP_BYTES)
            if data is None:
                oversized[name] = size
                continue
            total += len(data)
            if total > SNAPSHOT_CAP_BYTES:
                raise UsageError(f"snapshot {root}: its files hold more than {SNAPSHOT_CAP_BYTES >> 20} MiB; "
                                 "not a snapshot trainctl wrote")
            files[name] = data.decode("utf-8", "replace")
    except OSError as exc:
        raise UsageError(f"snapshot {root}: cannot read {exc.filename or 'a file'}: {exc.strerror or exc}") from exc
    return Snapshot(path=str(root), files=files, oversized=oversized)


def _known_files(root: Path) -> list[Path]:
    """The regular files of `root` that some input reads: named files, and files under named trees."""
    names = sorted({s.name for sources in INPUTS.values() for s in sources if isinstance(s, FileSource)})
    trees = sorted({s.name for sources in INPUTS.values() for s in sources if isinstance(s, TreeSource)})
    found = [root / name for name in names if (root / name).is_file()]
    for tree in trees:
        if any(tree.startswith(other) and tree != other for other in trees):
            continue    # inside a wider tree that is walked anyway
        top = root / tree
        if top.is_dir():
            found += sorted(file for file in top.rglob("*") if file.is_file())
    return found


def _read_capped(file: Path, cap: int) -> tuple[bytes | None, int]:
    """(contents, size), or (None, size) when the file holds more than `cap` bytes. sysfs and
    procfs report sizes that are not the contents' length: the read itself is capped too."""
    with open(file, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > cap:
            return None, size
        data = handle.read(cap + 1)
    return (None, max(size, len(data))) if len(data) > cap else (data, len(data))


@dataclass(frozen=True)
class FileSource:
    name: str
    parse: Callable[..., object]    # parse(text, source=name)

    def read(self, snapshot: Snapshot) -> object | None:
        if self.name in snapshot.oversized:
            raise _too_large(self.name, snapshot.oversized[self.name])
        text = snapshot.files.get(self.name)
        return None if text is None else self.parse(text, source=self.name)


@dataclass(frozen=True)
class TreeSource:
    name: str                       # a directory prefix ending in "/"
    parse: Callable[[Mapping[str, str]], object]

    def read(self, snapshot: Snapshot) -> object | None:
        for path, size in snapshot.oversized.items():
            if path.startswith(self.name):
                raise _too_large(path, size)
        tree = {path: text for path, text in snapshot.files.items() if path.startswith(self.name)}
        return self.parse(tree) if tree else None


def _too_large(name: str, size: int) -> ParseError:
    cap = SYSFS_FILE_CAP_BYTES if name.startswith("sys/") else FILE_CAP_BYTES
    return ParseError(f"{size} bytes, more than the {cap} a snapshot file may hold: not read", source=name)


# Named inputs a check can ask for: the first source the snapshot holds is used.
INPUTS: dict[str, tuple[FileSource | TreeSource, ...]] = {
    "meta": (FileSource("meta.json", parse_meta),),
    "host": (FileSource("host.json", parse_host),),
    "topo": (FileSource("nvidia-smi-topo-m.txt", parse_topo),),
    "nvlink": (FileSource("nvidia-smi-nvlink-s.txt", parse_nvlink_status),),
    "smi": (FileSource("nvidia-smi-q.xml", parse_smi_xml), FileSource("nvidia-smi-q.txt", parse_smi_text)),
    "ib": (FileSource("ibstat.txt", parse_ibstat), TreeSource("sys/class/infiniband/", parse_ib_sysfs)),
    "ib_sysfs": (TreeSource("sys/class/infiniband/", parse_ib_sysfs),),
    "ibv_devinfo": (FileSource("ibv_devinfo.txt", parse_ibv_devinfo),),
    "netdevs": (FileSource("ip-link.json", parse_ip_link), TreeSource("sys/class/net/", parse_net_sysfs)),
    "lscpu": (FileSource("lscpu.txt", parse_lscpu),),
    "kernel_log": (FileSource("dmesg.txt", parse_kernel_log),),
    "ib_counters": (TreeSource("sys/class/infiniband/", parse_ib_counters),
                    FileSource("perfquery.txt", parse_perfquery)),
    "nvlink_errors": (FileSource("nvidia-smi-nvlink-e.txt", parse_nvlink_errors),
                      TreeSource("dcgmi-nvlink-e/", parse_dcgm_nvlink_tree)),
    "pci": (TreeSource("sys/bus/pci/devices/", parse_pci_sysfs), FileSource("lspci.txt", parse_lspci)),
    "hca_pci": (TreeSource("sys/class/infiniband/", parse_hca_pci_addresses),),
    "pcie_kernel": (FileSource("dmesg.txt", parse_pcie_kernel_lines),),
    "compute_apps": (FileSource("nvidia-smi-compute-apps.csv", parse_compute_apps),),
    "dcgm_diag": (FileSource("dcgmi-diag.json", parse_dcgm_diag),),
    "software": (TreeSource("sys/", parse_software_sysfs),),
}


@dataclass(frozen=True)
class Unavailable:
    """Why an input cannot be had: not collected, or collected but not readable."""
    reason: str
    unreadable: bool = False


IB_CLASS_DIR = "sys/class/infiniband/"
IB_TOOL_OUTPUTS = ("ibstat.txt", "ibv_devinfo.txt")


class SnapshotInputs:
    """Parses each named input of one snapshot at most once."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._cache: dict[str, object] = {}

    def get(self, name: str) -> object:
        """The parsed input, or `Unavailable` saying why there is none."""
        if name not in self._cache:
            self._cache[name] = self._resolve(name)
        return self._cache[name]

    @functools.cached_property
    def lacks_infiniband(self) -> bool:
        """True when the snapshot copied the node's sysfs, holds nothing of /sys/class/infiniband,
        and no IB tool printed anything: the kernel knows no InfiniBand or RoCE device there. A
        snapshot that did not copy sysfs cannot tell, and says False."""
        meta = self.get("meta")
        files = self.snapshot.files
        return (not isinstance(meta, Unavailable) and meta.sysfs_files is not None
                and not any(path.startswith(IB_CLASS_DIR) for path in files)
                and not any(files.get(output, "").strip() for output in IB_TOOL_OUTPUTS))

    def timed_out(self, files: tuple[str, ...]) -> bool:
        """Whether a probe that writes one of `files` hung: a fact the checks must not hide."""
        meta = self.get("meta")
        probes = {} if isinstance(meta, Unavailable) else meta.probes
        return any(probes[file].timed_out for file in files if file in probes)

    def _resolve(self, name: str) -> object:
        sources = INPUTS[name]
        for source in sources:
            try:
                parsed = source.read(self.snapshot)
            except ParseError as exc:
                # a probe that failed usually explains its unreadable output
                failed = self._probe_error(source.name)
                return Unavailable(f"unreadable: {exc}" + (f" ({failed})" if failed else ""), unreadable=True)
            if parsed is not None:
                return parsed
        return Unavailable("not collected: " + "; ".join(self._why_missing(s.name) for s in sources))

    def _why_missing(self, file: str) -> str:
        error = self._probe_error(file)
        return f"{file} ({error})" if error else file

    def _probe_error(self, file: str) -> str | None:
        """meta.json's one line on why the probe that writes `file` failed, if it did."""
        meta = self.get("meta") if file != "meta.json" else None
        probe = meta.probes.get(file) if meta is not None and not isinstance(meta, Unavailable) else None
        if probe is not None and probe.missing and probe.command:
            # Not the PATH searched: a node without GPUs would repeat it for every GPU check;
            # `health check` says once which probes are missing and where it looked.
            return f"{probe.command[0]} not found"
        return probe.error if probe is not None else None
