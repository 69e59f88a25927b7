"""`trainctl health ...`: collect a node snapshot, judge it, list the checks."""

from __future__ import annotations

import json
import socket

import click


@click.group("health")
def health() -> None:
    """Node health: collect a snapshot, check it, list the checks."""


@health.command("snapshot")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory to write (default: ./trainctl-snapshot-HOST).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=20.0, show_default=True,
              help="Seconds each probe may run before it is killed and recorded as timed out.")
@click.option("--json", "as_json", is_flag=True, help="Print meta.json instead of a summary.")
def snapshot(out_dir: str | None, timeout_s: float, as_json: bool) -> None:
    """Collect this node's probe outputs and sysfs state into a snapshot directory.

    Every probe runs concurrently with its own timeout; a probe that fails, hangs or is
    missing is recorded in meta.json, so this never hangs. Probe binaries can be pointed
    elsewhere with TRAINCTL_BIN_<NAME> (e.g. TRAINCTL_BIN_NVIDIA_SMI=/opt/nvidia-smi).
    """
    from trainctl.health.collect import collect_snapshot

    out_dir = out_dir or f"trainctl-snapshot-{socket.gethostname()}"
    meta = collect_snapshot(out_dir, timeout_s=timeout_s)
    if as_json:
        click.echo(json.dumps(meta, indent=1))
        return
    for output, record in meta["probes"].items():
        click.echo(f"{output:<26} {record['duration_s']:>7.2f} s  {_probe_outcome(record)}")
    click.echo(f"snapshot of {meta['host']} in {out_dir} ({meta['duration_s']:.2f} s, "
               f"{meta['sysfs_files']} sysfs files)")


def _probe_outcome(record: dict) -> str:
    if record["missing"]:
        return f"not found: {record['command'][0]} (PATH in meta.json)"
    if record["timed_out"] or record["exit_code"] != 0:
        return record["error"]
    return "ok"
