"""Where the real recorded outputs live; `write_replay` serves one as a command."""

import os
from pathlib import Path

from trainctl.devcluster.replay import write_replay

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "tests" / "fixtures" / "library"  # real recorded outputs; sources in its SOURCES.md
RECORDED = REPO / "tests" / "fixtures" / "recorded"


def swap_replay(bin_dir: Path, name: str, outputs: dict[str, Path]) -> Path:
    """Serve `outputs` as `bin_dir/name` from now on, replaced in one rename: a node that runs the
    command meanwhile runs the old script or the new one, never half of one."""
    staged = write_replay(bin_dir.parent / "staging", name, outputs)
    os.replace(staged, bin_dir / name)
    return bin_dir / name
