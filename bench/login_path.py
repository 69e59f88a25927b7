"""The login path's start-up: `trainctl --help` against `import click`, and `trainctl submit
--dry-run` against the libraries it cannot do without (click, jinja2, tomllib).

Run: .venv/bin/python bench/login_path.py [--rounds 30]
Whole processes of the installed wheel, each timed back to back with its floor in interleaved
pairs (bench/timing.py); the ratio is the median of the pairs' wall-time ratios (their CPU-time
ratio, printed beside it, leaves out waiting for a core). Targets: --help <= 1.2x,
submit --dry-run <= 1.3x. A bare Click group's --help is timed too: what Click's help formatting
alone costs over `import click`. Which health/ modules the login commands may import:
tests/test_import_graph.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_ratios  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HELP = "trainctl --help"
BARE_HELP = "a bare Click group's --help (reference)"
DRY_RUN = "trainctl submit --dry-run (local-demo, 2+2 nodes)"
TARGETS = {HELP: 1.2, DRY_RUN: 1.3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    if args.rounds < 10:
        parser.error("--rounds must be at least 10 (medians of fewer runs are noise)")
    python = sys.executable
    trainctl = str(Path(python).with_name("trainctl"))
    bare_group = "import click\n@click.group()\ndef group():\n    'A group.'\ngroup(['--help'])"
    pairs = {
        HELP: ([python, "-c", "import click"], [trainctl, "--help"]),
        BARE_HELP: ([python, "-c", "import click"], [python, "-c", bare_group]),
        DRY_RUN: ([python, "-c", "import click, jinja2, tomllib"],
                  [trainctl, "submit", "--site", "local-demo", "--nodes", "2", "--spare", "2", "--dry-run",
                   "--", str(REPO / "examples" / "train_ddp.py")]),
    }
    floors = {HELP: "python -c 'import click'", BARE_HELP: "python -c 'import click'",
              DRY_RUN: "python -c 'import click, jinja2, tomllib'"}
    # Timed as users run it: with the .pyc files Python writes (a shell may switch that off).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    results = paired_ratios(pairs, rounds=args.rounds, env=env)
    load = os.getloadavg()[0]
    print(f"interpreter: {python}; {args.rounds} interleaved pairs, medians; load average {load:.1f}")
    all_met = True
    for name, result in results.items():
        command_ms, floor_ms = result["command_s"] * 1e3, result["floor_s"] * 1e3
        verdict = ""
        if name in TARGETS:
            met = result["ratio"] <= TARGETS[name]
            all_met &= met
            verdict = f" (target <= {TARGETS[name]}: {'met' if met else 'MISSED'})"
        print(f"{name}: {command_ms:.1f} ms vs {floors[name]} {floor_ms:.1f} ms: "
              f"{result['ratio']:.2f}x{verdict}; CPU time {result['cpu_ratio']:.2f}x")
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
