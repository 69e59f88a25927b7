"""PCIe links of the GPUs and HCAs: trained at the speed and width they can do."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.pcie import PciDevice, PcieLimit, pci_address
from trainctl.health.parse.smi_query import SmiQuery
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("pcie.links", "Every GPU and HCA PCIe link runs at its maximum speed and width (sysfs, and the "
       "kernel's 'limited by' lines)", uses=("pci", "smi", "hca_pci", "pcie_kernel"))
def pcie_links(pci: dict[str, PciDevice] | None, smi: SmiQuery | None, hca_pci: dict[str, str] | None,
               limits: tuple[PcieLimit, ...] | None, expected: NodeExpectations) -> Finding:
    status = Status.WARN if expected.pcie_below_max_warns else Status.FAIL
    pci = pci or {}     # the collector copies NVIDIA devices and HCAs only: none on a plain host
    names: dict[str, str] = {}
    for address, device in pci.items():
        if device.is_gpu:
            names[address] = f"GPU at {address}"
    for gpu in smi.gpus if smi else ():
        names[pci_address(gpu.pci_bus_id)] = f"GPU {gpu.index} ({pci_address(gpu.pci_bus_id)})"
    for hca, address in (hca_pci or {}).items():
        names[address] = f"{hca} ({address})"
    issues, rows, unread = [], [], []
    for address, name in sorted(names.items(), key=lambda item: item[1]):
        device = pci.get(address)
        if device is None or None in (device.current_speed_gts, device.max_speed_gts,
                                      device.current_width, device.max_width):
            unread.append(name)
            continue
        rows.append({"device": name, "speed_gts": device.current_speed_gts,
                     "max_speed_gts": device.max_speed_gts, "width": device.current_width,
                     "max_width": device.max_width})
        below = []
        if device.current_speed_gts < device.max_speed_gts:
            below.append(f"{device.current_speed_gts:g} GT/s of {device.max_speed_gts:g}")
        if device.current_width < device.max_width:
            below.append(f"x{device.current_width} of x{device.max_width}")
        if below:
            issues.append((status, f"{name}: PCIe link at {', '.join(below)}"))
    for limit in limits or ():
        name = names.get(limit.device, f"{limit.driver} {limit.device}")
        issues.append((status, f"{name}: kernel says limited by a {limit.speed_gts:g} GT/s "
                               f"x{limit.width} link at {limit.at} (capable of {limit.capable_speed_gts:g} GT/s "
                               f"x{limit.capable_width}; dmesg line {limit.line})"))
    if unread:
        issues.append((Status.UNKNOWN, f"no PCIe link figures in sysfs for {', '.join(unread)}"))
    details = {"links": rows, "kernel_limits": [{"device": lim.device, "at": lim.at,
                                                 "speed_gts": lim.speed_gts, "width": lim.width}
                                                for lim in limits or ()]}
    ok = (f"{len(rows)} GPU/HCA link(s) at their maximum speed and width" if rows
          else "no GPU or HCA on the PCI bus")
    return summarize(issues, ok, details)
