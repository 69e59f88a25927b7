"""What the gate found reaches Slurm: `[gate] drain_on` drains the nodes the gate left out.

A site may ask (default: off) that nodes the gate excluded for a failure are drained, so the
next job does not land on them. Which exclusions count is the site's `drain_on`:
"fail" (a node check failed), "unknown" (a check could not decide, or the node left no
report), "fabric" (the fabric test excluded it: slow against its peers, did not join).

The drain is the one `trainctl drain` makes (`trainctl.sweep.drain.drain_within`): within the
site's breaker (`[breaker]`: so many drains an hour, so much of a partition), the tagged reason,
cut to 255 bytes, naming the check and the job, set only on a node with no reason from anyone,
looked at right before. Where the job's user lacks Slurm operator rights the report says
"not drained: no operator rights" and the job goes on. The breaker counts drains in the site's
sweep history, so a job that cannot write it drains nothing (the report says why); a drain is
recorded there as a sweep of kind "gate", so `trainctl resume` treats it like its own.

Planning is pure (`plan_gate_drains`; `plan_watch_drains` for the nodes the in-training watch
condemned); `drain_planned` makes the drains; `trainctl gate decide` and the job's supervisor call it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Mapping

from trainctl.detections import RULES, DetectionKind
from trainctl.errors import PrivilegeError, TrainctlError, UsageError
from trainctl.health.fabric.report import FabricReport
from trainctl.job.decision import Decision
from trainctl.validate import check_job_id

NO_RIGHTS = "not drained: no operator rights"


@dataclass(frozen=True)
class GateDrain:
    host: str
    check: str                  # the first failing check, as in `trainctl drain`
    reason: str                 # the reason to set (`trainctl: <check>: <reason> [+others] (job N)`)
    outcome: str = "planned"    # "drained", "shadow" (recorded only), or why not ("not drained: ...")
    reason_time: str = ""       # Slurm's timestamp for the reason, read back after draining
    recorded: str = ""          # where the drain was recorded, or why it was not

    def line(self) -> str:
        done = (self.reason if self.outcome == "drained" else f"shadow mode, would set {self.reason}"
                if self.outcome == "shadow" else self.outcome)
        note = f" ({self.recorded})" if self.recorded else ""
        return f"drain {self.host}: {done}{note}"

    def to_json(self) -> dict:
        return asdict(self)


def plan_gate_drains(decision: Decision, node_reports: Mapping[str, dict], fabric: FabricReport | None,
                     drain_on: tuple[str, ...], job_id: str) -> list[GateDrain]:
    """The excluded nodes whose exclusion the site drains for, each with its tagged reason."""
    from trainctl.slurm import tagged_reason

    fabric_excluded = {item.host: item.reason for item in fabric.excluded} if fabric else {}
    drains = []
    for exclusion in decision.excluded:
        report = node_reports.get(exclusion.host)
        failures = []
        if report is None and "unknown" in drain_on:
            failures.append(("gate", "no health report"))
        for check in (report or {}).get("checks", []):
            if check["status"] in drain_on and check["status"] in ("fail", "unknown"):
                failures.append((check["name"], check["reason"]))
        if "fabric" in drain_on and exclusion.host in fabric_excluded:
            failures.append(("fabric", fabric_excluded[exclusion.host]))
        if failures:
            check, reason = tagged_reason(failures, context=f"gate of job {job_id}")
            drains.append(GateDrain(exclusion.host, check, reason))
    return drains


def plan_watch_drains(condemned: Mapping[str, tuple[DetectionKind, tuple[tuple[str, str], ...]]],
                      drain_on: tuple[str, ...], job_id: str) -> list[GateDrain]:
    """The nodes the in-training watch condemned ({node: (kind, its (check, reason)s)}), drained as
    the gate's exclusions are, each counting as its kind's status (`trainctl.detections.RULES`):
    a check that newly failed (sick) as "fail"; a node that hung, or slowed, as "unknown" (no
    check could tell what is wrong with it)."""
    from trainctl.slurm import tagged_reason

    drains = []
    for node, (kind, causes) in sorted(condemned.items()):
        if RULES[kind].drain_as in drain_on:
            name, tagged = tagged_reason(list(causes), context=f"watch of job {job_id}")
            drains.append(GateDrain(node, name, tagged))
    return drains


@dataclass(frozen=True)
class GateDrains:
    """What became of a job's planned drains, and the breaker's one line when it held any back
    (or recorded them only, for a rule in `[breaker] shadow`)."""

    drains: tuple[GateDrain, ...] = ()
    breaker: str = ""

    def lines(self) -> list[str]:
        return [drain.line() for drain in self.drains] + ([self.breaker] if self.breaker else [])


def job_id_of(environ: Mapping[str, str]) -> str:
    """The job's id for a drain reason and the history; "?" where SLURM_JOB_ID is not a Slurm job id."""
    try:
        return check_job_id(environ.get("SLURM_JOB_ID", ""), "SLURM_JOB_ID")
    except UsageError:
        return "?"


def drain_excluded(site: str | None, config, decision: Decision, node_reports: Mapping[str, dict],
                   fabric: FabricReport | None, environ: Mapping[str, str], clock=time.time) -> GateDrains:
    """Drain what the site's `[gate] drain_on` asks for (`config`: the site, loaded; None: no site);
    never raises for Slurm, rights or the history."""
    if site is None or config is None or not config.gate.drain_on:
        return GateDrains()
    job_id = job_id_of(environ)
    return drain_planned(plan_gate_drains(decision, node_reports, fabric, tuple(config.gate.drain_on), job_id),
                         config, site, job_id, "gate", clock)


def drain_condemned(site: str | None, config,
                    condemned: Mapping[str, tuple[DetectionKind, tuple[tuple[str, str], ...]]],
                    environ: Mapping[str, str], clock=time.time) -> GateDrains:
    """Drain the watch's condemned nodes where `[gate] drain_on` asks (`plan_watch_drains`)."""
    if site is None or config is None or not config.gate.drain_on:
        return GateDrains()
    job_id = job_id_of(environ)
    return drain_planned(plan_watch_drains(condemned, tuple(config.gate.drain_on), job_id), config, site, job_id,
                         "watch", clock)


def drain_planned(planned: list[GateDrain], config, site: str, job_id: str, rule: str, clock) -> GateDrains:
    """The planned drains, made within the breaker (`trainctl.sweep.drain.drain_within`) and recorded in
    the site's sweep history as a sweep of kind "gate", so `trainctl resume` treats them as its own.
    Without the history there is no breaker to ask, so nothing is drained."""
    if not planned:
        return GateDrains()
    from pathlib import Path

    from trainctl.slurm import require_operator
    from trainctl.sweep.breaker import Breaker
    from trainctl.sweep.db import History
    from trainctl.sweep.drain import drain_within

    breaker = Breaker.from_site(config)
    if rule not in breaker.shadow:
        try:
            require_operator()
        except PrivilegeError:
            return GateDrains(tuple(replace(d, outcome=NO_RIGHTS) for d in planned))
        except TrainctlError as exc:
            return GateDrains(tuple(replace(d, outcome=f"not drained: {exc}") for d in planned))
    path = Path(config.sweep.db).expanduser()
    try:
        with History.open(path, write=True) as history:
            sweep_id = history.start_sweep(kind="gate", started_at=clock(), site=site, via="slurm",
                                           target=f"job {job_id}", checks=",".join(config.gate.drain_on))
            done, line = drain_within(history, breaker, rule=rule, site=site, target=f"job {job_id}",
                                      sweep_id=sweep_id, planned=[(d.host, d.reason, d.check) for d in planned],
                                      clock=clock)
            history.finish_sweep(sweep_id, clock())
    except (TrainctlError, OSError) as exc:
        why = f"not drained: the breaker could not count drains ({exc})"
        return GateDrains(tuple(replace(d, outcome=why) for d in planned))
    recorded = f"recorded in {path}: `trainctl resume` treats it as its own"
    return GateDrains(tuple(replace(drain, outcome=outcome.outcome, reason=outcome.reason,
                                    reason_time=outcome.reason_time,
                                    recorded=recorded if outcome.outcome == "drained" else "")
                            for drain, outcome in zip(planned, done)), line)
