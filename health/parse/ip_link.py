"""`ip -j -d link` (or `ip -j addr`): one JSON object per interface."""

from __future__ import annotations

from trainctl.errors import ParseError
from trainctl.health.parse.common import json_field, load_json
from trainctl.health.parse.fabric import NetDev

SOURCE = "ip -j -d link"


def parse_ip_link(text: str, *, source: str = SOURCE) -> tuple[NetDev, ...]:
    interfaces = load_json(text, source=source)
    if not isinstance(interfaces, list):
        raise ParseError("expected a JSON list of interfaces", source=source, line=1)
    return tuple(_netdev(i, entry, source) for i, entry in enumerate(interfaces))


def _netdev(position: int, entry: object, source: str) -> NetDev:
    name = json_field(entry, "ifname", str, where=f"interface #{position}", source=source)
    where = f"interface {name}"
    flags = json_field(entry, "flags", list, where=where, source=source, required=False) or []
    if not all(isinstance(f, str) for f in flags):
        raise ParseError(f"{where}: 'flags' is not a list of strings", source=source)
    operstate = json_field(entry, "operstate", str, where=where, source=source, required=False)
    return NetDev(name=name,
                  mtu=json_field(entry, "mtu", int, where=where, source=source, required=False),
                  operstate=operstate.lower() if operstate else None,
                  admin_up="UP" in flags, carrier="LOWER_UP" in flags,
                  link_type=json_field(entry, "link_type", str, where=where, source=source,
                                       required=False),
                  master=json_field(entry, "master", str, where=where, source=source,
                                    required=False))
