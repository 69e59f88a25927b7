"""One sweep, start to end: decide which nodes to check, check them, commit each as it comes.

collect (Slurm states, then the node task on each node) -> parse (envelopes to outcomes) ->
record (what has arrived, one transaction per batch) -> verdict (the worst node status is the exit code).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.health.counters import COUNTER_CHECKS, judge_growth
from trainctl.health.versions import VERSIONS_CHECK, odd_nodes_out
from trainctl.slurm import NodeState, fold_hostlist, node_states
from trainctl.sweep.collect import (FabricVerdict, NodeCommand, SshAccess, collect_via_slurm,
                                    collect_via_ssh)
from trainctl.sweep.db import History
from trainctl.health.status import Status
from trainctl.sweep.model import CHECKED, NOT_SWEPT, STATUSES, CheckRow, NodeOutcome, worst_label
from trainctl.text import printable

FABRIC_CHECK = "fabric.allreduce"
# Nodes per transaction at most: 24-40 check rows each, so a batch is a few MB of SQL work and
# a sweep of 10,000 nodes that answer together is a handful of commits.
BATCH_MAX = 2000


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
    status = worst_label((node.status or "ok", row.status))
    return NodeOutcome(node.host, node.outcome, status=status, slurm_state=node.slurm_state, detail=node.detail,
                       duration_s=node.duration_s, checks=(*node.checks, row))


@dataclass
class SweepResult:
    sweep_id: int
    nodes: dict[str, NodeOutcome] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The worst node status's code (fail > unknown > warn > ok; no verdict counts as unknown)."""
        return Status.worst((node.verdict for node in self.nodes.values()), default=Status.OK).exit_code


def record_sweep(history: History, *, sweep_id: int, not_swept: list[NodeOutcome],
                 outcomes: Iterable[NodeOutcome | FabricVerdict],
                 progress: Callable[[str], None], clock: Callable[[], float] = time.time,
                 odd_node_fails: bool = False, batch_max: int = BATCH_MAX) -> SweepResult:
    """Commit outcomes as they arrive; the sweep is finished only if the collection ends.

    A writer thread takes what the collector hands over: whatever arrived while it wrote the
    last batch goes into one transaction (at most `batch_max` nodes), and a node that arrives
    alone is committed alone at once. So the write lock is never held while waiting on nodes,
    10,000 nodes that answer together take a few transactions instead of 10,000, and a sweep
    stopped half-way (Ctrl-C, SIGTERM) still writes everything that had arrived.

    Error counters are judged by their growth since the node's previous sweep as each node
    arrives; once all are in, a node whose versions differ from the sweep's majority is
    marked on its `node.versions` row (warn, or fail with `odd_node_fails`).
    """
    result = SweepResult(sweep_id)
    try:
        _record(history, result, not_swept, clock)
        writer = BatchWriter(lambda batch: _write_batch(history, result, batch, clock, progress), batch_max)
        try:
            for item in outcomes:
                writer.put(item)
        finally:
            writer.close()
        _mark_odd_nodes(history, result, odd_node_fails, clock)
    except Exception as exc:  # recorded as finished with an error, then reported (exit 4)
        # Never an empty error: an empty one reads as a complete sweep (EOFError's text is "").
        history.finish_sweep(sweep_id, clock(), error=str(exc) or type(exc).__name__)
        raise
    history.finish_sweep(sweep_id, clock())
    return result


class BatchWriter:
    """Hands items to `write` in a thread of its own, as lists of what has arrived: each list
    waits for one item, then takes every item already queued (at most `batch_max`).

    The collector keeps running in the caller's thread, so Ctrl-C still stops it (and srun)
    where it waits; `close()` then waits until everything handed over is written. A failed
    write is raised by the next `put` or by `close`; later items are dropped, not written.
    """

    _END = object()

    def __init__(self, write: Callable[[list], None], batch_max: int):
        self._write = write
        self._batch_max = max(1, batch_max)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sweep-writer", daemon=True)
        self._thread.start()

    def put(self, item: object) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(self._END)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while batch[-1] is not self._END and len(batch) < self._batch_max:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            end = batch[-1] is self._END
            if end:
                batch.pop()
            if batch and self._error is None:
                try:
                    self._write(batch)
                except BaseException as exc:  # raised in the caller's thread by put() or close()
                    self._error = exc
            if end:
                return


def _write_batch(history: History, result: SweepResult, batch: list, clock: Callable[[], float],
                 progress: Callable[[str], None]) -> None:
    nodes: list[NodeOutcome] = []
    for item in batch:
        if isinstance(item, FabricVerdict):  # it judges the nodes before it: write those first
            _record(history, result, nodes, clock, progress)
            nodes = []
            _record_fabric(history, result, item, progress, clock)
        else:
            nodes.append(with_counter_growth(history, result.sweep_id, item))
    _record(history, result, nodes, clock, progress)


def _record(history: History, result: SweepResult, nodes: list[NodeOutcome], clock: Callable[[], float],
            progress: Callable[[str], None] | None = None) -> None:
    if not nodes:
        return
    history.record_nodes(result.sweep_id, nodes, clock())
    for node in nodes:
        result.nodes[node.host] = node
        if progress is not None:
            progress(describe(node))


def _record_fabric(history: History, result: SweepResult, verdict: FabricVerdict,
                   progress: Callable[[str], None], clock: Callable[[], float]) -> None:
    checked = [host for host, node in result.nodes.items() if node.outcome == CHECKED]
    judged = [with_check(result.nodes[host], row) for host, row in fabric_rows(verdict, checked).items()
              if host in checked]
    _record(history, result, judged, clock)
    progress(f"fabric test: {verdict.outcome}" + (f" ({verdict.detail})" if verdict.detail else ""))


def with_counter_growth(history: History, sweep_id: int, node: NodeOutcome) -> NodeOutcome:
    """`node` with its counter checks judged by their growth since its previous sweep."""
    if node.outcome != CHECKED:
        return node
    rows, changed = [], False
    for row in node.checks:
        judged_here = row.name in COUNTER_CHECKS and row.status == "ok" and "counters" in row.details
        previous = history.previous_details(node.host, row.name, sweep_id) if judged_here else None
        if previous is not None and "counters" in previous[1]:
            judged = judge_growth(row.name, previous[1], row.details, f"since sweep #{previous[0]}")
            row = CheckRow(row.name, judged.status.label, judged.reason, judged.details)
            changed = True
        rows.append(row)
    return _with_rows(node, rows) if changed else node


def _mark_odd_nodes(history: History, result: SweepResult, fails: bool, clock: Callable[[], float]) -> None:
    versions = {}
    for host, node in result.nodes.items():
        row = next((c for c in node.checks if c.name == VERSIONS_CHECK), None)
        if node.outcome == CHECKED and row is not None and isinstance(row.details.get("versions"), dict):
            versions[host] = row.details["versions"]
    odd_by_host: dict[str, list[str]] = {}
    for odd in odd_nodes_out(versions):
        odd_by_host.setdefault(odd.host, []).append(odd.describe())
    marked = []
    for host, texts in sorted(odd_by_host.items()):
        node = result.nodes[host]
        rows = [CheckRow(c.name, worst_label([c.status, "fail" if fails else "warn"]),
                         "odd node out: " + "; ".join(texts) + (f"; {c.reason}" if c.status != "ok" else ""),
                         c.details)
                if c.name == VERSIONS_CHECK else c for c in node.checks]
        marked.append(_with_rows(node, rows))
    _record(history, result, marked, clock)


def _with_rows(node: NodeOutcome, rows: list[CheckRow]) -> NodeOutcome:
    status = worst_label([node.status or "ok", *(r.status for r in rows)])
    return NodeOutcome(node.host, node.outcome, status=status, slurm_state=node.slurm_state,
                       detail=node.detail, duration_s=node.duration_s, checks=tuple(rows))


def describe(node: NodeOutcome) -> str:
    """One line for progress and summaries: `node2  fail  ib.ports: mlx5_11/1 Down`."""
    if node.outcome != CHECKED:
        label = "not swept" if node.outcome == NOT_SWEPT else node.outcome
        return printable(f"{node.host}  {label}  {node.detail}".rstrip())
    bad = [f"{c.name}: {c.reason}" for c in node.checks if c.status != "ok"]
    took = f"  ({node.duration_s:.1f} s)" if node.duration_s is not None else ""
    return printable(f"{node.host}  {node.status}  {'; '.join(bad)}{took}".rstrip())  # text from the nodes


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
    odd_node_fails: bool = False   # the site's [gate] odd_node_out = "fail"


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
                        progress=progress, odd_node_fails=request.odd_node_fails)


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
