"""Link error counters (IB port counters, NVLink error counters): recorded here, judged by growth.

One snapshot holds counts since boot, which say little (see health/counters.py). These
checks record the reading in their details and pass; the gate (around its fabric test)
and sweeps (since the node's previous sweep) replace the verdict with `judge_growth`.
"""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.counters import CounterReading
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status

_JUDGED = "growth is judged between two readings (gate: around the fabric test; sweeps: since the last one)"


@check("ib.counters", "IB port error counters do not grow (link_downed growth is a flap); read here, "
       "judged between readings", needs=("ib_counters",), hardware="ib")
def ib_counters(reading: CounterReading, expected: NodeExpectations) -> Finding:
    return _recorded(reading, "port(s)")


@check("nvlink.counters", "NVLink replay, recovery and CRC error counters do not grow; read here, "
       "judged between readings", needs=("nvlink_errors",), hardware="nvlink")
def nvlink_counters(reading: CounterReading, expected: NodeExpectations) -> Finding:
    return _recorded(reading, "NVLink(s)")


def _recorded(reading: CounterReading, what: str) -> Finding:
    no_pma = (f"; no counters on {', '.join(reading.without_counters)} (no PMA)"
              if reading.without_counters else "")
    return Finding(Status.OK, f"counters of {len(reading.counters)} {what} read; {_JUDGED}{no_pma}",
                   reading.to_json())
