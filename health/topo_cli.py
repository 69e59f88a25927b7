"""`trainctl topo`: each GPU's CPU and NUMA affinity and nearest NICs, from `nvidia-smi topo -m`."""

from __future__ import annotations

import json
from pathlib import Path

import click

TOPO_FILE = "nvidia-smi-topo-m.txt"
TOPO_TIMEOUT_S = 20.0


@click.command("topo")
@click.option("--snapshot", "snapshot_dir", type=click.Path(file_okay=False, exists=True),
              help=f"Read {TOPO_FILE} from this snapshot instead of running nvidia-smi.")
@click.option("--json", "as_json", is_flag=True, help='Print {"gpus": [...]} as JSON.')
def topo(snapshot_dir: str | None, as_json: bool) -> None:
    """Show each GPU's CPU affinity, NUMA node and nearest NIC(s), as binding uses them."""
    from trainctl.errors import UsageError
    from trainctl.health.affinity import gpu_affinity
    from trainctl.health.parse.topo import parse_topo

    if snapshot_dir:
        path = Path(snapshot_dir) / TOPO_FILE
        if not path.is_file():
            raise UsageError(f"{path}: not in the snapshot (nvidia-smi topo -m was not collected)")
        try:  # undecodable bytes are the parser's to judge, like in any snapshot file
            text, source = path.read_bytes().decode("utf-8", "replace"), str(path)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    else:
        import os

        from trainctl.errors import ExternalCommandError
        from trainctl.health.collect import binary_paths
        from trainctl.proc import resolve, run_checked

        binary = binary_paths()["nvidia-smi"]
        if resolve(binary) is None:  # said once, with where trainctl looked
            raise ExternalCommandError(f"{binary} not found (looked on PATH={os.environ.get('PATH', '')}; "
                                       "TRAINCTL_BIN_NVIDIA_SMI points elsewhere)")
        text = run_checked([binary, "topo", "-m"], timeout=TOPO_TIMEOUT_S).stdout
        source = "nvidia-smi topo -m"
    gpus = gpu_affinity(parse_topo(text, source=source))
    if as_json:
        click.echo(json.dumps({"gpus": [g.to_json() for g in gpus]}, indent=1))
        return
    click.echo(f"{'GPU':<4} {'CPU AFFINITY':<20} {'NUMA':<5} NEAREST NICS")
    for gpu in gpus:
        nics = ", ".join(gpu.nearest_nics) or "-"
        path = f" ({gpu.nic_path})" if gpu.nic_path else ""
        numa = "-" if gpu.numa_node is None else str(gpu.numa_node)
        click.echo(f"{gpu.index:<4} {gpu.cpu_affinity or '-':<20} {numa:<5} {nics}{path}")
