"""Build sweep histories through trainctl's own API, for report, drain and history tests.

`night(history, t, {"gpu1": "ok", "gpu2": {"ib.ports": ("fail", "mlx5_2/1 Down")}, "gpu3": "allocated"})`
records one finished sweep at time `t`: a status string is a checked node whose every check
has that status, a dict gives its checks, "allocated"/"drained"/"down" a node not swept, and
"timeout"/"error" a node with no verdict.
"""

from __future__ import annotations

from trainctl.sweep.db import History
from trainctl.sweep.model import (CHECKED, ERROR, NOT_SWEPT, STATUS_CODE, TIMEOUT, CheckRow,
                                  NodeOutcome)

DAY = 86400.0
BASE_CHECKS = ("gpu.xid", "host.memory", "ib.ports")


def outcome(host: str, spec) -> NodeOutcome:
    if isinstance(spec, dict):
        checks = {name: ("ok", "fine") for name in BASE_CHECKS} | spec
        rows = tuple(CheckRow(name, status, reason, {}) for name, (status, reason) in sorted(checks.items()))
        worst = max((r.status for r in rows), key=STATUS_CODE.__getitem__)
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
    for host, spec in nodes.items():
        history.record_node(sweep_id, outcome(host, spec), started_at + 1)
    if finished:
        history.finish_sweep(sweep_id, started_at + 60)
    return sweep_id
