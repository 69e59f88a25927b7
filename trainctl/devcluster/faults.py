"""Real faults on a dev cluster node, for tests: kill it, kill its tasks, hang it, slow it.

Every fault acts on real processes by PID, and only on processes inside the node's own
network namespace (`ip netns pids`), so nothing outside the dev cluster is touched:

- `kill_node`: SIGKILL everything of the node (slurmd, slurmstepd, tasks), as a node that
  loses power; `restore_node` restarts its slurmd and resumes it in Slurm, so a session-scoped
  cluster is whole again for the next test;
- `kill_step_tasks`: SIGKILL only the node's tasks of one job step (slurmd stays up), as a
  task that crashes or is OOM-killed;
- `stopped`: SIGSTOP the whole node, SIGCONT on exit (a hung node: alive, silent);
- `cpu_quota`: a cgroup v1 CFS quota on every process of the node (fail-slow compute), undone
  on exit; the kernel's CFS bandwidth control enforces it (Documentation/scheduler/sched-bwc.rst).
  With `shares` above the default 1024, the node's processes also outweigh the host's other
  processes when they compete for a core (cpu.shares: Documentation/scheduler/sched-design-CFS.rst,
  "Group scheduler extensions to CFS"), so the quota, not the neighbours' load, bounds what they get;
  `set_cpu_quota` changes it while it holds (a node that slows mid-run);

Only DevCluster's public attributes are used (spec, base, slurm_conf, exec_argv, client_env,
daemon_pids), so this module does not depend on how the harness is laid out inside.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainctl.errors import ExternalCommandError
from trainctl.proc import run, run_checked

CMD_TIMEOUT_S = 15.0
CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1 cpu controller on these machines
CFS_PERIOD_US = 100_000
DEFAULT_CPU_SHARES = 1024
RESTORE_TIMEOUT_S = 30.0
FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")  # cgroup v1 freezer, beside the cpu controller
FREEZE_PASSES = 5  # a node's processes listed and frozen until no new one appears


def node_pids(cluster, node: str) -> list[int]:
    """Live processes inside `node`'s network namespace (zombies left out)."""
    result = run_checked(["ip", "netns", "pids", cluster.spec.netns(node)], timeout=CMD_TIMEOUT_S)
    return [pid for pid in (int(p) for p in result.stdout.split() if p.isdigit()) if _alive(pid)]


def step_task_pids(cluster, node: str, job_id: str, step_id: str) -> list[int]:
    """`node`'s processes of job step JOB.STEP: the tasks and their children, not slurmstepd."""
    wanted = {b"SLURM_JOB_ID=" + job_id.encode(), b"SLURM_STEP_ID=" + step_id.encode()}
    return [pid for pid in node_pids(cluster, node) if wanted <= _environ(pid)]


def kill_node(cluster, node: str) -> list[int]:
    """SIGKILL every process of `node` (its slurmd, slurmstepds, tasks) at once, as a node that
    dies loses them all; returns their PIDs.

    Killed one after another, a process outlives its parent by a moment and can act on that
    death as no process of a dead node can: srun's shepherd, a child that cancels srun's step
    when srun dies without telling it (Slurm src/srun/libsrun/srun_job.c, `_shepherd_spawn`),
    cancelled the job's sentinel step on another node. SIGSTOP first is no better: a stopped
    process group orphaned by a parent's death gets SIGHUP and SIGCONT from the kernel
    (POSIX _exit(), "orphaned process group"), and srun answers SIGHUP by cancelling its step.
    So the processes go into a cgroup v1 freezer (frozen tasks run no code, whatever signal
    comes; kernel Documentation/admin-guide/cgroup-v1/freezer-subsys.rst), get SIGKILL while
    frozen, and are thawed only to die.
    """
    group = FREEZER_ROOT / f"trainctl-{cluster.spec.prefix}-{node}-dying"
    group.mkdir(exist_ok=True)
    frozen: set[int] = set()
    killed: list[int] = []
    try:
        for _ in range(FREEZE_PASSES):  # again for any process forked while the others froze
            new = [pid for pid in node_pids(cluster, node) if pid not in frozen]
            if not new:
                break
            _move(new, group)
            frozen.update(new)
            _freeze(group)
        killed = _signal(sorted(frozen), signal.SIGKILL)
        return killed
    finally:
        (group / "freezer.state").write_text("THAWED")
        if killed:  # a freeze that failed leaves its live processes in the (thawed) group
            _remove_when_empty(group)


def _freeze(group: Path) -> None:
    """Freeze `group` and wait until the kernel says every task in it is frozen."""
    (group / "freezer.state").write_text("FROZEN")
    deadline = time.monotonic() + CMD_TIMEOUT_S
    while (group / "freezer.state").read_text().strip() != "FROZEN":
        if time.monotonic() > deadline:
            raise ExternalCommandError(f"dev cluster: {group} not frozen after {CMD_TIMEOUT_S:g} s")
        time.sleep(0.01)


def _remove_when_empty(group: Path) -> None:
    """rmdir the cgroup once its killed tasks are gone (a cgroup with tasks cannot be removed)."""
    deadline = time.monotonic() + CMD_TIMEOUT_S
    while True:
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise ExternalCommandError(f"dev cluster: {group} still has tasks {CMD_TIMEOUT_S:g} s "
                                           "after they were killed") from None
            time.sleep(0.05)


def kill_step_tasks(cluster, node: str, job_id: str, step_id: str) -> list[int]:
    """SIGKILL only `node`'s tasks of step JOB.STEP; slurmd and slurmstepd live on."""
    return _signal(step_task_pids(cluster, node, job_id, step_id), signal.SIGKILL)


def stop_node(cluster, node: str) -> list[int]:
    """SIGSTOP every process of `node`: a hung node, alive but silent."""
    return _signal(node_pids(cluster, node), signal.SIGSTOP)


def cont_node(cluster, node: str) -> list[int]:
    """SIGCONT every process of `node` (harmless for those that were not stopped)."""
    return _signal(node_pids(cluster, node), signal.SIGCONT)


@contextmanager
def stopped(cluster, node: str) -> Iterator[list[int]]:
    """`node` hung (SIGSTOP) inside the block, running again (SIGCONT) after it."""
    try:
        yield stop_node(cluster, node)
    finally:
        cont_node(cluster, node)


@contextmanager
def cpu_quota(cluster, node: str, fraction: float, shares: int = DEFAULT_CPU_SHARES) -> Iterator[Path]:
    """Every process of `node` (and what they start) gets `fraction` of one CPU until exit, and
    the weight `shares` (1024: a plain process's) against the host's other processes."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not 2 <= shares <= 262144:
        raise ValueError(f"shares must be in [2, 262144] (cgroup v1 cpu.shares), got {shares}")
    group = CPU_CGROUP_ROOT / f"trainctl-{cluster.spec.prefix}-{node}"
    group.mkdir(exist_ok=True)
    (group / "cpu.shares").write_text(str(shares))
    (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(int(CFS_PERIOD_US * fraction)))
    _move(node_pids(cluster, node), group)  # children inherit the group
    try:
        yield group
    finally:
        _move([int(p) for p in (group / "cgroup.procs").read_text().split()], CPU_CGROUP_ROOT)
        group.rmdir()


def set_cpu_quota(cluster, node: str, fraction: float) -> None:
    """Change the quota of `node`'s group, which `cpu_quota` made and still holds, to `fraction` of one CPU."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    group = CPU_CGROUP_ROOT / f"trainctl-{cluster.spec.prefix}-{node}"
    (group / "cpu.cfs_quota_us").write_text(str(int(CFS_PERIOD_US * fraction)))


def restore_node(cluster, node: str, timeout_s: float = RESTORE_TIMEOUT_S) -> None:
    """Bring a killed node back: SIGCONT it, restart its slurmd, resume it, wait until idle.

    Waits for `idle` because a job that still holds the node (a --no-kill job, say) keeps it
    allocated; the caller restores after that job has ended.
    """
    cont_node(cluster, node)
    if cluster.daemon_pids().get(f"slurmd-{node}") is None:
        run_checked(cluster.slurmd_argv(node), timeout=CMD_TIMEOUT_S)
    deadline = time.monotonic() + timeout_s
    while True:
        state = _slurm_state(cluster, node)
        if state == "idle":
            return
        if state.startswith(("down", "drain", "fail")):
            # a node Slurm marked down (it stopped answering) stays down until resumed
            _scontrol_update(cluster, node, "state=resume")
        elif state.startswith(("mixed", "alloc")) and not _jobs_on(cluster, node):
            # Slurm 22.05 keeps a node that a --no-kill job lost "mixed" for minutes after
            # that job ended; down + resume clears it at once
            _scontrol_update(cluster, node, "state=down", "reason=trainctl dev cluster: restore")
            _scontrol_update(cluster, node, "state=resume")
        if time.monotonic() > deadline:
            raise ExternalCommandError(f"dev cluster: {node} not idle {timeout_s:g} s after restore "
                                       f"(state {state or 'unknown'})")
        time.sleep(0.2)


# Slurm 25.05 appends the step: "Kill task failed (JobId=J StepId=S)" (CHANGELOG/slurm-25.05.md,
# 25.05.0rc1: 'Add "(JobId=%u StepId=%u) suffix to node drain reason when setting it to
# 'Kill task failed'"); earlier releases set the bare text.
UNKILLABLE_STEP_REASON = "Kill task failed"


def resume_unkillable_drains(cluster) -> list[str]:
    """Resume the nodes Slurm drained because a step's processes outlived its kill
    (UnkillableStepTimeout, reason "Kill task failed"); return their names.

    A fault test that kills one node can leave another node's gate step slow to die; Slurm's
    answer is that drain, which would fail every later test for want of nodes.
    """
    listing = run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], timeout=CMD_TIMEOUT_S, env=cluster.client_env())
    drained = set()
    for line in listing.stdout.splitlines():
        node, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        # only drained ones: Slurm 23.11-25.11 without slurmdbd leave the reason on a resumed node
        # (trainctl.slurm.IN_SERVICE_STATES)
        if state.startswith("drain") and is_unkillable_step_reason(reason.strip()):
            drained.add(node)
    for node in sorted(drained):
        _scontrol_update(cluster, node, "state=resume")
    return sorted(drained)


def is_unkillable_step_reason(reason: str) -> bool:
    """Slurm's own drain for a step that outlived its kill, in any release's wording."""
    return reason == UNKILLABLE_STEP_REASON or (
        reason.startswith(f"{UNKILLABLE_STEP_REASON} (JobId=") and reason.endswith(")"))


def new_unkillable_step_records(cluster) -> list[str]:
    """What the dev cluster's UnkillableStepProgram recorded since the last call: the step's
    SLURM_* variables and every process's state and kernel wait channel when Slurm gave up
    killing it (why a step outlived its kill). Each record is returned once."""
    texts = []
    for path in sorted((Path(cluster.spec.base_dir) / "log").glob("unkillable-*.txt")):
        texts.append(f"{path}:\n{path.read_text(errors='replace')}")
        path.rename(path.with_suffix(".reported"))
    return texts


def _scontrol_update(cluster, node: str, *settings: str) -> None:
    run(["scontrol", "update", f"nodename={node}", *settings], timeout=CMD_TIMEOUT_S, env=cluster.client_env())


def _jobs_on(cluster, node: str) -> list[str]:
    result = run(["squeue", "-h", "-w", node, "-o", "%i"], timeout=CMD_TIMEOUT_S, env=cluster.client_env())
    return result.stdout.split() if result.ok else ["(squeue failed)"]


def _slurm_state(cluster, node: str) -> str:
    result = run(["sinfo", "-h", "-n", node, "-o", "%T"], timeout=CMD_TIMEOUT_S, env=cluster.client_env())
    return result.stdout.strip() if result.ok else ""


def _signal(pids: list[int], sig: int) -> list[int]:
    done = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            done.append(pid)
        except ProcessLookupError:
            pass
    return done


def _move(pids: list[int], group: Path) -> None:
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except (ProcessLookupError, FileNotFoundError):
            pass  # exited meanwhile
        except OSError as exc:
            if exc.errno != 3:  # ESRCH: exited meanwhile
                raise


def _environ(pid: int) -> set[bytes]:
    try:
        return set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    """Zombies count as dead (PID 1 here may reap late)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status
