"""`trainctl gate node|decide`: the health gate a job script runs before its real `srun`."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import click


@click.group("gate")
def gate() -> None:
    """The in-job health gate: check every allocated node, then choose the healthy ones.

    A job script runs `srun --ntasks-per-node=1 trainctl gate node --dir D` on all its
    nodes, then `trainctl gate decide --dir D --nodes N` on the batch host, and starts the
    real job on the nodes that decide prints. `trainctl submit` writes such scripts.
    """


@gate.command("node")
@click.option("--site", default=None, help="Site name or .toml file: expectations, checks, fabric policy.")
@click.option("--partition", default=None, help="Partition of --site (default: the site's default).")
@click.option("--dir", "gate_dir", required=True, type=click.Path(file_okay=False),
              help="The job's gate directory (on a filesystem the batch host sees).")
@click.option("--no-fabric", is_flag=True, help="Run the node checks only.")
def node(site, partition, gate_dir, no_fabric):
    """Run this node's checks and take part in the fabric test (one task per node).

    Writes DIR/nodes/HOST.json and DIR/snapshots/HOST/; rank 0 of the step also writes
    DIR/fabric.json. The verdict is in those files: this exits 0 unless it could not run.
    """
    from trainctl.health.node import check_node, policy_for

    root = Path(gate_dir)
    host = socket.gethostname()
    policy = policy_for(site, partition, None)
    report = check_node(root / "snapshots" / host, policy, collect=True)
    _write_json(root / "nodes" / f"{host}.json", report.to_json())
    click.echo(f"gate: {host} node checks {report.status.label}", err=True)
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    if no_fabric or world < 2:
        return 0
    from trainctl.health.cli import run_fabric_from_cli_options

    fabric = run_fabric_from_cli_options(site=site, partition=partition)
    if fabric is not None:
        _write_json(root / "fabric.json", fabric)
        click.echo(f"gate: fabric test {fabric['status']}, excluded "
                   f"{[item['host'] for item in fabric['excluded']] or 'none'}", err=True)
    return 0


@gate.command("decide")
@click.option("--site", default=None, help="Site name or .toml file (named in the report).")
@click.option("--partition", default=None, help="Partition of --site.")
@click.option("--dir", "gate_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The gate directory `gate node` wrote.")
@click.option("--nodes", "wanted", required=True, type=click.IntRange(min=1), help="Nodes the job runs on.")
@click.option("--min-nodes", "minimum", type=click.IntRange(min=1), default=None,
              help="Fewest healthy nodes the job accepts (default: --nodes).")
@click.option("--allocated", default=None,
              help="Hostlist of the allocation (default: $SLURM_JOB_NODELIST).")
def decide_command(site, partition, gate_dir, wanted, minimum, allocated):
    """Choose the healthy nodes; print their hostlist and rank 0's address, or fail with why.

    Writes DIR/decision.json and DIR/report.txt, and prints the report on stderr. On
    success stdout has two lines: the folded hostlist of the chosen nodes and the address
    of the first one (for MASTER_ADDR). With fewer than --min-nodes healthy nodes it exits
    2 with one line naming which nodes failed which check.
    """
    from trainctl.errors import GateFailed, UsageError
    from trainctl.health.gate import decide, format_report
    from trainctl.slurm import expand_hostlist, fold_hostlist, node_address

    hostlist = allocated or os.environ.get("SLURM_JOB_NODELIST")
    if not hostlist:
        raise UsageError("no allocation: pass --allocated or run inside a Slurm job")
    minimum = minimum or wanted
    if minimum > wanted:
        raise UsageError(f"--min-nodes {minimum} is more than --nodes {wanted}")
    root = Path(gate_dir)
    node_reports = {}
    for path in sorted((root / "nodes").glob("*.json")):
        report = _read_json(path)
        if report is not None:
            node_reports[report.get("host", path.stem)] = report
    fabric = _read_json(root / "fabric.json")
    decision = decide(expand_hostlist(hostlist), node_reports, fabric, wanted, minimum)
    text = format_report(decision, fabric)
    if site:
        text = f"site {site}{f' partition {partition}' if partition else ''}\n" + text
    _write_json(root / "decision.json", decision.to_json())
    (root / "report.txt").write_text(text)
    click.echo(text, err=True, nl=False)
    if not decision.ok:
        raise GateFailed(decision.failure_line())
    click.echo(fold_hostlist(list(decision.chosen)))
    click.echo(node_address(decision.chosen[0]))
    return 0


def _write_json(path: Path, data: dict) -> None:
    from trainctl.files import write_atomically

    write_atomically(path, json.dumps(data, indent=1) + "\n")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"trainctl: warning: {path}: unreadable ({exc}); treated as missing", file=sys.stderr)
        return None
