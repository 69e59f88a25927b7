"""A successor job around bad nodes: when the gate or the training step failed, or the watch
named nodes the allocation cannot do without, the job's driver (`trainctl.job.driver`) decides
here whether the job submits its successor, and submits it.

Collect (`collect_evidence`: the job's record, the nodes' Slurm states, a probe step that
tells which nodes still start a task; Slurm's commands run in `slurm_actions`) -> decide
(`decide_retry`, pure) -> act (`retry_around_bad_nodes`:
sbatch with the same script, `--exclude` the bad nodes and the job's own excludes,
`--dependency=afterany:` this job, a `--comment` naming the attempt; `retry.json` in this
job's gate directory and `attempt.json` in the successor's, so `trainctl job show` can follow
the chain).

What tells a lost node from a program that failed on healthy nodes: a node is lost when Slurm
has removed it from this --no-kill job (sbatch(1) --no-kill: the allocation stays, the failed
node leaves it), or marks it down, failed or not responding, or when a probe step cannot start
a task on it (srun: "Task launch ... failed on node ...: Communication connection failure";
checked on the dev cluster, Slurm 22.05.8: the probe's per-node output file exists on every
node where the task started). A failed step whose nodes all answer is the program's failure
and is never retried.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from trainctl.errors import TrainctlError, UsageError
from trainctl.job import jobdir
from trainctl.job.decision import Decision
from trainctl.job.jobdir import AttemptRecord, JobPaths, RetryRecord
from trainctl.launcher.plan import SbatchOption
from trainctl.slurm import expand_hostlist, fold_hostlist, node_states

# Slurm states (sinfo %T, suffix removed; scontrol State= flags) that mean the node is gone.
LOST_STATES = ("down", "fail", "failing", "not_responding", "unknown", "future", "power_down")
# sbatch reads these SLURM_ variables as input (sbatch(1) INPUT ENVIRONMENT VARIABLES); every
# other SLURM_ variable in the job's environment describes this job and stays out of the successor's.
SBATCH_INPUT_VARS = ("SLURM_CONF", "SLURM_CLUSTERS", "SLURM_DEBUG_FLAGS", "SLURM_EXIT_ERROR", "SLURM_HINT",
                     "SLURM_UMASK")
ENV_ATTEMPT, ENV_EXCLUDE, ENV_PREVIOUS = "TRAINCTL_ATTEMPT", "TRAINCTL_EXCLUDE", "TRAINCTL_PREVIOUS_JOB"


@dataclass(frozen=True)
class Attempt:
    """Which attempt this job is, carried from job to job in the environment."""

    job_id: str
    number: int                         # 1 for the job the user submitted
    retries: int                        # successors allowed in all (submit --retries)
    excluded: tuple[str, ...] = ()      # nodes earlier attempts excluded
    previous_job: str | None = None
    kept_out: tuple[str, ...] = ()      # nodes the job's own sbatch options exclude (`plan_excludes`)


@dataclass(frozen=True)
class Evidence:
    """What the job script and Slurm say about how this attempt ended."""

    phase: Literal["gate", "step"]
    status: int                                   # gate decide's or the training srun's exit status
    nodes: tuple[str, ...]                        # the step's nodes (gate: the allocated nodes)
    gate_bad: dict[str, str] = field(default_factory=dict)    # node -> why this job's gate left it out
    in_job: tuple[str, ...] | None = None         # the job's nodes now (None: unknown)
    states: dict[str, str] = field(default_factory=dict)      # node -> Slurm state with flags
    answered: tuple[str, ...] | None = None       # nodes where the probe started a task (None: no probe)
    batch_host: str = ""
    condemned: tuple[str, ...] = ()               # nodes the in-training watch named (trainctl.job.watch)


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    reason: str                                   # one line: why (not) retried
    bad_nodes: dict[str, str] = field(default_factory=dict)   # node -> why it counts as bad
    exclude: tuple[str, ...] = ()                 # the successor's --exclude (the job's own + earlier + bad)
    next_attempt: int = 0


def lost_nodes(evidence: Evidence) -> tuple[dict[str, str], str | None]:
    """{node: why it is lost} among the step's nodes; or a reason the evidence cannot tell."""
    lost: dict[str, str] = {}
    if evidence.answered is not None and evidence.batch_host and evidence.batch_host not in evidence.answered:
        # the batch host runs this very script: a probe that did not reach it says nothing
        return {}, "the probe step did not start even on the batch host"
    for node in evidence.nodes:
        state = evidence.states.get(node, "")
        base = state.rstrip("*~#!%$@^-").lower()
        if evidence.in_job is not None and node not in evidence.in_job:
            lost[node] = "Slurm removed it from the job (node failure)"
        elif base in LOST_STATES or "*" in state or "NOT_RESPONDING" in state.upper():
            lost[node] = f"Slurm state {state}"
        elif evidence.answered is not None and node not in evidence.answered:
            lost[node] = "no task could be started on it after the step ended"
    return lost, None


def decide_retry(attempt: Attempt, evidence: Evidence) -> RetryDecision:
    """Whether this attempt submits a successor, and which nodes the successor excludes."""
    if evidence.phase == "gate":
        if evidence.status != 2:   # 2: too few healthy nodes; anything else is not about nodes
            return RetryDecision(False, f"gate decide exited with status {evidence.status}, not a node verdict")
        bad = {**_watch_named(evidence), **evidence.gate_bad}
        if not bad:
            return RetryDecision(False, "the gate found too few healthy nodes but excluded none")
        what = "the gate found too few healthy nodes"
    else:
        if evidence.status == 0:
            return RetryDecision(False, "the training step succeeded")
        lost, unknown = lost_nodes(evidence)
        bad = {**_watch_named(evidence), **lost}
        if unknown and not bad:
            return RetryDecision(False, f"cannot tell whether a node was lost: {unknown}")
        if not bad:
            return RetryDecision(False, f"the program exited with status {evidence.status} on healthy nodes "
                                        "(every node still answers): not retried")
        what = "a node was lost during training" if lost else "the watch named a bad node during training"
    # after a step's failure too, the nodes this job's own gate left out stay out: the successor's
    # spares are optional (`--nodes=N-(N+spare)`), so its gate could otherwise meet them again
    exclude = tuple(sorted(set(attempt.kept_out) | set(attempt.excluded) | set(bad) | set(evidence.gate_bad)))
    if attempt.number > attempt.retries:
        return RetryDecision(False, f"{what}, but this was attempt {attempt.number} of {attempt.retries + 1}: "
                                    "no retries left", bad, exclude)
    return RetryDecision(True, what, bad, exclude, attempt.number + 1)


def _watch_named(evidence: Evidence) -> dict[str, str]:
    return {node: "named by the watch during training (trainctl job show)" for node in evidence.condemned}


EXCLUDE_OPTIONS = ("--exclude", "-x")


def plan_excludes(options: Iterable[SbatchOption]) -> tuple[str, ...]:
    """The nodes the job's own sbatch options exclude (the site's `[slurm] extra_sbatch`, submit's
    lemons), as its plan holds them. The successor's command-line --exclude replaces the script's
    `#SBATCH --exclude` (sbatch(1): command-line options win), so it must name these too.
    UsageError (one line) for a value that is not a hostlist."""
    return tuple(sorted({node for option in options if option.name in EXCLUDE_OPTIONS and option.value
                         for node in expand_hostlist(option.value, source=f"the job's {option.name}")}))


def successor_comment(attempt: Attempt, decision: RetryDecision) -> str:
    return (f"trainctl: attempt {decision.next_attempt} of {attempt.retries + 1}, after job {attempt.job_id} "
            f"({decision.reason}: {fold_hostlist(list(decision.bad_nodes))})")


def successor_argv(attempt: Attempt, decision: RetryDecision, extra_options: tuple[str, ...],
                   nodes: int, spare: int) -> list[str]:
    """sbatch for the successor; the script goes to stdin. Options on the command line win over
    the script's #SBATCH lines (sbatch(1)), so --exclude is added to the same script.

    Its spares are optional: `--nodes=N-(N+spare)`, "as many nodes as possible within the range
    specified and without delaying the initiation of the job" (sbatch(1), --nodes). With the bad
    nodes excluded, N + spare may be more than the partition has left, and a fixed count would
    then wait or be rejected."""
    count = [f"--nodes={nodes}-{nodes + spare}"] if spare else []
    # sbatch keeps only the last --exclude: the decision's one holds the job's own ones already
    extra = [option for option in extra_options if option.partition("=")[0] not in EXCLUDE_OPTIONS]
    return ["sbatch", "--parsable", *extra, *count, f"--exclude={fold_hostlist(list(decision.exclude))}",
            f"--dependency=afterany:{attempt.job_id}", f"--comment={successor_comment(attempt, decision)}"]


def successor_environment(environ: dict[str, str], attempt: Attempt, decision: RetryDecision) -> dict[str, str]:
    """The job's environment without this job's SLURM_ variables, plus the attempt to carry on."""
    env = {name: value for name, value in environ.items()
           if not name.startswith("SLURM_") or name in SBATCH_INPUT_VARS}
    env[ENV_ATTEMPT] = str(decision.next_attempt)
    env[ENV_EXCLUDE] = ",".join(decision.exclude)
    env[ENV_PREVIOUS] = attempt.job_id
    return env


def attempt_from_environment(environ: dict[str, str], job_id: str, retries: int,
                             kept_out: tuple[str, ...] = ()) -> Attempt:
    raw = environ.get(ENV_ATTEMPT, "1")
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{ENV_ATTEMPT}={raw!r}: expected a number from 1")
    excluded = tuple(node for node in environ.get(ENV_EXCLUDE, "").split(",") if node)
    return Attempt(job_id, int(raw), retries, excluded, environ.get(ENV_PREVIOUS) or None, kept_out)


def gate_bad_nodes(decision: Decision | None) -> dict[str, str]:
    """{node: reasons} of the nodes `gate decide` excluded (its decision.json)."""
    if decision is None:
        return {}
    return {item.host: "; ".join(map(str, item.reasons)) or "excluded by the gate" for item in decision.excluded}


def record(attempt: Attempt, evidence: Evidence, decision: RetryDecision, successor: str | None,
           error: str | None) -> RetryRecord:
    return RetryRecord(attempt.job_id, attempt.number, attempt.retries, evidence.phase, evidence.status,
                       decision.retry, decision.reason, dict(decision.bad_nodes), tuple(decision.exclude),
                       successor, error, attempt.previous_job, tuple(attempt.excluded))


def summary_line(rec: RetryRecord) -> str:
    """One line for the job output and the gate report."""
    head = f"attempt {rec.attempt} of {rec.retries + 1} (job {rec.job_id})"
    bad = "; ".join(f"{node}: {why}" for node, why in rec.bad_nodes.items())
    if rec.successor:
        return (f"{head}: {rec.reason} ({bad}); submitted job {rec.successor} "
                f"excluding {fold_hostlist(list(rec.exclude))}")
    if rec.error:
        return f"{head}: {rec.reason} ({bad}); the successor could not be submitted: {rec.error}"
    return f"{head}: {rec.reason}" + (f" ({bad})" if bad else "")


# ---------------------------------------------------------------- collect and act (I/O)


def collect_evidence(phase: str, status: int, nodes: list[str], gate_dir: str, env: dict[str, str]) -> Evidence:
    # here, not at the top: `job show` (a login-node command) reads this module's records, and
    # slurm_actions brings the job's state machine with it (10-20 ms, `python -X importtime`)
    from trainctl.job.slurm_actions import job_record, probe_nodes

    job_id = env["SLURM_JOB_ID"]
    decision = jobdir.read_decision(JobPaths(Path(gate_dir)))
    if phase == "gate":
        return Evidence("gate", status, tuple(nodes), gate_bad_nodes(decision))
    job = job_record(job_id, env)
    in_job = tuple(expand_hostlist(job["NodeList"])) if job.get("NodeList") else None
    try:
        states = {name: state.label for name, state in node_states(nodes=nodes, env=env).items()}
    except TrainctlError:  # sinfo failed: weaker evidence (the job record and the probe remain)
        states = {}
    reachable = [node for node in nodes if in_job is None or node in in_job]
    batch_host = env.get("SLURMD_NODENAME", "")
    # the batch host is probed too, even when the gate left it out of the step: a probe that
    # does not start there (this very script's node) says nothing about the others
    probed = reachable + ([batch_host] if reachable and batch_host and batch_host not in reachable else [])
    answered = probe_nodes(probed, gate_dir, jobdir.PROBE_PREFIX, env) if probed else ()
    return Evidence("step", status, tuple(nodes), gate_bad_nodes(decision), in_job, states, answered, batch_host)


def retry_around_bad_nodes(gate_dir: str, phase: str, status: int, nodes: list[str], retries: int,
                           script_path: str, sbatch_options: tuple[str, ...], env: dict[str, str],
                           node_count: tuple[int, int], condemned: tuple[str, ...] = (),
                           plan_options: tuple[SbatchOption, ...] = ()) -> RetryRecord:
    """Collect, decide and (when decided) submit the successor; record it all in retry.json, in the
    successor's attempt.json and in report.txt. Returns the record (`summary_line` says it).
    `sbatch_options` are the plan's options on sbatch's command line, `plan_options` all of them."""
    from trainctl.job.slurm_actions import submit_successor   # as in collect_evidence

    job_id = env["SLURM_JOB_ID"]
    attempt = attempt_from_environment(env, job_id, retries, plan_excludes(plan_options))
    evidence = replace(collect_evidence(phase, status, nodes, gate_dir, env), condemned=condemned)
    decision = decide_retry(attempt, evidence)
    successor = error = None
    if decision.retry:
        argv = successor_argv(attempt, decision, sbatch_options, *node_count)
        try:
            with open(script_path) as handle:
                script_text = handle.read()
            successor = submit_successor(script_text, argv, successor_environment(env, attempt, decision),
                                         env.get("SLURM_SUBMIT_DIR") or os.getcwd())
        except (OSError, TrainctlError) as exc:
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    rec = record(attempt, evidence, decision, successor, error)
    paths = JobPaths(Path(os.path.abspath(gate_dir)))
    jobdir.write_json(paths.retry, rec.to_json())
    if successor:
        following = paths.sibling(successor)
        os.makedirs(following.root, exist_ok=True)
        jobdir.write_json(following.attempt, AttemptRecord(successor, decision.next_attempt, retries, job_id,
                                                           tuple(decision.exclude)).to_json())
    # report.txt is for a human: a FIFO or a directory in its place is left as it is, never waited on
    jobdir.write_report(paths, f"\nretry: {summary_line(rec)}\n", append=True)
    return rec

