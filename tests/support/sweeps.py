"""Sweep test helpers: histories built through trainctl's own API, and dev-cluster staging.

`night(history, t, {"gpu1": "ok", "gpu2": {"ib.ports": ("fail", "mlx5_2/1 Down")}, "gpu3": "allocated"})`
records one finished sweep at time `t`: a status string is a checked node whose every check
has that status, a dict gives its checks, "allocated"/"drained"/"down" a node not swept, and
"timeout"/"error" a node with no verdict.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from support.replay import LIBRARY, write_replay
from trainctl.sweep.db import History
from trainctl.sweep.model import (CHECKED, ERROR, NOT_SWEPT, STATUS_CODE, TIMEOUT, CheckRow,
                                  NodeOutcome, worst_label)

DAY = 86400.0
BASE_CHECKS = ("gpu.xid", "host.memory", "ib.ports")


def outcome(host: str, spec) -> NodeOutcome:
    if isinstance(spec, dict):
        checks = {name: ("ok", "fine") for name in BASE_CHECKS} | spec
        rows = tuple(CheckRow(name, status, reason, {}) for name, (status, reason) in sorted(checks.items()))
        worst = worst_label(r.status for r in rows)
        return NodeOutcome(host, CHECKED, status=worst, slurm_state="idle", duration_s=1.0, checks=rows)
    if spec in STATUS_CODE:
        rows = tuple(CheckRow(name, spec, f"{name} {spec}", {}) for name in BASE_CHECKS)
        return NodeOutcome(host, CHECKED, status=spec, slurm_state="idle", duration_s=1.0, checks=rows)
    if spec in (TIMEOUT, ERROR):
        return NodeOutcome(host, spec, slurm_state="idle", detail=f"{spec} on {host}")
    return NodeOutcome(host, NOT_SWEPT, slurm_state=spec, detail=f"Slurm state {spec}")


def night(history: History, started_at: float, nodes: dict, *, finished: bool = True, kind: str = "sweep") -> int:
    sweep_id = history.start_sweep(kind=kind, started_at=started_at, site="test", via="slurm", target="gpu",
                                   checks="all")
    history.record_nodes(sweep_id, [outcome(host, spec) for host, spec in nodes.items()], started_at + 1)
    if finished:
        history.finish_sweep(sweep_id, started_at + 60)
    return sweep_id


# ---------------------------------------------------------------- on the dev cluster

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
DEMO_SITE = Path(__file__).resolve().parents[2] / "site-configs" / "local-demo.toml"
IBSTAT = LIBRARY / "infiniband" / "ibstat"
# The same H100 node type recorded twice (leptonai/gpud testdata, see SOURCES.md): all twelve
# ConnectX ports Active, and with mlx5_5 and mlx5_11 `State: Down` / `Physical state: Disabled`.
PORTS_ACTIVE = IBSTAT / "gpud-h100-12hca-cx7-ndr400-ib-plus-cx6dx-eth-all-active.txt"
PORTS_DOWN = IBSTAT / "gpud-h100-12hca-roce-eth-400-some-down-disabled.txt"


def write_site(path: Path, db: Path, *, checks=("ib.ports", "host.memory"), ssh=None,
               probes: dict[str, str] | None = None, gpus_per_node: int = 1) -> Path:
    """The demo site, judging the recorded ConnectX ports (RoCE: link layer Ethernet)."""
    text = DEMO_SITE.read_text().replace('name = "local-demo"', 'name = "sweep-test"')
    sweep = {"db": f'"{db}"', "checks": json.dumps(list(checks))}
    if ssh is not None:
        sweep |= {"ssh_key": f'"{ssh.key_path}"', "known_hosts": f'"{ssh.known_hosts_path}"'}
    text = _set(text, "sweep", sweep)
    text = _set(text, "partitions.gpu", {"link_layer": '"Ethernet"', "gpus_per_node": str(gpus_per_node)})
    if probes:
        table = "".join(f'{name} = "{where}"  # test\n' for name, where in probes.items())
        text = text.replace("\n[slurm]", f"\n[probes]\n{table}\n[slurm]")
    path.write_text(text)
    return path


def _set(text: str, table: str, values: dict[str, str]) -> str:
    """Replace keys inside one [table] of a sample site file."""
    start = text.index(f"\n[{table}]\n")
    end = text.find("\n[", start + 1)
    end = len(text) if end < 0 else end
    body = text[start:end]
    for key, value in values.items():
        body, count = re.subn(rf"^{re.escape(key)} = .*$", f"{key} = {value}  # test", body, flags=re.M)
        assert count == 1, f"[{table}] {key}"
    return text[:start] + body + text[end:]


def stage_ibstat(cluster, node: str, recording: Path, sleep_s: float = 0) -> None:
    write_replay(cluster.node_bin_dir(node), "ibstat", {"": recording}, sleep_s=sleep_s)


def unstage(cluster, nodes) -> None:
    for node in nodes:
        (cluster.node_bin_dir(node) / "ibstat").unlink(missing_ok=True)


def trainctl(cluster, *args, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINCTL, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=cluster.client_env())


def slurm(cluster, *argv, timeout=30) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=True,
                          env=cluster.client_env()).stdout
