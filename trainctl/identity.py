"""Which distribution this is, and whether another one claims the import name `trainctl`.

On the public index the name `trainctl` belongs to an unrelated project (an experiment
supervisor, 0.1.0) that also ships a top-level `trainctl` package and a `trainctl` command:
installed beside this one, each overwrites the other's files. This project is published as
`slurm-trainctl`; the command and the import name stay `trainctl`.
"""

from __future__ import annotations

import os
import sys

DISTRIBUTION = "slurm-trainctl"
SUMMARY = "Start multi-node GPU training on Slurm fast, and only on healthy hardware."


def foreign_distribution(paths: list[str] | None = None) -> str | None:
    """One line naming another installed distribution that ships the `trainctl` package, else None.

    Looks for `trainctl-*.dist-info` in each import path (a directory listing each: well under a
    millisecond); one whose summary is ours is this project installed under its old name.
    """
    for directory in paths if paths is not None else sys.path:
        try:
            names = os.listdir(directory or ".")
        except OSError:
            continue
        for name in names:
            if not (name.startswith("trainctl-") and name.endswith(".dist-info")):
                continue
            fields = _metadata(os.path.join(directory, name, "METADATA"))
            if fields.get("Summary") == SUMMARY:
                continue
            return (f"the distribution trainctl {fields.get('Version', '?')} ({fields.get('Summary', 'unknown')!r}) "
                    f"in {directory} also installs the import package `trainctl`, so the two overwrite each "
                    f"other: `pip uninstall trainctl`, then `pip install --force-reinstall {DISTRIBUTION}`")
    return None


def _metadata(path: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first blank line; the description follows
                key, sep, value = line.partition(":")
                if sep and key in ("Name", "Version", "Summary"):
                    fields[key] = value.strip()
    except OSError:
        pass
    return fields
