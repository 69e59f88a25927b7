"""The guest room's rules (guest/__init__.py), each guarded here on the room itself; the programs
that run with it are in test_guest.py."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.guest import signal_judge, wire

ROOM = Path(__file__).resolve().parents[1] / "guest"
MODULES = sorted(path.stem for path in ROOM.glob("*.py") if path.stem != "__init__")
# Built into the interpreter (no file of a program's can stand in for them) or loaded by Python
# before any program's line (os, stat, sys), or underscore modules torch loads before the room.
ALLOWED = {"_signal", "_socket", "_struct", "_thread", "_warnings", "atexit", "os", "stat", "sys", "time"}


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


@pytest.mark.parametrize("path", sorted(ROOM.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOM)))
def test_the_room_imports_only_what_no_program_file_can_stand_in_for(path):
    foreign = {name for name in imports_of(path) if not name.startswith(".") and name not in ALLOWED}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
    # relative imports only in the `from .module import name` form, which needs no parent package
    # in sys.modules (the bootstrap loads the room without `trainctl`)
    assert "." not in imports_of(path)


# Import every module of the room in a watched rank's environment, and compare what a program can
# see before and after: threads, descriptors, the environment, exit and fork handlers, signal
# handlers, sys.path and sys.meta_path.
SNAPSHOT = """
import atexit, importlib, json, os, signal, sys
def seen():
    return {"tasks": len(os.listdir("/proc/self/task")), "fds": sorted(os.listdir("/proc/self/fd")),
            "environ": dict(os.environ), "atexit": atexit._ncallbacks(),
            "handlers": {int(s): repr(signal.getsignal(s)) for s in signal.valid_signals()
                         if s not in (signal.SIGKILL, signal.SIGSTOP)},
            "path": list(sys.path), "meta_path": [repr(f) for f in sys.meta_path]}
before = seen()
for name in sys.argv[1:]:
    importlib.import_module("trainctl.guest." + name)
after = seen()
print(json.dumps({key: before[key] == after[key] for key in before}))
"""


def test_importing_the_room_changes_nothing_a_program_can_see(tmp_path):
    env = dict(os.environ, RANK="0", **{wire.SOCKET_ENV: str(tmp_path / "agent.sock"),
                                        wire.WATCH_DIR_ENV: str(tmp_path), wire.SIGNAL_ENV: "10"})
    out = subprocess.run([sys.executable, "-P", "-c", SNAPSHOT, *MODULES], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {key: True for key in ("tasks", "fds", "environ", "atexit", "handlers",
                                                            "path", "meta_path")}
    assert list(tmp_path.iterdir()) == []   # no claim, no socket, no file: nothing before the first report


class RaisingEquality:
    """A handler whose comparison ends the interpreter, and whose attributes raise."""

    def __eq__(self, other):
        raise SystemExit("compared")

    __hash__ = object.__hash__

    def __getattr__(self, name):
        raise SystemExit(f"asked for {name}")

    def __call__(self, signum, frame):
        pass


def test_judging_a_handler_runs_none_of_its_code():
    assert signal_judge.signal_refusal(signal.SIGUSR1, RaisingEquality()) is None
    assert signal_judge.owner_module(RaisingEquality()) == __name__


PUBLIC_CALLS = """
import trainctl.progress as progress
from trainctl.guest import rank, reporter
def broken(*args, **kwargs):
    raise SystemError("a bug in the guest")
reporter.Reporter.step = broken
reporter.Reporter.send = broken
progress.requests = broken
progress.step()
progress.checkpoint(3)
with progress.compute():
    pass
print(progress.checkpoint_requested())
"""


def test_the_public_calls_never_raise_into_the_program_even_when_the_room_fails(tmp_path):
    env = dict(os.environ, RANK="0", **{wire.SOCKET_ENV: str(tmp_path / "agent.sock")})
    out = subprocess.run([sys.executable, "-P", "-c", PUBLIC_CALLS], env=env, capture_output=True, text=True,
                         timeout=120)
    assert (out.returncode, out.stdout) == (0, "False\n"), out.stderr


def test_the_bootstrap_waits_for_exactly_the_modules_the_room_has_a_hook_for():
    from trainctl.guest import hook
    from trainctl.launcher.rank_exec import BOOTSTRAP_DIR

    tree = ast.parse((Path(BOOTSTRAP_DIR) / "sitecustomize.py").read_text())
    [targets] = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and [getattr(t, "id", None) for t in node.targets] == ["_TARGETS"]]
    assert set(ast.literal_eval(targets.args[0])) == set(hook.INSTALLERS)
