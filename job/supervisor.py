"""The life of a job, as a state machine: gate -> release unused nodes -> training step -> done,
retry around bad nodes, or fail.

`advance(facts, state, event)` is pure: from what the job knows and what just happened, it returns
the next state and the one action to take. The driver (`trainctl.job.run`) takes each action
through `trainctl.job.slurm_actions` and feeds back the event that followed. The argv builders and
parsers here are pure too, so the whole job can be unit-tested without Slurm.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal, NamedTuple, Union

from trainctl.launcher.plan import RANK_OUTPUT, JobPlan

GATE_STEP = "trainctl-gate"          # step names: scancel finds the steps to end by them
SENTINEL_STEP = "trainctl-sentinel"
Phase = Literal["start", "gate", "release", "train", "retry", "end"]


@dataclass(frozen=True)
class JobFacts:
    """What stays true for the whole job."""

    allocated: tuple[str, ...]     # the job's nodes at its start, in Slurm's order
    batch_host: str                # runs the supervisor; never released
    release_unused: bool           # the site's launch.release_unused
    retries: int                   # submit --retries (0: a failure ends the chain)


@dataclass(frozen=True)
class JobState:
    phase: Phase = "start"
    job_nodes: str = ""            # the hostlist the gate chose, as `gate decide` printed it
    chosen: tuple[str, ...] = ()
    master_addr: str = ""
    sentinel_moved: bool = False   # the release cancelled the sentinel: it must start again
    status: int = 0                # the exit status the job ends with


# ---------------------------------------------------------------- events (what happened)

class Started(NamedTuple):
    pass


class GateDecided(NamedTuple):
    job_nodes: str                 # folded hostlist
    chosen: tuple[str, ...]
    master_addr: str


class GateRefused(NamedTuple):
    status: int                    # gate decide's exit status (2: too few healthy nodes)
    retryable: bool = True         # False: decide printed nonsense, not a verdict about nodes


class Resized(NamedTuple):
    node_count: int                # the job's nodes after the update (all of them when refused)


class StepEnded(NamedTuple):
    status: int


class RetryHandled(NamedTuple):
    pass


Event = Union[Started, GateDecided, GateRefused, Resized, StepEnded, RetryHandled]


# ---------------------------------------------------------------- actions (what to do next)

class RunGate(NamedTuple):
    pass


class Release(NamedTuple):
    keep: str                      # NodeList= for scontrol update
    move_sentinel: bool            # the sentinel's node goes: cancel it first


class RunTraining(NamedTuple):
    job_nodes: str
    node_count: int
    master_addr: str
    start_sentinel: bool           # the release moved it off its node: start it on the new second node


class Retry(NamedTuple):
    phase: Literal["gate", "step"]
    status: int
    nodes: tuple[str, ...]


class Finish(NamedTuple):
    status: int


Action = Union[RunGate, Release, RunTraining, Retry, Finish]


def advance(facts: JobFacts, state: JobState, event: Event) -> tuple[JobState, Action]:
    """The next state and action after `event`. Raises ValueError for an event the phase cannot have."""
    if state.phase == "start" and isinstance(event, Started):
        return JobState("gate"), RunGate()
    if state.phase == "gate" and isinstance(event, GateRefused):
        if facts.retries and event.retryable:
            return JobState("retry", status=event.status), Retry("gate", event.status, facts.allocated)
        return JobState("end", status=event.status), Finish(event.status)
    if state.phase == "gate" and isinstance(event, GateDecided):
        decided = JobState("gate", event.job_nodes, event.chosen, event.master_addr)
        keep = nodes_to_keep(facts, event.job_nodes, event.chosen) if facts.release_unused else None
        if keep is None:
            return _train(decided, len(facts.allocated))
        keep_hostlist, kept = keep
        moved = len(facts.allocated) > 1 and facts.allocated[1] not in kept
        return (JobState("release", event.job_nodes, event.chosen, event.master_addr, moved),
                Release(keep_hostlist, moved))
    if state.phase == "release" and isinstance(event, Resized):
        return _train(state, event.node_count)
    if state.phase == "train" and isinstance(event, StepEnded):
        if event.status == 0:
            return JobState("end", state.job_nodes, state.chosen, state.master_addr), Finish(0)
        if facts.retries:
            return (JobState("retry", state.job_nodes, state.chosen, state.master_addr, status=event.status),
                    Retry("step", event.status, state.chosen))
        return JobState("end", state.job_nodes, state.chosen, state.master_addr, status=event.status), \
            Finish(event.status)
    if state.phase == "retry" and isinstance(event, RetryHandled):
        return JobState("end", state.job_nodes, state.chosen, state.master_addr, status=state.status), \
            Finish(state.status)
    raise ValueError(f"job supervisor: {type(event).__name__} cannot happen in phase {state.phase}")


def _train(state: JobState, node_count: int) -> tuple[JobState, Action]:
    restart_sentinel = state.sentinel_moved and node_count > 1
    return (JobState("train", state.job_nodes, state.chosen, state.master_addr),
            RunTraining(state.job_nodes, len(state.chosen), state.master_addr, restart_sentinel))


def nodes_to_keep(facts: JobFacts, job_nodes: str, chosen: tuple[str, ...]) -> tuple[str, set[str]] | None:
    """(NodeList= value, its nodes) when the job can give nodes back; None when it uses them all.
    The batch host runs the supervisor, so it stays even when the gate left it out."""
    kept = set(chosen)
    keep = job_nodes
    if facts.batch_host not in kept:
        kept.add(facts.batch_host)
        keep = f"{facts.batch_host},{job_nodes}"
    if len(kept) >= len(facts.allocated):
        return None
    return keep, kept


# ---------------------------------------------------------------- what the job runs (argv, pure)

def gate_step_argv(plan: JobPlan, gate_dir: str, task_count: int) -> list[str]:
    """One task per allocated node runs the node checks and the fabric test. --kill-on-bad-exit=0:
    one node's failure must not end the others' tasks. Each node logs to its own file: srun aborts
    the whole step when its I/O connection to one node's slurmstepd breaks (Slurm 22.05,
    step_launch_notify_io_failure), so a node that dies would take the others' tasks with it.
    --overlap: a lost node keeps this step registered until Slurm gives up on it; an overlapping
    step does not hold the nodes the training step needs (srun(1): "A step using this option will
    overlap all other steps, even those that did not specify --overlap"). --ntasks overrides the
    job's SLURM_NTASKS, which srun would otherwise read."""
    return ["srun", "--overlap", f"--job-name={GATE_STEP}", f"--ntasks={task_count}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", "--input=none", f"--output={gate_dir}/node-%N.log",
            plan.trainctl, "gate", "node", "--site", plan.site_ref, "--partition", plan.partition,
            "--dir", gate_dir]


def decide_argv(plan: JobPlan, gate_dir: str) -> list[str]:
    """Waits until every node has reported or the gate's deadline (from the site), then prints the
    chosen nodes and MASTER_ADDR, or one line on stderr naming which nodes failed and why."""
    return [plan.trainctl, "gate", "decide", "--site", plan.site_ref, "--partition", plan.partition,
            "--dir", gate_dir, "--nodes", str(plan.nodes), "--min-nodes", str(plan.min_nodes), "--wait"]


def sentinel_argv(plan: JobPlan, gate_dir: str) -> list[str]:
    """On the job's second node, for the job's life; it writes its own log (srun's output forwarding
    runs through the batch host, whose loss is what the sentinel reports)."""
    return ["srun", "--overlap", f"--job-name={SENTINEL_STEP}", "--nodes=1", "--ntasks=1", "--relative=1",
            "--input=none", "--open-mode=append", f"--output={gate_dir}/sentinel.out",
            plan.trainctl, "gate", "sentinel", "--dir", gate_dir, "--log", f"{gate_dir}/sentinel.log"]


def training_argv(plan: JobPlan, action: RunTraining, gate_dir: str) -> list[str]:
    """The program, on the chosen nodes only; rank-exec sets the torch.distributed environment,
    binds each rank (when the plan binds) and execs the program. --kill-on-bad-exit=1: one rank
    that fails ends the step, rather than leaving the others waiting in a collective."""
    argv = ["srun", f"--nodelist={action.job_nodes}", f"--nodes={action.node_count}",
            f"--ntasks={action.node_count * plan.tasks_per_node}", f"--ntasks-per-node={plan.tasks_per_node}",
            "--kill-on-bad-exit=1"]
    if plan.bind:
        argv.append("--cpu-bind=none")
    if plan.rank_output:
        argv.append(f"--output={gate_dir}/{RANK_OUTPUT}")
    argv += [plan.trainctl, "rank-exec", "--site", plan.site_ref, "--partition", plan.partition,
             "--master-addr", action.master_addr, "--gate-dir", gate_dir]
    if not plan.bind:
        argv.append("--no-bind")
    return argv + ["--", *plan.program]


# ---------------------------------------------------------------- what comes back (parsers, pure)

def parse_decision(stdout: str) -> tuple[str, str] | None:
    """`gate decide`'s two lines: (hostlist of the chosen nodes, MASTER_ADDR); None if not that."""
    lines = stdout.splitlines()
    if len(lines) < 2 or not lines[0].strip() or not lines[1].strip():
        return None
    return lines[0].strip(), lines[1].strip()


def parse_resize_script(text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """scontrol's slurm_job_<id>_resize.sh -> (variables it exports, variables it unsets).

    scontrol writes `export NAME="value"` and `unset NAME` lines (src/scontrol/update_job.c,
    _update_job_size; Slurm's FAQ, "Can I change my job's size after it has started running?"),
    so that the job's later steps see the smaller job. Read as shell words, never run."""
    exported: dict[str, str] = {}
    unset: list[str] = []
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            exported[name] = value
        elif len(words) >= 2 and words[0] == "unset":
            unset += words[1:]
    return exported, tuple(unset)
