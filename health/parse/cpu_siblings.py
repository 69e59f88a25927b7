"""Physical cores and their hardware threads, as the node itself reports them.

The kernel lists each CPU's hyperthread siblings in
`/sys/devices/system/cpu/cpuN/topology/thread_siblings_list` (Documentation/ABI/stable/
sysfs-devices-system-cpu). Numbering differs between machines: siblings may be adjacent
(`0-1`) or half the machine apart (`0,32`), so cores are read, never guessed from ranges.
`lscpu -p` gives the same grouping in its Core column (parse/lscpu.py).

A core here is the frozenset of its threads' CPU numbers; cores are ordered by lowest CPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainctl.errors import ParseError
from trainctl.health.parse.cpulist import parse_cpu_list

SIBLINGS_GLOB = "sys/devices/system/cpu/cpu[0-9]*/topology"   # what the collector copies
_SIBLINGS_FILE = re.compile(r"(?:.*/)?cpu/cpu([0-9]+)/topology/thread_siblings_list")

Cores = tuple[frozenset[int], ...]


def parse_thread_siblings(files: Mapping[str, str]) -> Cores:
    """Cores from copies of sysfs `thread_siblings_list` files (path -> contents); other paths are ignored."""
    core_of: dict[int, frozenset[int]] = {}
    for path, text in sorted(files.items()):
        match = _SIBLINGS_FILE.fullmatch(path)
        if not match:
            continue
        cpu = int(match[1])
        siblings = parse_cpu_list(text, source=path, line=1)
        if cpu not in siblings:
            raise ParseError(f"cpu{cpu} is not among its own siblings {text.strip()!r}", source=path, line=1)
        core_of[cpu] = siblings
    for cpu, siblings in core_of.items():
        for other in siblings:
            if other in core_of and core_of[other] != siblings:
                raise ParseError(f"cpu{cpu} lists siblings {format_cpus(siblings)} but cpu{other} lists "
                                 f"{format_cpus(core_of[other])}", source="thread_siblings_list")
    return tuple(sorted(set(core_of.values()), key=min))


def format_cpus(cpus: frozenset[int] | set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
