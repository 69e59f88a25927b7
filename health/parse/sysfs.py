"""InfiniBand and network-interface state from copies of sysfs files.

Input is a mapping of sysfs path -> file contents. Paths may be the class view
(`sys/class/infiniband/mlx5_0/ports/1/state`), the PCI-device view that gcm records
(`/sys/bus/pci/devices/0000:0c:00.0/infiniband/mlx5_0/...`) or carry any prefix
(a snapshot directory, a ttar archive): only the part from `infiniband/` or `net/` on
matters. A netdev belongs to an HCA when both sit under the same PCI device, which in
the class view is the path `infiniband/<hca>/device/net/<if>/...`.

`parse_ttar` reads node_exporter/procfs text archives into the same mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_float, to_int
from trainctl.health.parse.fabric import IbInventory, IbPort, NetDev

_IB_PORT_FILE = re.compile(r"(?P<dev>.*?)/?infiniband/(?P<hca>[^/]+)/ports/(?P<port>[0-9]+)/"
                           r"(?P<attr>state|phys_state|rate|link_layer)")
_IB_HCA_TYPE = re.compile(r".*?/?infiniband/(?P<hca>[^/]+)/hca_type")
_NET_FILE = re.compile(r"(?P<dev>.*?)/?net/(?P<ifname>[^/]+)/(?P<attr>operstate|mtu|speed|dev_port|type)")
_PCI_DIR = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")
_DEVICE_LINK = re.compile(r".*?/?infiniband/(?P<hca>[^/]+)/device")
_NUMBERED = re.compile(r"[0-9]+: (\S+)")            # "4: ACTIVE", "5: LinkUp"
_RATE = re.compile(r"([0-9.]+) Gb/sec(?: \(.*\))?")  # "200 Gb/sec (4X HDR)"
# net/<if>/type is the ARPHRD number; these are the ones `ip` names in "link_type".
_LINK_TYPES = {"1": "ether", "32": "infiniband", "772": "loopback"}
# sysfs prints port states in capitals; use ibstat's names so both sources compare equal.
_STATE_NAMES = {"DOWN": "Down", "INIT": "Initializing", "ARMED": "Armed", "ACTIVE": "Active",
                "ACTIVE_DEFER": "ActiveDefer"}


def parse_ib_sysfs(files: Mapping[str, str]) -> IbInventory:
    ports: dict[tuple[str, int], dict[str, tuple[str, str]]] = {}
    hca_dirs: dict[str, str] = {}       # hca -> the directory holding its infiniband/ entry
    kinds: dict[str, str] = {}
    for path, contents in files.items():
        match = _IB_PORT_FILE.fullmatch(path)
        if match:
            ports.setdefault((match["hca"], int(match["port"])), {})[match["attr"]] = (
                contents.strip(), path)
            hca_dirs[match["hca"]] = match["dev"]
        hca_type = _IB_HCA_TYPE.fullmatch(path)
        if hca_type:
            kinds[hca_type["hca"]] = contents.strip()
    port_counts: dict[str, int] = {}
    for hca, _ in ports:
        port_counts[hca] = port_counts.get(hca, 0) + 1
    netdevs = _netdevs_of_ports(_netdev_records(files), hca_dirs, port_counts)
    result = []
    for (hca, port), attrs in sorted(ports.items()):
        missing = [a for a in ("state", "phys_state") if a not in attrs]
        if missing:
            raise ParseError(f"{hca} port {port}: no {', '.join(missing)} file",
                             source=f"infiniband/{hca}/ports/{port}")
        netdev = netdevs.get((hca, port))
        result.append(IbPort(
            device=hca, port=port, state=_state(*attrs["state"]),
            phys_state=_numbered_name(*attrs["phys_state"]),
            rate_gbps=_rate(*attrs["rate"]) if "rate" in attrs else None,
            link_layer=attrs["link_layer"][0] if "link_layer" in attrs else None,
            kind=kinds.get(hca), netdev=netdev.name if netdev else None,
            netdev_operstate=netdev.operstate if netdev else None,
            netdev_mtu=netdev.mtu if netdev else None))
    return IbInventory(ports=tuple(result))


def parse_net_sysfs(files: Mapping[str, str]) -> tuple[NetDev, ...]:
    # The class view and the device view may both hold an interface: one record each.
    by_name = {record.netdev.name: record.netdev for record in _netdev_records(files)}
    return tuple(by_name[name] for name in sorted(by_name))


@dataclass(frozen=True)
class _NetdevRecord:
    device_dir: str         # the directory holding net/<if>/
    dev_port: int | None    # 0-based port of the device this interface serves
    netdev: NetDev


def _netdev_records(files: Mapping[str, str]) -> list[_NetdevRecord]:
    attrs: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
    for path, contents in files.items():
        match = _NET_FILE.fullmatch(path)
        if match:
            attrs.setdefault((match["dev"], match["ifname"]), {})[match["attr"]] = (
                contents.strip(), path)
    records = []
    for (device_dir, ifname), values in sorted(attrs.items()):
        mtu, speed, dev_port = (_optional_int(*values[a]) if a in values else None
                                for a in ("mtu", "speed", "dev_port"))
        operstate = values["operstate"][0].lower() if "operstate" in values else None
        arphrd = values["type"][0] if "type" in values else None
        link_type = _LINK_TYPES.get(arphrd, f"arphrd {arphrd}") if arphrd is not None else None
        records.append(_NetdevRecord(device_dir, dev_port, NetDev(
            name=ifname, mtu=mtu, operstate=operstate, link_type=link_type, speed_mbps=speed)))
    return records


def _netdevs_of_ports(records: list[_NetdevRecord], hca_dirs: dict[str, str],
                      port_counts: dict[str, int]) -> dict[tuple[str, int], NetDev]:
    """(hca, port) -> its netdev, where the paths show that they share a PCI device."""
    hca_of_pci_dir = {d: hca for hca, d in hca_dirs.items() if _PCI_DIR.search(d)}
    result = {}
    for record in records:
        via_device_link = _DEVICE_LINK.fullmatch(record.device_dir)
        hca = via_device_link["hca"] if via_device_link else hca_of_pci_dir.get(record.device_dir)
        if hca is None or hca not in port_counts:
            continue
        if record.dev_port is not None:
            port = record.dev_port + 1
        elif port_counts[hca] == 1:
            port = 1
        else:
            continue    # a multi-port HCA without dev_port: which port is not known
        result[(hca, port)] = record.netdev
    return result


def parse_ttar(text: str, *, source: str = "ttar") -> dict[str, str]:
    """A ttar archive (`Path:`/`Lines:`/content/`Mode:` records) -> path -> contents."""
    files: dict[str, str] = {}
    lines = text.splitlines()
    at = 0
    while at < len(lines):
        line = lines[at]
        if not line.strip() or line.startswith("# ttar"):
            at += 1
        elif line.startswith("Directory: "):
            at = _expect_mode(lines, at + 1, source)
        elif line.startswith("Path: "):
            path = line.removeprefix("Path: ")
            if at + 1 < len(lines) and lines[at + 1].startswith("SymlinkTo: "):
                at += 2     # a symlink carries no contents of its own
                continue
            if at + 1 >= len(lines) or not lines[at + 1].startswith("Lines: "):
                raise ParseError(f"{path}: expected 'Lines: N'", source=source, line=at + 2)
            count = to_int(lines[at + 1].removeprefix("Lines: "), what="Lines", source=source,
                           line=at + 2)
            body = lines[at + 2:at + 2 + count]
            if len(body) < count:
                raise ParseError(f"{path}: {count} lines announced, {len(body)} present",
                                 source=source, line=at + 2)
            contents = "\n".join(body)
            # ttar marks a file without a final newline by ending it in "EOF".
            files[path] = contents[:-3] if contents.endswith("EOF") else contents + ("\n" if body else "")
            at = _expect_mode(lines, at + 2 + count, source)
        else:
            raise ParseError(f"unexpected line: {line!r}", source=source, line=at + 1)
    return files


def _expect_mode(lines: list[str], at: int, source: str) -> int:
    if at >= len(lines) or not re.fullmatch(r"Mode: [0-7]{3,4}", lines[at]):
        raise ParseError("expected 'Mode: NNN'", source=source, line=at + 1)
    return at + 1


def _optional_int(value: str, path: str) -> int | None:
    # An interface without link reports an empty speed, or -1: not known.
    return None if value in ("", "-1") else to_int(value, what=path, source=path, line=1)


def _numbered_name(value: str, path: str) -> str:
    match = _NUMBERED.fullmatch(value)
    if not match:
        raise ParseError(f"expected 'N: NAME', got {value!r}", source=path, line=1)
    return match[1]


def _state(value: str, path: str) -> str:
    name = _numbered_name(value, path)
    return _STATE_NAMES.get(name, name)


def _rate(value: str, path: str) -> float:
    match = _RATE.fullmatch(value)
    if not match:
        raise ParseError(f"expected '<N> Gb/sec (...)', got {value!r}", source=path, line=1)
    return to_float(match[1], what="rate", source=path, line=1)
