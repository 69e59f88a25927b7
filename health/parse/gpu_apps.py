"""`nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv`.

Real output (the header, then one line per process; only the header when none runs):

    gpu_uuid, pid, process_name, used_gpu_memory [MiB]
    GPU-a44622e3-2296-6285-0a86-84d0f6c67900, 1328667, /usr/local/bin/python3.10, 130004 MiB

trainctl asks for the process name last, so a name with ", " in it stays whole. Used
memory reads `[N/A]` where the driver cannot tell (containers, some MIG setups).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_int

QUERY = "gpu_uuid,pid,used_memory,process_name"
HEADER = "gpu_uuid, pid, used_gpu_memory [MiB], process_name"
SOURCE = "nvidia-smi --query-compute-apps"


@dataclass(frozen=True)
class ComputeApp:
    gpu_uuid: str
    pid: int
    used_memory_mib: int | None
    name: str


def parse_compute_apps(text: str, *, source: str = SOURCE) -> tuple[ComputeApp, ...]:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines or lines[0][1].strip() != HEADER:
        raise ParseError(f"expected the header {HEADER!r}", source=source, line=lines[0][0] if lines else 1)
    apps = []
    for lineno, line in lines[1:]:
        fields = line.strip().split(", ", 3)
        if len(fields) != 4 or not fields[0].startswith(("GPU-", "MIG-")):
            raise ParseError(f"expected 'uuid, pid, memory, name', got {line.strip()!r}", source=source,
                             line=lineno)
        uuid, pid, memory, name = fields
        if memory in ("[N/A]", "N/A", "[Not Supported]"):
            used = None
        elif memory.endswith(" MiB"):
            used = to_int(memory.removesuffix(" MiB"), what="used_memory", source=source, line=lineno)
        else:
            raise ParseError(f"used memory: expected 'N MiB', got {memory!r}", source=source, line=lineno)
        apps.append(ComputeApp(uuid, to_int(pid, what="pid", source=source, line=lineno), used, name))
    return tuple(apps)
