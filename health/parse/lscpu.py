"""`lscpu`: CPU count, online CPUs, the CPUs of each NUMA node, and the cores where shown.

Old (`CPU MHz:`) and new layouts, indented sub-sections of newer util-linux, and the
`lscpu -p` table that util-linux test outputs append after a `#` comment block. Only the
first table gives cores: `lscpu -p` numbers cores logically, unique across the machine, while
a second table (util-linux's tests append `lscpu -p -y`, physical IDs) repeats core IDs on
every socket or die.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_int
from trainctl.health.parse.cpu_siblings import Cores
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
    threads_per_core: int | None = None
    cores: Cores | None = None              # from an `lscpu -p` table; None where there is none

    def measured_cores(self) -> Cores | None:
        """Cores as this output shows them: the -p table, or one thread per core where SMT is off."""
        if self.cores is not None:
            return self.cores
        if self.threads_per_core == 1:
            return tuple(frozenset({cpu}) for cpu in sorted(self.online))
        return None


def parse_lscpu(text: str, *, source: str = SOURCE) -> CpuInfo:
    fields: dict[str, tuple[str, int]] = {}
    tables: list[tuple[str, list[tuple[str, int]]]] = []    # (column header, rows) of each -p table
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if not tables or tables[-1][1]:
                tables.append(("", []))
            tables[-1] = (stripped.lstrip("#").strip(), [])   # the last comment line names the columns
            continue
        if tables:
            if not _PARSABLE_ROW.fullmatch(stripped):
                raise ParseError(f"unexpected line in the lscpu -p table: {stripped!r}",
                                 source=source, line=lineno)
            tables[-1][1].append((stripped, lineno))
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
    threads = fields.get("Thread(s) per core")
    return CpuInfo(cpus=to_int(cpus, what="CPU(s)", source=source, line=cpus_line),
                   online=parse_cpu_list(online, source=source, line=online_line),
                   model_name=fields.get("Model name", (None,))[0],
                   sockets=to_int(sockets[0], what="Socket(s)", source=source, line=sockets[1])
                   if sockets else None,
                   numa_nodes=numa_nodes,
                   threads_per_core=to_int(threads[0], what="Thread(s) per core", source=source,
                                           line=threads[1]) if threads else None,
                   cores=_cores(*tables[0], source) if tables else None)


def _cores(header: str, rows: list[tuple[str, int]], source: str) -> Cores | None:
    """CPUs grouped by the Core column of the first `lscpu -p` table."""
    columns = header.split(",")
    if "CPU" not in columns or "Core" not in columns or not rows:
        return None
    cpu_at, core_at = columns.index("CPU"), columns.index("Core")
    threads: dict[int, set[int]] = {}
    for row, lineno in rows:
        cells = row.split(",")
        if len(cells) <= max(cpu_at, core_at):
            raise ParseError(f"lscpu -p row has no {header!r} columns: {row!r}", source=source, line=lineno)
        cpu = to_int(cells[cpu_at], what="CPU", source=source, line=lineno)
        core = to_int(cells[core_at], what="Core", source=source, line=lineno)
        threads.setdefault(core, set()).add(cpu)
    return tuple(sorted((frozenset(cpus) for cpus in threads.values()), key=min))
