"""`pip install .` gives one import namespace: nothing but `trainctl` at the top of site-packages."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_has_one_top_level_package_and_its_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(REPO)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    (wheel,) = tmp_path.glob("slurm_trainctl-*.whl")  # the distribution name; the package is trainctl
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"trainctl"}
    for module in ("trainctl/cli.py", "trainctl/health/collect.py", "trainctl/launcher/__init__.py",
                   "trainctl/devcluster/__init__.py"):
        assert module in names
    shipped_data = {n for n in names if n.startswith(("trainctl/templates/", "trainctl/site_configs/"))
                    and not n.endswith(".py")}
    on_disk = {f"trainctl/templates/{p.name}" for p in (REPO / "templates").glob("*.j2")}
    on_disk |= {f"trainctl/site_configs/{p.name}" for p in (REPO / "site-configs").glob("*.toml")}
    assert shipped_data == on_disk
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "trainctl = trainctl.entry:run" in zipfile.ZipFile(wheel).read(entry_points).decode()
