"""Seeing every GPU: nvidia-smi lists what it counts and what the PCI bus holds; no GPU is taken."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.gpu_apps import ComputeApp
from trainctl.health.parse.pcie import PciDevice, pci_address
from trainctl.health.parse.smi_query import SmiQuery
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("gpu.visible", "nvidia-smi lists as many GPUs as it says are attached, and every NVIDIA GPU on "
       "the PCI bus", needs=("smi",), uses=("pci",), hardware="gpu")
def gpu_visible(smi: SmiQuery, pci: dict[str, PciDevice] | None, expected: NodeExpectations) -> Finding:
    listed = {pci_address(g.pci_bus_id) for g in smi.gpus}
    on_bus = sorted(address for address, device in (pci or {}).items() if device.is_gpu)
    missing = [address for address in on_bus if address not in listed]
    issues = []
    if smi.attached_gpus is not None and smi.attached_gpus != len(smi.gpus):
        issues.append((Status.FAIL, f"nvidia-smi says {smi.attached_gpus} GPU(s) attached but lists "
                                    f"{len(smi.gpus)}"))
    if missing:
        # A job holding part of a node sees only its GPUs (Slurm's device cgroup); the bus shows
        # them all. Where the site's count is met, the rest are another job's: a warning.
        hidden = expected.gpus is not None and len(smi.gpus) >= expected.gpus
        issues.append((Status.WARN if hidden else Status.FAIL,
                       f"{len(missing)} NVIDIA GPU(s) on the PCI bus not listed by nvidia-smi: "
                       f"{', '.join(missing)}" + (" (hidden from this job?)" if hidden else
                                                  " (fallen off the bus, or driver failed to attach?)")))
    details = {"attached_gpus": smi.attached_gpus, "listed": len(smi.gpus), "on_pci_bus": on_bus,
               "missing_from_nvidia_smi": missing, "pci_read": pci is not None}
    bus = f", {len(on_bus)} on the PCI bus" if pci is not None else " (PCI bus not read)"
    return summarize(issues, f"{len(smi.gpus)} GPU(s) listed{bus}", details)


@check("gpu.processes", "No process holds a GPU before the job starts (fails in the gate, warns in sweeps)",
       needs=("compute_apps",), uses=("smi",), hardware="gpu")
def gpu_processes(apps: tuple[ComputeApp, ...], smi: SmiQuery | None, expected: NodeExpectations) -> Finding:
    index = {g.uuid: g.index for g in smi.gpus if g.uuid} if smi else {}
    status = Status.FAIL if expected.gpu_processes_fail else Status.WARN
    issues = []
    for app in apps:
        gpu = f"GPU {index[app.gpu_uuid]}" if app.gpu_uuid in index else app.gpu_uuid
        memory = f", {app.used_memory_mib} MiB" if app.used_memory_mib is not None else ""
        issues.append((status, f"{gpu}: pid {app.pid} {app.name}{memory}"))
    details = {"processes": [{"gpu": index.get(a.gpu_uuid), "gpu_uuid": a.gpu_uuid, "pid": a.pid,
                              "name": a.name, "used_memory_mib": a.used_memory_mib} for a in apps]}
    if issues:
        issues[0] = (status, f"{len(apps)} process(es) already on the GPUs: {issues[0][1]}")
    return summarize(issues, "no process holds a GPU", details)
