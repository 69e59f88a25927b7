"""Where the real recorded outputs live; `write_replay` serves one as a command."""

from pathlib import Path

from trainctl.devcluster.replay import write_replay  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "tests" / "fixtures" / "library"  # real recorded outputs; sources in its SOURCES.md
RECORDED = REPO / "tests" / "fixtures" / "recorded"
