"""`trainctl submit --dry-run` wall time against the libraries it needs (click, jinja2, tomllib).

Run: .venv/bin/python bench/submit_dryrun.py [--rounds 20]
Target (issue 6): submit --dry-run <= 1.3x `python -c 'import click, jinja2, tomllib'`; the
local dry-run path must not import torch or paramiko (tests/test_submit.py checks that).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_medians, print_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLOOR = "python -c 'import click, jinja2, tomllib' (floor)"
DRY_RUN = "trainctl submit --dry-run (local-demo, 2+2 nodes)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    if args.rounds < 10:
        parser.error("--rounds must be at least 10 (medians of fewer runs are noise)")
    python = sys.executable
    trainctl = str(Path(python).with_name("trainctl"))
    commands = {
        "python -c pass": [python, "-c", "pass"],
        FLOOR: [python, "-c", "import click, jinja2, tomllib"],
        DRY_RUN: [trainctl, "submit", "--site", "local-demo", "--nodes", "2", "--spare", "2", "--dry-run",
                  "--", str(REPO / "examples" / "train_ddp.py")],
        "trainctl submit --help": [trainctl, "submit", "--help"],
    }
    # Timed as users run it: with the .pyc files Python writes (a shell may switch that off).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    medians = interleaved_medians(commands, rounds=args.rounds, env=env)
    print(f"interpreter: {python}; {args.rounds} interleaved rounds, medians")
    met = print_table(medians, floor=FLOOR, targets={DRY_RUN: 1.3})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
