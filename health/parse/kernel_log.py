"""The kernel log: NVIDIA Xid (GPU) and SXid (NVSwitch) events with their timestamps.

Timestamp forms, each optionally behind `dmesg --decode`'s `kern  :warn  : ` prefix:
`[Sun Feb 23 16:24:18 2025]` (dmesg -T, local time), `2025-01-21T02:21:33,498559+00:00`
(dmesg --time-format=iso), `[186965.348898]` (seconds since boot), `Aug 17 06:18:01 host
kernel:` (syslog / journalctl -k, no year), or none. Other kernel messages are skipped,
but a line that says `NVRM: Xid` or `SXid` and does not read as one is a ParseError:
silently missing a GPU fault is worse than not judging.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from trainctl.errors import ParseError

SOURCE = "kernel log"
_DECODE_PREFIX = re.compile(r"[a-z]+ *:[a-z]+ *: ")
_CTIME = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9]?[0-9] [0-9:]{8} [0-9]{4})\] ?")
_ISO = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}(?:[.,][0-9]+)?(?:[+-][0-9]{2}:?[0-9]{2}|Z)?) ")
_MONOTONIC = re.compile(r"\[ *([0-9]+\.[0-9]+)\] ?")
_SYSLOG = re.compile(r"([A-Z][a-z]{2} +[0-9]{1,2} [0-9:]{8}) \S+ [^:]+: ")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\): "
                  r"([0-9]+)(?:, (.*))?")
_SXID = re.compile(r"(nvidia-nvswitch[0-9]+): SXid \(PCI:([0-9a-fA-F:.]+)\): ([0-9]+)(?:, (.*))?")


@dataclass(frozen=True)
class LogTime:
    wall: datetime | None = None        # naive for dmesg -T/syslog (local time), aware for iso
    year_known: bool = True             # False for syslog stamps: the year is a placeholder
    since_boot_s: float | None = None   # plain dmesg


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str                # "0000:9b:00": domain:bus:device as the driver prints it
    message: str            # the text after the number: process, then the driver's words
    time: LogTime | None
    line: int


@dataclass(frozen=True)
class SxidEvent:
    switch: str             # "nvidia-nvswitch2"
    pci: str
    sxid: int
    severity: str | None    # "Fatal" or "Non-fatal" where the message starts with one
    message: str
    time: LogTime | None
    line: int


@dataclass(frozen=True)
class KernelLog:
    xids: tuple[XidEvent, ...]
    sxids: tuple[SxidEvent, ...]


def parse_kernel_log(text: str, *, source: str = SOURCE) -> KernelLog:
    xids: list[XidEvent] = []
    sxids: list[SxidEvent] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if "Xid" not in line:       # the fast path: almost every kernel line
            continue
        time, message = _split_time(line, source, lineno)
        if "NVRM: Xid" in message:
            match = _XID.search(message)
            if not match:
                raise ParseError(f"unreadable Xid line: {line.strip()!r}", source=source,
                                 line=lineno)
            xids.append(XidEvent(xid=int(match[2]), pci=match[1].lower(), message=match[3] or "",
                                 time=time, line=lineno))
        elif "SXid" in message:
            match = _SXID.search(message)
            if not match:
                raise ParseError(f"unreadable SXid line: {line.strip()!r}", source=source,
                                 line=lineno)
            rest = match[4] or ""
            severity = next((s for s in ("Non-fatal", "Fatal") if rest.startswith(s)), None)
            sxids.append(SxidEvent(switch=match[1], pci=match[2].lower(), sxid=int(match[3]),
                                   severity=severity, message=rest, time=time, line=lineno))
    return KernelLog(xids=tuple(xids), sxids=tuple(sxids))


def _split_time(line: str, source: str, lineno: int) -> tuple[LogTime | None, str]:
    """(timestamp, message) for one line in any of the supported forms."""
    text = line.lstrip()
    prefix = _DECODE_PREFIX.match(text)
    if prefix:
        text = text[prefix.end():]
    for pattern, convert in _STAMPS:
        match = pattern.match(text)
        if match:
            try:
                return convert(match[1]), text[match.end():]
            except ValueError:
                raise ParseError(f"bad timestamp {match[1]!r}", source=source,
                                 line=lineno) from None
    return None, text


def _ctime(stamp: str) -> LogTime:
    return LogTime(wall=datetime.strptime(" ".join(stamp.split()), "%a %b %d %H:%M:%S %Y"))


def _iso(stamp: str) -> LogTime:
    return LogTime(wall=datetime.fromisoformat(stamp.replace(",", ".")))


def _monotonic(stamp: str) -> LogTime:
    return LogTime(since_boot_s=float(stamp))


def _syslog(stamp: str) -> LogTime:
    # 2000 is a leap year, so "Feb 29" parses; the reader supplies the real year.
    return LogTime(wall=datetime.strptime("2000 " + " ".join(stamp.split()), "%Y %b %d %H:%M:%S"),
                   year_known=False)


_STAMPS = ((_CTIME, _ctime), (_ISO, _iso), (_MONOTONIC, _monotonic), (_SYSLOG, _syslog))
