"""`ibstat`: every HCA port's state, physical state, rate and link layer.

Indentation is tabs or spaces depending on the build, so lines are read by content.
`ibpanic:` lines (ibstat failing on one device and exiting 255) are kept as errors.
"""

from __future__ import annotations

import re

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_float, to_int
from trainctl.health.parse.fabric import IbInventory, IbPort

SOURCE = "ibstat"
_CA = re.compile(r"CA '([^']+)'")
_PORT = re.compile(r"Port (\d+):")
_FIELD = re.compile(r"([A-Za-z][A-Za-z ]*): (.*)")
_TOOL_ERROR = re.compile(r"ib(?:panic|warn|error): .*")
_REQUIRED_PORT_FIELDS = ("State", "Physical state", "Rate")


def parse_ibstat(text: str, *, source: str = SOURCE) -> IbInventory:
    cas: list[dict] = []
    errors: list[str] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if _TOOL_ERROR.fullmatch(stripped):
            errors.append(stripped)
            continue
        ca = _CA.fullmatch(stripped)
        if ca:
            cas.append({"name": ca[1], "fields": {}, "ports": [], "line": lineno})
            continue
        if not cas:
            raise ParseError(f"expected \"CA '<name>'\", got {stripped!r}", source=source,
                             line=lineno)
        port = _PORT.fullmatch(stripped)
        field = _FIELD.fullmatch(stripped)
        if port:
            cas[-1]["ports"].append({"port": int(port[1]), "fields": {}, "line": lineno})
        elif field:
            target = cas[-1]["ports"][-1] if cas[-1]["ports"] else cas[-1]
            target["fields"][field[1]] = (field[2].strip(), lineno)
        else:
            raise ParseError(f"unexpected line: {stripped!r}", source=source, line=lineno)
    if not cas and not errors:
        raise ParseError("no CA in the output", source=source, line=1)
    return IbInventory(ports=tuple(p for ca in cas for p in _ports(ca, source)),
                       errors=tuple(errors))


def _ports(ca: dict, source: str) -> list[IbPort]:
    declared = ca["fields"].get("Number of ports")
    if declared is not None:
        count = to_int(declared[0], what="Number of ports", source=source, line=declared[1])
        if count != len(ca["ports"]):
            raise ParseError(f"CA {ca['name']} declares {count} ports but lists "
                             f"{len(ca['ports'])} (truncated?)", source=source, line=ca["line"])
    kind = ca["fields"].get("CA type", (None,))[0]
    ports = []
    for port in ca["ports"]:
        fields = port["fields"]
        missing = [f for f in _REQUIRED_PORT_FIELDS if f not in fields]
        if missing:
            raise ParseError(f"{ca['name']} port {port['port']} lacks {', '.join(missing)} "
                             "(truncated?)", source=source, line=port["line"])
        rate, rate_line = fields["Rate"]
        ports.append(IbPort(device=ca["name"], port=port["port"], state=fields["State"][0],
                            phys_state=fields["Physical state"][0],
                            rate_gbps=to_float(rate, what="Rate", source=source, line=rate_line),
                            link_layer=fields.get("Link layer", (None,))[0], kind=kind))
    return ports
