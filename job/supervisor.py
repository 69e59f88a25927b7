"""The life of a job, as a state machine: gate -> release unused nodes -> training step -> done,
retry around bad nodes, or fail. While training runs, the watch (`trainctl.job.watch`) may end
the step on a detection: the gate runs again on the nodes the job holds, less those the
detection condemned, and training restarts from its checkpoint on the nodes it chooses (a held
spare included), up to the site's `watch.max_restarts`; then the job retries as on a failure.

`advance(facts, state, event)` is pure: from what the job knows and what just happened, it returns
the next state and the one action to take. The driver (`trainctl.job.run`) takes each action
through `trainctl.job.slurm_actions` and feeds back the event that followed. The argv builders and
parsers here are pure too, so the whole job can be unit-tested without Slurm.
"""

from __future__ import annotations

import shlex
import signal as signals
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, Union

from trainctl.job.jobdir import AGENT_LOG_PATTERN, GATE_LOG_PATTERN, SENTINEL_LOG, SENTINEL_OUT
from trainctl.launcher.plan import RANK_OUTPUT, JobPlan
from trainctl.slurm import fold_hostlist
from trainctl.validate import SLURM_SIGNAL

GATE_STEP = "trainctl-gate"          # step names: scancel finds the steps to end by them
SENTINEL_STEP = "trainctl-sentinel"
AGENT_STEP = "trainctl-agent"
PROBE_STEP = "trainctl-probe"
OWN_STEPS = (GATE_STEP, SENTINEL_STEP, AGENT_STEP, PROBE_STEP)   # every other numbered step is the training step
Phase = Literal["start", "gate", "release", "train", "retry", "end"]


@dataclass(frozen=True)
class JobFacts:
    """What stays true for the whole job."""

    allocated: tuple[str, ...]     # the job's nodes at its start, in Slurm's order
    batch_host: str                # runs the supervisor; never released
    release_unused: bool           # the site's launch.release_unused
    retries: int                   # submit --retries (0: a failure ends the chain)
    max_restarts: int = 0          # the site's watch.max_restarts: in-allocation restarts after a detection
    hold_spares: int = 0           # the site's watch.hold_spares: healthy unused nodes kept through training


@dataclass(frozen=True)
class JobState:
    phase: Phase = "start"
    job_nodes: str = ""            # the hostlist the gate chose, as `gate decide` printed it
    chosen: tuple[str, ...] = ()
    master_addr: str = ""
    sentinel_moved: bool = False   # the release cancelled the sentinel: it must start again
    status: int = 0                # the exit status the job ends with
    held: tuple[str, ...] = ()     # the job's nodes now, in Slurm's order (empty: all allocated)
    spares: tuple[str, ...] = ()   # healthy nodes the gate did not choose, kept through training
    restarts: int = 0              # in-allocation restarts so far
    condemned: tuple[str, ...] = ()  # nodes a watch detection named: never chosen again by this job
    releasing: tuple[str, ...] = ()  # the nodes a Release in flight keeps


# ---------------------------------------------------------------- events (what happened)

class Started(NamedTuple):
    pass


class GateDecided(NamedTuple):
    job_nodes: str                 # folded hostlist
    chosen: tuple[str, ...]
    master_addr: str
    healthy_unused: tuple[str, ...] = ()   # passed the gate, not chosen: candidate spares


class GateRefused(NamedTuple):
    status: int                    # gate decide's exit status (2: too few healthy nodes)
    retryable: bool = True         # False: decide printed nonsense, not a verdict about nodes


class Resized(NamedTuple):
    node_count: int                # the job's nodes after the update (all of them when refused)


class StepEnded(NamedTuple):
    status: int


class WatchStopped(NamedTuple):
    """The watch ended the training step on a detection."""
    kind: str                      # slow, sick or hung
    suspects: tuple[str, ...]      # nodes it named (sick, hung): left out of the next gate
    status: int                    # the step's exit status once ended


class RetryHandled(NamedTuple):
    pass


Event = Union[Started, GateDecided, GateRefused, Resized, StepEnded, WatchStopped, RetryHandled]


# ---------------------------------------------------------------- actions (what to do next)

class RunGate(NamedTuple):
    nodes: tuple[str, ...] = ()    # the nodes to check (empty: every node of the job)


class Release(NamedTuple):
    keep: str                      # NodeList= for scontrol update
    move_sentinel: bool            # the sentinel's node goes: cancel it first


class RunTraining(NamedTuple):
    job_nodes: str
    node_count: int
    master_addr: str
    start_sentinel: bool           # the release moved it off its node: start it on the new second node
    restart: int = 0               # 0: the first training step; N: the Nth restart after a detection


class Retry(NamedTuple):
    phase: Literal["gate", "step"]
    status: int
    nodes: tuple[str, ...]
    condemned: tuple[str, ...] = ()   # nodes the watch named: excluded by the successor too


class Finish(NamedTuple):
    status: int


Action = Union[RunGate, Release, RunTraining, Retry, Finish]


def advance(facts: JobFacts, state: JobState, event: Event) -> tuple[JobState, Action]:
    """The next state and action after `event`. Raises ValueError for an event the phase cannot have."""
    if state.phase == "start" and isinstance(event, Started):
        return replace(state, phase="gate", held=facts.allocated), RunGate()
    if state.phase == "gate" and isinstance(event, GateRefused):
        if facts.retries and event.retryable:
            return (replace(state, phase="retry", status=event.status),
                    Retry("gate", event.status, state.held, state.condemned))
        return replace(state, phase="end", status=event.status), Finish(event.status)
    if state.phase == "gate" and isinstance(event, GateDecided):
        decided = replace(state, job_nodes=event.job_nodes, chosen=event.chosen, master_addr=event.master_addr,
                          spares=event.healthy_unused[:facts.hold_spares])
        kept = nodes_to_keep(facts, decided) if facts.release_unused else None
        if kept is None:
            return _train(decided, len(decided.held))
        moved = len(decided.held) > 1 and decided.held[1] not in kept
        return (replace(decided, phase="release", sentinel_moved=moved, releasing=kept),
                Release(fold_hostlist(list(kept)), moved))
    if state.phase == "release" and isinstance(event, Resized):
        held = state.releasing if event.node_count == len(state.releasing) else state.held
        return _train(replace(state, held=held, releasing=()), event.node_count)
    if state.phase == "train" and isinstance(event, StepEnded):
        if event.status == 0:
            return replace(state, phase="end"), Finish(0)
        if facts.retries:
            return (replace(state, phase="retry", status=event.status),
                    Retry("step", event.status, state.chosen, state.condemned))
        return replace(state, phase="end", status=event.status), Finish(event.status)
    if state.phase == "train" and isinstance(event, WatchStopped):
        condemned = state.condemned + tuple(node for node in event.suspects if node not in state.condemned)
        stopped = replace(state, condemned=condemned, status=event.status)
        if state.restarts >= facts.max_restarts:
            if facts.retries:
                return replace(stopped, phase="retry"), Retry("step", event.status, state.chosen, condemned)
            return replace(stopped, phase="end"), Finish(event.status)
        again = tuple(node for node in state.held if node not in condemned)
        return replace(stopped, phase="gate", restarts=state.restarts + 1, status=0), RunGate(again)
    if state.phase == "retry" and isinstance(event, RetryHandled):
        return replace(state, phase="end"), Finish(state.status)
    raise ValueError(f"job supervisor: {type(event).__name__} cannot happen in phase {state.phase}")


def _train(state: JobState, node_count: int) -> tuple[JobState, Action]:
    restart_sentinel = state.sentinel_moved and node_count > 1
    return (replace(state, phase="train", sentinel_moved=False),
            RunTraining(state.job_nodes, len(state.chosen), state.master_addr, restart_sentinel, state.restarts))


def nodes_to_keep(facts: JobFacts, state: JobState) -> tuple[str, ...] | None:
    """The nodes the job keeps, in Slurm's order, when it can give nodes back; None when it keeps
    them all. It keeps the chosen nodes, the spares the site holds through training, and the
    batch host, which runs the supervisor, even when the gate left it out."""
    wanted = set(state.chosen) | set(state.spares) | {facts.batch_host}
    kept = tuple(node for node in state.held if node in wanted)
    return None if len(kept) >= len(state.held) else kept


# ---------------------------------------------------------------- what the job runs (argv, pure)

def gate_step_argv(plan: JobPlan, gate_dir: str, task_count: int, nodes: tuple[str, ...] = ()) -> list[str]:
    """One task per allocated node runs the node checks and the fabric test. --kill-on-bad-exit=0:
    one node's failure must not end the others' tasks. Each node logs to its own file: srun aborts
    the whole step when its I/O connection to one node's slurmstepd breaks (Slurm 22.05,
    step_launch_notify_io_failure), so a node that dies would take the others' tasks with it.
    --overlap: a lost node keeps this step registered until Slurm gives up on it; an overlapping
    step does not hold the nodes the training step needs (srun(1): "A step using this option will
    overlap all other steps, even those that did not specify --overlap"). --ntasks overrides the
    job's SLURM_NTASKS, which srun would otherwise read."""
    only = [f"--nodelist={fold_hostlist(list(nodes))}", f"--nodes={len(nodes)}"] if nodes else []
    return ["srun", "--overlap", f"--job-name={GATE_STEP}", *only, f"--ntasks={len(nodes) or task_count}",
            "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--input=none", f"--output={gate_dir}/{GATE_LOG_PATTERN}",
            plan.trainctl, "gate", "node", "--site", plan.site_ref, "--partition", plan.partition,
            "--dir", gate_dir]


def decide_argv(plan: JobPlan, gate_dir: str, nodes: tuple[str, ...] = ()) -> list[str]:
    """Waits until every node has reported or the gate's deadline (from the site), then prints the
    chosen nodes and MASTER_ADDR, or one line on stderr naming which nodes failed and why.
    `nodes`: only these (a gate after a detection leaves the condemned nodes out)."""
    only = ["--allocated", fold_hostlist(list(nodes))] if nodes else []
    return [plan.trainctl, "gate", "decide", "--site", plan.site_ref, "--partition", plan.partition,
            "--dir", gate_dir, "--nodes", str(plan.nodes), "--min-nodes", str(plan.min_nodes), *only, "--wait"]


def agent_argv(plan: JobPlan, action: RunTraining, gate_dir: str) -> list[str]:
    """The watch's node agents: one task on each training node, for the training step's life
    (--overlap: beside the training step, on its CPUs)."""
    return ["srun", "--overlap", f"--job-name={AGENT_STEP}", f"--nodelist={action.job_nodes}",
            f"--nodes={action.node_count}", f"--ntasks={action.node_count}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", "--input=none", f"--output={gate_dir}/{AGENT_LOG_PATTERN}",
            plan.trainctl, "job", "agent", "--dir", gate_dir, "--site", plan.site_ref,
            "--partition", plan.partition]


def sentinel_argv(plan: JobPlan, gate_dir: str) -> list[str]:
    """On the job's second node, for the job's life; it writes its own log (srun's output forwarding
    runs through the batch host, whose loss is what the sentinel reports)."""
    return ["srun", "--overlap", f"--job-name={SENTINEL_STEP}", "--nodes=1", "--ntasks=1", "--relative=1",
            "--input=none", "--open-mode=append", f"--output={gate_dir}/{SENTINEL_OUT}",
            plan.trainctl, "gate", "sentinel", "--dir", gate_dir, "--log", f"{gate_dir}/{SENTINEL_LOG}"]


def training_argv(plan: JobPlan, action: RunTraining, gate_dir: str) -> list[str]:
    """The program, on the chosen nodes only; rank-exec sets the torch.distributed environment,
    binds each rank (when the plan binds) and execs the program. --kill-on-bad-exit=1: one rank
    that fails ends the step, rather than leaving the others waiting in a collective."""
    argv = ["srun", f"--nodelist={action.job_nodes}", f"--nodes={action.node_count}",
            f"--ntasks={action.node_count * plan.tasks_per_node}", f"--ntasks-per-node={plan.tasks_per_node}",
            "--kill-on-bad-exit=1"]
    if action.restart:
        # the ended step stays registered on a hung node until Slurm declares that node down
        # (SlurmdTimeout), holding its CPUs on every node of the step; an overlapping step does not
        # wait for them (srun(1) --overlap). Its tasks on the live nodes are gone.
        argv.append("--overlap")
    if plan.bind:
        argv.append("--cpu-bind=none")
    if plan.rank_output:
        argv.append(f"--output={gate_dir}/{RANK_OUTPUT}")
    argv += [plan.trainctl, "rank-exec", "--site", plan.site_ref, "--partition", plan.partition,
             "--master-addr", action.master_addr, "--gate-dir", gate_dir]
    if not plan.bind:
        argv.append("--no-bind")
    return argv + ["--", *plan.program]


def checkpoint_signal(sbatch_signal: str) -> int | None:
    """The signal the job's program checkpoints on, from the plan's sbatch --signal value, read
    with the same pattern that checked it (`trainctl.validate.SLURM_SIGNAL`); None when there is
    none, or it goes to the batch shell only (B:), which the ranks never see."""
    match = SLURM_SIGNAL.fullmatch(sbatch_signal)
    if not match or "B" in (match["prefix"] or "").upper():
        return None
    name = match["sig"].upper().removeprefix("SIG")
    if name.isdigit():
        return int(name)
    return int(signals.Signals["SIG" + name]) if "SIG" + name in signals.Signals.__members__ else None


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
