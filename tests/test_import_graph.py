"""The folders' import graph, read from the source with ast: the job room (job/) sits above
health/, sweep/ and launcher/; health/ imports none of the others; no cycle between folders."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# folder -> the name it is installed under (setup.py's ROOTS, the Python packages)
FOLDERS = {"trainctl": "trainctl", "health": "trainctl.health", "sweep": "trainctl.sweep",
           "launcher": "trainctl.launcher", "job": "trainctl.job"}


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
