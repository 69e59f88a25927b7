"""PCIe devices and their links: sysfs, `lspci` / `lspci -vvv`, and the kernel's link warnings.

sysfs (`/sys/bus/pci/devices/<addr>/` or `/sys/devices/pci.../<addr>/`): `vendor`
("0x10de"), `class` ("0x030200"), `current_link_speed` / `max_link_speed` ("16.0 GT/s
PCIe"; older kernels "8 GT/s", and "Unknown" where no link is trained),
`current_link_width` / `max_link_width` (a number). The device is the last PCI address
in the path, so a snapshot's copies and node_exporter's ttar excerpts read alike.

`lspci` prints one header per device (`19:00.0 3D controller: NVIDIA Corporation Device
2330 (rev a1)`); with `-vvv` (as root) indented lines follow, among them `LnkCap: Port
#0, Speed 32GT/s, Width x16, ...` and `LnkSta: Speed 16GT/s (downgraded), Width x16
(ok)`. Vendors and classes are names there; the ones trainctl judges map to their ids.

The kernel prints, when a driver finds its device's link below what the device can do
(`pcie_print_link_status`, drivers/pci/pci.c), `... available PCIe bandwidth, limited by
32.0 GT/s PCIe x8 link at 0000:97:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe
x16 link)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_float, to_int

NVIDIA = 0x10de
MELLANOX = 0x15b3
# PCI class codes (base class, subclass): display VGA / 3D.
GPU_CLASSES = (0x0300, 0x0302)
LINK_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")

_ADDRESS = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_SYSFS_FILE = re.compile(rf".*?/?(?P<addr>{_ADDRESS})/(?P<attr>vendor|class|{'|'.join(LINK_ATTRS)})")
_SPEED = re.compile(r"([0-9.]+) ?GT/s(?: PCIe)?")
_LSPCI_HEADER = re.compile(rf"(?P<addr>(?:[0-9a-fA-F]{{4}}:)?[0-9a-fA-F]{{2}}:[0-9a-fA-F]{{2}}\.[0-7]) "
                           r"(?P<class>[^:]+): (?P<vendor>.*)")
# "(ok)" / "(downgraded)" after LnkSta figures are lspci's own comparison with LnkCap: not needed
_LSPCI_LINK = re.compile(r"(?P<kind>LnkCap|LnkSta):\s+(?:Port #\d+, )?Speed (?P<speed>[0-9.]+)GT/s"
                         r"(?: \([a-z]+\))?, Width x(?P<width>\d+)(?: \([a-z]+\))?")
_KERNEL_LIMIT = re.compile(
    rf"(?P<driver>\S+) (?P<device>{_ADDRESS}): (?P<available>[0-9.]+) Gb/s available PCIe bandwidth, "
    rf"limited by (?P<speed>[0-9.]+) GT/s PCIe x(?P<width>\d+) link at (?P<at>{_ADDRESS}) "
    r"\(capable of (?P<capable>[0-9.]+) Gb/s with (?P<cap_speed>[0-9.]+) GT/s PCIe "
    r"x(?P<cap_width>\d+) link\)")
_LSPCI_CLASSES = {"VGA compatible controller": 0x0300, "3D controller": 0x0302,
                  "Ethernet controller": 0x0200, "Infiniband controller": 0x0207}
_LSPCI_VENDORS = {"NVIDIA Corporation": NVIDIA, "Mellanox Technologies": MELLANOX}


@dataclass(frozen=True)
class PciDevice:
    address: str                        # "0000:19:00.0", lower case
    vendor: int | None = None
    device_class: int | None = None     # base class and subclass: 0x0302
    current_speed_gts: float | None = None
    current_width: int | None = None
    max_speed_gts: float | None = None
    max_width: int | None = None

    @property
    def is_gpu(self) -> bool:
        return self.vendor == NVIDIA and self.device_class in GPU_CLASSES


@dataclass(frozen=True)
class PcieLimit:
    """One kernel line: a device whose link is below what it can do."""
    driver: str
    device: str
    speed_gts: float
    width: int
    at: str                 # the link that limits it (often an upstream switch port)
    capable_speed_gts: float
    capable_width: int
    line: int


def pci_address(bus_id: str) -> str:
    """"00000000:9B:00.0" (nvidia-smi) or "9b:00.0" (lspci) -> "0000:9b:00.0" (sysfs)."""
    parts = bus_id.lower().split(":")
    domain = parts[0][-4:] if len(parts) == 3 else "0000"
    return f"{domain}:{parts[-2]}:{parts[-1]}"


def parse_pci_sysfs(files: Mapping[str, str]) -> dict[str, PciDevice] | None:
    attrs: dict[str, dict[str, tuple[str, str]]] = {}
    for path, contents in files.items():
        match = _SYSFS_FILE.fullmatch(path)
        if match:
            attrs.setdefault(match["addr"].lower(), {})[match["attr"]] = (contents.strip(), path)
    if not attrs:
        return None
    devices = {}
    for address, values in sorted(attrs.items()):
        def number(attr: str) -> int | None:
            if attr not in values:
                return None
            text, path = values[attr]
            try:
                return int(text, 16) >> (8 if attr == "class" else 0)
            except ValueError:
                raise ParseError(f"{attr}: not a hex number: {text!r}", source=path, line=1) from None

        def link(attr: str, read: Callable[[str, str], float | int | None]) -> float | int | None:
            return read(*values[attr]) if attr in values else None

        devices[address] = PciDevice(
            address=address, vendor=number("vendor"), device_class=number("class"),
            current_speed_gts=link("current_link_speed", _sysfs_speed),
            current_width=link("current_link_width", _sysfs_width),
            max_speed_gts=link("max_link_speed", _sysfs_speed), max_width=link("max_link_width", _sysfs_width))
    return devices


def parse_lspci(text: str, *, source: str = "lspci") -> dict[str, PciDevice]:
    """`lspci` or `lspci -vvv`: devices by address; link figures where -vvv shows them."""
    devices: dict[str, PciDevice] = {}
    current: PciDevice | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if not line[0].isspace():
            header = _LSPCI_HEADER.fullmatch(line.rstrip())
            if not header:
                raise ParseError(f"not an lspci device line: {line.strip()!r}", source=source, line=lineno)
            vendor = next((vid for name, vid in _LSPCI_VENDORS.items()
                           if header["vendor"].startswith(name)), None)
            current = PciDevice(pci_address(header["addr"]), vendor=vendor,
                                device_class=_LSPCI_CLASSES.get(header["class"]))
            devices[current.address] = current
            continue
        if current is None:
            raise ParseError("device details before any device line", source=source, line=lineno)
        link = _LSPCI_LINK.search(line)
        if link:
            speed = to_float(link["speed"], what=link["kind"], source=source, line=lineno)
            width = to_int(link["width"], what=link["kind"], source=source, line=lineno)
            if link["kind"] == "LnkCap":
                current = replace(current, max_speed_gts=speed, max_width=width)
            else:
                current = replace(current, current_speed_gts=speed, current_width=width)
            devices[current.address] = current
    if not devices:
        raise ParseError("no devices", source=source, line=1)
    return devices


def parse_pcie_kernel_lines(text: str, *, source: str = "dmesg") -> tuple[PcieLimit, ...]:
    """The kernel's "limited by ... link" lines; every other line is left alone."""
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if "available PCIe bandwidth, limited by" not in line:
            continue
        match = _KERNEL_LIMIT.search(line)
        if not match:
            raise ParseError(f"unreadable PCIe bandwidth line: {line.strip()!r}", source=source, line=lineno)
        found.append(PcieLimit(
            driver=match["driver"], device=match["device"].lower(),
            speed_gts=to_float(match["speed"], what="speed", source=source, line=lineno),
            width=to_int(match["width"], what="width", source=source, line=lineno), at=match["at"].lower(),
            capable_speed_gts=to_float(match["cap_speed"], what="speed", source=source, line=lineno),
            capable_width=to_int(match["cap_width"], what="width", source=source, line=lineno), line=lineno))
    return tuple(found)


def _sysfs_speed(value: str, path: str) -> float | None:
    if value.startswith("Unknown"):
        return None     # no link trained (or the kernel does not know the rate)
    match = _SPEED.fullmatch(value)
    if not match:
        raise ParseError(f"expected '<N> GT/s PCIe', got {value!r}", source=path, line=1)
    return to_float(match[1], what="link speed", source=path, line=1)


def _sysfs_width(value: str, path: str) -> int | None:
    # 0 or 255: no link trained, or the width is not known (seen on virtual functions)
    width = to_int(value, what="link width", source=path, line=1)
    return width if 0 < width < 255 else None


_UEVENT = re.compile(r".*?/?infiniband/(?P<hca>[^/]+)/device/uevent")


def parse_hca_pci_addresses(files: Mapping[str, str]) -> dict[str, str] | None:
    """HCA -> its PCI address, from `infiniband/<hca>/device/uevent` (`PCI_SLOT_NAME=...`)."""
    found = {}
    for path, contents in files.items():
        match = _UEVENT.fullmatch(path)
        if not match:
            continue
        slot = [line.split("=", 1)[1] for line in contents.splitlines() if line.startswith("PCI_SLOT_NAME=")]
        if len(slot) != 1 or not re.fullmatch(_ADDRESS, slot[0].strip()):
            raise ParseError("expected one PCI_SLOT_NAME=<address> line", source=path)
        found[match["hca"]] = slot[0].strip().lower()
    return dict(sorted(found.items())) or None
