"""`trainctl health ...`: collect a node snapshot, judge it, list the checks."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING

import click

from trainctl.validate import DAY_S, Bounds, Number

if TYPE_CHECKING:
    from trainctl.health.fabric.report import FabricReport


@click.group("health")
def health() -> None:
    """Node health: collect a snapshot, check it, list the checks."""


@health.command("snapshot")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory to write (default: ./trainctl-snapshot-HOST).")
@click.option("--timeout", "timeout_s", type=Number(float, Bounds(0.1, 3600)), default=20.0, show_default=True,
              help="Seconds each probe may run before it is killed and recorded as timed out.")
@click.option("--json", "as_json", is_flag=True, help="Print meta.json instead of a summary.")
def snapshot(out_dir: str | None, timeout_s: float, as_json: bool) -> None:
    """Collect this node's probe outputs and sysfs state into a snapshot directory.

    Every probe runs concurrently with its own timeout; a probe that fails, hangs or is
    missing is recorded in meta.json, so this never hangs. Probe binaries can be pointed
    elsewhere with TRAINCTL_BIN_<NAME> (e.g. TRAINCTL_BIN_NVIDIA_SMI=/opt/nvidia-smi).
    """
    from trainctl.health.collect import collect_snapshot

    from trainctl.slurm import this_node_name

    out_dir = out_dir or f"trainctl-snapshot-{this_node_name()}"
    with _writing(out_dir):
        meta = collect_snapshot(out_dir, timeout_s=timeout_s)
    if as_json:
        click.echo(json.dumps(meta, indent=1))
        return
    for output, record in meta["probes"].items():
        click.echo(f"{output:<26} {record['duration_s']:>7.2f} s  {_probe_outcome(record)}")
    click.echo(f"snapshot of {meta['host']} in {out_dir} ({meta['duration_s']:.2f} s, "
               f"{meta['sysfs_files']} sysfs files)")


@health.command("check")
@click.option("--snapshot", "snapshot_dir", type=click.Path(file_okay=False, exists=True),
              help="Judge this snapshot directory instead of collecting one now.")
@click.option("--site", default=None, help="Site name or .toml file: expectations and which checks run.")
@click.option("--partition", default=None, help="Partition of --site (default: the site's default).")
@click.option("--only", default=None, help="Comma-separated check names or families (gpu, ib, host...).")
@click.option("--keep", "keep_dir", type=click.Path(file_okay=False), default=None,
              help="Collect into this directory and keep it (default: a temporary one).")
@click.option("--timeout", "timeout_s", type=Number(float, Bounds(0.1, 3600)), default=None,
              help="Seconds each probe may run (default: the site's probe_timeout_s, else 20).")
@click.option("--json", "as_json", is_flag=True, help="Print the node report as JSON.")
def check(snapshot_dir, site, partition, only, keep_dir, timeout_s, as_json):
    """Collect this node's snapshot (unless --snapshot), run the checks, print the verdict.

    Exits with the node status, the worst check (fail > unknown > warn > ok): 0 ok,
    1 warn, 2 fail, 3 unknown.
    """
    import dataclasses
    import tempfile

    from trainctl.health.node import check_node, policy_for
    from trainctl.health.registry import parse_check_list

    policy = policy_for(site, partition, parse_check_list(only) if only else None)
    if timeout_s:
        policy = dataclasses.replace(policy, probe_timeout_s=timeout_s)
    if snapshot_dir:
        report, missing = check_node(snapshot_dir, policy, collect=False), missing_probes(snapshot_dir)
    elif keep_dir:
        with _writing(keep_dir):
            report, missing = check_node(keep_dir, policy, collect=True), missing_probes(keep_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="trainctl-snapshot-") as tmp:
            report, missing = check_node(tmp, policy, collect=True), missing_probes(tmp)
    click.echo(json.dumps(report.to_json(), indent=1) if as_json else format_node_report(report))
    if missing:
        click.echo(f"trainctl: {missing}", err=True)
    return report.status.exit_code


@health.command("slurm-hook")
@click.option("--role", type=click.Choice(["auto", "health-check", "prolog", "epilog"]), default="auto",
              show_default=True, help="What slurmd runs this as; auto reads SLURM_SCRIPT_CONTEXT "
                                      "(prolog_slurmd, epilog_slurmd; none: health check).")
@click.option("--site", default=None, help="Site name or .toml file: expectations and the gate's checks.")
@click.option("--partition", default=None, help="Partition of --site (default: the site's default).")
@click.option("--only", default=None,
              help="Comma-separated checks or families (default: the site's gate checks).")
@click.option("--budget", "budget_s", type=Number(float, Bounds(1, 55)), default=8.0, show_default=True,
              help="Seconds for the whole run: probes get half, Slurm calls the rest. Keep it inside "
                   "MessageTimeout (slurm.conf(5) expects a Prolog to end within it; PrologEpilogTimeout "
                   "ends one that does not) and slurmd's 60 s kill (HealthCheckProgram).")
@click.option("--state-dir", default="/var/lib/trainctl/slurm-hook", show_default=True,
              help="Where the hook remembers the drain it set on this node (node-local is fine).")
@click.option("--drain-unknown", is_flag=True,
              help="Also drain when a check cannot decide (a probe hung or is missing); "
                   "default: only on fail.")
@click.option("--log", "log_file", type=click.Path(dir_okay=False), default=None,
              help="Append the one-line outcome here too (slurmd keeps no output of its hooks).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def slurm_hook(role, site, partition, only, budget_s, state_dir, drain_unknown, log_file, as_json):
    """Quick node checks as slurm.conf's HealthCheckProgram, Prolog or Epilog (no fabric test).

    A failing node is drained with `trainctl: <check>: <reason>` unless someone set a reason;
    the hook resumes its own drain once the node passes, never anyone else's. Exit code as
    Slurm expects per role: a prolog exits 1 on a failing node (Slurm requeues the job);
    a health check and an epilog exit 0 once they drained it themselves, 1 only when they
    could not. `trainctl contrib` prints the hook script and its slurm.conf lines.
    """
    import os

    from trainctl.health.node import policy_for
    from trainctl.health.registry import parse_check_list
    from trainctl.health.slurm_hook import role_from_env, run_hook

    policy = policy_for(site, partition, parse_check_list(only) if only else None)
    chosen = role_from_env(os.environ) if role == "auto" else role
    outcome = run_hook(role=chosen, policy=policy, budget_s=budget_s, state_dir=state_dir,
                       drain_unknown=drain_unknown)
    if log_file:
        try:
            with open(log_file, "a") as handle:
                handle.write(outcome.line() + "\n")
        except OSError as exc:  # the outcome stands (a prolog's non-zero exit would drain the node)
            click.echo(f"trainctl: warning: --log {log_file}: {exc.strerror or exc}", err=True)
    click.echo(json.dumps(outcome.to_json(), indent=1) if as_json else outcome.line())
    return outcome.exit_code


def missing_probes(snapshot_dir: str) -> str:
    """One line naming the probe binaries that were not found and where trainctl looked ("" if none)."""
    from pathlib import Path

    from trainctl.errors import ParseError
    from trainctl.health.parse.snapshot_files import parse_meta
    from trainctl.text import printable

    try:
        meta = parse_meta((Path(snapshot_dir) / "meta.json").read_bytes().decode("utf-8", "replace"))
    except (OSError, ParseError):
        return ""  # no or a hand-written meta.json: the checks say what they lack
    missing = {probe.command[0]: probe.error or "" for probe in meta.probes.values() if probe.missing and probe.command}
    if not missing:
        return ""
    looked = next((error.partition(" not found on ")[2] for error in missing.values() if " not found on " in error),
                  "")
    return printable(f"probes not found: {', '.join(sorted(missing))}" + (f" (looked on {looked})" if looked else "")
                     + "; the site's [probes] table or TRAINCTL_BIN_<NAME> points elsewhere")


@contextlib.contextmanager
def _writing(directory: str):
    """A directory trainctl cannot write (read-only, under a file) is bad input: one line, exit 2."""
    from trainctl.errors import UsageError

    try:
        yield
    except OSError as exc:
        raise UsageError(f"cannot write to {directory}: {exc.strerror or exc}") from exc


@health.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: name, description, files.")
def list_checks(as_json):
    """List the registered checks with what each one judges and the files it reads."""
    from trainctl.health.registry import all_checks

    specs = all_checks()
    if as_json:
        click.echo(json.dumps([{"name": s.name, "description": s.description, "files": list(s.files),
                                "hardware": s.hardware} for s in specs], indent=1))
        return
    width = max(len(s.name) for s in specs)
    for spec in specs:
        click.echo(f"{spec.name:<{width}}  {spec.description}")


def format_node_report(report) -> str:
    lines = [f"{report.host}: {report.status.label.upper()}"]
    width = max((len(c.name) for c in report.checks), default=0)
    for result in sorted(report.checks, key=lambda c: (-c.status.severity, c.name)):
        lines.append(f"  {result.status.label:<7} {result.name:<{width}}  {result.reason}")
    from trainctl.text import printable

    return "\n".join(printable(line) for line in lines)  # host and reasons come from files: `\n` stays in its line


def _probe_outcome(record: dict) -> str:
    if record["missing"]:
        return f"not found: {record['command'][0]} (PATH in meta.json)"
    outcome = record["error"] if record["timed_out"] or record["exit_code"] != 0 else "ok"
    if record.get("truncated"):
        outcome += f" (output cut to its head and tail: {record['stdout_bytes']} bytes written)"
    return outcome


@health.command("compute")
@click.option("--budget", "budget_s", type=Number(float, Bounds(0.1, 600)), default=1.5, show_default=True,
              help="Seconds per GPU, warm-up included (all GPUs run at once).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def compute(budget_s, as_json):
    """Time a matmul and a device-memory copy on every GPU of this node (the CPU without GPUs).

    Prints each GPU's TFLOPS (bf16 where supported, else fp16; float32 on the CPU) and copy
    GB/s (read + write, as NVIDIA's bandwidthTest counts). The gate runs the same test on every
    node and judges each GPU against the job's GPUs of the same model.
    """
    from trainctl.health.compute.measure import measure_node

    devices = measure_node(budget_s)
    if as_json:
        click.echo(json.dumps({"budget_s": budget_s, "devices": [d.to_json() for d in devices]}, indent=1))
    else:
        for d in devices:
            label = "CPU" if d.index < 0 else f"GPU {d.index} ({d.name})"
            click.echo(f"{label}: " + (f"error: {d.error}" if d.error else
                                       f"{d.tflops:.4g} TFLOPS {d.dtype} matmul ({d.matmul_iters} iters), "
                                       f"{d.copy_gbps:.4g} GB/s copy ({d.copy_iters} iters)"))
    return 2 if any(d.error for d in devices) else 0


@health.command("fabric")
@click.option("--sizes", default=None, help="all_reduce sizes, e.g. 1M,64M (default: site, else 1M,64M).")
@click.option("--iters", type=click.IntRange(min=1), default=None,
              help="Timed iterations per size and pass (default: site, else 5).")
@click.option("--passes", type=click.IntRange(min=1), default=None,
              help="Run the pairing rounds this many times, interleaved (default: site, else 1).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed iterations before timing.")
@click.option("--timeout", "timeout_s", type=Number(float, Bounds(5, DAY_S)), default=None,
              help="Deadline for the whole test in seconds (default: site, else 120).")
@click.option("--join-timeout", "join_timeout_s", type=Number(float, Bounds(1, DAY_S)), default=None,
              help="How long rank 0 waits for every node to join (default: a quarter of --timeout).")
@click.option("--factor", type=Number(float, Bounds(0.01, 1)), default=None,
              help="Straggler factor: best busbw below factor x healthy pairs' (default: site, else 0.7).")
@click.option("--floor", "floor_gbps", type=Number(float, Bounds(0, 1e6)), default=None,
              help="Absolute busbw floor in GB/s for inter-node pairs (default: site, else none).")
@click.option("--site", default=None, help="Site name or .toml file for the gate policy and interface.")
@click.option("--partition", default=None, help="Partition of --site (default: the site's default).")
@click.option("--master-addr", default=None,
              help="Address of rank 0 (default: $MASTER_ADDR, else the first node of the Slurm step).")
@click.option("--port", type=click.IntRange(1024, 65535), default=None,
              help="TCPStore port (default: $TRAINCTL_FABRIC_PORT, else derived from the job id).")
@click.option("--no-intra", is_flag=True, help="Skip the intra-node test.")
@click.option("--local-procs", type=click.IntRange(min=0), default=0,
              help="Intra-node ranks (default: one per GPU, or 2 CPU processes without GPUs).")
@click.option("--rails", default=None, metavar="DEV[,DEV...]",
              callback=lambda _ctx, _param, value: _rail_devices(value),
              help="Measure every rail (two or more, else a usage error): rail r's rank pairs with rail r "
                   "on the other nodes, over DEV r, an interface (gloo, e.g. eth0,eth1) or an HCA port with GPU r (NCCL, e.g. "
                   "mlx5_0:1,...) (default: the site's fabric_rails, else one rank per node).")
@click.option("--json", "as_json", is_flag=True, help="Rank 0 prints the report as JSON.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Rank 0 also writes the JSON report to this file.")
def fabric(sizes, iters, passes, warmup, timeout_s, join_timeout_s, factor, floor_gbps, site, partition,
           master_addr, port, no_intra, local_procs, rails, as_json, out_file):
    """Measure intra-node and pairwise inter-node all_reduce bandwidth; name the stragglers.

    Start it with one task per node, e.g. `srun --ntasks-per-node=1 trainctl health fabric`.
    Ranks meet at a TCPStore on rank 0; a node that does not join in time, dies, or is
    slow against more than one partner is reported, and rank 0 prints the verdict and exits
    with the worst node status (fail > unknown > warn > ok; exit 0 ok, 1 warn, 2 fail,
    3 unknown). Bus bandwidth is computed as nccl-tests does: algbw = bytes / time,
    busbw = algbw x 2(n-1)/n.
    """
    from torch.distributed import DistError

    from trainctl.errors import EXIT_EXTERNAL
    from trainctl.health.fabric.runner import end_process

    from trainctl.health.fabric.options import FabricOverrides, fabric_policy, run_fabric

    try:
        report = run_fabric(fabric_policy(site, partition), FabricOverrides(
            sizes=sizes, iters=iters, passes=passes, warmup=warmup, timeout_s=timeout_s,
            join_timeout_s=join_timeout_s, factor=factor, floor_gbps=floor_gbps, no_intra=no_intra,
            local_procs=local_procs, rails=rails), master_addr=master_addr, port=port)
    except DistError as exc:  # rank 0's store gone or silent past the deadline: the machine, not a bug
        click.echo(f"trainctl: error: fabric test ended: the coordinator's store: {' '.join(str(exc).split())[:300]}",
                   err=True)
        end_process(EXIT_EXTERNAL)
        return EXIT_EXTERNAL

    if report is None:
        end_process(0)
        return 0
    if out_file:
        with _writing(out_file), open(out_file, "w") as handle:
            json.dump(report.to_json(), handle, indent=1)
    click.echo(json.dumps(report.to_json(), indent=1) if as_json else format_fabric_report(report))
    code = report.exit_status.exit_code
    end_process(code)
    return code


def _rail_devices(text: str | None) -> tuple[str, ...] | None:
    """--rails DEV,DEV,...: two or more devices (one would silently measure over socket_ifname)."""
    if text is None:
        return None
    devices = tuple(device.strip() for device in text.split(","))
    if len(devices) < 2 or not all(devices):
        from trainctl.errors import UsageError
        raise UsageError(f"--rails {text!r}: give two or more devices, comma-separated (one rail is the "
                         "default test; its interface is the site's socket_ifname)")
    return devices


def _gbps_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_fabric_report(report: FabricReport) -> str:
    size_mib = report.judged_size / (1 << 20)
    reference = report.reference_gbps
    lines = [f"fabric test: {report.joined} of {report.world} nodes joined, {report.rounds} rounds"
             f" (+{report.retest_rounds} retest), judged at {size_mib:g} MiB, {report.duration_s:.1f} s,"
             f" reference {'-' if reference is None else f'{reference:.2f} GB/s'}, status {report.status}"]
    lines.append(f"{'NODE':<12} {'STATUS':<10} {'BEST GB/s':>9} {'INTRA GB/s':>10}  "
                 "INTER GB/s (partner)  REASON")
    by_rank = sorted(report.nodes.items(), key=lambda item: item[1].rank)
    for host, node in by_rank:
        figures = node.figures
        intra, best = (figures.intra_busbw_gbps, figures.busbw_gbps) if figures else (None, None)
        inter = ", ".join(f"{peer} {bw:.2f}" for peer, bw in sorted(figures.inter_busbw_gbps.items())) \
            if figures else ""
        lines.append(f"{host:<12} {node.status:<10} {'-' if best is None else f'{best:.2f}':>9} "
                     f"{'-' if intra is None else f'{intra:.2f}':>10}  {inter or '-'}  {node.reason}")
    for host, node in by_rank:
        rails = node.figures.rails if node.figures else None
        for number, (name, rail) in enumerate((rails or {}).items()):
            ratio = "-" if rail.ratio is None else f"{rail.ratio:.2f}x"
            lines.append(f"  {host} rail {number} ({name}): best {_gbps_text(rail.busbw_gbps)} GB/s, "
                         f"{ratio} the rail's reference")
    for item in report.excluded:
        lines.append(f"excluded: {item.host}: {item.reason}")
    return "\n".join(lines)
