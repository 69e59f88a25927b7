"""What users install is what is tested: the wheel and the sdist hold the whole tree, and the
suite runs against the installed wheel, not against this folder."""

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import trainctl

REPO = Path(__file__).resolve().parents[1]
# The folders the wheel maps into the `trainctl` namespace (setup.py's ROOTS).
ROOTS = {"trainctl": "trainctl", "launcher": "trainctl/launcher", "health": "trainctl/health",
         "sweep": "trainctl/sweep", "job": "trainctl/job", "guest": "trainctl/guest",
         "templates": "trainctl/templates", "site-configs": "trainctl/site_configs",
         "contrib": "trainctl/contrib"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The sdist and the wheel built from it, as `scripts/setup` builds what it installs."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "-q", "--no-isolation", "-o", str(out), str(REPO)],
                   check=True, timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    (wheel,) = out.glob("slurm_trainctl-*.whl")  # the distribution name; the package is trainctl
    (sdist,) = out.glob("slurm_trainctl-*.tar.gz")
    return wheel, sdist


def tree_files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def test_the_wheel_holds_every_module_and_data_file_of_the_tree(dists):
    wheel, _ = dists
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"{installed}/{path.relative_to(REPO / folder).as_posix()}"
                for folder, installed in ROOTS.items() for path in tree_files(REPO / folder)}
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {len(missing)} file(s) of the tree: {missing}"
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"trainctl"}, "only one import package may land in site-packages"
    unexpected = sorted(n for n in names - expected if ".dist-info/" not in n)
    assert not unexpected, f"the wheel holds files that are not in the tree: {unexpected}"


def test_the_wheel_declares_the_command_and_leaves_torch_to_the_node_extra(dists):
    wheel, _ = dists
    archive = zipfile.ZipFile(wheel)
    info = {Path(n).name: archive.read(n).decode() for n in archive.namelist() if ".dist-info/" in n}
    assert "trainctl = trainctl.entry:run" in info["entry_points.txt"]
    requires = [line for line in info["METADATA"].splitlines() if line.startswith("Requires-Dist: torch")]
    assert requires and all("extra == \"node\"" in line for line in requires), requires


def test_the_sdist_is_the_whole_repository(dists):
    _, sdist = dists
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to compare the sdist with")
    tracked = set(subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True,
                                 check=True).stdout.split("\0")) - {""}
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()}
    missing = sorted(path for path in tracked if (REPO / path).is_file() and path not in members)
    assert not missing, f"the sdist lacks {len(missing)} tracked file(s): {missing}"


def test_the_suite_runs_against_the_installed_wheel_not_this_folder():
    # scripts/test installs the wheel it builds and runs pytest with -P, so the tree's `trainctl/`
    # folder never shadows the install; an editable install would hide a file missing from the wheel
    installed = Path(trainctl.__file__).resolve()
    direct_url = json.loads(metadata.distribution("slurm-trainctl").read_text("direct_url.json") or "{}")
    hint = "run the tests with `bash scripts/test`, which installs the built wheel"
    assert installed.parent != REPO / "trainctl", f"trainctl is imported from the tree, {installed}: {hint}"
    assert not direct_url.get("dir_info", {}).get("editable"), f"trainctl is an editable install: {hint}"


def test_every_module_of_the_installed_package_imports():
    # in a fresh interpreter, as a user would: a module whose import fails is named
    code = ("import importlib, pkgutil, trainctl\n"
            "bad = []\n"
            "for info in pkgutil.walk_packages(trainctl.__path__, 'trainctl.', onerror=bad.append):\n"
            "    if info.name.endswith('.__main__'): continue\n"
            "    try:\n"
            "        importlib.import_module(info.name)\n"
            "    except Exception as exc:\n"
            "        bad.append(f'{info.name}: {exc!r}')\n"
            "print('\\n'.join(map(str, bad)))\n")
    # runner and measure import torch at the top: they are the [node] extra's, which tests install
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300,
                         cwd="/", env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr


def test_python_dash_m_trainctl_is_the_trainctl_command():
    out = subprocess.run([sys.executable, "-P", "-m", "trainctl", "--version"], capture_output=True, text=True,
                         timeout=60, cwd="/")
    assert out.returncode == 0 and out.stdout.startswith("trainctl "), out.stderr


def test_a_command_that_needs_torch_without_it_names_the_extra_in_one_line():
    # torch blocked as if the login-node install (no [node] extra) lacked it
    code = "import sys; sys.modules['torch'] = None; from trainctl.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-P", "-c", code, "health", "compute"], capture_output=True, text=True,
                         timeout=60, cwd="/")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "pip install 'slurm-trainctl[node]'" in out.stderr


def test_login_node_commands_never_import_torch():
    code = ("import sys; sys.modules['torch'] = None; from trainctl.cli import main\n"
            "for argv in (['submit', '--help'], ['site', 'list'], ['job', '--help'], ['report', '--help'],\n"
            "             ['sweep', '--help'], ['contrib']):\n"
            "    assert main(argv) == 0, argv\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
