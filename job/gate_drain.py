"""What the gate found reaches Slurm: `[gate] drain_on` drains the nodes the gate left out.

A site may ask (default: off) that nodes the gate excluded for a failure are drained, so the
next job does not land on them. Which exclusions count is the site's `drain_on`:
"fail" (a node check failed), "unknown" (a check could not decide, or the node left no
report), "fabric" (the fabric test excluded it: slow against its peers, did not join).

The drain is the one `trainctl drain` makes (`trainctl.slurm`): the tagged reason, cut to
255 bytes, naming the check and the job, set only on a node with no reason from anyone,
looked at right before. Where the job's user lacks Slurm operator rights the report says
"not drained: no operator rights" and the job goes on. A drain is recorded in the site's
sweep history as a sweep of kind "gate" when the job can write it, so `trainctl resume`
treats it like its own; otherwise the report says it is not recorded.

Planning is pure (`plan_gate_drains`; `plan_watch_drains` for the nodes the in-training watch
condemned); `drain_planned` does the Slurm calls and records the drains in the sweep history
(trainctl.sweep); `trainctl gate decide` and the job's supervisor call it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Mapping

from trainctl.errors import PrivilegeError, TrainctlError
from trainctl.health.fabric.report import FabricReport
from trainctl.job.decision import Decision

NO_RIGHTS = "not drained: no operator rights"


@dataclass(frozen=True)
class GateDrain:
    host: str
    check: str                  # the first failing check, as in `trainctl drain`
    reason: str                 # the reason to set (`trainctl: <check>: <reason> [+others] (job N)`)
    outcome: str = "planned"    # "drained", or why not ("not drained: ...")
    reason_time: str = ""       # Slurm's timestamp for the reason, read back after draining
    recorded: str = ""          # where the drain was recorded, or why it was not

    def line(self) -> str:
        done = self.reason if self.outcome == "drained" else self.outcome
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


def plan_watch_drains(condemned: Mapping[str, tuple[str, str, str]], drain_on: tuple[str, ...],
                      job_id: str) -> list[GateDrain]:
    """The nodes the in-training watch condemned ({node: (kind, check, reason)}), drained as the
    gate's exclusions are: a check that newly failed ("sick") counts as "fail"; a node that hung
    and fell silent counts as "unknown" (no check could tell what is wrong with it)."""
    from trainctl.slurm import tagged_reason

    drains = []
    for node, (kind, check, reason) in sorted(condemned.items()):
        if ("fail" if kind == "sick" else "unknown") in drain_on:
            name, tagged = tagged_reason([(check, reason)], context=f"watch of job {job_id}")
            drains.append(GateDrain(node, name, tagged))
    return drains


def drain_excluded(site: str | None, config, decision: Decision, node_reports: Mapping[str, dict],
                   fabric: FabricReport | None, environ: Mapping[str, str], clock=time.time) -> list[GateDrain]:
    """Drain what the site's `[gate] drain_on` asks for (`config`: the site, loaded; None: no site);
    never raises for Slurm or rights."""
    if site is None or config is None or not config.gate.drain_on:
        return []
    job_id = environ.get("SLURM_JOB_ID", "?")
    return drain_planned(plan_gate_drains(decision, node_reports, fabric, tuple(config.gate.drain_on), job_id),
                         config, site, job_id, clock)


def drain_condemned(site: str | None, config, condemned: Mapping[str, tuple[str, str, str]],
                    environ: Mapping[str, str], clock=time.time) -> list[GateDrain]:
    """Drain the watch's condemned nodes where `[gate] drain_on` asks (`plan_watch_drains`)."""
    if site is None or config is None or not config.gate.drain_on:
        return []
    job_id = environ.get("SLURM_JOB_ID", "?")
    return drain_planned(plan_watch_drains(condemned, tuple(config.gate.drain_on), job_id), config, site, job_id,
                         clock)


def drain_planned(planned: list[GateDrain], config, site: str, job_id: str, clock) -> list[GateDrain]:
    """The Slurm calls for planned drains, then their record in the sweep history."""
    if not planned:
        return []
    from trainctl.slurm import drain_unclaimed, require_operator

    try:
        require_operator()
    except PrivilegeError:
        return [GateDrain(d.host, d.check, d.reason, NO_RIGHTS) for d in planned]
    except TrainctlError as exc:
        return [GateDrain(d.host, d.check, d.reason, f"not drained: {exc}") for d in planned]
    done = []
    for drain in planned:
        try:
            after, why = drain_unclaimed(drain.host, drain.reason)
        except PrivilegeError:
            after, why = None, "no operator rights"
        except TrainctlError as exc:
            after, why = None, str(exc)
        if after is None:
            done.append(GateDrain(drain.host, drain.check, drain.reason, f"not drained: {why}"))
        else:
            done.append(GateDrain(drain.host, drain.check, after.reason or drain.reason, "drained",
                                  after.reason_time))
    return _record(done, config, site, job_id, clock)


def _record(drains: list[GateDrain], config, site: str, job_id: str, clock) -> list[GateDrain]:
    """Record the drains in the site's sweep history (kind "gate"), so `trainctl resume` considers them."""
    drained = [d for d in drains if d.outcome == "drained"]
    if not drained:
        return drains
    from pathlib import Path

    from trainctl.sweep.db import History

    path = Path(config.sweep.db).expanduser()
    try:
        with History.open(path, write=True) as history:
            now = clock()
            sweep_id = history.start_sweep(kind="gate", started_at=now, site=site, via="slurm",
                                           target=f"job {job_id}", checks=",".join(config.gate.drain_on))
            for drain in drained:
                history.record_drain(host=drain.host, reason=drain.reason, reason_time=drain.reason_time,
                                     sweep_id=sweep_id, check=drain.check, drained_at=now)
            history.finish_sweep(sweep_id, clock())
        note = f"recorded in {path}: `trainctl resume` treats it as its own"
    except (TrainctlError, OSError) as exc:
        note = f"not recorded in the sweep history ({exc}): `trainctl resume` will not consider it"
    return [replace(d, recorded=note) if d.outcome == "drained" else d for d in drains]
