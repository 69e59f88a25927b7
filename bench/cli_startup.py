"""`trainctl --help` start-up time against the Click floor and a bare interpreter.

Run: .venv/bin/python bench/cli_startup.py [--rounds 20]
Target (issue 3): trainctl --help <= 1.25x `python -c 'import click'`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_medians, print_table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    python = sys.executable
    trainctl = str(Path(python).with_name("trainctl"))
    commands = {
        "python -c pass": [python, "-c", "pass"],
        "python -c 'import click' (floor)": [python, "-c", "import click"],
        "trainctl --help": [trainctl, "--help"],
        "trainctl dev-cluster --help": [trainctl, "dev-cluster", "--help"],
    }
    medians = interleaved_medians(commands, rounds=args.rounds)
    print(f"interpreter: {python}; {args.rounds} interleaved rounds, medians")
    met = print_table(medians, floor="python -c 'import click' (floor)",
                      targets={"trainctl --help": 1.25})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
