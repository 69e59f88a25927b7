"""NVLink checks: the topology matrix (`topo -m`) and per-link state (`nvlink -s`)."""

from __future__ import annotations

from itertools import combinations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.nvlink import NvlinkGpu
from trainctl.health.parse.topo import Topology, is_nvlink
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("nvlink.topology", "Every GPU pair is joined by the NVLink type the site expects; a pair "
       "that falls back to PCIe is named", needs=("topo",), hardware="nvlink")
def nvlink_topology(topo: Topology, expected: NodeExpectations) -> Finding:
    pairs = {(a.index, b.index): topo.link(a.label, b.label) for a, b in combinations(topo.gpus, 2)}
    details = {"link_types": sorted(set(pairs.values())), "expected": expected.nvlink_type}
    if expected.nvlink_type is not None and not pairs:
        return Finding(Status.OK, f"a single GPU: no pair to join with {expected.nvlink_type}", details)
    if expected.nvlink_type is not None:
        wrong = [f"GPU {a}-GPU {b}: {link}" for (a, b), link in pairs.items()
                 if link != expected.nvlink_type]
        issues = [(Status.FAIL, f"{len(wrong)} GPU pair(s) not {expected.nvlink_type}: "
                                + ", ".join(wrong))] if wrong else []
        return summarize(issues, f"all {len(pairs)} GPU pairs {expected.nvlink_type}", details)
    # With no expectation only a mix is suspect: most pairs on NVLink, some on PCIe.
    # (Some designs, such as DGX-1's hybrid cube mesh, are mixed on purpose: a warning.)
    nvlinked = [p for p, link in pairs.items() if is_nvlink(link)]
    fallback = [f"GPU {a}-GPU {b}: {link}" for (a, b), link in pairs.items() if not is_nvlink(link)]
    if nvlinked and fallback:
        return Finding(Status.WARN, f"{len(fallback)} GPU pair(s) without NVLink while "
                       f"{len(nvlinked)} have it: " + ", ".join(fallback), details)
    return Finding(Status.OK, "GPU links: " + (", ".join(details["link_types"]) or
                                               "a single GPU"), details)


@check("nvlink.links", "Every NVLink is up and at the speed of its peers (or the site's)",
       needs=("nvlink",), hardware="nvlink")
def nvlink_links(gpus: tuple[NvlinkGpu, ...], expected: NodeExpectations) -> Finding:
    wants_nvlink = bool(expected.nvlink or expected.nvlink_type or expected.nvlink_links_per_gpu)
    speeds = [link.speed_gbps for gpu in gpus for link in gpu.links if link.speed_gbps is not None]
    reference = expected.nvlink_speed_gbps or max(speeds, default=None)
    issues = []
    for gpu in gpus:
        name = f"GPU {gpu.index} ({gpu.name})"
        if gpu.state == "all_inactive":
            issues.append((Status.FAIL, f"{name}: all NVLinks inactive"))
        elif gpu.state == "mig":
            issues.append((Status.UNKNOWN, f"{name}: NVLink state cannot be read in MIG mode"))
        elif gpu.state == "absent":
            if wants_nvlink:
                issues.append((Status.FAIL, f"{name} has no NVLink; the site expects it"))
        else:
            issues += _link_issues(gpu, name, reference, expected.nvlink_links_per_gpu)
    details = {"gpus": [{"index": g.index, "state": g.state,
                         "link_speeds_gbps": [link.speed_gbps for link in g.links]} for g in gpus],
               "reference_speed_gbps": reference}
    if not gpus and wants_nvlink:
        issues.append((Status.FAIL, "nvidia-smi nvlink -s lists no GPU; the site expects NVLink"))
    ok = ("no NVLink on these GPUs" if reference is None
          else f"all NVLinks up at {reference:g} GB/s")
    return summarize(issues, ok, details)


def _link_issues(gpu: NvlinkGpu, name: str, reference: float | None,
                 links_expected: int | None) -> list[tuple[Status, str]]:
    issues = []
    inactive = [str(link.number) for link in gpu.links if link.speed_gbps is None]
    if inactive:
        issues.append((Status.FAIL, f"{name}: NVLink {', '.join(inactive)} inactive"))
    slow = [f"{link.number} ({link.speed_gbps:g} GB/s)" for link in gpu.links
            if link.speed_gbps is not None and reference is not None and link.speed_gbps < reference]
    if slow:
        issues.append((Status.FAIL, f"{name}: NVLink {', '.join(slow)} below {reference:g} GB/s"))
    if links_expected is not None and len(gpu.links) < links_expected:
        issues.append((Status.FAIL, f"{name}: {len(gpu.links)} NVLinks, the site expects "
                                    f"{links_expected}"))
    return issues
