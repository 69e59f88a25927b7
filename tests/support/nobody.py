"""trainctl as another user (nobody), from an install that user can reach wherever the clone lies.

The tests run against the clone's .venv. Cloned into /root (0700 on Debian), that .venv is out of
nobody's reach, and so is its interpreter when the venv was made from one under /root (pyenv).
So the tests that run trainctl as nobody get their own install: a virtual
environment under a 755 temporary folder, made from an interpreter of the same Python version
that nobody can run, holding copies of the installed files of slurm-trainctl and of what it
requires (not its extras: nobody runs login-node commands, which need no torch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

NOBODY_UID = NOBODY_GID = 65534
DISTRIBUTION = "slurm-trainctl"


def setpriv_nobody() -> list[str]:
    """The argv prefix that runs a command as uid/gid nobody with no supplementary groups.

    setpriv execs its program while it still holds root's capabilities (they go at that exec),
    so it would start an interpreter that nobody cannot reach; env(1), started by setpriv, execs
    the command with nobody's rights alone."""
    setpriv, env = shutil.which("setpriv"), shutil.which("env")
    if setpriv is None or env is None:
        raise RuntimeError("setpriv (util-linux) and env are needed to run trainctl as nobody")
    return [setpriv, f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", env]


def _runs_as_nobody(python: str) -> bool:
    """Whether nobody can start `python`, which finds its standard library and is of this version."""
    probe = "import sys, json, sqlite3; print(sys.version_info[:2])"
    try:
        result = subprocess.run([*setpriv_nobody(), python, "-I", "-c", probe],
                                capture_output=True, text=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip() == str(sys.version_info[:2])


def base_interpreter() -> str:
    """An interpreter of this Python version that nobody can run: this venv's own base, else the system's."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [os.path.realpath(sys._base_executable), f"/usr/bin/python{version}", "/usr/bin/python3"]
    for python in dict.fromkeys(candidates):
        if os.path.isfile(python) and _runs_as_nobody(python):
            return python
    raise RuntimeError(f"no Python {version} that user nobody can run (tried {', '.join(candidates)})")


def requirement_closure(name: str) -> list[metadata.Distribution]:
    """The installed distribution `name` and, recursively, those its requirements name (no extras)."""
    found: dict[str, metadata.Distribution] = {}
    pending = [name]
    while pending:
        dist = metadata.distribution(pending.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in found:
            continue
        found[key] = dist
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


def make_install(root: Path) -> str:
    """root/venv with copies of this environment's slurm-trainctl and its requirements, every part
    readable by all; returns its interpreter."""
    root.chmod(0o755)
    python = root / "venv" / "bin" / "python"
    subprocess.run([base_interpreter(), "-m", "venv", "--without-pip", str(root / "venv")], check=True,
                   timeout=120)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(subprocess.run([str(python), "-c", where], capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip())
    for dist in requirement_closure(DISTRIBUTION):
        for file in dist.files or ():
            target = (purelib / file).resolve()
            if not target.is_relative_to(purelib):   # console scripts: they name the clone's interpreter
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dist.locate_file(file), target)
    for directory, _, files in os.walk(root):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, 0o644)
    return str(python)
