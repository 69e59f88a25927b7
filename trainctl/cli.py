"""The `trainctl` command: a Click group whose subcommands load lazily from one map.

Login nodes are slow shared machines, so `trainctl --help` imports Click and nothing
else: each subcommand's module is imported only when that subcommand runs, and the
help listing is read from the map below, not from the modules.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import signal
import sys

import click

from trainctl import __version__
from trainctl.errors import (EXIT_CLOSED_PIPE, EXIT_INTERNAL, EXIT_SIGNAL_BASE, EXIT_USAGE, CommandLoadError,
                             STOP_SIGNALS, Stopped, TrainctlError)
from trainctl.signals import on_stop_signal

# name -> (module, attribute, one-line help). The only place a subcommand is registered.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "breaker": ("trainctl.sweep.cli", "breaker",
                "The cap on trainctl's automatic drains: its state, and the admin's reset."),
    "contrib": ("trainctl.contrib_cli", "contrib",
                "Print the files admins install: slurm.conf hook lines, the hook script, sweep units."),
    "dev-cluster": ("trainctl.devcluster.cli", "dev_cluster",
                    "Start, inspect and stop the local demo Slurm cluster (needs root)."),
    "drain": ("trainctl.sweep.cli", "drain",
              "Drain the nodes that failed the newest sweep (tagged reason; never others' drains)."),
    "gate": ("trainctl.job.gate_cli", "gate",
             "Inside a job: check every allocated node, then choose the healthy ones for srun."),
    "health": ("trainctl.health.cli", "health",
               "Node health: collect a snapshot, check it, list the checks."),
    "history": ("trainctl.sweep.cli", "history",
                "The node history: fold the jobs' journals in (the nightly sweep does it too)."),
    "job": ("trainctl.job.cli", "job",
            "A job: run it (inside its script), or show its timeline, goodput, gate decision and ranks' logs."),
    "rank-exec": ("trainctl.launcher.submit_cli", "rank_exec",
                  "Inside a job step: set one rank's torch.distributed env, bind it, exec the program."),
    "report": ("trainctl.sweep.cli", "report",
               "What is broken since when: sweep history as text, JSON, Markdown, HTML, Prometheus."),
    "resume": ("trainctl.sweep.cli", "resume",
               "Resume nodes trainctl drained that still carry its reason and pass a fresh check."),
    "topo": ("trainctl.health.topo_cli", "topo",
             "Each GPU's CPU/NUMA affinity and nearest NICs, from nvidia-smi topo -m."),
    "site": ("trainctl.launcher.site_cli", "site",
             "Site configs: list them, show what one sets and where each value came from."),
    "submit": ("trainctl.launcher.submit_cli", "submit",
               "Render the sbatch script for a site (gate, NCCL, binding) and submit it, here or over SSH."),
    "sweep": ("trainctl.sweep.cli", "sweep",
              "Run the node checks on a partition's idle nodes (or over SSH); record the history."),
}


# Modules only some commands import -> the extra that installs them (pyproject.toml). A login node
# installs plain slurm-trainctl; compute nodes, where the fabric and compute tests run, add [node].
OPTIONAL_EXTRAS = {"torch": "node"}


class ClosedPipe(Exception):
    """stdout's reader went away. Not an OSError, so that Click's own EPIPE handling (exit 1,
    which reads as "warning") never sees it and `main` exits 141 instead."""


@contextlib.contextmanager
def _pipe_closes_quietly():
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            raise ClosedPipe() from exc
        raise


def help_width() -> int:
    """The width Click's help formatter would choose (the terminal's, at most 78 and at least 50),
    found as shutil.get_terminal_size() finds the terminal's (COLUMNS, then stdout's terminal, else
    80) without importing shutil, which Click does for it: shutil's imports (bz2, lzma, zlib,
    fnmatch) are a third of what `trainctl --help` costs over `import click`."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return max(min(columns or 80, 80) - 2, 50)


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is used."""

    def make_context(self, *args, **kwargs) -> click.Context:  # --help and --version print here
        kwargs.setdefault("terminal_width", help_width())   # every subcommand's context inherits it
        with _pipe_closes_quietly():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context):
        with _pipe_closes_quietly():
            return super().invoke(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr, _ = COMMANDS[cmd_name]
        try:
            command = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # a broken subcommand must say so, not vanish
            raise CommandLoadError(
                f"command {cmd_name!r} failed to load from {module_name}.{attr}: "
                f"{type(exc).__name__}: {exc}",
                hint="a bug or a broken install; TRAINCTL_DEBUG=1 shows the traceback") from exc
        if not isinstance(command, click.Command):
            raise CommandLoadError(f"{module_name}.{attr} is not a Click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainctl", message="%(prog)s %(version)s")
def cli() -> None:
    """Start multi-node GPU training on Slurm fast, and only on healthy hardware.

    Exit codes: 0 ok, 1 warning, 2 failure or bad input, 3 unknown, 4 an external
    command failed, 70 internal error, 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP.
    """


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and funnel every error into one line and an exit code."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, on_stop_signal)
    code = _run(argv)
    if code < EXIT_SIGNAL_BASE:     # after a stop signal the process is leaving: stay deaf
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


def _stopped(signum: int) -> int:
    """The one way out after Ctrl-C, SIGTERM or SIGHUP: end every command we started, say so once."""
    from trainctl.proc import abort_all

    abort_all()
    name = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
    click.echo(f"trainctl: {name}", err=True)
    return EXIT_SIGNAL_BASE + signum


def _run(argv: list[str] | None) -> int:
    debug = os.environ.get("TRAINCTL_DEBUG") == "1"
    from trainctl.identity import foreign_distribution

    clash = foreign_distribution()
    if clash:  # a broken install (whichever was installed last owns some of the files): the user's to fix
        click.echo(f"trainctl: error: {clash}", err=True)
        return EXIT_USAGE
    try:
        result = cli.main(args=argv, prog_name="trainctl", standalone_mode=False)
        code = result if isinstance(result, int) else 0
        sys.stdout.flush()
        return code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:  # Click's usage block is four lines; the project promises one
        where = exc.ctx.command_path if exc.ctx is not None else "trainctl"
        _error_line(f"{exc.format_message()} (try '{where} --help')")
        return EXIT_USAGE
    except click.ClickException as exc:
        _error_line(exc.format_message())
        return exc.exit_code if exc.exit_code else EXIT_USAGE
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        if isinstance(exc.__cause__, EOFError):  # Click turns a stray EOFError into Abort: a bug, not Ctrl-C
            return _internal_error(exc.__cause__, debug)
        return _stopped(signal.SIGINT)
    except Stopped as exc:
        return _stopped(exc.signum)
    except (BrokenPipeError, ClosedPipe):
        return _closed_pipe()
    except TrainctlError as exc:
        if debug:
            raise
        _error_line(str(exc))
        return exc.exit_code
    except ModuleNotFoundError as exc:
        extra = OPTIONAL_EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None or debug:
            return _internal_error(exc, debug)
        _error_line(f"this command needs {exc.name}, which this install leaves out: "
                    f"pip install 'slurm-trainctl[{extra}]'")
        return EXIT_USAGE
    except Exception as exc:
        return _internal_error(exc, debug)


def _error_line(message: str) -> None:
    from trainctl.text import printable

    click.echo(f"trainctl: error: {printable(message)}", err=True)


def _internal_error(exc: BaseException, debug: bool) -> int:
    if debug:
        raise exc
    from trainctl.text import printable

    click.echo(f"trainctl: internal error: {type(exc).__name__}: {printable(str(exc))} "
               "(TRAINCTL_DEBUG=1 shows the traceback)", err=True)
    return EXIT_INTERNAL


def _closed_pipe() -> int:
    # `trainctl ... | head`: the reader left; say nothing (128 + SIGPIPE, as a shell reports it), and
    # keep the interpreter from complaining when it flushes stdout on exit.
    _silence_stdout()
    return EXIT_CLOSED_PIPE


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
