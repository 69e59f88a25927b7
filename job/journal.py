"""The timeline of a chain of attempts, from their journals (written and read by
`trainctl.job.jobdir`: `Journal`, `read_journal`); their goodput: `trainctl.job.goodput`.
"""

from __future__ import annotations

from trainctl.job.jobdir import KINDS, Kind
from trainctl.job.watch import link_line


def timeline_lines(attempts: list[tuple[str, list[dict]]], start: float) -> list[str]:
    """One line per event, at its offset from the chain's first submit (or first event), in time
    order; a submit is shown when Slurm took the job, not when the job journaled it."""
    timed = []
    for job_id, events in attempts:
        for event in events:
            when = event.get("submitted_t") if event["event"] == Kind.SUBMITTED else event["t"]
            if isinstance(when, (int, float)):
                timed.append((when, job_id, event))
    lines = []
    for when, job_id, event in sorted(timed, key=lambda item: item[0]):
        lines += event_lines(f"  +{hms(when - start)}", job_id, event)
    return lines


def event_lines(stamp: str, job_id: str, event: dict) -> list[str]:
    """One event of job `job_id` at `stamp` (its offset, or its time of day): its line, and a
    slowdown's evidence per rank and per link under it."""
    lines = [f"{stamp} job {job_id}: {describe(event)}"]
    if event["event"] in (Kind.DETECTION, Kind.WEIGHED):
        lines += [f"      {line}" for line in own_time_lines(event) + link_lines(event)]
    return lines


def describe(event: dict) -> str:
    kind = event["event"]
    if kind == Kind.NODE_VERDICT:
        reasons = "; ".join(event.get("reasons") or [])
        return f"{event.get('node')} {event.get('verdict')}" + (f": {reasons}" if reasons else "")
    if kind == Kind.SUBMITTED:
        return Kind.SUBMITTED.description
    if kind == Kind.DETECTION:
        suspects = ",".join(event.get("suspects") or []) or "no node named yet"
        return f"watch: {event.get('kind')} ({suspects}): {event.get('evidence')}"
    if kind == Kind.WEIGHED:
        return weighed_line(event)
    if kind == Kind.CONFIRMATION:
        named = event.get("named") or {}
        if not named:
            return f"watch: the gate names no node: {event.get('note', 'nobody named')}; same nodes again"
        return "watch: left out " + "; ".join(f"{node}: {why}" for node, why in named.items())
    # job_start's job and site are for the fleet history (trainctl.sweep.fleet): the timeline names the job already
    hidden = ("t", "at", "event", "job", "site") if kind == "job_start" else ("t", "at", "event")
    detail = {key: value for key, value in event.items() if key not in hidden and not key.endswith("_t")}
    text = KINDS[kind].description if kind in KINDS else str(kind)
    if detail:
        text += ": " + ", ".join(f"{key} {_value(value)}" for key, value in detail.items())
    return text


def weighed_line(event: dict) -> str:
    """A slowdown nobody was named for, and why the watch stopped for the gate or let training go on."""
    def seconds(key: str) -> str:
        value = event.get(key)
        return f"{value:.0f} s" if isinstance(value, (int, float)) else "?"
    gate = event.get("action") == "gate"
    factor = event.get("pay_factor")
    factor = f"{factor:g}" if isinstance(factor, (int, float)) else "?"
    return (f"watch: {event.get('kind', 'slow')}, no node named: {event.get('evidence', '')}; "
            f"{'stopped for the gate' if gate else 'training goes on'}: gain {seconds('gain_s')} over "
            f"{seconds('left_s')} left ({event.get('left_basis', '?')}) {'>' if gate else 'not >'} {factor} x price "
            f"{seconds('price_s')} (restart {seconds('restart_s')}, {event.get('restart_basis', '?')}; "
            f"{seconds('lost_work_s')} of work since the last checkpoint)")


def own_time_lines(event: dict) -> list[str]:
    """A slowdown's evidence per rank (`trainctl.job.watch.OwnTime.fields`), a line each, for under the event."""
    details = event.get("details")
    ranks = details.get("own") if isinstance(details, dict) else None
    lines = []
    for item in ranks if isinstance(ranks, list) else ():
        try:
            (cpu_before, cpu_now), (runq_before, runq_now) = item["cpu_s"], item["runq_s"]
            lines.append(f"rank {int(item['rank'])} on {item['node']}: own time a step "
                         f"{cpu_now + runq_now:.3g} s (on a CPU {cpu_now:.3g} + waiting for one {runq_now:.3g}), "
                         f"{cpu_before + runq_before:.3g} s before ({cpu_before:.3g} + {runq_before:.3g})")
        except (KeyError, TypeError, ValueError):
            continue   # a journal line from another version: the evidence line above still says it
    return lines


def link_lines(event: dict) -> list[str]:
    """A slowdown's evidence per link (`trainctl.job.watch.LinkWait.fields`), a line each, for under the event."""
    details = event.get("details")
    links = details.get("links") if isinstance(details, dict) else None
    lines = []
    for item in links if isinstance(links, list) else ():
        try:
            lines.append(link_line(item))
        except (KeyError, TypeError, ValueError):
            continue   # a journal line from another version: the evidence line above still says it
    return lines


def _value(value) -> str:
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "none"
    return str(value)


def hms(seconds: float) -> str:
    """3725 -> '1:02:05'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
