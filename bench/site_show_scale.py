"""`trainctl site show` on a site with N partitions against one with 4N: linear means ~4x.

Run: .venv/bin/python bench/site_show_scale.py [--partitions 2500] [--rounds 3]
Target (issue 12): linear in the number of partitions (it was quadratic: 10,000 took 286 s).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved_medians, print_table  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "site-configs" / "local-demo.toml"


def site_with(partitions: int, directory: Path) -> Path:
    text = DEMO.read_text()
    start = text.index("[partitions.gpu]")
    end = text.find("\n[", start + 1)
    block = text[start:] if end < 0 else text[start:end]
    path = directory / f"parts{partitions}.toml"
    path.write_text(text + "\n" + "".join(block.replace("[partitions.gpu]", f"[partitions.p{i}]") + "\n"
                                          for i in range(partitions)))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trainctl = str(Path(sys.executable).with_name("trainctl"))
    with tempfile.TemporaryDirectory() as tmp:
        small, large = site_with(args.partitions, Path(tmp)), site_with(4 * args.partitions, Path(tmp))
        commands = {f"site show, {args.partitions} partitions (floor)": [trainctl, "site", "show", str(small)],
                    f"site show, {4 * args.partitions} partitions": [trainctl, "site", "show", str(large)]}
        medians = interleaved_medians(commands, rounds=args.rounds, warmup=1)
    print(f"{args.rounds} interleaved rounds, medians; linear is 4x, quadratic 16x")
    met = print_table(medians, floor=next(iter(commands)), targets={list(commands)[1]: 6.0})
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
