"""The versions a node runs, recorded for the odd-node-out comparison and held to the site's pins."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.smi_query import SmiQuery
from trainctl.health.parse.snapshot_files import HostInfo
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("node.versions", "Driver, CUDA, VBIOS, HCA firmware, OFED, kernel, torch, NCCL: as the site pins them, "
       "alike in the node and the job", uses=("smi", "software", "host"))
def node_versions(smi: SmiQuery | None, software: dict[str, str] | None, host: HostInfo | None,
                  expected: NodeExpectations) -> Finding:
    versions = node_version_table(smi, software, host)
    issues = []
    for name, value in versions.items():
        if ", " in value:   # GPUs (VBIOS) or adapters of one model (firmware) that differ here
            issues.append((Status.WARN, f"{name} differs within this node: {value}"))
    for name, pinned in sorted(expected.pinned_versions.items()):
        if name not in versions:
            issues.append((Status.UNKNOWN, f"{name}: not reported (the site pins {pinned})"))
        elif versions[name] != pinned:
            issues.append((Status.FAIL, f"{name} {versions[name]}, the site pins {pinned}"))
    shown = ", ".join(f"{name} {value}" for name, value in versions.items()) or "no versions reported"
    return summarize(issues, shown, {"versions": versions, "pinned": dict(expected.pinned_versions)})


def node_version_table(smi: SmiQuery | None, software: dict[str, str] | None,
                       host: HostInfo | None) -> dict[str, str]:
    versions: dict[str, str] = {}
    if smi is not None:
        if smi.driver_version:
            versions["driver"] = smi.driver_version
        if smi.cuda_version:
            versions["cuda"] = smi.cuda_version
        vbios = sorted({g.vbios_version for g in smi.gpus if g.vbios_version})
        if vbios:
            versions["vbios"] = ", ".join(vbios)
    versions.update(software or {})
    versions.update(host.software if host is not None else {})
    return dict(sorted(versions.items()))
