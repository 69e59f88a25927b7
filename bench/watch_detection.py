"""Detection quality of the in-training watch, N runs per scenario on the dev cluster, as a table
(by hand, as root).

Runs tests/test_watch_cluster.py with TRAINCTL_WATCH_SCENARIOS and TRAINCTL_WATCH_RUNS (each run
submits a job of 3 nodes + 1 held spare, injects the scenario's fault at step 20 by PID,
namespace or tc, and reads the job's journal; h-k: an unmodified framework program on 2 nodes + 1
held spare, the fault after its second save), then summarises
test-artifacts/watch-detection.tsv: per scenario, runs, runs COMPLETED, runs in which the right
node (and only it) was named and left out, runs in which a healthy node was left out, the
seconds from fault to detection, from fault to decision and from decision to training again
(median, max), and for the whole chain of jobs (a requeue adds one) the seconds from submit to
the end and the goodput, how many slowdowns the gate pinned on no node (training then went on on
the same nodes), how many times the watch stopped the training step (stops), and how many
slowdowns nobody was named for it weighed and let go on (let go), and how long the job trained
(its first step to its end). `--watch-off` runs the same faults without the watch, with `--retries 1`.
Each run's journal is kept beside the figures, in test-artifacts/watch-journals/.

    TRAINCTL_DEVCLUSTER_INSTANCE=1 .venv/bin/python -P bench/watch_detection.py --scenarios a,c,d,e --runs 10
    .venv/bin/python -P bench/watch_detection.py --scenarios f --runs 20 --seconds 180
    for i in $(seq 10); do .venv/bin/python -P bench/watch_detection.py --scenarios l,o,m --seconds 200 --keep; done
    TRAINCTL_DEVCLUSTER_INSTANCE=2 .venv/bin/python -P bench/watch_detection.py --scenarios h,i,j --runs 3
    .venv/bin/python -P bench/watch_detection.py --scenarios a,c --runs 3 --watch-off --keep
    .venv/bin/python -P bench/watch_detection.py --summary-only
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
FIGURES = REPO / "test-artifacts" / "watch-detection.tsv"
CONDEMNS = {"a", "b", "c", "d", "g", "h", "i", "j", "k"}      # scenarios whose victim must be named (the rest: nobody)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f}, {max(values):.1f}"


def summary(path: Path) -> str:
    rows = defaultdict(list)
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        # scenario run job state victim named right detect decide retrain detections mode jobs wall goodput
        # stops let-go (rows from before those two columns count neither)
        if len(fields) >= 15:
            rows[(fields[0], fields[11])].append(fields)
    lines = [f"{'scenario':<8} {'watch':<5} {'runs':>4} {'COMPLETED':>9} {'right node':>10} {'healthy out':>11}  "
             f"{'fault->detection s':<19} {'fault->decision s':<18} {'decision->training s':<21} "
             f"{'slow, not localised':<19} {'stops':>5} {'let go':>6} {'jobs':>4}  {'submit->end s':<14} {'goodput':<8}"
             f"trained s (min, median)"]
    for (scenario, mode), runs in sorted(rows.items()):
        def numbers(index: int) -> list[float]:
            return [float(r[index]) for r in runs if r[index]]

        right = sum(r[6] == "True" for r in runs) if scenario in CONDEMNS and mode == "watch" else "-"
        healthy_out = sum(1 for r in runs for node in (r[5].split(",") if r[5] != "-" else [])
                          if node != r[4] or scenario not in CONDEMNS)
        # slowdowns the gate pinned on no node (training went on on the same nodes): "slow:-"
        unlocalised = [r[10].split(";").count("slow:-") for r in runs]
        goodputs = numbers(14)
        stops = sum(int(r[15]) for r in runs if len(r) > 16)
        let_go = sum(int(r[16]) for r in runs if len(r) > 16)
        trained = [float(r[17]) for r in runs if len(r) > 17 and r[17]]   # first step to the job's end
        lines.append(f"{scenario:<8} {mode:<5} {len(runs):>4} {sum(r[3] == 'COMPLETED' for r in runs):>9} "
                     f"{right!s:>10} {healthy_out:>11}  {spread(numbers(7)):<19} {spread(numbers(8)):<18} "
                     f"{spread(numbers(9)):<21} {f'{sum(unlocalised)} in {sum(map(bool, unlocalised))} runs':<19} "
                     f"{stops:>5} {let_go:>6} "
                     f"{max(int(r[12]) for r in runs):>4}  {spread(numbers(13)):<14} "
                     f"{f'{statistics.median(goodputs):.1%}' if goodputs else '-':<8}"
                     f"{f'{min(trained):.0f}, {statistics.median(trained):.0f}' if trained else '-'}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="a,c,d,e,f")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=180.0, help="length of a healthy run (scenario f)")
    parser.add_argument("--keep", action="store_true", help="append to the last figures instead of starting anew")
    parser.add_argument("--watch-off", action="store_true",
                        help="the same faults with the watch off and --retries 1 (what a job had before it)")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args()
    if not args.summary_only:
        if not args.keep:
            FIGURES.unlink(missing_ok=True)
        env = {**os.environ, "TRAINCTL_WATCH_SCENARIOS": args.scenarios, "TRAINCTL_WATCH_RUNS": str(args.runs),
               "TRAINCTL_WATCH_SECONDS": str(args.seconds), "PYTHONSAFEPATH": "1",
               "TRAINCTL_WATCH_OFF": "1" if args.watch_off else "0"}
        subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "tests/test_watch_cluster.py"], cwd=REPO, env=env)
    print(summary(FIGURES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
