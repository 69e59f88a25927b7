"""The `trainctl` command: a Click group whose subcommands load lazily from one map.

Login nodes are slow shared machines, so `trainctl --help` imports Click and nothing
else: each subcommand's module is imported only when that subcommand runs, and the
help listing is read from the map below, not from the modules.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from trainctl import __version__
from trainctl.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, CommandLoadError,
                             TrainctlError)

# name -> (module, attribute, one-line help). The only place a subcommand is registered.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "dev-cluster": ("trainctl.devcluster.cli", "dev_cluster",
                    "Start, inspect and stop the local demo Slurm cluster (needs root)."),
    "drain": ("trainctl.sweep.cli", "drain",
              "Drain the nodes that failed the newest sweep (tagged reason; never others' drains)."),
    "gate": ("trainctl.health.gate_cli", "gate",
             "Inside a job: check every allocated node, then choose the healthy ones for srun."),
    "health": ("trainctl.health.cli", "health",
               "Node health: collect a snapshot, check it, list the checks."),
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


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is used."""

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
    command failed, 70 internal error, 130 interrupted.
    """


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI and funnel every error into one line and an exit code."""
    debug = os.environ.get("TRAINCTL_DEBUG") == "1"
    try:
        result = cli.main(args=argv, prog_name="trainctl", standalone_mode=False)
        code = result if isinstance(result, int) else 0
        sys.stdout.flush()
        return code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code if exc.exit_code else EXIT_USAGE
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("trainctl: interrupted", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `trainctl ... | head`: the reader left; say nothing, and keep the interpreter
        # from complaining when it flushes stdout on exit.
        _silence_stdout()
        return 141
    except TrainctlError as exc:
        if debug:
            raise
        click.echo(f"trainctl: error: {exc}", err=True)
        return exc.exit_code
    except Exception as exc:
        if debug:
            raise
        click.echo(f"trainctl: internal error: {type(exc).__name__}: {exc} "
                   "(TRAINCTL_DEBUG=1 shows the traceback)", err=True)
        return EXIT_INTERNAL


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
