"""The folders' import graph, read from the source with ast: the job room (job/) sits above
health/, sweep/ and launcher/; health/ imports none of the others; no cycle between folders.
And what the login-node commands import when they run: none of health/'s checks, parsers or
probes (they cost a third of `submit --dry-run`'s start-up; bench/login_path.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.sweeps import night
from trainctl.health.check_names import CHECK_NAMES
from trainctl.sweep.db import History

REPO = Path(__file__).resolve().parents[1]
# folder -> the name it is installed under (setup.py's ROOTS, the Python packages)
FOLDERS = {"trainctl": "trainctl", "health": "trainctl.health", "sweep": "trainctl.sweep",
           "launcher": "trainctl.launcher", "job": "trainctl.job", "guest": "trainctl.guest"}


def folder_of(module: str) -> str | None:
    """The folder a `trainctl...` module lives in (the longest installed name that holds it)."""
    matches = [folder for folder, name in FOLDERS.items() if module == name or module.startswith(name + ".")]
    return max(matches, key=lambda folder: len(FOLDERS[folder])) if matches else None


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (lazy imports count too)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def folder_graph() -> dict[str, dict[str, set[str]]]:
    """{folder: {imported folder: {file that imports it, ...}}}, between different folders only."""
    graph: dict[str, dict[str, set[str]]] = {folder: {} for folder in FOLDERS}
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            for module in imported_modules(path):
                target = folder_of(module)
                if target and target != folder:
                    graph[folder].setdefault(target, set()).add(str(path.relative_to(REPO)))
    return graph


def test_imports_are_read_from_lazy_imports_too(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\ndef f():\n    from trainctl.job.gate import decide\n")
    assert "trainctl.job.gate" in imported_modules(source)
    assert folder_of("trainctl.job.gate") == "job" and folder_of("trainctl.slurm") == "trainctl"
    assert folder_of("trainctl.jobs") == "trainctl" and folder_of("click") is None


@pytest.mark.parametrize("folder", ["health", "sweep", "launcher", "trainctl"])
def test_nothing_below_the_job_room_imports_it(folder):
    assert "job" not in folder_graph()[folder], folder_graph()[folder].get("job")


def test_the_guest_room_is_the_lowest_floor():
    # its code runs inside the user's program: it may use nothing of trainctl's outside itself
    assert folder_graph()["guest"] == {}


def test_health_imports_neither_sweep_nor_launcher():
    graph = folder_graph()["health"]
    assert not {"sweep", "launcher", "job"} & set(graph), graph


def test_no_cycle_between_folders():
    graph = {folder: set(targets) for folder, targets in folder_graph().items()}
    done: set[str] = set()

    def visit(folder: str, path: tuple[str, ...]) -> None:
        assert folder not in path, f"import cycle: {' -> '.join(path + (folder,))}: {folder_graph()}"
        if folder in done:
            return
        for target in graph[folder]:
            visit(target, path + (folder,))
        done.add(folder)

    for folder in graph:
        visit(folder, ())


# ---------------------------------------------------------------- what the login-node commands import

NAMES_ONLY = {"trainctl.health", "trainctl.health.check_names"}   # submit and site show check a site's names
STATUSES = {"trainctl.health", "trainctl.health.status"}         # a report prints the checks' statuses
# and groups the strikes by failure family, the Xids' by the catalogue (a table beside the statuses)
FAMILIES = STATUSES | {"trainctl.health.xid_catalog"}
LOGIN_COMMANDS = {
    "submit --dry-run": (["submit", "--site", "local-demo", "--nodes", "2", "--spare", "2", "--dry-run", "--",
                          str(REPO / "examples" / "train_ddp.py")], NAMES_ONLY),
    "submit --help": (["submit", "--help"], set()),
    "site show": (["site", "show", "local-demo", "--json"], NAMES_ONLY),
    "site list": (["site", "list"], set()),
    "job show": (["job", "show", "8", "--dir", "{job_dir}"], set()),
    "job show --json": (["job", "show", "8", "--dir", "{job_dir}", "--json"], set()),
    "job show --html": (["job", "show", "8", "--dir", "{job_dir}", "--html", "{job_dir}.html"], set()),
    "report": (["report", "--db", "{db}"], FAMILIES),
    "report --format html": (["report", "--db", "{db}", "--format", "html"], FAMILIES),
    "drain (the plan)": (["drain", "--db", "{db}"], FAMILIES),
    "--help": (["--help"], set()),
}
REPORT_MODULES = ("import sys, json; from trainctl.cli import main; rc = main(sys.argv[1:]); "
                  "health = sorted(m for m in sys.modules if m.startswith('trainctl.health')); "
                  "print(json.dumps([rc, health]), file=sys.stderr)")


@pytest.mark.parametrize("name", LOGIN_COMMANDS)
def test_a_login_node_command_imports_only_the_health_modules_it_needs(name, tmp_path):
    job_dir = tmp_path / "trainctl-gate-8"
    job_dir.mkdir()
    start = {"t": 100.0, "event": "job_start", "attempt": 1}
    (job_dir / "journal.jsonl").write_text(json.dumps(start) + "\n")
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        night(history, time.time() - 3600, {"gpu1": "ok", "gpu2": {"ib.ports": ("fail", "mlx5_2/1 Down")}})
    bin_dir = tmp_path / "bin"      # drain plans against Slurm's node states: a Slurm that knows no node
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sinfo").chmod(0o755)
    args, allowed = LOGIN_COMMANDS[name]
    argv = [arg.format(job_dir=job_dir, db=db) for arg in args]
    result = subprocess.run([sys.executable, "-c", REPORT_MODULES, *argv], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    returncode, imported = json.loads(result.stderr.splitlines()[-1])
    assert returncode == 0, result.stderr
    assert set(imported) <= allowed, sorted(set(imported) - allowed)


def test_every_check_name_the_login_commands_know_is_a_registered_check():
    # the other way round, registry.check refuses a check that check_names does not list
    from trainctl.health.registry import all_checks

    assert {spec.name for spec in all_checks()} == CHECK_NAMES
