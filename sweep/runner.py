"""One sweep, start to end: decide which nodes to check, check them, commit each as it comes.

collect (Slurm states, then the node task on each node) -> parse (envelopes to outcomes) ->
record (one committed transaction per node) -> verdict (the worst node status is the exit code).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.slurm import NodeState, fold_hostlist, node_states
from trainctl.sweep.collect import (FabricVerdict, NodeCommand, SshAccess, collect_via_slurm,
                                    collect_via_ssh)
from trainctl.sweep.db import History
from trainctl.sweep.model import CHECKED, NOT_SWEPT, STATUS_CODE, STATUSES, CheckRow, NodeOutcome

FABRIC_CHECK = "fabric.allreduce"


@dataclass(frozen=True)
class SlurmSelection:
    """Which nodes a Slurm sweep checks, and the others with the state that kept them out."""

    to_check: list[str]
    not_swept: list[NodeOutcome]


def select_idle(states: dict[str, NodeState]) -> SlurmSelection:
    """Idle, responding nodes are checked; every other node is recorded as not swept, never dropped."""
    to_check, not_swept = [], []
    for name in sorted(states):
        state = states[name]
        if state.idle:
            to_check.append(name)
            continue
        why = f"Slurm state {state.label}" + (f" ({state.reason})" if state.reason else "")
        not_swept.append(NodeOutcome(name, NOT_SWEPT, slurm_state=state.label, detail=why))
    return SlurmSelection(to_check, not_swept)


def fabric_rows(verdict: FabricVerdict, hosts: Iterable[str]) -> dict[str, CheckRow]:
    """Per-node `fabric.allreduce` rows from rank 0's fabric report; nodes it never judged are unknown."""
    rows: dict[str, CheckRow] = {}
    report = verdict.report if isinstance(verdict.report, dict) else {}
    for host, node in (report.get("nodes") or {}).items():
        if isinstance(node, dict):
            status = node.get("status") if node.get("status") in STATUSES else "unknown"
            details = {k: v for k, v in node.items() if k not in ("status", "reason")}
            rows[host] = CheckRow(FABRIC_CHECK, status, str(node.get("reason", "")), details)
    for item in report.get("excluded") or []:
        if isinstance(item, dict) and item.get("host") and item["host"] not in rows:
            rows[item["host"]] = CheckRow(FABRIC_CHECK, "fail", f"excluded: {item.get('reason', '')}", {})
    why = verdict.detail or "the fabric test reported nothing for this node"
    for host in hosts:
        rows.setdefault(host, CheckRow(FABRIC_CHECK, "unknown", why, {}))
    return rows


def with_check(node: NodeOutcome, row: CheckRow) -> NodeOutcome:
    """`node` with one more check row, its status the worse of both."""
    status = max(node.status or "ok", row.status, key=STATUS_CODE.__getitem__)
    return NodeOutcome(node.host, node.outcome, status=status, slurm_state=node.slurm_state, detail=node.detail,
                       duration_s=node.duration_s, checks=(*node.checks, row))


@dataclass
class SweepResult:
    sweep_id: int
    nodes: dict[str, NodeOutcome] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The worst node status (a node with no verdict counts as unknown)."""
        return max((node.exit_code for node in self.nodes.values()), default=0)


def record_sweep(history: History, *, sweep_id: int, not_swept: list[NodeOutcome],
                 outcomes: Iterable[NodeOutcome | FabricVerdict],
                 progress: Callable[[str], None], clock: Callable[[], float] = time.time) -> SweepResult:
    """Commit each outcome as it arrives; the sweep is finished only if the collection ends."""
    result = SweepResult(sweep_id)
    for node in not_swept:
        history.record_node(sweep_id, node, clock())
        result.nodes[node.host] = node
    try:
        for item in outcomes:
            if isinstance(item, FabricVerdict):
                _record_fabric(history, result, item, progress, clock)
                continue
            history.record_node(sweep_id, item, clock())
            result.nodes[item.host] = item
            progress(describe(item))
    except Exception as exc:  # recorded as finished with an error, then reported (exit 4)
        history.finish_sweep(sweep_id, clock(), error=str(exc))
        raise
    history.finish_sweep(sweep_id, clock())
    return result


def _record_fabric(history: History, result: SweepResult, verdict: FabricVerdict,
                   progress: Callable[[str], None], clock: Callable[[], float]) -> None:
    checked = [host for host, node in result.nodes.items() if node.outcome == CHECKED]
    for host, row in fabric_rows(verdict, checked).items():
        if host in checked:
            result.nodes[host] = with_check(result.nodes[host], row)
            history.record_node(result.sweep_id, result.nodes[host], clock())
    progress(f"fabric test: {verdict.outcome}" + (f" ({verdict.detail})" if verdict.detail else ""))


def describe(node: NodeOutcome) -> str:
    """One line for progress and summaries: `node2  fail  ib.ports: mlx5_11/1 Down`."""
    if node.outcome != CHECKED:
        label = "not swept" if node.outcome == NOT_SWEPT else node.outcome
        return f"{node.host}  {label}  {node.detail}".rstrip()
    bad = [f"{c.name}: {c.reason}" for c in node.checks if c.status != "ok"]
    took = f"  ({node.duration_s:.1f} s)" if node.duration_s is not None else ""
    return f"{node.host}  {node.status}  {'; '.join(bad)}{took}".rstrip()


@dataclass(frozen=True)
class SweepRequest:
    kind: str                  # "sweep", or "recheck" for resume's look at drained nodes
    site: str                  # as given (name or file): the nodes resolve it themselves
    via: str                   # "slurm" or "ssh"
    partition: str | None
    nodes: list[str] | None
    command: NodeCommand
    gpu_args: list[str]
    access: SshAccess | None
    fanout: int


def run_sweep(request: SweepRequest, history: History | None, progress: Callable[[str], None],
              env: dict[str, str] | None = None) -> SweepResult:
    """Select, collect and record one sweep; `history=None` checks without recording (dry runs)."""
    if request.via == "slurm":
        states = node_states(partition=request.partition, nodes=request.nodes, env=env)
        missing = sorted(set(request.nodes or []) - set(states))
        if missing:
            where = f" in partition {request.partition}" if request.partition else ""
            raise UsageError(f"not Slurm nodes{where}: {fold_hostlist(missing)}",
                             hint="--via ssh reaches nodes outside Slurm")
        selection = select_idle(states)
        target = request.partition or fold_hostlist(request.nodes or [])
        progress(f"{len(selection.to_check)} of {len(states)} nodes idle; "
                 + (f"checking {fold_hostlist(selection.to_check)} in one Slurm job"
                    if selection.to_check else "nothing to check"))
    else:
        states = _known_states(request, env)
        hosts = request.nodes or sorted(states)
        selection = SlurmSelection(hosts, [])
        target = fold_hostlist(hosts)
        progress(f"checking {target} over SSH, {request.fanout} at a time")
    labels = {name: state.label for name, state in states.items()}

    if history is None:
        outcomes = list(_collect(request, selection.to_check, states, labels, env, lambda job: None))
        result = SweepResult(0)
        result.nodes = {node.host: node for node in selection.not_swept + outcomes
                        if isinstance(node, NodeOutcome)}
        return result
    sweep_id = history.start_sweep(kind=request.kind, started_at=time.time(), site=request.site, via=request.via,
                                   target=target, checks=",".join(request.command.only))
    outcomes = _collect(request, selection.to_check, states, labels, env,
                        lambda job: history.set_slurm_job(sweep_id, job))
    return record_sweep(history, sweep_id=sweep_id, not_swept=selection.not_swept, outcomes=outcomes,
                        progress=progress)


def _collect(request: SweepRequest, hosts: list[str], states: dict[str, NodeState], labels: dict[str, str],
             env: dict[str, str] | None, on_job: Callable[[str], None]) -> Iterable[NodeOutcome | FabricVerdict]:
    if not hosts:
        return []
    if request.via == "slurm":
        return collect_via_slurm(hosts, request.command, partition=request.partition, extra=request.gpu_args,
                                 states=labels, on_job=on_job, env=env)
    addresses = {host: states[host].address if host in states else host for host in hosts}
    return collect_via_ssh(addresses, request.command, request.access, fanout=request.fanout, states=labels)


def _known_states(request: SweepRequest, env: dict[str, str] | None) -> dict[str, NodeState]:
    """Slurm's view of SSH targets (their addresses and states), if Slurm knows them at all."""
    if request.nodes is None:
        return node_states(partition=request.partition, env=env)
    try:
        return node_states(nodes=request.nodes, env=env)
    except ExternalCommandError:  # nodes outside Slurm: their names are their addresses
        return {}
