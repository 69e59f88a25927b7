"""Drain the nodes a sweep found failing, and resume only what trainctl itself drained.

The rule that keeps trainctl off other admins' toes: it never touches a node that has a
reason it did not set. It drains only nodes with no reason at all, records the exact reason
it set (and Slurm's timestamp for it) and resumes a node only while Slurm still shows that
same reason with that same timestamp, and only after the node passes a fresh check. A drain
whose reason someone changed is let go (closed in the history), never resumed.

Planning is pure (`plan_drains`, `plan_resumes`); `apply_*` do the Slurm calls, each
preceded by a fresh look at the node, so a reason set a moment ago is still respected.
Every drain, the gate's and the watch's too, is made by `drain_within`, inside the breaker
(`trainctl.sweep.breaker`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trainctl.errors import PrivilegeError, TrainctlError
from trainctl.slurm import (DRAIN_TAG, NodeState, drain_unclaimed, node_states, not_drainable, not_ours_any_more,
                            partition_nodes, resume_nodes, tagged_reason)
from trainctl.sweep.breaker import Breaker, claim, shadow
from trainctl.sweep.db import REFUSED_CLOSE, History
from trainctl.sweep.fleet import Lemon, LemonRule
from trainctl.sweep.model import CHECKED, DrainRow, NodeOutcome, NodeRow, ResultRow, SweepRow

DRAIN = "drain"
RESUME = "resume"
SKIP = "skip"
RELEASE = "release"      # trainctl lets go of its record: the drain is no longer its own
RECHECK = "recheck"      # a candidate for resume, pending a fresh check


@dataclass(frozen=True)
class Action:
    host: str
    action: str
    text: str             # the reason to set (drain), or why (skip, release, resume)
    check: str = ""
    drain_id: int | None = None


def drain_reason(failing: list[ResultRow]) -> tuple[str, str]:
    """(first failing check, `trainctl: <check>: <reason> [+other checks]`) within Slurm's limit."""
    return tagged_reason([(r.check, r.reason) for r in failing])


def plan_drains(nodes: list[NodeRow], results: list[ResultRow], states: dict[str, NodeState],
                open_drains: Iterable[DrainRow]) -> list[Action]:
    """What `drain` does with each node that failed in the sweep (or has no verdict from it)."""
    held = {d.host: d for d in open_drains}
    failing: dict[str, list[ResultRow]] = {}
    for row in results:
        if row.status == "fail":
            failing.setdefault(row.host, []).append(row)
    actions = []
    for node in nodes:
        if node.outcome != CHECKED:
            if node.outcome in ("timeout", "error"):
                actions.append(Action(node.host, SKIP, f"{node.outcome}, no verdict: a node that did not "
                                                       f"answer is not drained ({node.detail})"))
            continue
        if node.host not in failing:
            if node.status == "unknown":
                actions.append(Action(node.host, SKIP, "checks could not decide (unknown): not drained"))
            continue
        check, reason = drain_reason(failing[node.host])
        actions.append(_drain_or_skip(node.host, reason, check, states.get(node.host), held))
    return actions


def _drain_or_skip(host: str, reason: str, check: str, state: NodeState | None, held: dict[str, DrainRow]) -> Action:
    """DRAIN only a node Slurm knows, with no reason from anyone, that trainctl does not hold already."""
    if host in held:
        return Action(host, SKIP, f"already drained by trainctl: {held[host].reason}", check)
    if state is None:
        return Action(host, SKIP, "not known to Slurm", check)
    if state.reason.startswith(DRAIN_TAG):
        why = f"drained by trainctl outside this history (the Slurm hook, or another history): {state.reason!r}"
        return Action(host, SKIP, f"{why}; left alone", check)
    if state.reason:
        who = state.reason_user or "someone"
        return Action(host, SKIP, f"has a reason trainctl did not set ({who}: {state.reason!r}); left alone", check)
    return Action(host, DRAIN, reason, check)


LEMON_CHECK = "fleet.lemon"     # the check a lemon's drain names; its drain row has sweep 0 (no sweep)
LEMON_SWEEP = 0


def lemon_reason(lemon: Lemon, rule: LemonRule) -> str:
    """`trainctl: fleet.lemon: 3 nvlink strikes in 7 days: job 101, job 102, sweep #5`, within Slurm's limit."""
    sources = ", ".join(dict.fromkeys(strike.source for strike in lemon.evidence))
    families = " and ".join(f"{family.strikes:g} {family.family}" for family in lemon.families)
    return tagged_reason([(LEMON_CHECK, f"{families} strikes in {rule.days:g} days: {sources}")])[1]


def plan_lemon_drains(lemons: Iterable[Lemon], rule: LemonRule, states: dict[str, NodeState],
                      open_drains: Iterable[DrainRow]) -> list[Action]:
    """What `drain --lemons` does with each lemon: the same rule as a sweep's failures."""
    held = {d.host: d for d in open_drains}
    return [_drain_or_skip(lemon.host, lemon_reason(lemon, rule), LEMON_CHECK, states.get(lemon.host), held)
            for lemon in lemons]


def keep_lemons_drained(candidates: list[Action], lemons: set[str], rule: LemonRule) -> tuple[list[Action], list[Action]]:
    """(candidates to re-check, those kept drained): a lemon's drain stays while the node is still a
    lemon by the rule, however well it passes a check (a lemon often does); it lifts once its strikes age out."""
    recheck, kept = [], []
    for candidate in candidates:
        if candidate.check == LEMON_CHECK and candidate.host in lemons:
            kept.append(Action(candidate.host, SKIP, f"kept drained: still a lemon ({rule.describe()})",
                               candidate.check, candidate.drain_id))
        else:
            recheck.append(candidate)
    return recheck, kept


def plan_resumes(open_drains: Iterable[DrainRow], states: dict[str, NodeState]) -> list[Action]:
    """Which of trainctl's drains are still its own (RECHECK) and which it must let go (RELEASE)."""
    actions = []
    for drain in open_drains:
        why = not_ours_any_more(states.get(drain.host), drain.reason, drain.reason_time)
        if why:
            actions.append(Action(drain.host, RELEASE, why, drain.check, drain.id))
        else:
            actions.append(Action(drain.host, RECHECK, "drained by trainctl; re-checking", drain.check, drain.id))
    return actions


def decide_resumes(candidates: list[Action], rechecked: dict[str, NodeOutcome]) -> list[Action]:
    """Resume a candidate only if its fresh check passed (ok or warn); keep the rest drained."""
    decided = []
    for candidate in candidates:
        outcome = rechecked.get(candidate.host)
        if outcome is None:
            why = "was not re-checked"
        elif outcome.outcome != CHECKED:
            why = f"re-check gave no verdict ({outcome.outcome}: {outcome.detail})"
        elif outcome.status in ("ok", "warn"):
            decided.append(Action(candidate.host, RESUME, f"passes now ({outcome.status})", candidate.check,
                                  candidate.drain_id))
            continue
        else:
            bad = "; ".join(f"{c.name}: {c.reason}" for c in outcome.checks if c.status not in ("ok", "warn"))
            why = f"still {outcome.status}: {bad}"
        decided.append(Action(candidate.host, SKIP, f"kept drained: {why}", candidate.check, candidate.drain_id))
    return decided


# ---------------------------------------------------------------- applying (Slurm + history)

def latest_sweep(sweeps: list[SweepRow]) -> SweepRow | None:
    """The newest finished full sweep (re-checks of drained nodes are not sweeps to drain from)."""
    finished = [s for s in sweeps if s.kind == "sweep" and s.complete and not s.error]
    return finished[-1] if finished else None


@dataclass(frozen=True)
class Drained:
    host: str
    outcome: str          # "drained", "shadow" (recorded only), or "not drained: why"
    reason: str           # as Slurm shows it after draining (else as planned)
    reason_time: str = ""


HELD_BACK = "not drained: held back by the breaker"


def drain_within(history: History, breaker: Breaker, *, rule: str, site: str, target: str, sweep_id: int,
                 planned: list[tuple[str, str, str]], clock: Callable[[], float] = time.time
                 ) -> tuple[list[Drained], str]:
    """Every automatic drain goes through here: (host, reason, check) in order, within the breaker
    (`trainctl.sweep.breaker`), each drain recorded against `sweep_id`. Returns what became of each
    and the breaker's one line ("" when it held nothing back)."""
    if not planned:
        return [], ""
    if rule in breaker.shadow:
        line = shadow(history, rule=rule, sweep_id=sweep_id, planned=planned, now=clock())
        return [Drained(host, "shadow", reason) for host, reason, _ in planned], line
    states = node_states()
    # Slurm's record too: a drain the Slurm hook or another history made holds a node as well.
    slurm_held = {name for name, state in states.items() if state.drained and state.reason.startswith(DRAIN_TAG)}
    # A node someone else holds is never drained, so it costs the breaker nothing.
    left_alone = {host: why for host, _, _ in planned if (why := not_drainable(states.get(host)))}
    ids, line = claim(history, breaker, rule=rule, site=site, target=target, sweep_id=sweep_id,
                      planned=[p for p in planned if p[0] not in left_alone], slurm_held=slurm_held,
                      partitions=partition_nodes(), now=clock())
    done = []
    for host, reason, _ in planned:
        if host in left_alone:
            done.append(Drained(host, f"not drained: {left_alone[host]}", reason))
            continue
        if host not in ids:
            done.append(Drained(host, HELD_BACK, reason))
            continue
        try:
            after, why = drain_unclaimed(host, reason)
        except PrivilegeError:
            after, why = None, "no operator rights"
        except TrainctlError as exc:
            after, why = None, str(exc)
        if after is None:   # the claim is let go, and counts no more
            history.close_drain(ids[host], clock(), f"{REFUSED_CLOSE}{why}")
            done.append(Drained(host, f"not drained: {why}", reason))
        else:
            history.settle_drain(ids[host], after.reason or reason, after.reason_time)
            done.append(Drained(host, "drained", after.reason or reason, after.reason_time))
    return done, line


def apply_drains(history: History, sweep_id: int, actions: list[Action], breaker: Breaker, *, rule: str, site: str,
                 target: str, clock: Callable[[], float] = time.time) -> tuple[list[Action], str]:
    """Drain each DRAIN action's node within the breaker unless a reason appeared meanwhile; each
    drain is recorded. Returns the actions as done and the breaker's line ("" when it held nothing back)."""
    planned = [(a.host, a.text, a.check) for a in actions if a.action == DRAIN]
    drained, line = drain_within(history, breaker, rule=rule, site=site, target=target, sweep_id=sweep_id,
                                 planned=planned, clock=clock)
    outcomes = {d.host: d for d in drained}
    done = []
    for action in actions:
        outcome = outcomes.get(action.host) if action.action == DRAIN else None
        if outcome is None or outcome.outcome == "drained":
            done.append(action)
        elif outcome.outcome == "shadow":
            done.append(Action(action.host, SKIP, f"shadow mode, would drain: {action.text}", action.check))
        else:
            done.append(Action(action.host, SKIP, outcome.outcome, action.check))
    return done, line


def apply_resumes(history: History, actions: list[Action], clock: Callable[[], float] = time.time) -> list[Action]:
    """Resume RESUME actions whose drain is still exactly trainctl's; close released drains."""
    done = []
    drains = {d.id: d for d in history.drains(open_only=True)}
    for action in actions:
        drain = drains.get(action.drain_id)
        if action.action == RELEASE and drain:
            history.close_drain(drain.id, clock(), f"released: {action.text}")
        elif action.action == RESUME and drain:
            # Look once more right before resuming: an admin may have taken the node over.
            still_ours = plan_resumes([drain], node_states(nodes=[drain.host]))[0]
            if still_ours.action != RECHECK:
                history.close_drain(drain.id, clock(), f"released: {still_ours.text}")
                done.append(still_ours)
                continue
            resume_nodes([drain.host])
            history.close_drain(drain.id, clock(), "resumed")
        done.append(action)
    return done
