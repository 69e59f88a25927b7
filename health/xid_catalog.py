"""NVIDIA Xid numbers: what each means and how hard the health gate treats it.

Meanings follow NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/, "Analyzing
Xid Errors with the Xid Catalog"). Severity is trainctl's call, from the catalogue's
resolution buckets: FAIL where the GPU, its memory or its links need a reset, a
reboot or service before the next job (the node should not take work); WARN where
the usual cause is the application or the event is informational. An Xid missing
from this table is a WARN with "unknown Xid": it is reported, never hidden.

Each FAIL Xid also names the failure family fleet memory counts its strikes in
(`trainctl.sweep.families`), by the cause the catalogue gives: GPU memory (ECC errors,
row remapping, contained and uncontained memory errors), a GPU that fell off the bus,
stopped answering or asks for a reset (GSP and micro-controller errors included),
NVLink and C2C links, and the GPU's other hardware. A WARN Xid has no family: it
never strikes a node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.health.status import Status


GPU_MEMORY = "gpu-memory"    # ECC errors, row remapping, the video memory interface
GPU_RESET = "gpu-reset"      # off the bus, stopped answering, firmware (GSP, PMU) halted: needs a reset
NVLINK = "nvlink"            # NVLink and C2C links
GPU = "gpu"                  # the GPU's other hardware faults


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    status: Status
    family: str | None = None   # None: never strikes a node (the application's, or informational)


_APP = Status.WARN      # usually the application's fault, or informational
_ACT = Status.FAIL      # the node needs action before it takes work

XID_CATALOG: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing (channel idle timeout)", _APP),
    13: XidInfo("Graphics Engine Exception (usually an application error)", _APP),
    31: XidInfo("GPU memory page fault (usually an application error)", _APP),
    32: XidInfo("Invalid or corrupted push buffer stream", _APP),
    38: XidInfo("Driver firmware error", _ACT, GPU_RESET),
    43: XidInfo("GPU stopped processing: reset channel verification error (application)", _APP),
    44: XidInfo("Graphics Engine fault during context switch", _ACT, GPU),
    45: XidInfo("Preemptive cleanup, due to previous errors", _APP),
    46: XidInfo("GPU stopped processing", _ACT, GPU_RESET),
    48: XidInfo("Double Bit ECC Error (uncorrectable memory error)", _ACT, GPU_MEMORY),
    56: XidInfo("Display Engine error", _APP),
    57: XidInfo("Error programming video memory interface", _ACT, GPU_MEMORY),
    58: XidInfo("Unstable video memory interface detected", _ACT, GPU_MEMORY),
    61: XidInfo("Internal micro-controller breakpoint/warning", _ACT, GPU_RESET),
    62: XidInfo("Internal micro-controller halt", _ACT, GPU_RESET),
    63: XidInfo("ECC page retirement or row remapping recording event (reset the GPU to apply)",
                _ACT, GPU_MEMORY),
    64: XidInfo("ECC page retirement or row remapper recording failure", _ACT, GPU_MEMORY),
    65: XidInfo("Video processor exception", _APP),
    68: XidInfo("NVDEC0 exception (video decoder)", _APP),
    69: XidInfo("Graphics Engine class error", _APP),
    73: XidInfo("NVENC2 error (video encoder)", _APP),
    74: XidInfo("NVLink error", _ACT, NVLINK),
    79: XidInfo("GPU has fallen off the bus", _ACT, GPU_RESET),
    80: XidInfo("Corrupted data sent to GPU", _ACT, GPU),
    81: XidInfo("VGA subsystem error", _ACT, GPU),
    92: XidInfo("High single-bit ECC error rate", _ACT, GPU_MEMORY),
    93: XidInfo("Non-fatal violation of provisioned InfoROM wear limit", _APP),
    94: XidInfo("Contained ECC error (the affected application was stopped; reset the GPU)", _ACT, GPU_MEMORY),
    95: XidInfo("Uncontained ECC error (reset the GPU)", _ACT, GPU_MEMORY),
    109: XidInfo("Context switch timeout error", _APP),
    110: XidInfo("Security fault error", _ACT, GPU),
    119: XidInfo("GSP RPC timeout (GPU System Processor not responding)", _ACT, GPU_RESET),
    120: XidInfo("GSP error (GPU System Processor)", _ACT, GPU_RESET),
    121: XidInfo("C2C link error", _ACT, NVLINK),
    122: XidInfo("SPI PMU RPC read failure", _ACT, GPU),
    123: XidInfo("SPI PMU RPC write failure", _ACT, GPU),
    124: XidInfo("SPI PMU RPC erase failure", _ACT, GPU),
    125: XidInfo("InfoROM FS failure", _ACT, GPU),
    140: XidInfo("Unrecovered ECC error", _ACT, GPU_MEMORY),
    143: XidInfo("GPU initialization failure", _ACT, GPU_RESET),
    144: XidInfo("NVLink SAW error", _ACT, NVLINK),
    145: XidInfo("NVLink RLW error", _ACT, NVLINK),
    146: XidInfo("NVLink TLW error", _ACT, NVLINK),
    147: XidInfo("NVLink TREX error", _ACT, NVLINK),
    148: XidInfo("NVLink NVLPW control error", _ACT, NVLINK),
    149: XidInfo("NVLink NETIR error", _ACT, NVLINK),
    150: XidInfo("NVLink MSE error", _ACT, NVLINK),
    154: XidInfo("GPU recovery action changed (see the recovery action nvidia-smi reports)", _ACT, GPU_RESET),
}


def xid_info(xid: int) -> XidInfo:
    return XID_CATALOG.get(xid, XidInfo(f"unknown Xid {xid} (not in trainctl's catalogue)",
                                        Status.WARN))


# gpu.xid's reason names each Xid as "Xid N (meaning) on GPU ...", one issue per Xid and GPU
# (`xid_issue`, written by trainctl.health.checks.kernel); `xids_named` reads the numbers back
# (the fleet history files a gate's or a sweep's gpu.xid failure by them).
_XID_NAMED = re.compile(r"\bXid (\d+)\b")


def xid_issue(xid: int, where: str, count: int, last: str) -> str:
    """One Xid's issue in gpu.xid's reason: its number, meaning, GPU, events and the last one."""
    return f"Xid {xid} ({xid_info(xid).meaning}) on {where}: {count} event(s), last: {last}"


def xids_named(reason: str) -> frozenset[int]:
    """The Xid numbers a gpu.xid reason names (`xid_issue`); none where it was cut before any."""
    return frozenset(int(number) for number in _XID_NAMED.findall(reason))
