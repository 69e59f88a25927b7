"""Where the real recorded outputs live; `write_replay` serves one as a command."""

from pathlib import Path

from trainctl.devcluster.replay import write_replay  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parents[2]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
RECORDED = REPO / "tests" / "fixtures" / "recorded"
