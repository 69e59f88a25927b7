"""Serve real recorded outputs as a command (a node's `nvidia-smi`, say) on the dev cluster.

The bytes the replay script prints are a real recording, copied verbatim; only the
delivery is staged. Put the script in `DevCluster.node_bin_dir(node)` to make it that
node's command for Slurm tasks. Arguments the recording does not cover make the script
fail the way a missing feature would (exit 2, a message on stderr).
"""

from __future__ import annotations

import shlex
from pathlib import Path


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
