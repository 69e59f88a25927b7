"""The `trainctl` entry point: lazy loading, the error funnel, exit codes, signals, pipes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent

# Run `trainctl` with probe commands grafted onto its command map, in a real interpreter.
GRAFT = """
import sys
import trainctl.cli as cli
for name, attr in [("sleep-forever", "sleep_forever"), ("many-lines", "many_lines"),
                   ("bad-config", "bad_config"), ("bug", "bug"), ("not-a-command", "not_a_command")]:
    cli.COMMANDS[name] = ("cli_probe_commands", attr, "probe")
cli.COMMANDS["broken"] = ("trainctl.no_such_module", "x", "a subcommand whose module is missing")
sys.exit(cli.main(sys.argv[1:]))
"""


def trainctl(*args, extra_env=None):
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR), **(extra_env or {}))
    return subprocess.run([sys.executable, "-c", GRAFT, *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_help_lists_commands_from_the_map_without_importing_them():
    code = ("import sys; from trainctl.cli import main; rc = main(['--help']); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'torch', 'paramiko', 'jinja2', 'trainctl'} and m not in "
            "{'trainctl', 'trainctl.cli', 'trainctl.errors', 'trainctl.identity', 'trainctl.signals'}); print('HEAVY', heavy, rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "dev-cluster" in out.stdout
    assert "HEAVY [] 0" in out.stdout


def test_console_script_version():
    exe = Path(sys.executable).with_name("trainctl")
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("trainctl ")


def test_unknown_command_is_a_usage_error():
    out = trainctl("no-such-thing")
    assert out.returncode == 2
    assert "No such command" in out.stderr


def test_broken_subcommand_fails_loudly_not_as_no_such_command():
    out = trainctl("broken")
    assert out.returncode == 70
    assert "failed to load" in out.stderr and "trainctl.no_such_module" in out.stderr
    assert "No such command" not in out.stderr
    assert "Traceback" not in out.stderr


def test_map_entry_that_is_not_a_command_fails_loudly():
    out = trainctl("not-a-command")
    assert out.returncode == 70
    assert "is not a Click command" in out.stderr


def test_typed_error_is_one_line_with_its_exit_code():
    out = trainctl("bad-config")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "trainctl: error: site-configs/x.toml: [partition.gpu] nodes: expected an integer, got 'four'"]


def test_unexpected_exception_is_an_internal_error_without_traceback():
    out = trainctl("bug")
    assert out.returncode == 70
    assert "internal error: KeyError" in out.stderr
    assert "Traceback" not in out.stderr


def test_debug_environment_shows_the_traceback():
    out = trainctl("bug", extra_env={"TRAINCTL_DEBUG": "1"})
    assert out.returncode != 0
    assert "Traceback" in out.stderr


def test_ctrl_c_exits_130_quietly():
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    proc = subprocess.Popen([sys.executable, "-c", GRAFT, "sleep-forever"], stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stderr.readline().strip() == "sleeping"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert "interrupted" in err


def test_closed_pipe_is_quiet():
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    producer = subprocess.Popen([sys.executable, "-c", GRAFT, "many-lines"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
    first = producer.stdout.readline()
    producer.stdout.close()  # the reader leaves, as `| head -1` does
    start = time.monotonic()
    err = producer.stderr.read().decode()
    producer.wait(timeout=30)
    assert first == b"line 0\n"
    assert err == ""
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("argv", [["--help"], ["dev-cluster", "--help"]])
def test_help_exits_zero(argv):
    out = trainctl(*argv)
    assert out.returncode == 0, out.stderr
    assert "Usage:" in out.stdout


@pytest.mark.parametrize("columns", ["", "0", "40", "60", "79", "80", "200", "wide"])
def test_the_help_width_is_the_one_click_would_choose(columns, monkeypatch):
    import click

    from trainctl.cli import help_width

    monkeypatch.setenv("COLUMNS", columns)
    if columns == "wide":   # shutil refuses a COLUMNS that is not a number; Click cannot ask it
        monkeypatch.delenv("COLUMNS")
    assert help_width() == click.HelpFormatter().width
