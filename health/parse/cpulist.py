"""Linux CPU list notation: `0-55,112-167`, stride ranges `0-62:2`, single CPUs `7`."""

from __future__ import annotations

import re

from trainctl.errors import ParseError

_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
# Linux caps NR_CPUS at 8192; a larger number is corrupt input, not a big machine.
MAX_CPU = 8191


def parse_cpu_list(text: str, *, source: str = "cpu list", line: int | None = None) -> frozenset[int]:
    """CPUs named by `text`; an empty string is the empty set."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for part in text.split(","):
        match = _RANGE.fullmatch(part.strip())
        if not match:
            raise ParseError(f"not a CPU list: {text!r}", source=source, line=line)
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        stride = int(match[3]) if match[3] is not None else 1
        if last < first or stride == 0 or last > MAX_CPU:
            raise ParseError(f"bad CPU range {part!r} in {text!r}", source=source, line=line)
        cpus.update(range(first, last + 1, stride))
    return frozenset(cpus)
