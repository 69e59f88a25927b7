"""The two snapshot files trainctl itself writes: `meta.json` and `host.json`.

Keys not listed are ignored, so the collector may record more.

meta.json:
    {"host": "node2",
     "collected_at": "2025-02-23T16:31:00+00:00",   # ISO 8601 with its UTC offset
     "probes": {"<output file>": {
         "command": ["nvidia-smi", "topo", "-m"],
         "exit_code": 0,                            # null when it never ran or was killed
         "duration_s": 0.21, "timed_out": false,
         "missing": false,                          # the binary was not found (optional)
         "error": null,                             # one line when it failed: why (optional)
         "stderr_tail": "",
         "stdout_bytes": 1234,                      # what it wrote, before any cut (optional)
         "truncated": false}}}                      # stdout kept only its head and tail (optional)

host.json (psutil and /proc):
    {"memory": {"total_bytes": 2164..., "available_bytes": 1980...},
     "disks": [{"path": "/dev/shm", "total_bytes": ..., "free_bytes": ...}, ...],
     "defunct_processes": [{"pid": 4242, "ppid": 1, "name": "python"}],
     "load_avg": [1.5, 1.2, 0.9],                   # 1, 5 and 15 minutes
     "cpu_count": 224,
     "boot_time": "2025-02-20T08:00:00+00:00",      # optional: dates dmesg's seconds-since-boot
     "software": {"kernel": "5.15.0-112-generic",   # optional: versions compared between nodes
                  "torch": "2.13.0", "nccl": "2.28.9"}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from trainctl.errors import ParseError
from trainctl.health.parse.common import json_field, load_json


@dataclass(frozen=True)
class Probe:
    command: tuple[str, ...]
    exit_code: int | None
    duration_s: float
    timed_out: bool
    missing: bool
    error: str | None
    stderr_tail: str
    stdout_bytes: int | None = None     # None: not recorded (a hand-written or older snapshot)
    truncated: bool = False


@dataclass(frozen=True)
class SnapshotMeta:
    host: str | None
    collected_at: datetime | None
    probes: dict[str, Probe]        # output file name -> how its command went
    sysfs_files: int | None = None  # attributes copied from /sys; None: sysfs was not copied


@dataclass(frozen=True)
class Filesystem:
    path: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class DefunctProcess:
    pid: int
    ppid: int
    name: str


@dataclass(frozen=True)
class HostInfo:
    memory_total_bytes: int
    memory_available_bytes: int
    disks: tuple[Filesystem, ...]
    defunct_processes: tuple[DefunctProcess, ...]
    load_average: tuple[float, float, float]
    cpu_count: int
    boot_time: datetime | None
    software: dict[str, str] = field(default_factory=dict)    # name -> version as printed


def parse_meta(text: str, *, source: str = "meta.json") -> SnapshotMeta:
    doc = load_json(text, source=source)
    probes_doc = json_field(doc, "probes", dict, where="meta", source=source, required=False) or {}
    probes = {}
    for output, probe in probes_doc.items():
        where = f"probe {output}"
        command = json_field(probe, "command", list, where=where, source=source)
        if not all(isinstance(arg, str) for arg in command):
            raise ParseError(f"{where}: 'command' is not a list of strings", source=source)
        probes[output] = Probe(
            command=tuple(command),
            exit_code=json_field(probe, "exit_code", int, where=where, source=source,
                                 required=False),
            duration_s=_float(json_field(probe, "duration_s", (int, float), where=where,
                                         source=source), where, source),
            timed_out=json_field(probe, "timed_out", bool, where=where, source=source),
            missing=bool(json_field(probe, "missing", bool, where=where, source=source,
                                    required=False)),
            error=json_field(probe, "error", str, where=where, source=source, required=False),
            stderr_tail=json_field(probe, "stderr_tail", str, where=where, source=source,
                                   required=False) or "",
            stdout_bytes=json_field(probe, "stdout_bytes", int, where=where, source=source,
                                    required=False),
            truncated=bool(json_field(probe, "truncated", bool, where=where, source=source,
                                      required=False)))
    return SnapshotMeta(host=json_field(doc, "host", str, where="meta", source=source,
                                        required=False),
                        collected_at=_time(doc, "collected_at", source), probes=probes,
                        sysfs_files=json_field(doc, "sysfs_files", int, where="meta", source=source,
                                               required=False))


def parse_host(text: str, *, source: str = "host.json") -> HostInfo:
    doc = load_json(text, source=source)
    memory = json_field(doc, "memory", dict, where="host", source=source)
    disks = json_field(doc, "disks", list, where="host", source=source)
    defunct = json_field(doc, "defunct_processes", list, where="host", source=source)
    load = json_field(doc, "load_avg", list, where="host", source=source)
    if len(load) != 3 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                 for x in load):
        raise ParseError("host: 'load_avg' is not three numbers", source=source)
    if any(x < 0 for x in load):
        raise ParseError("host: 'load_avg' has a negative number", source=source)
    return HostInfo(
        memory_total_bytes=_count(memory, "total_bytes", "memory", source),
        memory_available_bytes=_count(memory, "available_bytes", "memory", source),
        disks=tuple(Filesystem(
            path=json_field(fs, "path", str, where=f"disk #{i}", source=source),
            total_bytes=_count(fs, "total_bytes", f"disk #{i}", source),
            free_bytes=_count(fs, "free_bytes", f"disk #{i}", source))
            for i, fs in enumerate(disks)),
        defunct_processes=tuple(DefunctProcess(
            pid=json_field(p, "pid", int, where=f"defunct process #{i}", source=source),
            ppid=json_field(p, "ppid", int, where=f"defunct process #{i}", source=source),
            name=json_field(p, "name", str, where=f"defunct process #{i}", source=source))
            for i, p in enumerate(defunct)),
        load_average=(_float(load[0], "load", source), _float(load[1], "load", source),
                      _float(load[2], "load", source)),
        cpu_count=_count(doc, "cpu_count", "host", source, least=1),
        boot_time=_time(doc, "boot_time", source),
        software=_strings(json_field(doc, "software", dict, where="host", source=source, required=False) or {},
                          "software", source))


def _strings(table: dict, where: str, source: str) -> dict[str, str]:
    if not all(isinstance(value, str) for value in table.values()):
        raise ParseError(f"{where}: every value must be a string", source=source)
    return dict(table)


MAX_COUNT = 2**63 - 1   # the largest byte or CPU count the kernel itself can report (a signed 64-bit)


def _count(obj: object, key: str, where: str, source: str, least: int = 0) -> int:
    """A byte or CPU count: a negative one (or no CPUs) is a broken snapshot, never "ok"."""
    value = json_field(obj, key, int, where=where, source=source)
    if value < least:
        raise ParseError(f"{where}: {key!r} is {value}, less than {least}", source=source)
    if value > MAX_COUNT:  # no machine has more bytes; arithmetic on such a number overflows a float
        raise ParseError(f"{where}: {key!r} is larger than {MAX_COUNT}", source=source)
    return value


def _float(value: int | float, where: str, source: str) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ParseError(f"{where}: number out of range", source=source) from None


def _time(doc: object, key: str, source: str) -> datetime | None:
    value = json_field(doc, key, str, where=source, source=source, required=False)
    if value is None:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ParseError(f"{key!r} is not an ISO 8601 time: {value!r}", source=source) from None
    if stamp.tzinfo is None:
        raise ParseError(f"{key!r} has no UTC offset: {value!r}", source=source)
    return stamp
