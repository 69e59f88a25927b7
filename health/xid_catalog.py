"""NVIDIA Xid numbers: what each means and how hard the health gate treats it.

Meanings follow NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/, "Analyzing
Xid Errors with the Xid Catalog"). Severity is trainctl's call, from the catalogue's
resolution buckets: FAIL where the GPU, its memory or its links need a reset, a
reboot or service before the next job (the node should not take work); WARN where
the usual cause is the application or the event is informational. An Xid missing
from this table is a WARN with "unknown Xid": it is reported, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainctl.health.status import Status


@dataclass(frozen=True)
class XidInfo:
    meaning: str
    status: Status


_APP = Status.WARN      # usually the application's fault, or informational
_ACT = Status.FAIL      # the node needs action before it takes work

XID_CATALOG: dict[int, XidInfo] = {
    8: XidInfo("GPU stopped processing (channel idle timeout)", _APP),
    13: XidInfo("Graphics Engine Exception (usually an application error)", _APP),
    31: XidInfo("GPU memory page fault (usually an application error)", _APP),
    32: XidInfo("Invalid or corrupted push buffer stream", _APP),
    38: XidInfo("Driver firmware error", _ACT),
    43: XidInfo("GPU stopped processing: reset channel verification error (application)", _APP),
    44: XidInfo("Graphics Engine fault during context switch", _ACT),
    45: XidInfo("Preemptive cleanup, due to previous errors", _APP),
    46: XidInfo("GPU stopped processing", _ACT),
    48: XidInfo("Double Bit ECC Error (uncorrectable memory error)", _ACT),
    56: XidInfo("Display Engine error", _APP),
    57: XidInfo("Error programming video memory interface", _ACT),
    58: XidInfo("Unstable video memory interface detected", _ACT),
    61: XidInfo("Internal micro-controller breakpoint/warning", _ACT),
    62: XidInfo("Internal micro-controller halt", _ACT),
    63: XidInfo("ECC page retirement or row remapping recording event (reset the GPU to apply)",
                _ACT),
    64: XidInfo("ECC page retirement or row remapper recording failure", _ACT),
    65: XidInfo("Video processor exception", _APP),
    68: XidInfo("NVDEC0 exception (video decoder)", _APP),
    69: XidInfo("Graphics Engine class error", _APP),
    73: XidInfo("NVENC2 error (video encoder)", _APP),
    74: XidInfo("NVLink error", _ACT),
    79: XidInfo("GPU has fallen off the bus", _ACT),
    80: XidInfo("Corrupted data sent to GPU", _ACT),
    81: XidInfo("VGA subsystem error", _ACT),
    92: XidInfo("High single-bit ECC error rate", _ACT),
    93: XidInfo("Non-fatal violation of provisioned InfoROM wear limit", _APP),
    94: XidInfo("Contained ECC error (the affected application was stopped; reset the GPU)", _ACT),
    95: XidInfo("Uncontained ECC error (reset the GPU)", _ACT),
    109: XidInfo("Context switch timeout error", _APP),
    110: XidInfo("Security fault error", _ACT),
    119: XidInfo("GSP RPC timeout (GPU System Processor not responding)", _ACT),
    120: XidInfo("GSP error (GPU System Processor)", _ACT),
    121: XidInfo("C2C link error", _ACT),
    122: XidInfo("SPI PMU RPC read failure", _ACT),
    123: XidInfo("SPI PMU RPC write failure", _ACT),
    124: XidInfo("SPI PMU RPC erase failure", _ACT),
    125: XidInfo("InfoROM FS failure", _ACT),
    140: XidInfo("Unrecovered ECC error", _ACT),
    143: XidInfo("GPU initialization failure", _ACT),
    144: XidInfo("NVLink SAW error", _ACT),
    145: XidInfo("NVLink RLW error", _ACT),
    146: XidInfo("NVLink TLW error", _ACT),
    147: XidInfo("NVLink TREX error", _ACT),
    148: XidInfo("NVLink NVLPW control error", _ACT),
    149: XidInfo("NVLink NETIR error", _ACT),
    150: XidInfo("NVLink MSE error", _ACT),
    154: XidInfo("GPU recovery action changed (see the recovery action nvidia-smi reports)", _ACT),
}


def xid_info(xid: int) -> XidInfo:
    return XID_CATALOG.get(xid, XidInfo(f"unknown Xid {xid} (not in trainctl's catalogue)",
                                        Status.WARN))
