"""`lscpu`: CPU count, online CPUs and the CPUs of each NUMA node.

Old (`CPU MHz:`) and new layouts, indented sub-sections of newer util-linux, and the
`lscpu -p` table that util-linux test outputs append after a `#` comment block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_int
from trainctl.health.parse.cpulist import parse_cpu_list

SOURCE = "lscpu"
_FIELD = re.compile(r"([^:]+):\s*(.*)")
_NUMA_NODE = re.compile(r"NUMA node([0-9]+) CPU\(s\)")
_PARSABLE_ROW = re.compile(r"[0-9]*(?:,[0-9]*)*")


@dataclass(frozen=True)
class CpuInfo:
    cpus: int
    online: frozenset[int]
    model_name: str | None
    sockets: int | None
    numa_nodes: dict[int, frozenset[int]]   # node -> its CPUs; nodes without CPUs are absent


def parse_lscpu(text: str, *, source: str = SOURCE) -> CpuInfo:
    fields: dict[str, tuple[str, int]] = {}
    in_parsable_table = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            in_parsable_table = True
            continue
        if in_parsable_table:
            if not _PARSABLE_ROW.fullmatch(stripped):
                raise ParseError(f"unexpected line in the lscpu -p table: {stripped!r}",
                                 source=source, line=lineno)
            continue
        field = _FIELD.fullmatch(stripped)
        if not field:
            raise ParseError(f"expected 'Key: value', got {stripped!r}", source=source, line=lineno)
        fields[field[1].strip()] = (field[2].strip(), lineno)
    for required in ("CPU(s)", "On-line CPU(s) list"):
        if required not in fields:
            raise ParseError(f"no {required!r} line (truncated?)", source=source)
    numa_nodes = {}
    for key, (value, lineno) in fields.items():
        node = _NUMA_NODE.fullmatch(key)
        if node:
            numa_nodes[int(node[1])] = parse_cpu_list(value, source=source, line=lineno)
    cpus, cpus_line = fields["CPU(s)"]
    online, online_line = fields["On-line CPU(s) list"]
    sockets = fields.get("Socket(s)")
    return CpuInfo(cpus=to_int(cpus, what="CPU(s)", source=source, line=cpus_line),
                   online=parse_cpu_list(online, source=source, line=online_line),
                   model_name=fields.get("Model name", (None,))[0],
                   sockets=to_int(sockets[0], what="Socket(s)", source=source, line=sockets[1])
                   if sockets else None,
                   numa_nodes=numa_nodes)
