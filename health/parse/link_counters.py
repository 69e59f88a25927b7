"""A node's own links as its kernel counts them: how much each sent, and how often it held the
sender back. Two sources, one reading per link (`LinkCounters`, cumulative since the counters
were made):

- `tc -s -j qdisc show` (iproute2's JSON): each interface's root qdisc, with `bytes` and
  `packets` sent, `drops`, `overlimits` and `requeues`. A shaping qdisc (tbf) counts an
  overlimit each time it holds a packet back because the link's tokens ran out; a qdisc drops
  what it cannot queue; a driver that refuses a packet has it requeued. Their sum is the link's
  `wait`: the times it made its sender wait or lose a packet. Only root qdiscs (`"root": true`),
  and never the loopback interface: a child qdisc's counts are in its root's already.
- sysfs `infiniband/<hca>/ports/<n>/counters/port_xmit_wait` and `port_xmit_data`: the port's
  ticks with data to send and no flow-control credit to send it (PortXmitWait), and its data
  sent in units of 4 bytes (PortXmitData). Where an adapter keeps them in 32 bits they stop at
  their largest value rather than wrap (mlx4's port_xmit_wait in node_exporter's recording); a
  port whose adapter has no performance agent (`N/A (no PMA)`) is left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from trainctl.errors import ParseError
from trainctl.health.parse.common import json_field, load_json, to_int

LOOPBACK = "lo"
IB_DATA_UNIT_BYTES = 4
_IB_PORT_COUNTER = re.compile(
    r".*?/?infiniband/(?P<hca>[^/]+)/ports/(?P<port>[0-9]+)/counters/(?P<name>port_xmit_wait|port_xmit_data)")
_NO_PMA = "N/A (no PMA)"


class LinkCounters(NamedTuple):
    link: str                  # "eth0" (its root qdisc) or "mlx5_0:1" (an InfiniBand port)
    source: str                # "qdisc" or "ib"
    sent_bytes: int
    wait: int                  # qdisc: overlimits + requeues + drops; ib: port_xmit_wait ticks


def parse_qdisc_stats(text: str, *, source: str = "tc -s -j qdisc show") -> tuple[LinkCounters, ...]:
    """Each non-loopback interface's root qdisc, by interface name."""
    doc = load_json(text, source=source)
    if not isinstance(doc, list):
        raise ParseError("expected a JSON list of qdiscs", source=source)
    links = {}
    for qdisc in doc:
        where = "qdisc"
        device = json_field(qdisc, "dev", str, where=where, source=source)
        if device == LOOPBACK or not json_field(qdisc, "root", bool, where=device, source=source, required=False):
            continue
        count = {name: json_field(qdisc, name, int, where=device, source=source)
                 for name in ("bytes", "drops", "overlimits", "requeues")}
        if any(value < 0 for value in count.values()):
            raise ParseError(f"{device}: a negative count", source=source)
        links[device] = LinkCounters(device, "qdisc", count["bytes"],
                                     count["overlimits"] + count["requeues"] + count["drops"])
    return tuple(links[device] for device in sorted(links))


def parse_ib_xmit_counters(files: Mapping[str, str]) -> tuple[LinkCounters, ...]:
    """Each InfiniBand port that has both counters (paths as in sysfs, a snapshot or a ttar)."""
    ports: dict[str, dict[str, int]] = {}
    for path, contents in files.items():
        match = _IB_PORT_COUNTER.fullmatch(path)
        if not match or contents.strip() == _NO_PMA:
            continue
        value = to_int(contents, what=match["name"], source=path, line=1)
        if value < 0:
            raise ParseError(f"{match['name']}: a negative count", source=path, line=1)
        ports.setdefault(f"{match['hca']}:{match['port']}", {})[match["name"]] = value
    return tuple(LinkCounters(port, "ib", counts["port_xmit_data"] * IB_DATA_UNIT_BYTES, counts["port_xmit_wait"])
                 for port, counts in sorted(ports.items())
                 if "port_xmit_wait" in counts and "port_xmit_data" in counts)
