"""The node checks as Slurm's own hook: HealthCheckProgram, Prolog (PrologFlags=Alloc) or Epilog.

slurmd runs the hook as root with a bare environment (SLURMD_NODENAME, plus the job's
variables and SLURM_SCRIPT_CONTEXT in a prolog or epilog; no PATH), so the hook is quick
node checks only (never the fabric test) inside a time budget, and it acts on the node itself:

- a failing node is drained with trainctl's tagged reason (`trainctl.slurm.tagged_reason`),
  only if nobody has set a reason (`trainctl.slurm.drain_unclaimed`, as `trainctl drain`);
- the reason it set and Slurm's timestamp for it are kept in a small state file per node,
  so a later run that finds the node passing resumes that drain, and only while Slurm still
  shows exactly that reason with that timestamp (`not_ours_any_more`, as `trainctl resume`);
- an admin's drain, or any reason trainctl did not set, is never touched.

What Slurm does with the exit code differs per role (slurm.conf(5), "PROLOG AND EPILOG
SCRIPTS" and HealthCheckProgram, https://slurm.schedmd.com/slurm.conf.html):
- Prolog: non-zero drains the node and requeues the job (held, unless SchedulerParameters has
  nohold_on_prolog_fail). The hook drains first with its own reason, which Slurm keeps (the node
  is already drained; seen on Slurm 22.05), then exits 1 so the job does not start on a bad node.
- Epilog: non-zero drains the node with "Epilog error". The job is over, so the hook exits 0
  once it has drained with its own reason, and 1 only when it could not, so Slurm drains instead.
- HealthCheckProgram: the action must be taken by the program itself. Slurm releases that
  made slurmd wait at start-up until the program exits 0 (SchedMD commit b31fa177, which Debian
  reverted for a while), so the hook exits 0 whenever it did its job and 1 only when it could not.

The time budget (`--budget`, default 8 s) covers the whole run: probes get half of it (they
run at once), Slurm calls the rest. slurmd kills a HealthCheckProgram after 60 s and expects a
Prolog to finish "in less time than MessageTimeout" (default 10 s), advice rather than a limit
(slurmd answers the launch request before it runs the prolog); PrologEpilogTimeout (default:
wait forever) is what kills a wedged prolog, drains the node and requeues the job, so set it
well above the budget (contrib/trainctl-slurm-hook.conf uses 30 s).

Planning is pure (`plan_action`, `exit_code`); `run_hook` does the I/O.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from trainctl.errors import TrainctlError
from trainctl.files import write_atomically
from trainctl.validate import check_node_name
from trainctl.slurm import (NodeState, drain_unclaimed, node_states, not_ours_any_more, resume_nodes,
                            tagged_reason)

HEALTH_CHECK, PROLOG, EPILOG = "health-check", "prolog", "epilog"

DRAIN, RESUME, KEEP, RELEASE, SKIP, NONE = "drain", "resume", "keep", "release", "skip", "none"


def role_from_env(environ: Mapping[str, str]) -> str:
    """slurmd sets SLURM_SCRIPT_CONTEXT for a prolog or epilog; a health check gets none."""
    context = environ.get("SLURM_SCRIPT_CONTEXT", "")
    return {"prolog_slurmd": PROLOG, "epilog_slurmd": EPILOG}.get(context, HEALTH_CHECK)


@dataclass(frozen=True)
class OwnDrain:
    """A drain this hook set on this node: exactly the reason, and Slurm's timestamp for it."""

    reason: str
    reason_time: str
    drained_at: float
    role: str
    job_id: str = ""


@dataclass(frozen=True)
class Plan:
    action: str        # DRAIN, RESUME, KEEP, RELEASE, SKIP or NONE
    text: str          # the reason to set (DRAIN), or why
    failing: bool      # the node failed a check this run


def plan_action(failures: list[tuple[str, str]], undecided: bool, state: NodeState | None,
                own: OwnDrain | None) -> Plan:
    """What to do with the node, given this run's failing checks and the drain it may hold.

    `undecided`: no check failed but some could not decide: a drain is neither set nor lifted.
    """
    why_not_ours = not_ours_any_more(state, own.reason, own.reason_time) if own else "no drain of its own"
    if failures:
        _, reason = tagged_reason(failures)
        if own and not why_not_ours:
            return Plan(KEEP, f"still failing; drained by trainctl: {own.reason}", True)
        if state is None:
            return Plan(SKIP, "not known to Slurm: not drained", True)
        if state.reason:
            return Plan(SKIP, f"has a reason trainctl did not set ({state.reason_user or 'someone'}: "
                              f"{state.reason!r})", True)
        return Plan(DRAIN, reason, True)
    if undecided:
        return Plan(NONE, "checks could not decide (unknown): drains neither set nor lifted", False)
    if own and not why_not_ours:
        return Plan(RESUME, "passes now", False)
    if own:
        return Plan(RELEASE, why_not_ours, False)
    return Plan(NONE, "passes", False)


def exit_code(role: str, plan: Plan, acted: bool) -> int:
    """The exit status Slurm should see (module docstring). `acted`: a needed drain was set."""
    if role == PROLOG:
        return 1 if plan.failing else 0
    if plan.action == DRAIN and not acted:
        return 1
    return 0


# ---------------------------------------------------------------- I/O

@dataclass(frozen=True)
class HookResult:
    node: str
    role: str
    status: str                 # the node's worst check status
    plan: Plan
    acted: bool
    exit_code: int
    detail: str                 # the failing checks, or what went wrong
    duration_s: float

    def line(self) -> str:
        done = {DRAIN: "drained" if self.acted else "NOT drained", RESUME: "resumed", KEEP: "kept drained",
                RELEASE: "let go of its drain", SKIP: "left alone", NONE: "no change"}[self.plan.action]
        detail = f" ({self.detail})" if self.detail else ""
        return (f"trainctl slurm-hook {self.role} {self.node}: {self.status}{detail}; {done}: "
                f"{self.plan.text} [{self.duration_s:.1f} s, exit {self.exit_code}]")

    def to_json(self) -> dict:
        return {**asdict(self), "plan": asdict(self.plan)}


class StateFile:
    """`<dir>/<node>.json`, the hook's own drain on that node, under an flock (`<node>.lock`)."""

    def __init__(self, directory: str | Path, node: str):
        self.dir = Path(directory)
        check_node_name(node, "the node name")
        self.path = self.dir / f"{node}.json"
        self._lock_path = self.dir / f"{node}.lock"
        self._fd: int | None = None

    def lock(self, deadline: float) -> bool:
        """Take the lock before `deadline` (a health check and a prolog may overlap); False if not."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.unlock()
                    return False
                time.sleep(0.05)

    def unlock(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> OwnDrain | None:
        try:
            return OwnDrain(**json.loads(self.path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise TrainctlError(f"{self.path}: unreadable slurm-hook state: {exc}",
                                hint="remove it after checking the node's drain by hand") from exc

    def write(self, own: OwnDrain) -> None:
        write_atomically(self.path, json.dumps(asdict(own)) + "\n")  # a TrainctlError on failure

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def node_name(environ: Mapping[str, str]) -> str:
    """SLURMD_NODENAME, else the short host name; either names the state file (a UsageError if it
    cannot be a node name)."""
    if environ.get("SLURMD_NODENAME"):
        return check_node_name(environ["SLURMD_NODENAME"], "SLURMD_NODENAME")
    return check_node_name(socket.gethostname().split(".")[0], "the host name")


def run_hook(*, role: str, policy, budget_s: float, state_dir: str, drain_unknown: bool,
             environ: Mapping[str, str] = os.environ, clock: Callable[[], float] = time.time) -> HookResult:
    """Check this node inside `budget_s`, then drain, keep, resume or leave its Slurm state."""
    from trainctl.health.node import check_node
    from trainctl.health.status import Status

    start = time.monotonic()
    deadline = start + budget_s
    node = node_name(environ)
    # Probes get half the budget (they run at once, so that bounds the collection); the rest
    # is for up to three Slurm calls (look, drain or resume, read back). DCGM's diagnostic
    # (a minute or more) never fits: the hook runs the quick checks only, the gate and sweeps run it.
    policy = replace(policy, probe_timeout_s=min(policy.probe_timeout_s, budget_s / 2),
                     expectations=replace(policy.expectations, dcgm_diag_level=None))
    with tempfile.TemporaryDirectory(prefix="trainctl-hook-") as tmp:
        report = check_node(tmp, policy, collect=True)
    bad = {Status.FAIL, Status.UNKNOWN} if drain_unknown else {Status.FAIL}
    failures = [(c.name, c.reason) for c in report.checks if c.status in bad]
    undecided = any(c.status == Status.UNKNOWN for c in report.checks) and not failures
    detail = "; ".join(f"{c.name}: {c.reason}" for c in sorted(report.checks, key=lambda c: c.name)
                       if c.status >= Status.FAIL)

    def result(plan: Plan, acted: bool, extra: str = "") -> HookResult:
        text = "; ".join(part for part in (detail, extra) if part)
        return HookResult(node, role, report.status.label, plan, acted, exit_code(role, plan, acted), text,
                          time.monotonic() - start)

    def slurm_timeout() -> float:
        return max(1.0, (deadline - time.monotonic()) / 3)

    state_file = StateFile(state_dir, node)
    if not state_file.lock(deadline - 2 * slurm_timeout()):
        # Another run of the hook on this node is acting now; it will have the same view.
        return result(Plan(SKIP, "another slurm-hook run holds the node's lock", bool(failures)), False)
    try:
        own = state_file.read()
        if not failures and (own is None or undecided):  # nothing to set or lift: leave Slurm alone
            return result(plan_action(failures, undecided, None, own), False)
        try:
            state = node_states(nodes=[node], timeout=slurm_timeout()).get(node)
        except TrainctlError as exc:
            plan = Plan(DRAIN if failures else NONE, "cannot read the node's Slurm state", bool(failures))
            return result(plan, False, str(exc))
        plan = plan_action(failures, undecided, state, own)
        return result(*_apply(plan, node, role, own, state_file, environ, clock, slurm_timeout))
    finally:
        state_file.unlock()


def _apply(plan: Plan, node: str, role: str, own: OwnDrain | None, state_file: StateFile,
           environ: Mapping[str, str], clock: Callable[[], float],
           slurm_timeout: Callable[[], float]) -> tuple[Plan, bool, str]:
    """Carry out `plan`: (what was done, whether the node now holds the hook's drain, what went wrong)."""
    try:
        if plan.action == DRAIN:
            after, why = drain_unclaimed(node, plan.text, timeout=slurm_timeout())
            if after is None:  # a reason appeared since the plan: someone else's now
                return replace(plan, action=SKIP, text=why), False, ""
            state_file.write(OwnDrain(after.reason or plan.text, after.reason_time, clock(), role,
                                      environ.get("SLURM_JOB_ID", "")))
            return plan, True, ""
        if plan.action == RESUME:
            # Look once more right before resuming: an admin may have taken the node over.
            why = not_ours_any_more(node_states(nodes=[node], timeout=slurm_timeout()).get(node),
                                    own.reason, own.reason_time)
            if not why:
                resume_nodes([node], timeout=slurm_timeout())
            state_file.remove()
            return (replace(plan, action=RELEASE, text=why) if why else plan), False, ""
        if plan.action == RELEASE:
            state_file.remove()
        return plan, plan.action == KEEP, ""
    except TrainctlError as exc:
        return plan, False, str(exc)
