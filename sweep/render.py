"""Report formats: text (a terminal, a mail), JSON (machines), Markdown (tickets, wikis), HTML (one
self-contained file: inline CSS and SVG, nothing fetched), and Prometheus textfile metrics.

Every function here is pure: a Report (or rows) in, a string out.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable

from trainctl.html_page import escape, legend, page_head
from trainctl.slurm import fold_hostlist
from trainctl.sweep.model import STATUS_CODE, DrainRow, NodeRow, ResultRow, SweepRow
from trainctl.sweep.families import FAMILIES
from trainctl.sweep.fleet import FamilyStrikes, Lemon, LemonRule, Standing
from trainctl.sweep.report import Fleet, Group, NodeFleet, Report
from trainctl.text import printable, prometheus_label as _label

CELL_COLOURS = {"ok": "#4caf50", "warn": "#ffb300", "fail": "#d32f2f", "unknown": "#7e57c2",
                "timeout": "#ff7043", "error": "#6d4c41", "not_swept": "#cfd8dc", None: "#ffffff"}
CELL_NAMES = {"not_swept": "not swept", None: "no sweep"}
HOSTLIST_SHOWN_CHARS = 160   # longer hostlists (scattered nodes) collapse behind their count in HTML
TEXT_ALIGN_CHARS = 40        # text report: hostlist column width at most
GRID_LABEL_CHARS = 40        # a grid row's label; the full hostlist is its tooltip
FLEET_ROWS = 50              # text, Markdown, HTML: nodes with strikes shown (all of them: --format json)


def local_time(timestamp: float | None, tz: datetime.tzinfo | None = None) -> str:
    if timestamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp, tz).strftime("%Y-%m-%d %H:%M")


def iso_utc(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat(timespec="seconds")


def describe_sweep(sweep: SweepRow, tz: datetime.tzinfo | None = None) -> str:
    state = ("complete" if sweep.complete and not sweep.error else
             f"failed: {sweep.error}" if sweep.complete else "INCOMPLETE (never finished: killed or crashed)")
    return (f"#{sweep.id} {sweep.kind} via {sweep.via} on {sweep.target}, started {local_time(sweep.started_at, tz)}"
            f", {state}")


def window_label(report: Report) -> str:
    days = (report.generated_at - report.since) / 86400
    return f"{days:g} days" if days >= 1 else f"{days * 24:g} hours"


def count_line(report: Report) -> str:
    order = ["ok", "warn", "fail", "unknown", "timeout", "error", "not_swept"]
    parts = [f"{report.counts[k]} {k.replace('_', ' ')}" for k in order if report.counts.get(k)]
    return ", ".join(parts) or "no nodes recorded"


def rechecks_text(report: Report, tz: datetime.tzinfo | None = None) -> str:
    """The resume re-checks of the window, apart from the sweeps: they looked at a few drained nodes only."""
    if not report.rechecks:
        return ""
    items = ", ".join(f"#{s.id} {s.target} {local_time(s.started_at, tz)}" for s in report.rechecks)
    return f"re-checks of drained nodes: {items}"


def since_text(group: Group, tz: datetime.tzinfo | None = None) -> str:
    text = f"{group.status} since {local_time(group.since, tz)} (sweep #{group.since_sweep})"
    return text + (f", flapping ({group.changes} changes)" if group.flapping else "")


# ---------------------------------------------------------------- text

def to_text(report: Report, tz: datetime.tzinfo | None = None) -> str:
    lines = [f"trainctl report {local_time(report.generated_at, tz)}: last {window_label(report)}, "
             f"{len(report.sweeps)} sweeps"]
    if report.latest:
        lines.append(f"latest sweep {describe_sweep(report.latest, tz)}")
    if report.rechecks:
        lines.append(rechecks_text(report, tz))
    lines += [f"WARNING: sweep {describe_sweep(s, tz)}" for s in report.incomplete if s is not report.latest]
    lines.append(f"nodes now: {count_line(report)}")
    lines.append(report.verdict)
    # Columns line up for short hostlists; a long one (thousands of scattered nodes) runs on
    # instead of padding every other line to its length.
    width = min(TEXT_ALIGN_CHARS, max([len(g.hostlist) for g in report.groups] + [len(h.hostlist) for h in
                report.unanswered + report.not_swept] + [len(d.host) for d in report.drained] + [5]))
    check_width = max([len(g.check) for g in report.groups] + [5])
    if report.groups:
        lines += ["", "FAILING CHECKS"]
        lines += [f"  {g.hostlist:<{width}}  {g.check:<{check_width}}  {g.reason}  [{since_text(g, tz)}]"
                  for g in report.groups]
    if report.unanswered:
        lines += ["", "NO VERDICT (timed out or no answer; not the same as failing)"]
        lines += [f"  {h.hostlist:<{width}}  {h.label:<7}  {h.detail}" for h in report.unanswered]
    if report.not_swept:
        lines += ["", "NOT SWEPT (Slurm state)"]
        lines += [f"  {h.hostlist:<{width}}  {h.label}" for h in report.not_swept]
    if report.drained:
        lines += ["", "DRAINED BY TRAINCTL"]
        lines += [f"  {d.host:<{width}}  since {local_time(d.drained_at, tz)}  {d.reason}" for d in report.drained]
    if report.fleet is not None:
        lines += fleet_text(report.fleet, report, tz)
    return _lines(lines)


def node_fleet_text(node: NodeFleet, fleet: Fleet) -> str:
    text = (f"left out by {node.jobs_excluded} jobs, {node.detections} detections, {node.sweeps_failed} sweeps "
            f"failed, served {node.jobs_served} jobs")
    if node.families:
        text += f"; strikes in the rule's {fleet.rule.days:g} days: {families_text(node.families)}"
    return text


def families_text(families: Iterable[FamilyStrikes]) -> str:
    """`gpu-memory 3 (forgiven: served 12 jobs since its last), hang 1`: a node's strikes by family."""
    def served(family: FamilyStrikes) -> str:
        since = f"served {_jobs(family.served_since)} since its last"
        return f" (forgiven: {since})" if family.forgiven else f" ({since})" if family.served_since else ""
    return ", ".join(f"{f.family} {f.strikes:g}{served(f)}" for f in families)


def lemon_text(lemon: Lemon) -> str:
    """`3 nvlink strikes, 3 jobs; served 2 jobs since its last nvlink strike`."""
    counts = " and ".join(f"{f.strikes:g} {f.family}" for f in lemon.families)
    served = "; ".join(f"served {_jobs(f.served_since)} since its last {f.family} strike"
                       for f in lemon.families if f.served_since)
    users = f" of {_users(lemon.users)}" if lemon.jobs else ""
    return f"{counts} strikes, {len(lemon.jobs)} jobs{users}" + (f"; {served}" if served else "")


def too_few_users_text(standing: Standing, rule: LemonRule) -> str:
    """`nvlink 3 from the jobs of 1 user (job 7, job 8, job 9); a lemon once the jobs of 2 users strike ...`."""
    families = ", ".join(f"{f.family} {f.strikes:g} from the jobs of {_users(f.users)} "
                         f"({', '.join(dict.fromkeys(s.source for s in f.evidence))})"
                         for f in standing.too_few_users(rule))
    return f"{families}; a lemon once the jobs of {rule.min_users} users strike a family, or a failed sweep agrees"


def _users(count: int) -> str:
    return f"{count} user{'' if count == 1 else 's'}"


def _jobs(count: int) -> str:
    return f"{count} job{'' if count == 1 else 's'}"


def strike_text(strike, tz: datetime.tzinfo | None = None) -> str:
    what = {"exclusion": "gate left it out", "detection": f"watch: {strike.what}", "sweep": "failed"}[strike.kind]
    detail = f": {strike.detail}" if strike.detail else ""
    return f"{local_time(strike.at, tz)} [{', '.join(strike.families)}] {strike.source} {what}{detail}"


def fleet_text(fleet: Fleet, report: Report, tz: datetime.tzinfo | None = None) -> list[str]:
    struck = fleet.struck
    lines = ["", f"JOBS AND SWEEPS PER NODE (last {window_label(report)}): {len(struck)} nodes with strikes, "
                 f"{len(fleet.nodes)} nodes seen by jobs or failing a sweep"]
    width = max([len(n.host) for n in struck[:FLEET_ROWS]] + [5])
    lines += [f"  {n.host:<{width}}  {node_fleet_text(n, fleet)}" for n in struck[:FLEET_ROWS]]
    if len(struck) > FLEET_ROWS:
        lines.append(f"  ... {len(struck) - FLEET_ROWS} more (--format json)")
    lines += ["", f"LEMONS ({fleet.rule.describe()}): "
                  + (fold_hostlist([lemon.host for lemon in fleet.lemons]) if fleet.lemons else "none")]
    for lemon in fleet.lemons[:FLEET_ROWS]:
        lines.append(f"  {lemon.host}  {lemon_text(lemon)}")
        lines += [f"    {strike_text(strike, tz)}" for strike in lemon.evidence]
    if len(fleet.lemons) > FLEET_ROWS:
        lines.append(f"  ... {len(fleet.lemons) - FLEET_ROWS} more (--format json)")
    if fleet.cleared:
        lines += ["", f"CLEARED BY SERVICE (enough strikes of a family, but {fleet.rule.forgive_after_jobs} jobs "
                      f"served since its last): {fold_hostlist([s.host for s in fleet.cleared])}"]
        lines += [f"  {s.host}  {families_text(s.cleared(fleet.rule))}" for s in fleet.cleared[:FLEET_ROWS]]
    if fleet.too_few_users:
        lines += ["", f"NOT LEMONS: TOO FEW USERS (enough strikes of a family, but from fewer than {fleet.rule.min_users} "
                      f"users' jobs, and no failed sweep agrees): {fold_hostlist([s.host for s in fleet.too_few_users])}"]
        lines += [f"  {s.host}  {too_few_users_text(s, fleet.rule)}" for s in fleet.too_few_users[:FLEET_ROWS]]
    return lines


# ---------------------------------------------------------------- JSON

def to_json_dict(report: Report) -> dict:
    return {
        "generated_at": iso_utc(report.generated_at),
        "since": iso_utc(report.since),
        "latest_sweep": report.latest.id if report.latest else None,
        "verdict": report.verdict,
        "rechecks": [s.id for s in report.rechecks],
        "sweeps": [{"id": s.id, "kind": s.kind, "started_at": iso_utc(s.started_at),
                    "finished_at": iso_utc(s.finished_at), "complete": s.complete, "via": s.via,
                    "target": s.target, "checks": s.checks, "slurm_job_id": s.slurm_job_id, "error": s.error}
                   for s in report.sweeps],
        "counts": report.counts,
        "groups": [{"check": g.check, "status": g.status, "reason": g.reason, "hostlist": g.hostlist,
                    "hosts": list(g.hosts), "since": iso_utc(g.since), "since_sweep": g.since_sweep,
                    "flapping": g.flapping, "changes": g.changes} for g in report.groups],
        "no_verdict": [{"outcome": h.label, "detail": h.detail, "hostlist": h.hostlist, "hosts": list(h.hosts)}
                       for h in report.unanswered],
        "not_swept": [{"slurm_state": h.label, "hostlist": h.hostlist, "hosts": list(h.hosts)}
                      for h in report.not_swept],
        "drained": [{"host": d.host, "reason": d.reason, "since": iso_utc(d.drained_at), "sweep_id": d.sweep_id,
                     "check": d.check} for d in report.drained],
        "nodes": [{"host": n.host, "state": n.state, "sweep": n.sweep_id, "recheck": n.recheck,
                   "slurm_state": n.slurm_state} for n in report.nodes],
        "grid": {"nights": list(report.grid.nights),
                 "rows": [{"host": host, "cells": list(cells)} for host, cells in report.grid.rows],
                 "hidden_rows": report.grid.hidden_rows},
        **({} if report.fleet is None else {"fleet": fleet_json(report.fleet)}),
    }


def fleet_json(fleet: Fleet) -> dict:
    rule = fleet.rule
    return {
        "rule": {"strikes": rule.strikes, "days": rule.days, "exclusion_strike": rule.exclusion,
                 "detection_strike": rule.detection, "sweep_strike": rule.sweep,
                 "forgive_after_jobs": rule.forgive_after_jobs, "min_users": rule.min_users, "text": rule.describe()},
        "nodes": [{"host": n.host, "jobs_excluded": n.jobs_excluded, "detections": n.detections,
                   "sweeps_failed": n.sweeps_failed, "jobs_served": n.jobs_served,
                   "families": families_json(n.families)} for n in fleet.nodes],
        "lemons": [{"host": lemon.host, "strikes": lemon.strikes, "jobs": list(lemon.jobs), "users": lemon.users,
                    "families": families_json(lemon.families),
                    "evidence": [{"at": iso_utc(s.at), "source": s.source, "kind": s.kind, "what": s.what,
                                  "detail": s.detail, "weight": s.weight, "families": list(s.families)}
                                 for s in lemon.evidence]}
                   for lemon in fleet.lemons],
        "cleared": [{"host": s.host, "families": families_json(s.cleared(rule))} for s in fleet.cleared],
        "too_few_users": [{"host": s.host, "families": families_json(s.too_few_users(rule)),
                           "why": too_few_users_text(s, rule)} for s in fleet.too_few_users],
    }


def families_json(families: Iterable[FamilyStrikes]) -> list[dict]:
    """Each family's strikes, the jobs served since, the distinct users whose jobs struck, and
    whether a failed sweep is among them."""
    return [{"family": f.family, "strikes": f.strikes, "served_since": f.served_since, "forgiven": f.forgiven,
             "users": f.users, "swept": f.swept} for f in families]


def to_json(report: Report) -> str:
    # No indent: Python's C encoder only runs without one, 5-10x faster on 100,000 nodes (jq indents).
    return json.dumps(to_json_dict(report)) + "\n"


# ---------------------------------------------------------------- Markdown

def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(report: Report, tz: datetime.tzinfo | None = None) -> str:
    lines = [f"# trainctl report, {local_time(report.generated_at, tz)}", "",
             f"Last {window_label(report)}: {len(report.sweeps)} sweeps. Nodes now: {count_line(report)}.",
             "", f"**{_md(report.verdict[:1].upper() + report.verdict[1:])}.**", ""]
    if report.latest:
        lines.append(f"Latest sweep {_md(describe_sweep(report.latest, tz))}.")
    if report.rechecks:
        lines.append(f"{_md(rechecks_text(report, tz)).capitalize()}.")
    lines += [f"**Incomplete:** sweep {_md(describe_sweep(s, tz))}." for s in report.incomplete
              if s is not report.latest]
    if report.groups:
        lines += ["", "## Failing checks", "", "| nodes | check | status | reason | since | flapping |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| `{g.hostlist}` | {g.check} | {g.status} | {_md(g.reason)} | {local_time(g.since, tz)} "
                  f"(#{g.since_sweep}) | {'yes, ' + str(g.changes) + ' changes' if g.flapping else 'no'} |"
                  for g in report.groups]
    if report.unanswered:
        lines += ["", "## No verdict (timed out or no answer)", "", "| nodes | outcome | detail |", "|---|---|---|"]
        lines += [f"| `{h.hostlist}` | {h.label} | {_md(h.detail)} |" for h in report.unanswered]
    if report.not_swept:
        lines += ["", "## Not swept", "", "| nodes | Slurm state |", "|---|---|"]
        lines += [f"| `{h.hostlist}` | {h.label} |" for h in report.not_swept]
    if report.drained:
        lines += ["", "## Drained by trainctl", "", "| node | since | reason |", "|---|---|---|"]
        lines += [f"| {d.host} | {local_time(d.drained_at, tz)} | {_md(d.reason)} |" for d in report.drained]
    if report.fleet is not None:
        fleet = report.fleet
        struck = fleet.struck
        lines += ["", f"## Jobs and sweeps per node ({len(struck)} nodes with strikes)", "",
                  "| node | jobs that left it out | detections | sweeps failed | jobs served | "
                  f"strikes by family ({fleet.rule.days:g} days) |", "|---|---|---|---|---|---|"]
        lines += [f"| {n.host} | {n.jobs_excluded} | {n.detections} | {n.sweeps_failed} | {n.jobs_served} | "
                  f"{_md(families_text(n.families))} |" for n in struck[:FLEET_ROWS]]
        if len(struck) > FLEET_ROWS:
            lines.append(f"\n{len(struck) - FLEET_ROWS} more nodes with strikes: see `--format json`.")
        lines += ["", "## Lemons", "", f"Rule: {_md(fleet.rule.describe())}.", ""]
        if not fleet.lemons:
            lines.append("None.")
        for lemon in fleet.lemons[:FLEET_ROWS]:
            lines += [f"- **{lemon.host}**: {_md(lemon_text(lemon))}"]
            lines += [f"  - {_md(strike_text(strike, tz))}" for strike in lemon.evidence]
        if fleet.cleared:
            lines += ["", "## Cleared by service", ""]
            lines += [f"- **{s.host}**: {_md(families_text(s.cleared(fleet.rule)))}" for s in fleet.cleared[:FLEET_ROWS]]
        if fleet.too_few_users:
            lines += ["", "## Not lemons: too few users", ""]
            lines += [f"- **{s.host}**: {_md(too_few_users_text(s, fleet.rule))}"
                      for s in fleet.too_few_users[:FLEET_ROWS]]
    return _lines(lines)


def _lines(lines: list[str]) -> str:
    """Host names, reasons and details come from the nodes: each line escaped on its own, so a
    newline inside a value is `\\n`, never a line of its own."""
    return "".join(printable(line) + "\n" for line in lines)


# ---------------------------------------------------------------- HTML (trainctl.html_page: the page's style)

def _badge(status: str) -> str:
    return f'<span class="badge" style="background:{CELL_COLOURS.get(status, "#999")}">{escape(status)}</span>'


def to_html(report: Report, tz: datetime.tzinfo | None = None) -> str:
    drained = {d.host: d for d in report.drained}
    parts = [*page_head(f"trainctl report {local_time(report.generated_at, tz)}"),
             "<h1>trainctl node health report</h1>",
             f'<p class="meta">{escape(local_time(report.generated_at, tz))}: last {escape(window_label(report))}, '
             f"{len(report.sweeps)} sweeps. Nodes now: {escape(count_line(report))}.</p>"]
    if report.latest:
        parts.append(f'<p class="meta">Latest sweep {escape(describe_sweep(report.latest, tz))}.</p>')
    if report.rechecks:
        parts.append(f'<p class="meta">{escape(rechecks_text(report, tz).capitalize())}.</p>')
    parts += [f'<p class="warn-box">Incomplete sweep {escape(describe_sweep(s, tz))}.</p>' for s in report.incomplete]
    verdict = report.verdict[:1].upper() + report.verdict[1:]
    parts.append(f'<p class="verdict"><strong>{escape(verdict)}.</strong></p>')

    # Folded by failure: one row per group (check, reason, streak), its nodes as one hostlist,
    # never a row per node, so 100,000 nodes with a few hundred failing stay one short table.
    parts += [f"<h2>Failing checks ({len(report.groups)} groups, "
              f"{sum(len(g.hosts) for g in report.groups)} node checks)</h2>",
              '<table class="failures"><thead><tr><th>status</th><th>check</th><th>nodes</th><th>reason</th>'
              "<th>since</th><th>flapping</th><th>drained by trainctl</th></tr></thead><tbody>"]
    for group in report.groups:
        held = [host for host in group.hosts if host in drained]
        parts.append(f'<tr class="group" data-check="{escape(group.check)}" data-status="{escape(group.status)}">'
                     f"<td>{_badge(group.status)}</td><td>{escape(group.check)}</td>"
                     f"<td>{_hostlist_cell(len(group.hosts), group.hostlist)}</td>"
                     f'<td class="reason">{escape(group.reason)}</td>'
                     f"<td>{escape(local_time(group.since, tz))} (#{group.since_sweep})</td>"
                     f"<td>{'yes, ' + str(group.changes) + ' changes' if group.flapping else 'no'}</td>"
                     f"<td>{_hostlist_cell(len(held), fold_hostlist(held)) if held else '-'}</td></tr>")
    parts.append("</tbody></table>")

    parts += ["<h2>Node &times; night</h2>",
              "<p>Every node with trouble in the window or drained by trainctl; a cell is the node's last "
              "verdict of that night, so its newest cell is its state now.</p>", grid_svg(report), _legend()]
    if report.unanswered:
        parts += ["<h2>No verdict (timed out or no answer)</h2>",
                  '<table class="unanswered"><tr><th>nodes</th><th>outcome</th><th>detail</th></tr>']
        parts += [f"<tr><td>{_hostlist_cell(len(h.hosts), h.hostlist)}</td><td>{escape(h.label)}</td>"
                  f"<td>{escape(h.detail)}</td></tr>" for h in report.unanswered]
        parts.append("</table>")
    if report.not_swept:
        parts += ["<h2>Not swept</h2>", '<table class="not-swept"><tr><th>nodes</th><th>Slurm state</th></tr>']
        parts += [f"<tr><td>{_hostlist_cell(len(h.hosts), h.hostlist)}</td><td>{escape(h.label)}</td></tr>"
                  for h in report.not_swept]
        parts.append("</table>")
    if report.drained:
        parts += ["<h2>Drained by trainctl</h2>",
                  '<table class="drained"><tr><th>node</th><th>since</th><th>reason</th></tr>']
        parts += [f"<tr><td>{escape(d.host)}</td><td>{escape(local_time(d.drained_at, tz))}</td><td>{escape(d.reason)}</td></tr>"
                  for d in report.drained]
        parts.append("</table>")
    if report.fleet is not None:
        parts += fleet_html(report.fleet, tz)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


TIMELINE_COLOURS = {"exclusion": "#d32f2f", "detection": "#ff7043", "served": "#4caf50", "sweep failed": "#6a1b9a",
                    "sweep passed": "#90caf9", "drained": "#263238", "drain lifted": "#b0bec5"}


def fleet_html(fleet: Fleet, tz: datetime.tzinfo | None = None) -> list[str]:
    struck = fleet.struck
    parts = [f"<h2>Jobs and sweeps per node ({len(struck)} nodes with strikes)</h2>",
             '<table class="fleet"><tr><th>node</th><th>jobs that left it out</th><th>detections</th>'
             f"<th>sweeps failed</th><th>jobs served</th><th>strikes by family ({fleet.rule.days:g} days)</th></tr>"]
    parts += [f"<tr><td>{escape(n.host)}</td><td>{n.jobs_excluded}</td><td>{n.detections}</td><td>{n.sweeps_failed}</td>"
              f"<td>{n.jobs_served}</td><td>{escape(families_text(n.families))}</td></tr>" for n in struck[:FLEET_ROWS]]
    parts.append("</table>")
    if len(struck) > FLEET_ROWS:
        parts.append(f"<p>{len(struck) - FLEET_ROWS} more nodes with strikes: see --format json.</p>")
    parts += [f"<h2>Lemons ({len(fleet.lemons)})</h2>", f"<p>Rule: {escape(fleet.rule.describe())}.</p>",
              _families_legend(fleet)]
    if not fleet.lemons:
        parts.append("<p>None.</p>")
    for lemon in fleet.lemons:
        parts.append(f'<h3 class="lemon" data-host="{escape(lemon.host)}">{escape(lemon.host)}: {escape(lemon_text(lemon))}</h3>')
        parts += node_timeline_html(lemon.host, fleet.timelines.get(lemon.host, ()), tz)
    held_back = (
        ("Cleared by service", "cleared", fleet.cleared,
         f"{fleet.rule.forgive_after_jobs} jobs or more served since its last strike: those strikes no longer count",
         lambda standing: families_text(standing.cleared(fleet.rule))),
        ("Not lemons: too few users", "too-few-users", fleet.too_few_users,
         f"from fewer than {fleet.rule.min_users} users' jobs, and no failed sweep agrees: one user's jobs never "
         "make a node a lemon for everyone", lambda standing: too_few_users_text(standing, fleet.rule)))
    for title, css, standings, why, text in held_back:
        if not standings:
            continue
        parts += [f"<h2>{title} ({len(standings)})</h2>",
                  f"<p>Enough strikes of a family to be lemons, but {why}.</p>"]
        for standing in standings:
            parts.append(f'<h3 class="{css}" data-host="{escape(standing.host)}">{escape(standing.host)}: '
                         f"{escape(text(standing))}</h3>")
            parts += node_timeline_html(standing.host, fleet.timelines.get(standing.host, ()), tz)
    return parts


def node_timeline_html(host: str, items, tz: datetime.tzinfo | None = None) -> list[str]:
    """A node's strikes (with their families), the jobs it served and its drains: the time axis, then the rows."""
    if not items:
        return []
    parts = [timeline_svg(host, items, tz),
             '<table class="timeline"><tr><th>when</th><th>job, sweep or drain</th><th>family</th><th>what</th></tr>']
    parts += [f'<tr data-kind="{escape(i.kind)}" data-family="{escape(" ".join(i.families))}"><td>{escape(local_time(i.at, tz))}'
              f"</td><td>{escape(i.source)}</td><td>{escape(', '.join(i.families))}</td>"
              f"<td>{_badge_colour(i.kind)} {escape(i.text)}</td></tr>" for i in items]
    parts.append("</table>")
    return parts


def _families_legend(fleet: Fleet) -> str:
    """What each family that strikes a node here counts."""
    shown = {f.family for node in fleet.nodes for f in node.families}
    shown |= {f.family for lemon in fleet.lemons for f in lemon.families}
    if not shown:
        return ""
    items = "".join(f"<li><code>{escape(name)}</code>: {escape(text)}</li>" for name, text in FAMILIES.items() if name in shown)
    return f'<ul class="families">{items}</ul>'


def _badge_colour(kind: str) -> str:
    return f'<span class="badge" style="background:{TIMELINE_COLOURS.get(kind, "#999")}">{escape(kind)}</span>'


def timeline_svg(host: str, items, tz: datetime.tzinfo | None = None) -> str:
    """One lemon's jobs and sweeps on a time axis: a mark per item, coloured by kind."""
    width, height, pad = 720, 34, 8
    first, last = items[0].at, items[-1].at
    span = max(last - first, 1.0)
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="{escape(host)} timeline" font-family="monospace" font-size="10">',
           f'<line x1="{pad}" y1="14" x2="{width - pad}" y2="14" stroke="#999"/>']
    for item in items:
        x = pad + (item.at - first) / span * (width - 2 * pad)
        family = f" [{', '.join(item.families)}]" if item.families else ""
        out.append(f'<circle cx="{x:.1f}" cy="14" r="5" fill="{TIMELINE_COLOURS.get(item.kind, "#999")}">'
                   f"<title>{escape(local_time(item.at, tz))} {escape(item.source)}{escape(family)}: {escape(item.text or item.kind)}"
                   "</title></circle>")
    out.append(f'<text x="{pad}" y="31">{escape(local_time(first, tz))}</text>')
    out.append(f'<text x="{width - pad}" y="31" text-anchor="end">{escape(local_time(last, tz))}</text></svg>')
    return "".join(out)


def _hostlist_cell(count: int, hostlist: str) -> str:
    """A folded hostlist; a long one (thousands of scattered nodes) collapsed behind its count."""
    if len(hostlist) <= HOSTLIST_SHOWN_CHARS:
        return f"<code>{escape(hostlist)}</code>"
    return (f"<details><summary>{count} nodes: <code>{escape(hostlist[:HOSTLIST_SHOWN_CHARS])}&hellip;</code>"
            f"</summary><code>{escape(hostlist)}</code></details>")


def folded_grid_rows(report: Report) -> list[tuple[str, int, tuple[str | None, ...]]]:
    """The grid's nodes folded by identical rows: (hostlist, node count, cells), first node's order."""
    hosts_by_cells: dict[tuple[str | None, ...], list[str]] = {}
    for host, cells in report.grid.rows:
        hosts_by_cells.setdefault(cells, []).append(host)
    return [(fold_hostlist(hosts), len(hosts), cells) for cells, hosts in hosts_by_cells.items()]


def grid_svg(report: Report) -> str:
    grid = report.grid
    if not grid.rows:
        return "<p>No node had trouble in this window.</p>"
    rows = folded_grid_rows(report)
    labels = [hostlist if len(hostlist) <= GRID_LABEL_CHARS else f"{hostlist[:GRID_LABEL_CHARS - 12]}… ({count})"
              for hostlist, count, _ in rows]
    cell, label_w, head_h = 18, 10 + 7 * max(len(label) for label in labels), 54
    # The rotated night labels lean right, past the last column.
    width, height = label_w + cell * len(grid.nights) + 40, head_h + cell * len(rows) + 4
    out = [f'<svg class="grid" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="node by night status grid" font-family="monospace" font-size="11">']
    for col, day in enumerate(grid.nights):
        x = label_w + col * cell + cell // 2
        out.append(f'<text x="{x}" y="{head_h - 4}" transform="rotate(-60 {x} {head_h - 4})">{escape(day[5:])}</text>')
    for row, ((hostlist, _, cells), label) in enumerate(zip(rows, labels)):
        y = head_h + row * cell
        out.append(f'<text x="0" y="{y + cell - 4}">{escape(label)}<title>{escape(hostlist)}</title></text>')
        for col, value in enumerate(cells):
            name = CELL_NAMES.get(value, value)
            out.append(f'<rect x="{label_w + col * cell}" y="{y}" width="{cell - 2}" height="{cell - 2}" '
                       f'fill="{CELL_COLOURS.get(value, "#999")}" stroke="#bbb">'
                       f"<title>{escape(hostlist)} {escape(grid.nights[col])}: {escape(name)}</title></rect>")
    out.append("</svg>")
    if len(rows) < len(grid.rows):
        out.append(f"<p>{len(grid.rows)} nodes in {len(rows)} rows: nodes with the same night-by-night "
                   "history share a row.</p>")
    if grid.hidden_rows:
        out.append(f"<p>{grid.hidden_rows} more nodes with trouble are not shown (see --format json).</p>")
    return "".join(out)


def _legend() -> str:
    return legend({CELL_NAMES.get(name, name): colour for name, colour in CELL_COLOURS.items()})


# ---------------------------------------------------------------- Prometheus textfile

def to_prometheus(latest: Iterable[tuple[ResultRow, float]], current: Iterable[NodeRow],
                  drains: Iterable[DrainRow], newest_sweep: SweepRow | None, fleet: Fleet | None = None) -> str:
    """Latest status per node and check, for node_exporter's textfile collector."""
    latest = sorted(latest, key=lambda item: (item[0].host, item[0].check))
    lines = ["# HELP trainctl_check_status Latest status of a trainctl health check on a node "
             "(0 ok, 1 warn, 2 fail, 3 unknown).", "# TYPE trainctl_check_status gauge"]
    lines += [f'trainctl_check_status{{node="{_label(r.host)}",check="{_label(r.check)}"}} {STATUS_CODE[r.status]}'
              for r, _ in latest]
    lines += ["# HELP trainctl_node_checked_timestamp_seconds When the node's latest checks were taken.",
              "# TYPE trainctl_node_checked_timestamp_seconds gauge"]
    checked_at = {r.host: at for r, at in latest}
    lines += [f'trainctl_node_checked_timestamp_seconds{{node="{_label(host)}"}} {at:.0f}'
              for host, at in sorted(checked_at.items())]
    lines += ["# HELP trainctl_node_outcome What the newest sweep that listed the node did with it "
              "(checked, timeout, error, not_swept).", "# TYPE trainctl_node_outcome gauge"]
    lines += [f'trainctl_node_outcome{{node="{_label(n.host)}",outcome="{n.outcome}"}} 1'
              for n in sorted(current, key=lambda n: n.host)]
    lines += ["# HELP trainctl_node_drained 1 while trainctl holds the node drained.",
              "# TYPE trainctl_node_drained gauge"]
    lines += [f'trainctl_node_drained{{node="{_label(d.host)}"}} 1' for d in sorted(drains, key=lambda d: d.host)]
    if newest_sweep:
        lines += ["# HELP trainctl_sweep_started_timestamp_seconds Start of the newest sweep.",
                  "# TYPE trainctl_sweep_started_timestamp_seconds gauge",
                  f"trainctl_sweep_started_timestamp_seconds {newest_sweep.started_at:.0f}",
                  "# HELP trainctl_sweep_complete 1 if the newest sweep finished, 0 if it was cut short.",
                  "# TYPE trainctl_sweep_complete gauge",
                  f"trainctl_sweep_complete {int(newest_sweep.complete)}"]
    if fleet is not None:
        for name, what, attr in (("jobs_excluded", "Jobs whose gate left the node out", "jobs_excluded"),
                                 ("detections", "The watch's detections naming the node", "detections"),
                                 ("sweeps_failed", "Full sweeps the node failed", "sweeps_failed"),
                                 ("jobs_served", "Jobs the node trained for through a step that ended well",
                                  "jobs_served")):
            lines += [f"# HELP trainctl_node_{name} {what}, over the report's window.",
                      f"# TYPE trainctl_node_{name} gauge"]
            lines += [f'trainctl_node_{name}{{node="{_label(n.host)}"}} {getattr(n, attr)}' for n in fleet.nodes]
        lines += [f"# HELP trainctl_node_family_strikes Strikes of a node by failure family over the lemon rule's "
                  f"{fleet.rule.days:g} days (those its service since forgave included).",
                  "# TYPE trainctl_node_family_strikes gauge"]
        lines += [f'trainctl_node_family_strikes{{node="{_label(n.host)}",family="{f.family}"}} {f.strikes:g}'
                  for n in fleet.nodes for f in n.families]
        lines += [f"# HELP trainctl_node_lemon_strikes Strikes of a lemon: {fleet.rule.describe()}.",
                  "# TYPE trainctl_node_lemon_strikes gauge"]
        lines += [f'trainctl_node_lemon_strikes{{node="{_label(lemon.host)}"}} {lemon.strikes:g}'
                  for lemon in sorted(fleet.lemons, key=lambda lemon: lemon.host)]
    return "\n".join(lines) + "\n"
