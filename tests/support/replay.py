"""Serve real recorded outputs as a node's `nvidia-smi` (or any probe binary).

The bytes a replay script prints are copied verbatim from `../shared/fixtures/` or
`tests/fixtures/recorded/`; only the delivery is staged. Arguments the recording does not
cover make the script fail the way a missing feature would (exit 2, message on stderr).
"""

from __future__ import annotations

import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
RECORDED = REPO / "tests" / "fixtures" / "recorded"


def write_replay(bin_dir: Path, name: str, outputs: dict[str, Path], *, sleep_s: float = 0,
                 exit_code: int = 0) -> Path:
    """Write an executable `bin_dir/name` printing `outputs[" ".join(args)]`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    lines = ["#!/bin/sh", f"# replays recorded `{name}` outputs (tests/support/replay.py)"]
    if sleep_s:
        lines.append(f"sleep {sleep_s:g}")
    lines.append('case "$*" in')
    for args, path in outputs.items():
        lines.append(f"  {shlex.quote(args)}) cat {shlex.quote(str(path))}; exit {exit_code};;")
    lines.append(f'  *) echo "{name}: no recording for: $*" >&2; exit 2;;')
    lines.append("esac")
    script = bin_dir / name
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script
