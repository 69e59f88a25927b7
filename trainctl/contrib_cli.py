"""`trainctl contrib`: the files admins install beside Slurm and systemd, from the installed package.

A pip install has no repository beside it, so the slurm.conf lines, the hook script and the
sweep's systemd units travel as package data (`trainctl.contrib`) and this command prints them.
"""

from __future__ import annotations

from importlib import resources

import click

from trainctl.errors import UsageError


def contrib_files() -> dict[str, str]:
    """File name -> contents of every shipped contrib file."""
    folder = resources.files("trainctl.contrib")
    return {entry.name: entry.read_text() for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.is_file() and entry.name.startswith("trainctl-")}


def summary(text: str) -> str:
    """The file's first comment line: what it is."""
    first = next((line for line in text.splitlines() if line.startswith("# ")), "")
    return first[2:].strip()


@click.command("contrib")
@click.argument("name", required=False)
def contrib(name: str | None) -> None:
    """List the files admins install beside Slurm and systemd, or print NAME to stdout.

    For example, on each compute node:
    `trainctl contrib trainctl-slurm-hook.sh > /etc/slurm/trainctl-slurm-hook.sh`
    """
    files = contrib_files()
    if name is None:
        for file_name, text in files.items():
            click.echo(f"{file_name:28} {summary(text)}")
        return
    if name not in files:
        raise UsageError(f"no contrib file {name!r}", hint=f"one of: {', '.join(files)}")
    click.echo(files[name], nl=False)
