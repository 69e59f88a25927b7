"""`trainctl gate node|decide|sentinel`: the health gate the job's supervisor runs before the training step."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from trainctl.job import jobdir
from trainctl.validate import DAY_S, MAX_NODES, Bounds, Number

if TYPE_CHECKING:
    from trainctl.health.fabric.report import FabricReport


@click.group("gate")
def gate() -> None:
    """The in-job health gate: check every allocated node, then choose the healthy ones.

    The job's supervisor (`trainctl job run`, which the scripts `trainctl submit` writes hand
    over to) runs `srun --ntasks-per-node=1 trainctl gate node --dir D` on all its nodes, then
    `trainctl gate decide --dir D --nodes N` on the batch host, and starts the real job on the
    nodes that decide prints.
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
    from trainctl.health.node import check_node, counter_growth, node_policy
    from trainctl.job.policy import load_gate_policy
    from trainctl.slurm import this_node_name

    ignore_checkpoint_signals()
    paths = jobdir.JobPaths(Path(gate_dir))
    host = this_node_name()  # the name `gate decide` finds in SLURM_JOB_NODELIST
    gate_policy = load_gate_policy(site, partition)
    policy = node_policy(gate_policy.config, gate_policy.partition, None, in_gate=True)
    report = check_node(paths.snapshot(host), policy, collect=True)
    jobdir.write_json(paths.node_report(host), report.to_json())
    click.echo(f"gate: {host} node checks {report.status.label}", err=True)
    _run_compute(paths, host, gate_policy.compute)
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    if no_fabric or world < 2:
        _write_final_marker(paths, host)
        return 0
    from torch.distributed import DistError

    from trainctl.health.fabric.options import run_fabric
    from trainctl.health.fabric.runner import end_process

    try:
        fabric = run_fabric(gate_policy.fabric)
    except DistError as exc:  # c10d's store errors: rank 0's node (the store's host) is gone
        click.echo(f"gate: {host}: fabric test ended: lost the coordinator's store: "
                   f"{' '.join(str(exc).split())[:300]}", err=True)
        end_process(0)
    if fabric is not None:
        jobdir.write_json(paths.fabric, fabric.to_json())
        click.echo(f"gate: fabric test {fabric.status}, excluded "
                   f"{[item.host for item in fabric.excluded] or 'none'}", err=True)
    # error counters judged by their growth while the fabric test loaded the links
    grown = counter_growth(report, paths.snapshot(host, after_fabric=True), policy)
    if grown is not report:
        jobdir.write_json(paths.node_report(host), grown.to_json())
    _write_final_marker(paths, host)
    end_process(0)
    return 0


def _write_final_marker(paths: jobdir.JobPaths, host: str) -> None:
    """DIR/nodes/HOST.final: this node's report will not change any more (its counters were
    read again after the fabric test), so `gate decide --wait` can judge it."""
    jobdir.write_json(paths.node_report_final(host), {"host": host})


def _run_compute(paths: jobdir.JobPaths, host: str, policy) -> None:
    from trainctl.job.gate_compute import run_for_gate

    if not policy.enabled:
        return
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    report = run_for_gate(paths, host, rank, world, policy.budget_s, policy.in_turns)
    figures = ", ".join(f"{d['tflops']:.3g} TFLOPS {d['copy_gbps']:.3g} GB/s" + (f" ({d['error']})" if d["error"] else "")
                        for d in report["devices"])
    click.echo(f"gate: {host} compute {figures}", err=True)


@gate.command("sentinel")
@click.option("--dir", "gate_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The job's gate directory: the batch script beats in DIR/batch-host.beat.")
@click.option("--silence", "silence_s", type=Number(float, Bounds(1, DAY_S)), default=30.0, show_default=True,
              help="Seconds without a beat after which the batch host counts as lost.")
@click.option("--log", "log_file", type=click.Path(dir_okay=False),
              help="Append this command's output to FILE itself, not through Slurm's I/O forwarding.")
def sentinel(gate_dir, silence_s, log_file):
    """End this job when its batch host is lost (one task on another node, for the job's life).

    The batch script writes a counter to DIR/batch-host.beat every 2 s. When it has not
    changed for --silence seconds, the batch host is dead or hung, and with it the job script:
    this sets the job's Comment to say so and cancels the job, retrying while Slurm refuses
    (a controller busy with the node's failure). Without it, a --no-kill job (Slurm 22.05)
    whose batch host died stays RUNNING, with no script, until its time limit.

    srun writes a task's --output file itself, on the batch host: when that host dies, what the
    sentinel says is lost just when it matters. Hence --log.
    """
    from trainctl.job.sentinel import watch_batch_host

    return watch_batch_host(Path(gate_dir), silence_s, Path(log_file) if log_file else None)


def ignore_checkpoint_signals() -> None:
    """submit --signal (e.g. USR1@120) reaches every step of the job, the gate's and the sentinel's
    too (sbatch(1) --signal: "By default all job steps will be signaled"); it is meant for the
    program, and Python's default for SIGUSR1/SIGUSR2 would end these steps."""
    import signal

    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)


@gate.command("decide")
@click.option("--site", default=None, help="Site name or .toml file (named in the report).")
@click.option("--partition", default=None, help="Partition of --site.")
@click.option("--dir", "gate_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="The gate directory `gate node` wrote.")
@click.option("--nodes", "wanted", required=True, type=click.IntRange(min=1, max=MAX_NODES),
              help="Nodes the job runs on.")
@click.option("--min-nodes", "minimum", type=click.IntRange(min=1), default=None,
              help="Fewest healthy nodes the job accepts (default: --nodes).")
@click.option("--allocated", default=None,
              help="Hostlist of the allocation (default: $SLURM_JOB_NODELIST).")
@click.option("--wait", "wait", is_flag=True,
              help="Wait for every node's report until the gate's deadline (from the site).")
@click.option("--deadline", "deadline_s", type=Number(float, Bounds(0, DAY_S)), default=None,
              help="Wait for every node's report at most this many seconds (implies --wait).")
def decide_command(site, partition, gate_dir, wanted, minimum, allocated, wait, deadline_s):
    """Choose the healthy nodes; print their hostlist and rank 0's address, or fail with why.

    With --wait (the job script starts it beside the gate step) it waits until every node
    has reported and the fabric test has its report, or the gate step has ended (the script
    writes DIR/gate-step.status), or the deadline (site: probe timeout + fabric timeout +
    margins); a node with no report by then is "lost during the gate: no report within N s",
    and the decision is made with what arrived.

    Writes DIR/decision.json (what the job's supervisor reads) and DIR/report.txt. On success
    it prints the report on stderr and two lines on stdout: the folded hostlist of the chosen
    nodes and the address of the first one (for MASTER_ADDR; also decision.json's master_addr). With fewer than --min-nodes healthy nodes it exits 2 with
    one line (nodes folded by cause, at most 300 characters); the detail is in report.txt.
    """
    from trainctl.errors import GateFailed, UsageError
    from trainctl.job.gate import decide, format_report
    from trainctl.job.policy import load_gate_policy
    from trainctl.slurm import expand_hostlist, fold_hostlist, node_address

    hostlist = allocated or os.environ.get("SLURM_JOB_NODELIST")
    if not hostlist:
        raise UsageError("no allocation: pass --allocated or run inside a Slurm job")
    minimum = minimum or wanted
    if minimum > wanted:
        raise UsageError(f"--min-nodes {minimum} is more than --nodes {wanted}")
    from trainctl.validate import check_node_name

    source = "--allocated" if allocated else "SLURM_JOB_NODELIST"
    hosts = [check_node_name(host, source) for host in expand_hostlist(hostlist, source=source)]  # file names under DIR
    policy = load_gate_policy(site, partition)
    paths = jobdir.JobPaths(Path(gate_dir))
    missing = None
    if wait or deadline_s is not None:
        limit = deadline_s if deadline_s is not None else policy.deadline_s(len(hosts))
        missing = _wait_for_reports(paths, hosts, limit, policy.final_grace_s)
    node_reports = {}
    for path in sorted(paths.node_reports.glob("*.json")):
        report = _read_json(path, paths)
        if report is not None and (problem := _not_a_node_report(report)) is not None:
            print(f"trainctl: warning: {path}: {problem}; treated as missing", file=sys.stderr)
        elif report is not None:
            node_reports[report.get("host", path.stem)] = report
    fabric = _read_fabric(paths)
    from trainctl.job.gate_compute import judge_gate_dir

    compute_verdicts, compute_reasons = judge_gate_dir(paths, policy.compute)
    decision = decide(hosts, node_reports, fabric, wanted, minimum, missing=missing,
                      unknown_policy=policy.gate.unknown, compute_reasons=compute_reasons,
                      odd_node_fails=policy.gate.odd_node_out == "fail")
    text = format_report(decision, fabric, compute_verdicts)
    if site:
        text = f"site {site}{f' partition {partition}' if partition else ''}\n" + text
    from trainctl.job.gate_drain import drain_excluded  # the site's [gate] drain_on; never fails the gate

    if decision.ok:   # the one place rank 0's address is asked of Slurm; the driver reads it from decision.json
        decision = dataclasses.replace(decision, master_addr=node_address(decision.chosen[0]))
    drains = drain_excluded(site, policy.config, decision, node_reports, fabric, os.environ)
    text += "".join(f"{line}\n" for line in drains.lines())
    jobdir.write_json(paths.decision, decision.to_json() | {"drains": [d.to_json() for d in drains.drains],
                                                             "breaker": drains.breaker,
                                                             "compute": [v.to_json() for v in compute_verdicts]})
    if (problem := jobdir.write_report(paths, text)) is not None:   # the report is for a human: the gate goes on
        click.echo(f"trainctl: warning: {problem}", err=True)
    if not decision.ok:
        if drains.breaker:   # the job's output says when the breaker held drains back, however the gate ends
            click.echo(drains.breaker, err=True)
        raise GateFailed(decision.failure_line())  # the one line; the detail is in report.txt
    click.echo(text, err=True, nl=False)
    click.echo(fold_hostlist(list(decision.chosen)))
    click.echo(decision.master_addr)
    return 0


WAIT_POLL_S = 0.2


def _wait_for_reports(paths: jobdir.JobPaths, hosts: list[str], limit_s: float, final_grace_s: float) -> str:
    """Wait until the gate is over; returns why a node still without a report is missing.

    Over means: the fabric test's report is in (rank 0 writes it last, after every live node
    joined or was given up) and every node that reported and is not lost has marked its report
    final (its error counters read again after the fabric test), or `final_grace_s` has passed
    since the fabric report; or, on one node, its report is final; or the gate step has ended
    (nothing more will come); or `limit_s` has passed.
    """
    import time

    start = time.monotonic()
    fabric_seen = None
    lost: set[str] = set()
    click.echo(f"gate: deciding when all {len(hosts)} nodes have reported, at the latest in {limit_s:g} s",
               err=True)
    while True:
        now = time.monotonic()
        waited = now - start
        reported = {p.stem for p in paths.node_reports.glob("*.json")}
        if len(hosts) == 1 and paths.node_report_final(hosts[0]).exists():
            why = "no health report"  # after its compute test too, which it runs after its checks
            break
        if fabric_seen is None and paths.fabric.exists():
            fabric_seen = now
            fabric = _read_fabric(paths)
            lost = {host for host, node in fabric.nodes.items() if node.lost} if fabric else set()
        if fabric_seen is not None:
            final = {p.name[:-len(jobdir.FINAL_MARKER)] for p in paths.node_reports.glob(f"*{jobdir.FINAL_MARKER}")}
            if reported - lost <= final or now - fabric_seen >= final_grace_s:
                why = "no health report"
                break
        if paths.gate_step_status.exists():
            why = f"no report (the gate step ended after {waited:.0f} s)"
            break
        if waited >= limit_s:
            why = f"no report within {limit_s:g} s"
            break
        time.sleep(WAIT_POLL_S)
    click.echo(f"gate: deciding after {waited:.1f} s", err=True)
    return why


def _read_fabric(paths: jobdir.JobPaths) -> FabricReport | None:
    """Rank 0's fabric.json; one that is not a fabric report counts as missing, as an unreadable one does."""
    from trainctl.health.fabric.report import FabricReport

    data = _read_json(paths.fabric, paths)
    if data is None:
        return None
    try:
        return FabricReport.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        print(f"trainctl: warning: {paths.fabric}: not a fabric report ({exc!r}); treated as missing", file=sys.stderr)
        return None


def _not_a_node_report(report: dict) -> str | None:
    """Why `report` is not what `gate node` writes (NodeReport.to_json), in a few words, as far as
    the decision reads it; None when it is one."""
    checks = report.get("checks")
    if not isinstance(report.get("host", ""), str) or not isinstance(checks, list):
        return "not a node report"
    if not all(isinstance(check, dict) and all(isinstance(check.get(key), str) for key in ("name", "status", "reason"))
               for check in checks):
        return "not a node report (a check without its name, status and reason)"
    return None


def _read_json(path: Path, paths: jobdir.JobPaths) -> dict | None:
    """A node's or rank 0's report, by the job directory's reader (a regular file inside it, never a
    FIFO's wait, at most JSON_MAX_BYTES; a counter's raw value kept); one line where it is no report."""
    report, problem = jobdir.read_json_file(path, root=paths.root, limited=False)
    if problem is not None:
        print(f"trainctl: warning: {path}: {problem}; treated as missing", file=sys.stderr)
    return report
