"""A node lost during the gate, N runs per case on the dev cluster, as a table (by hand, as root).

Runs tests/test_gate_faults.py with TRAINCTL_GATE_FAULT_RUNS=N (each run submits a gated job
and kills or stops node4 by PID at one moment of the gate), then summarises
test-artifacts/gate-faults.tsv: per case, runs COMPLETED, and the seconds from node4's death
to the decision and from the decision to the training step's start (medians, worst).

    TRAINCTL_DEVCLUSTER_INSTANCE=1 .venv/bin/python bench/gate_faults.py --runs 5 [-k 'mid_round']
    .venv/bin/python bench/gate_faults.py --summary-only     # just the table of the last runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "test-artifacts" / "gate-faults.tsv"


def summary(path: Path) -> str:
    rows = defaultdict(list)
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 7:  # case, run, job, state, death->decision, decision->training, start->training
            rows[fields[0]].append(fields)
    lines = [f"{'case':<18} {'runs':>4} {'COMPLETED':>9}  {'death->decision s (median, max)':<32} "
             f"{'decision->training s':<21} job start->training s (max)"]
    for case, runs in rows.items():
        decided = [float(r[4]) for r in runs]
        training = [float(r[5]) for r in runs]
        started = [float(r[6]) for r in runs]
        completed = sum(r[3] == "COMPLETED" for r in runs)
        lines.append(f"{case:<18} {len(runs):>4} {completed:>9}  "
                     f"{statistics.median(decided):>6.1f}, {max(decided):>6.1f}{'':<18} "
                     f"{statistics.median(training):>6.1f}, {max(training):>6.1f}{'':<7} {max(started):.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression (cases)")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    if not args.summary_only:
        FIGURES.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "pytest", "-q", "tests/test_gate_faults.py", "-k",
                args.select or "test_a_node_lost"]
        subprocess.run(argv, cwd=REPO, env={**os.environ, "TRAINCTL_GATE_FAULT_RUNS": str(args.runs)})
    print(summary(FIGURES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
