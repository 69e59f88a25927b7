"""Headless Chromium for the HTML pages' tests: the fixture that finds it, and a page's DOM or
screenshot as Chromium builds it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def chromium():
    binary = shutil.which("chromium")
    if binary is None:
        reason = "chromium not installed (scripts/setup installs the Debian package)"
        if os.environ.get("TRAINCTL_REQUIRE_CLUSTER") == "1":  # CI: a missing prerequisite fails
            pytest.fail(reason)
        pytest.skip(reason)
    return binary


def browse(chromium, tmp_path, page: Path, *action: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *action,
                           page.as_uri()], capture_output=True, text=True, timeout=120)


def page_dom(chromium, tmp_path, page: Path) -> subprocess.CompletedProcess:
    """The page's DOM as Chromium builds it (`--dump-dom`): its stdout."""
    dom = browse(chromium, tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom


def screenshot(chromium, tmp_path, page: Path, shot: Path, window: str) -> None:
    """A PNG of the page as Chromium draws it, at `shot` (test-artifacts/, for a person to look at)."""
    shot.parent.mkdir(exist_ok=True)
    shot.unlink(missing_ok=True)
    taken = browse(chromium, tmp_path, page, f"--screenshot={shot}", f"--window-size={window}")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
