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


def test_service_commands_parse_and_only_the_sweeps_own_failure_fails_the_unit():
    settings = unit_settings((CONTRIB / "trainctl-sweep.service").read_text())
    env = dict(item.split("=", 1) for item in settings["Environment"])
    commands = settings["ExecStart"] + settings["ExecStopPost"]
    assert len(commands) == 2
    for command in commands:
        argv = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], command))
        assert argv[0] == "/usr/local/bin/trainctl"
        accepts(argv[1:])
    assert shlex.split(settings["ExecStart"][0])[1] == "sweep"
    # failing nodes are findings (--exit-zero); every non-zero exit (2 a broken config, 4, 70) fails the unit
    assert "--exit-zero" in shlex.split(settings["ExecStart"][0]) and "SuccessExitStatus" not in settings


def test_cron_line_runs_the_same_sweep_and_report():
    lines = [l for l in (CONTRIB / "trainctl-sweep.cron").read_text().splitlines()
             if l and not l.startswith("#") and "=" not in l.split()[0]]
    (line,) = lines
    fields = line.split(None, 6)
    assert fields[5] == "root"
    sweep_part, report = fields[6].split(";")
    sweep_command, on_failure = sweep_part.split("||")
    assert shlex.split(on_failure)[0] == "echo"   # cron mails a failed sweep's one line to MAILTO
    for command in (sweep_command, report):
        argv = [word for word in shlex.split(command) if not word.startswith((">", "2>"))]
        assert argv[0] == "trainctl"
        accepts(argv[1:])
    assert "--exit-zero" in shlex.split(sweep_command)


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


def test_exit_zero_keeps_node_findings_out_of_the_exit_code_but_not_a_broken_config(tmp_path):
    # a node that gives no verdict (its host key cannot be verified) is a finding: exit 3, or 0 with
    # --exit-zero; a site that does not load is the sweep's own failure: exit 2 either way
    site = tmp_path / "site.toml"
    site.write_text((CONTRIB.parent / "site-configs" / "local-demo.toml").read_text().replace(
        "/tmp/trainctl-devcluster/ssh/known_hosts", str(tmp_path / "no-known-hosts")))
    sweep = [TRAINCTL, "sweep", "--site", str(site), "--via", "ssh", "--nodes", "nosuchnode",
             "--db", str(tmp_path / "sweeps.db")]
    assert subprocess.run(sweep, capture_output=True, timeout=60).returncode == 3
    assert subprocess.run([*sweep, "--exit-zero"], capture_output=True, timeout=60).returncode == 0
    site.write_text("name = 1\n")
    assert subprocess.run([*sweep, "--exit-zero"], capture_output=True, timeout=60).returncode == 2
