"""Round count of the fabric test's pairing schedule, N = 2 .. 1024, and the time to compute it.

Run: .venv/bin/python bench/fabric_schedule.py
The rounds run one after another and the pairs of a round at the same time, so the fabric
test's wall time follows the round count, which must not grow with N (issue 5).
bench/fabric_scaling.py imports `schedule_rows` for its README table.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from trainctl.health.fabric.schedule import pairing_schedule, partners_by_node

NODE_COUNTS = (2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 512, 1023, 1024)


@dataclass(frozen=True)
class ScheduleRow:
    node_count: int
    rounds: int
    pairs: int
    fewest_partners: int
    compute_ms: float


def schedule_rows(node_counts=NODE_COUNTS) -> list[ScheduleRow]:
    rows = []
    for n in node_counts:
        start = time.perf_counter()
        rounds = pairing_schedule(n)
        elapsed = time.perf_counter() - start
        partners = partners_by_node(rounds)
        rows.append(ScheduleRow(n, len(rounds), sum(len(pairs) for pairs in rounds),
                                min(len(found) for found in partners.values()), elapsed * 1e3))
    return rows


def main() -> int:
    print(f"{'N':>5} {'rounds':>6} {'pairs':>6} {'fewest partners':>15} {'compute ms':>10}")
    for row in schedule_rows():
        print(f"{row.node_count:>5} {row.rounds:>6} {row.pairs:>6} {row.fewest_partners:>15} "
              f"{row.compute_ms:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
