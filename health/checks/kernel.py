"""Kernel log checks: GPU Xid and NVSwitch SXid events within the site's window."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.kernel_log import KernelLog, LogTime
from trainctl.health.parse.smi_query import SmiQuery
from trainctl.health.parse.snapshot_files import HostInfo, SnapshotMeta
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize
from trainctl.health.xid_catalog import xid_info, xid_issue

_PROCESS_PREFIX = re.compile(r"pid=[^,]*, (?:name=[^,]*, )?")


@check("gpu.xid", "No GPU Xid events that need action in the kernel log (since boot or the "
       "last N hours)", needs=("kernel_log",), uses=("smi", "meta", "host"), hardware="gpu")
def gpu_xid(log: KernelLog, smi: SmiQuery | None, meta: SnapshotMeta | None,
            host: HostInfo | None, expected: NodeExpectations) -> Finding:
    window = _Window(meta, host, expected.xid_window_hours)
    gpu_index = {_pci_key(g.pci_bus_id): g.index for g in smi.gpus} if smi else {}
    groups: dict[tuple[int, str], list] = {}
    for event in log.xids:
        if window.admits(event.time):
            groups.setdefault((event.xid, event.pci), []).append(event)
    issues, summary = [], []
    for (xid, pci), events in sorted(groups.items()):
        info = xid_info(xid)
        index = gpu_index.get(_pci_key(pci))
        gpu = f"GPU {index} (PCI {pci})" if index is not None else f"the GPU at PCI {pci}"
        last = _PROCESS_PREFIX.sub("", events[-1].message, count=1)
        issues.append((info.status, xid_issue(xid, gpu, len(events), last)))
        summary.append({"xid": xid, "meaning": info.meaning, "severity": info.status.label,
                        "pci": pci, "gpu": index, "count": len(events),
                        "first_line": events[0].line, "last_line": events[-1].line,
                        "last_message": events[-1].message})
    details = {"events": summary, "window": window.describe(), "undated_events": window.undated}
    return summarize(issues, f"no Xid events {window.describe()}", details)


@check("nvswitch.sxid", "No NVSwitch SXid errors in the kernel log (fatal fails, non-fatal warns)",
       needs=("kernel_log",), uses=("meta", "host"), hardware="nvlink")
def nvswitch_sxid(log: KernelLog, meta: SnapshotMeta | None, host: HostInfo | None,
                  expected: NodeExpectations) -> Finding:
    window = _Window(meta, host, expected.xid_window_hours)
    issues, summary = [], []
    for event in log.sxids:
        if not window.admits(event.time):
            continue
        status = Status.FAIL if event.severity == "Fatal" else Status.WARN
        issues.append((status, f"SXid {event.sxid} on {event.switch} (PCI {event.pci}): "
                               f"{event.message}"))
        summary.append({"sxid": event.sxid, "switch": event.switch, "pci": event.pci,
                        "severity": event.severity, "line": event.line})
    return summarize(issues, f"no SXid events {window.describe()}",
                     {"events": summary, "window": window.describe(), "undated_events": window.undated})


class _Window:
    """Which events count: all (since boot), or those of the last N hours before the snapshot.

    An event whose time cannot be placed (no timestamp; seconds since boot without a boot
    time) is counted: a fault of unknown age is still a fault.
    """

    def __init__(self, meta: SnapshotMeta | None, host: HostInfo | None, hours: float | None):
        self.now = meta.collected_at if meta else None
        self.boot = host.boot_time if host else None
        self.hours = hours
        self.undated = 0

    def describe(self) -> str:
        if self.hours is None:
            return "since boot"
        if self.now is None:
            return f"since boot (a {self.hours:g} h window needs collected_at in meta.json)"
        return f"in the {self.hours:g} h before {self.now.isoformat()}"

    def admits(self, time: LogTime | None) -> bool:
        if self.hours is None or self.now is None:
            return True
        when = self._place(time)
        if when is None:
            self.undated += 1
            return True
        return when >= self.now - timedelta(hours=self.hours)

    def _place(self, time: LogTime | None) -> datetime | None:
        if time is None:
            return None
        if time.since_boot_s is not None:
            return self.boot + timedelta(seconds=time.since_boot_s) if self.boot else None
        wall = time.wall
        if wall.tzinfo is None:     # dmesg -T and syslog print the node's local time
            wall = wall.replace(tzinfo=self.now.tzinfo)
        if time.year_known:
            return wall
        # syslog stamps have no year: take the latest that is not after the snapshot
        # (eight years back reaches a leap year for a "Feb 29").
        for year in range(self.now.year, self.now.year - 8, -1):
            try:
                candidate = wall.replace(year=year)
            except ValueError:
                continue
            if candidate <= self.now:
                return candidate
        return None


def _pci_key(address: str) -> tuple[int, int, int]:
    """(domain, bus, device) of "00000000:9B:00.0" (nvidia-smi) or "0000:9b:00" (Xid lines)."""
    domain, bus, device = address.split(".")[0].split(":")
    return int(domain, 16), int(bus, 16), int(device, 16)
