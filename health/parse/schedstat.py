"""A thread's scheduler statistics, `/proc/<pid>/task/<tid>/schedstat`.

The kernel writes three numbers on one line (Documentation/scheduler/sched-stats.rst, "/proc/<pid>/
schedstat"): the time the thread spent on a CPU, the time it spent runnable but waiting on a run
queue (in nanoseconds both), and the number of timeslices it ran. A thread throttled by its
cgroup's CFS quota, or crowded by other work on its CPUs, waits on a run queue; a thread asleep
(waiting for a collective's peers, for I/O) is in neither.
"""

from __future__ import annotations

from typing import NamedTuple

from trainctl.errors import ParseError

NS_PER_S = 1e9
LINE_MAX = 128                 # three 64-bit decimals and their spaces


class SchedStat(NamedTuple):
    cpu_s: float               # on a CPU
    runq_s: float              # runnable, waiting for a CPU


def parse_schedstat(text: str, source: str = "schedstat") -> SchedStat:
    """The thread's times."""
    fields = text.split()
    if len(fields) != 3 or len(text) > LINE_MAX or not all(f.isascii() and f.isdigit() for f in fields):
        raise ParseError(f"expected 3 counts on one line, got {text[:LINE_MAX]!r}", source=source, line=1)
    return SchedStat(int(fields[0]) / NS_PER_S, int(fields[1]) / NS_PER_S)
