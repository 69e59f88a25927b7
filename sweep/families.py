"""Failure families: the cause a strike points at, the one table the lemon rule counts strikes by.

A strike's families are found once, when its journal is folded in (`trainctl.sweep.fleet`), from
the event's typed fields, each read by its owner's reader: an exclusion's reasons by
`Reason.read` (`trainctl.gate_reasons`), a detection's details by its kind's class
(`trainctl.detections.read_details`), gpu.xid's Xid numbers by `xids_named` (beside the text's
writer, `trainctl.health.xid_catalog`). The history keeps them in the event's row
(`JobEventRow.families`); a failed sweep's come from its failed checks, (check, reason) pairs.
Nothing reads them back out of formatted text, but for a history written before the rows kept
them (`families_from_text_before_v4`).

The Xid families are the catalogue's (by the cause NVIDIA's Xid catalogue gives); the checks
that look at the same part join them (gpu.ecc beside Xid 48). An Xid the catalogue puts on the
application, or calls informational, has no family and strikes nobody.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainctl.detections import LINK_WAIT, OWN_TIME, DetectionKind, SickDetails, SlowDetails, read_details
from trainctl.gate_reasons import Reason
from trainctl.health.xid_catalog import GPU, GPU_MEMORY, GPU_RESET, NVLINK, xid_info, xids_named

LINK, FABRIC, COMPUTE, HANG, HOST, OTHER = "link", "fabric", "compute", "hang", "host", "other"
FAMILIES: dict[str, str] = {   # family -> what strikes in it (the report's legend)
    GPU_MEMORY: "GPU memory: ECC errors, row remapping (Xid 48, 57, 58, 63, 64, 92, 94, 95, 140; gpu.ecc, "
                "gpu.row_remap)",
    GPU_RESET: "a GPU off the bus, not answering or asking for a reset (Xid 79, 119, 120, 154 ...; gpu.smi, "
               "gpu.visible, gpu.count, gpu.reset)",
    NVLINK: "NVLink, NVSwitch and C2C (Xid 74, 121, 144-150; nvlink.*, nvswitch.sxid, gpu.fabric)",
    GPU: "the GPU's other faults (Xid 44, 80, 81, 110, 122-125; dcgm.diag, pcie.links, other gpu.* checks)",
    LINK: "the node's network links (ib.*, net.*; the watch's link-wait rule)",
    FABRIC: "the gate's fabric test (pairwise all_reduce: a straggler, a slow intra-node figure)",
    COMPUTE: "slow compute (the gate's compute test, gpu.clock_events; the watch's own-time rule)",
    HANG: "stopped answering (the watch's hang; lost during the gate, no health report)",
    HOST: "the host's state (host.*, node.versions, topo.affinity, gpu.processes, gpu.persistence)",
    OTHER: "anything else (a cause this trainctl does not know; a slowdown no rule named a node for)",
}
CHECK_FAMILIES = {
    "gpu.ecc": GPU_MEMORY, "gpu.row_remap": GPU_MEMORY,
    "gpu.smi": GPU_RESET, "gpu.visible": GPU_RESET, "gpu.count": GPU_RESET, "gpu.reset": GPU_RESET,
    "gpu.fabric": NVLINK, "nvswitch.sxid": NVLINK,
    "gpu.clock_events": COMPUTE, "compute": COMPUTE, "compute fail-slow": COMPUTE,
    "gpu.processes": HOST, "gpu.persistence": HOST,
    "fabric": FABRIC,
    "lost during the gate": HANG, "no health report": HANG,   # the gate's causes (trainctl.job.gate)
}
CHECK_PREFIX_FAMILIES = {"gpu": GPU, "dcgm": GPU, "pcie": GPU, "nvlink": NVLINK, "ib": LINK, "net": LINK,
                         "host": HOST, "node": HOST, "topo": HOST}


def check_families(check: str, reason: str) -> tuple[str, ...]:
    """A check's (or a gate cause's) family, by its name; gpu.xid's are its Xids' (the catalogue's),
    the GPU's other faults where its reason names no Xid, none where every Xid is the application's."""
    if check == "gpu.xid":
        numbers = xids_named(reason)
        if not numbers:
            return (GPU,)
        return tuple(sorted({xid_info(n).family for n in numbers} - {None}))
    return (CHECK_FAMILIES.get(check) or CHECK_PREFIX_FAMILIES.get(check.split(".", 1)[0]) or OTHER,)


def failed_check_families(failed: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The families of (check, reason) pairs together: a failed sweep's checks, or one node's in a
    sick detection; none at all counts as OTHER."""
    found = [check_families(check, reason) for check, reason in failed]
    return tuple(sorted({family for families in found for family in families})) if found else (OTHER,)


def exclusion_families(reasons: Iterable[Reason]) -> tuple[str, ...]:
    """An exclusion's families: each reason's cause's (a node left out with no reason: OTHER)."""
    return failed_check_families((reason.cause, reason.detail) for reason in reasons)


def _slow(details: SlowDetails, node: str) -> tuple[str, ...]:
    return {LINK_WAIT: (LINK,), OWN_TIME: (COMPUTE,)}.get(details.named_by, (OTHER,))


def _sick(details: SickDetails, node: str) -> tuple[str, ...]:
    return failed_check_families((f.check, f.reason) for f in details.failed if f.node == node)


# Each detection kind's families for each node it names, from its details (the kind's class, RULES)
DETECTION_FAMILIES: Mapping[DetectionKind, Callable[[Any, str], tuple[str, ...]]] = {
    DetectionKind.HUNG: lambda details, node: (HANG,),
    DetectionKind.SLOW: _slow,    # by the rule that named the node: its link held it back, or its own time
    DetectionKind.SICK: _sick,    # by the node's own failed checks
}


def detection_families(kind: Any, details: Any, suspects: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """A journal detection's families for each node it names, from its `kind` and `details` fields
    (read once; a kind this trainctl does not know: OTHER)."""
    known = DetectionKind.read(kind)
    if known is None:
        return lambda node: (OTHER,)
    typed, rule = read_details(known, details, suspects), DETECTION_FAMILIES[known]
    return lambda node: rule(typed, node)


def families_from_text_before_v4(kind: str, what: str, detail: str, host: str) -> tuple[str, ...]:
    """The families of a job event of a history written before its rows kept them (schema version
    2 or 3), read from the text it kept, by the rules trainctl read it with then: an exclusion's
    checks, with gpu.xid's Xids from all its reasons; a slow detection's rule named in its evidence;
    a sick one's "node: check: reason" parts. Used only for such rows (`trainctl.sweep.db_rows`),
    where the upgrade to version 4 stores what it finds, and a reader of a history not yet upgraded."""
    if kind == "exclusion":
        return failed_check_families((check, detail) for check in what.split(", ") if check)
    detected = DetectionKind.read(what) if kind == "detection" else None
    if detected is DetectionKind.HUNG:
        return (HANG,)
    if detected is DetectionKind.SLOW:
        return (LINK,) if "(rule link-wait:" in detail else (COMPUTE,) if "(rule own-time:" in detail else (OTHER,)
    if detected is DetectionKind.SICK:
        parts = list(re.finditer(r"(?:^|; )([^\s:;]+): ([a-z][a-z0-9_]*\.[a-z0-9_]+): ", detail))
        return failed_check_families((match.group(2), detail[match.end():after.start() if after else len(detail)])
                                     for match, after in zip(parts, parts[1:] + [None]) if match.group(1) == host)
    return (OTHER,) if kind != "served" else ()
