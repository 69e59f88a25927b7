"""contrib/: the systemd units and the cron line run commands trainctl really accepts."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from trainctl.cli import cli

CONTRIB = Path(__file__).resolve().parents[1] / "contrib"
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))


def unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def accepts(argv: list[str]) -> None:
    """Parse `trainctl argv...` with the real CLI without running it (raises on a bad option)."""
    command = cli.get_command(click.Context(cli), argv[0])
    assert command is not None, f"no command {argv[0]!r}"
    command.make_context(argv[0], argv[1:])


def test_service_commands_parse_and_node_findings_do_not_fail_the_unit():
    settings = unit_settings((CONTRIB / "trainctl-sweep.service").read_text())
    env = dict(item.split("=", 1) for item in settings["Environment"])
    commands = settings["ExecStart"] + settings["ExecStopPost"]
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], command))
        assert argv[0] == "/usr/local/bin/trainctl"
        accepts(argv[1:])
    assert shlex.split(settings["ExecStart"][0])[1] == "sweep"
    assert settings["SuccessExitStatus"] == ["1 2 3"]   # warn/fail/unknown are findings; 4 and 70 are failures


def test_cron_line_runs_the_same_sweep_and_report():
    lines = [l for l in (CONTRIB / "trainctl-sweep.cron").read_text().splitlines()
             if l and not l.startswith("#") and "=" not in l.split()[0]]
    (line,) = lines
    fields = line.split(None, 6)
    assert fields[5] == "root"
    for command in fields[6].split(";"):
        argv = [word for word in shlex.split(command) if not word.startswith((">", "2>"))]
        assert argv[0] == "trainctl"
        accepts(argv[1:])


def test_bad_option_is_caught_by_the_parse_check():
    with pytest.raises(click.UsageError):
        accepts(["sweep", "--site", "x", "--no-such-option"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_verify(tmp_path):
    for name in ("trainctl-sweep.service", "trainctl-sweep.timer"):
        text = (CONTRIB / name).read_text().replace("/usr/local/bin/trainctl", TRAINCTL)
        (tmp_path / name).write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "trainctl-sweep.service"),
                          str(tmp_path / "trainctl-sweep.timer")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_installed_package_prints_every_contrib_file_as_it_is_in_the_repository():
    # a pip user has no contrib/ folder: `trainctl contrib NAME` is how the files reach them
    shipped = sorted(p.name for p in CONTRIB.iterdir() if p.name.startswith("trainctl-"))
    listing = subprocess.run([TRAINCTL, "contrib"], capture_output=True, text=True, timeout=60, check=True)
    assert [line.split()[0] for line in listing.stdout.splitlines()] == shipped
    for name in shipped:
        out = subprocess.run([TRAINCTL, "contrib", name], capture_output=True, timeout=60, check=True)
        assert out.stdout == (CONTRIB / name).read_bytes(), name


def test_an_unknown_contrib_file_is_one_line_naming_the_files():
    out = subprocess.run([TRAINCTL, "contrib", "slurm.conf"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "trainctl-slurm-hook.sh" in out.stderr
