"""The compute test's part in the gate: measure this node, write DIR/compute/HOST.json; and
judge every node's file for `gate decide`.

Nodes that share their processors (the dev cluster's namespace nodes share the host's cores;
oversubscribed VMs) would measure each other's load instead of their own hardware: there the
site sets `compute_in_turns`, and the nodes measure one after another (`_take_turn`): a node
dead before the turns start is left out of them, one that dies later delays the others by
its own turn at most.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainctl.errors import UsageError
from trainctl.files import write_regular
from trainctl.job import jobdir
from trainctl.health.compute.judge import GpuVerdict, deadline_for, figures_from_report, judge, node_reasons
from trainctl.site import GateConfig

TURN_POLL_S = 0.05
ORDER_GRACE_S = 2.0  # node 0 writes the order at the end of slot 0; a little more for a shared filesystem


@dataclass(frozen=True)
class ComputePolicy:
    """The site's `[gate] compute*` keys (`from_gate`; without a site, GateConfig's defaults)."""
    enabled: bool
    budget_s: float
    factor: float
    floor_tflops: float
    floor_copy_gbps: float
    in_turns: bool

    @classmethod
    def from_gate(cls, gate: GateConfig) -> ComputePolicy:
        return cls(gate.compute, gate.compute_budget_s, gate.compute_factor, gate.compute_floor_tflops,
                   gate.compute_floor_copy_gbps, gate.compute_in_turns)


def turn_limit_s(budget_s: float) -> float:
    """How long a node waits for the node before it in turns: its budget twice, plus start-up."""
    return 2 * budget_s + 5.0


def compute_deadline_s(policy: ComputePolicy, nodes: int) -> float:
    """The compute test's share of the gate's deadline (`health.gate.gate_deadline_s`)."""
    if not policy.enabled:
        return 0.0
    # in turns: node 0 waits one turn for every node's checks, then one turn per node
    return (nodes + 1) * turn_limit_s(policy.budget_s) if policy.in_turns else deadline_for(policy.budget_s)


def compute_dir(gate_dir: Path) -> Path:
    return gate_dir / jobdir.COMPUTE


def _wait_until(markers: list[Path], until: float) -> float:
    """Seconds waited for every marker to appear, until the monotonic time `until` at the latest."""
    started = time.monotonic()
    while not all(m.exists() for m in markers) and time.monotonic() < until:
        time.sleep(TURN_POLL_S)
    return time.monotonic() - started


def run_for_gate(gate_dir: Path, host: str, rank: int, world: int, budget_s: float, in_turns: bool) -> dict:
    """Measure this node and write its file. In turns, node 0 starts once every node has finished
    its node checks, then each node after the one before it, and once measured each waits for
    the last one too: whatever a node does next (the fabric test loads the CPUs) must not run
    beside another node's measurement."""
    from trainctl.health.compute.measure import measure_node

    out = compute_dir(gate_dir)
    out.mkdir(parents=True, exist_ok=True)
    turn = turn_limit_s(budget_s)
    phase_start = time.monotonic()
    waited = 0.0
    if in_turns:
        order = _take_turn(out, rank, world, turn, phase_start)
        waited = time.monotonic() - phase_start
    started = time.monotonic()
    devices = measure_node(budget_s)
    report = {"host": host, "rank": rank, "budget_s": budget_s, "in_turns": in_turns,
              "waited_s": round(waited, 3), "seconds": round(time.monotonic() - started, 3),
              "devices": [device.to_json() for device in devices]}
    try:   # a FIFO or a link in its place is refused, never waited on: the node is judged by its health report
        write_regular(out / f"{host}.json", json.dumps(report, indent=1) + "\n")
    except UsageError as exc:
        print(f"trainctl: gate: compute report not written: {exc}", file=sys.stderr, flush=True)
    if in_turns:
        (out / f".turn-{rank}").touch()
        _wait_until([out / f".turn-{order[-1]}"], phase_start + (len(order) + 1) * turn)
    return report


def _take_turn(out: Path, rank: int, world: int, turn: float, phase_start: float) -> list[int]:
    """Wait for this node's turn; returns the order of the turns.

    Every node works to the same slots, counted from when it got here: slot 0 for every node's
    checks to finish (probes still running elsewhere would load node 0's measurement), then
    one slot per node. Node 0 writes the order: the nodes ready within slot 0, so a node dead
    before then has no slot and delays no one (the others would otherwise wait out its slot,
    and when it is the last, every node until the end). A node that dies later costs its own
    slot; a node too late for the order measures after the last one. Without node 0's order
    (node 0 died), the nodes go in rank order.
    """
    (out / f".ready-{rank}").touch()
    order_file = out / ".order"
    if rank == 0:
        _wait_until([out / f".ready-{r}" for r in range(world)], phase_start + turn)
        order = [r for r in range(world) if (out / f".ready-{r}").exists()]
        try:   # not written: the others go in rank order
            write_regular(order_file, json.dumps(order) + "\n")
        except UsageError as exc:
            print(f"trainctl: gate: compute turns' order not written: {exc}", file=sys.stderr, flush=True)
        return order
    _wait_until([order_file], phase_start + turn + ORDER_GRACE_S)
    try:   # a regular file only, never blocking on a FIFO, at most so many bytes (`jobdir.read_bytes`)
        written = jobdir.read_bytes(order_file, jobdir.JSON_MAX_BYTES, root=out)
        order = [int(r) for r in jobdir.loads(written or b"")]
    except (OSError, ValueError, TypeError):
        order = list(range(1, world))  # node 0 is gone: rank order among the others
    if rank not in order:
        order = [*order, rank]
    position = order.index(rank)
    if position > 0:
        _wait_until([out / f".turn-{order[position - 1]}"], phase_start + (position + 1) * turn)
    return order


def judge_gate_dir(gate_dir: Path, policy: ComputePolicy) -> tuple[list[GpuVerdict], dict[str, list[str]]]:
    """Every node's figures judged together -> (per-GPU verdicts, host -> exclusion reasons)."""
    figures = []
    for path in sorted(compute_dir(gate_dir).glob("*.json")):
        report = jobdir.read_json(path, root=gate_dir)   # a regular file's JSON object, never blocking
        if report is None:
            continue  # a node without a readable file is judged by its missing health report
        figures += figures_from_report(str(report.get("host", path.stem)), report)
    verdicts = judge(figures, policy.factor, policy.floor_tflops, policy.floor_copy_gbps)
    return verdicts, node_reasons(verdicts)
