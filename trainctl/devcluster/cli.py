"""`trainctl dev-cluster`: start, inspect and stop the local multi-node Slurm test cluster."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time

import click

from trainctl.validate import DAY_S, Bounds, Number

from trainctl.devcluster import slurm_root
from trainctl.devcluster.cluster import (STATE_FILE, ClusterSpec, ClusterStatus, DevCluster,
                                        spec_for_instance)
from trainctl.devcluster.spec import ROOT_SLURMS, SLURM_ENV, SLURM_ROOTS, SYSTEM_SLURM
from trainctl.errors import ExternalCommandError, UsageError
from trainctl.proc import run

BASE_DIR_HELP = ("Directory holding the cluster's configs, keys, logs and state (deleted by `down`); "
                 "default: the instance's ($TRAINCTL_DEVCLUSTER_INSTANCE K: /tmp/trainctl-devcluster-K).")


def parse_node_assignments(values: tuple[str, ...], option: str) -> dict[str, str]:
    """('node2=9000', ...) -> {'node2': '9000'}; each node at most once."""
    assignments: dict[str, str] = {}
    for value in values:
        node, sep, setting = value.partition("=")
        if not sep or not node or not setting:
            raise UsageError(f"{option} {value!r}: expected NODE=VALUE, e.g. node2=9000")
        if node in assignments:
            raise UsageError(f"{option} given twice for {node}")
        assignments[node] = setting
    return assignments


def spec_from_options(nodes: int, base_dir: str | None, mtus: tuple[str, ...],
                      rates: tuple[str, ...], domain: str = "", rails: int = 1,
                      slurm: str | None = None, root_binds: tuple[str, ...] = (),
                      accounting: bool = False) -> ClusterSpec:
    """The `up` options as a validated ClusterSpec (raises UsageError naming the bad option).

    Names, subnet and port are those of dev cluster instance $TRAINCTL_DEVCLUSTER_INSTANCE.
    """
    mtu_by_node = {}
    for node, text in parse_node_assignments(mtus, "--mtu").items():
        if not text.isdigit():
            raise UsageError(f"--mtu {node}={text}: the MTU must be a whole number of bytes")
        mtu_by_node[node] = int(text)
    instance = spec_for_instance()
    spec = dataclasses.replace(instance, nodes=nodes, base_dir=base_dir or instance.base_dir,
                               mtus=mtu_by_node, rates=parse_node_assignments(rates, "--rate"),
                               domain=domain, rails=rails, slurm=slurm or instance.slurm,
                               root_binds=root_binds, accounting=accounting)
    spec.validate()
    return spec


def _progress(message: str) -> None:
    click.echo(f"dev-cluster: {message}", err=True)


def _print_status(status: ClusterStatus, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(status.as_dict(), indent=2))
        return

    def up_down(alive: bool) -> str:
        return "up" if alive else "DOWN"

    click.echo(f"dev cluster in {status.base_dir}   SLURM_CONF={status.slurm_conf}")
    click.echo(f"controller {status.controller_address}:{status.slurmctld_port}   "
               f"slurmctld {up_down(status.slurmctld_alive)}   munged {up_down(status.munged_alive)}")
    rows = [("NODE", "ADDRESS", "MTU", "RATE", "SLURM", "SLURMD", "SSHD")]
    for node in status.nodes:
        rate = f"{node.rate_bit_s / 1e6:g}Mbit" if node.rate_bit_s else "-"
        rows.append((node.name, node.address, str(node.mtu or "?"), rate, node.slurm_state or "?",
                     up_down(node.slurmd_alive), "up" if node.sshd_alive else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


base_dir_option = click.option("--base-dir", default=None, envvar="TRAINCTL_DEVCLUSTER_DIR",
                               metavar="DIR", help=BASE_DIR_HELP)


def _base_dir(base_dir: str | None) -> str:
    return base_dir or spec_for_instance().base_dir
json_option = click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real multi-node Slurm cluster on this machine, for tests and demos (needs root).

    Each node is a set of Linux namespaces (network, hostname, sysfs) on a bridge, with its
    own address (10.77.0.N), MTU, optional rate limit, fake GPUs and slurmd; slurmctld and
    munged run on the host. Point Slurm clients at it with `eval "$(trainctl dev-cluster env)"`
    or run one command with `trainctl dev-cluster run -- srun -N2 -l hostname`.
    """


@dev_cluster.command()
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Number of nodes (node1..nodeN).")
@base_dir_option
@click.option("--mtu", "mtus", multiple=True, metavar="NODE=MTU",
              help="MTU of a node's eth0, e.g. --mtu node3=1500 (repeatable). "
                   "Default: node1 1500, the others 9000.")
@click.option("--rate", "rates", multiple=True, metavar="NODE=RATE",
              help="Limit a node's bandwidth both ways with tc tbf, e.g. --rate node2=1gbit "
                   "(repeatable).")
@click.option("--domain", default="", metavar="DOMAIN",
              help="Give node N the hostname nodeN.DOMAIN (NodeHostname) while Slurm still calls "
                   "it nodeN, e.g. --domain cluster.test.")
@click.option("--rails", type=click.IntRange(1, 4), default=1, show_default=True,
              help="Data rails per node: rail r is the node's eth<r>, on a bridge and subnet of its own "
                   "(10.77.<K+10r>.N).")
@click.option("--sshd", is_flag=True, help="Also start sshd on every node (key auth as root).")
@click.option("--accounting", is_flag=True,
              help="Also start Slurm's accounting, so sacct answers: MariaDB (its own datadir, a Unix socket "
                   "only) and slurmdbd, with the cluster registered (system Slurm only).")
@click.option("--slurm", type=click.Choice([SYSTEM_SLURM, *ROOT_SLURMS]), default=None,
              help=f"Which Slurm runs the cluster: the system's, 24.11 from a Debian 13 root filesystem "
                   f"or 26.05 from a Debian sid one (built by `build-root`). Default: ${SLURM_ENV}, "
                   "else system.")
@click.option("--bind", "root_binds", multiple=True, metavar="DIR",
              help="With a Slurm root: one more host directory its jobs see at the same path "
                   "(repeatable; /tmp and trainctl's Python and checkout always are).")
@json_option
def up(nodes: int, base_dir: str | None, mtus: tuple[str, ...], rates: tuple[str, ...], domain: str,
       rails: int, sshd: bool, accounting: bool, slurm: str | None, root_binds: tuple[str, ...],
       as_json: bool) -> None:
    """Start the cluster (replacing any earlier one in DIR) and wait until all nodes are idle."""
    spec = spec_from_options(nodes, base_dir, mtus, rates, domain, rails, slurm, root_binds, accounting)
    base_dir = spec.base_dir
    cluster = DevCluster(spec)
    start = time.monotonic()
    cluster.up(progress=_progress)
    if sshd:
        for node in spec.node_names:
            endpoint = cluster.start_sshd(node)
        _progress(f"sshd on every node; e.g. {shlex.join(endpoint.ssh_argv('sinfo'))}")
    _progress(f"up in {time.monotonic() - start:.2f} s; "
              f"eval \"$(trainctl dev-cluster env --base-dir {base_dir})\" to use it")
    _print_status(cluster.status(), as_json)


@dev_cluster.command()
@base_dir_option
@json_option
def status(base_dir: str, as_json: bool) -> None:
    """Show nodes, addresses, MTUs, rate limits, Slurm states and daemons, read live."""
    _print_status(DevCluster.attach(_base_dir(base_dir)).status(), as_json)


@dev_cluster.command()
@base_dir_option
def down(base_dir: str) -> None:
    """Stop the daemons and remove namespaces, bridge, mounts, fake GPUs and DIR (idempotent)."""
    base_dir = _base_dir(base_dir)
    has_state = os.path.exists(os.path.join(base_dir, STATE_FILE))
    # Without a state file, still sweep the default-named namespaces a crashed run may have left.
    cluster = (DevCluster.attach(base_dir) if has_state
               else DevCluster(dataclasses.replace(spec_for_instance(), base_dir=base_dir)))
    start = time.monotonic()
    removed = cluster.down()
    _progress(f"removed {len(removed)} items in {time.monotonic() - start:.2f} s"
              if removed else "nothing to remove")


@dev_cluster.command("build-root")
@click.option("--slurm", type=click.Choice(ROOT_SLURMS), default=ROOT_SLURMS[0], show_default=True,
              help="The Slurm release the root holds.")
@click.option("--root", default=None, metavar="DIR",
              help="Where the root is built and cached. Default: "
                   + ", ".join(f"{path} for {slurm}" for slurm, path in SLURM_ROOTS.items()) + ".")
@click.option("--mirror", default=slurm_root.DEBIAN_MIRROR, show_default=True, help="Debian archive URL.")
@click.option("--rebuild", is_flag=True, help="Build it again even when it is there.")
def build_root(slurm: str, root: str | None, mirror: str, rebuild: bool) -> None:
    """Build (once) the Debian root filesystem that `up --slurm SLURM` runs Slurm from (needs root,
    mmdebstrap and Debian's archive)."""
    slurm_root.build_root(slurm, root, mirror=mirror, rebuild=rebuild, progress=_progress)


@dev_cluster.command()
@base_dir_option
def env(base_dir: str) -> None:
    """Print `export` lines for Slurm clients: eval "$(trainctl dev-cluster env)"."""
    for name, value in DevCluster.attach(_base_dir(base_dir)).env().items():
        click.echo(f"export {name}={shlex.quote(value)}")


@dev_cluster.command("run", context_settings={"ignore_unknown_options": True,
                                                "allow_interspersed_args": False})
@base_dir_option
@click.option("--timeout", "timeout_s", type=Number(float, Bounds(1, DAY_S)), default=600, show_default=True,
              help="Kill the command after this many seconds.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx: click.Context, base_dir: str, timeout_s: float, command: tuple[str, ...]) -> None:
    """Run COMMAND with the cluster's client environment, e.g. run -- srun -N2 -l hostname.

    Its output is printed when it ends; the exit status is COMMAND's.
    """
    cluster = DevCluster.attach(_base_dir(base_dir))
    result = run(list(command), timeout=timeout_s, env=cluster.client_env())
    if result.missing or result.timed_out:
        raise ExternalCommandError(result.describe_failure())
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    ctx.exit(result.returncode)
