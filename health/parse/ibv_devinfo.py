"""`ibv_devinfo` (plain or `-v`): per HCA port, the state and the active/max MTU.

Only device identity and the port blocks are read; `-v` adds capability lines at the
device level that say nothing about health and are skipped. What the checks use from
here is the IB MTU, which neither ibstat nor sysfs reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_int

SOURCE = "ibv_devinfo"
_HCA = re.compile(r"hca_id:\s+(\S+)")
_PORT = re.compile(r"port:\s+([0-9]+)")
_FIELD = re.compile(r"([a-z_]+):\s+(.+)")
_MTU = re.compile(r"([0-9]+) \([0-9]+\)")          # "4096 (5)": bytes, then the enum value
_PORT_STATE = re.compile(r"PORT_(\w+) \([0-9]+\)")  # "PORT_ACTIVE (4)"


@dataclass(frozen=True)
class IbvPort:
    port: int
    state: str              # "ACTIVE", "DOWN", "INIT", "ARMED"
    max_mtu: int            # bytes
    active_mtu: int
    link_layer: str | None
    phys_state: str | None  # only with -v: "LINK_UP", "POLLING", ...


@dataclass(frozen=True)
class IbvDevice:
    hca_id: str
    ports: tuple[IbvPort, ...]


def parse_ibv_devinfo(text: str, *, source: str = SOURCE) -> tuple[IbvDevice, ...]:
    devices: list[dict] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        hca = _HCA.fullmatch(stripped)
        if hca:
            devices.append({"hca_id": hca[1], "ports": [], "in_ports": False, "line": lineno})
            continue
        if not devices:
            raise ParseError(f"expected 'hca_id:', got {stripped!r}", source=source, line=lineno)
        device = devices[-1]
        if stripped == "Device ports:":
            device["in_ports"] = True
            continue
        if not device["in_ports"]:
            continue    # device-level capability lines
        port = _PORT.fullmatch(stripped)
        if port:
            device["ports"].append({"port": int(port[1]), "fields": {}, "line": lineno})
            continue
        field = _FIELD.fullmatch(stripped)
        if device["ports"] and field:
            device["ports"][-1]["fields"][field[1]] = (field[2].strip(), lineno)
        elif not (device["ports"] and stripped.startswith("GID[")):
            raise ParseError(f"unexpected line in the port list: {stripped!r}", source=source,
                             line=lineno)
    if not devices:
        raise ParseError("no hca_id in the output", source=source, line=1)
    return tuple(IbvDevice(hca_id=d["hca_id"], ports=tuple(_port(p, source) for p in d["ports"]))
                 for d in devices)


def _port(port: dict, source: str) -> IbvPort:
    fields = port["fields"]
    missing = [f for f in ("state", "max_mtu", "active_mtu") if f not in fields]
    if missing:
        raise ParseError(f"port {port['port']} lacks {', '.join(missing)} (truncated?)",
                         source=source, line=port["line"])
    state = _PORT_STATE.fullmatch(fields["state"][0])
    if not state:
        raise ParseError(f"unknown port state {fields['state'][0]!r}", source=source,
                         line=fields["state"][1])
    phys = fields.get("phys_state")
    return IbvPort(port=port["port"], state=state[1], max_mtu=_mtu(*fields["max_mtu"], source),
                   active_mtu=_mtu(*fields["active_mtu"], source),
                   link_layer=fields.get("link_layer", (None,))[0],
                   phys_state=phys[0].split(" (")[0] if phys else None)


def _mtu(value: str, line: int, source: str) -> int:
    match = _MTU.fullmatch(value)
    if not match:
        raise ParseError(f"expected an MTU like '4096 (5)', got {value!r}", source=source,
                         line=line)
    return to_int(match[1], what="MTU", source=source, line=line)
