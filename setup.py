"""Package discovery for the folder mapping in pyproject.toml.

The design keeps launcher/, health/, sweep/, job/, templates/, site-configs/ and contrib/ at the top of
the repository, installed as subpackages of `trainctl`. pyproject.toml's `packages.find` cannot
map several folders into one namespace, and a hand-written list let a new subpackage go missing
from the wheel. So every package is found here from the tree: a folder with an `__init__.py`
under one of the mapped roots is a package, whatever its depth.
"""

from pathlib import Path

from setuptools import find_packages, setup

ROOTS = {
    "trainctl": "trainctl",
    "trainctl.launcher": "launcher",
    "trainctl.health": "health",
    "trainctl.sweep": "sweep",
    "trainctl.job": "job",
    "trainctl.guest": "guest",
    "trainctl.templates": "templates",
    "trainctl.site_configs": "site-configs",
    "trainctl.contrib": "contrib",
}


def packages_under(name: str, folder: str) -> list[str]:
    return [name] + [f"{name}.{sub}" for sub in find_packages(folder)]


if __name__ == "__main__":
    assert all((Path(folder) / "__init__.py").is_file() for folder in ROOTS.values())
    setup(packages=[p for name, folder in ROOTS.items() for p in packages_under(name, folder)],
          package_dir=ROOTS)
