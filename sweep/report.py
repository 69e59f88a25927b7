"""The drain report: what is broken now, grouped by check and reason, since when, and whether it flaps.

`load_report_data` reads the few rows a report needs from the history (newest row per
node, the checks that are not ok, their past rows, the window's rows of every node with
trouble, the open drains); `build_report` is a pure function of those rows and `now`, so
every rule below is tested without a database. Every format (text, JSON, Markdown, HTML)
renders the one `Report` it returns, so they cannot tell different stories.

Rules:
- a node's current state is its newest row in the window: checked, timed out, error, or
  not swept (with Slurm's state), whether that row comes from a nightly sweep or from a
  resume's re-check of that node (the freshest look at it);
- the latest sweep is the newest full sweep; re-checks are listed as re-checks, never as it;
- a group is the nodes whose current check has the same status and reason, the same
  streak start and the same flapping verdict;
- a streak is the unbroken run of the check's rows with the current status, counting
  only sweeps that checked the node (a night it was busy neither breaks nor extends it);
- a check flaps when, within the window, it changed between ok and not ok twice or more;
- the node x night grid has a row for every node with trouble in the window (not ok, no
  verdict) or held drained by trainctl, so every node the report names is in it; a cell is
  the node's last verdict of that night, so a node's newest cell is its current state;
- fleet memory, per node over the window: the jobs whose gate left it out, the watch's
  detections naming it, the full sweeps it failed, the jobs it served (trained through a step
  that ended well), and its strikes by failure family over the rule's own days; the lemons are
  judged by the site's rule over those days (`trainctl.sweep.fleet.judge_nodes`: one family that
  recurs, not forgiven by the jobs served since, struck by enough users' jobs or a failed sweep),
  each with its evidence and its timeline across jobs, sweeps and drains; so are the nodes the
  jobs they served cleared, and those held back because too few users' jobs struck them.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from trainctl.slurm import fold_hostlist
from trainctl.sweep.db import History
from trainctl.sweep.families import failed_check_families
from trainctl.sweep.fleet import (DETECTION, EXCLUSION, SERVED, FamilyStrikes, Lemon, LemonRule, Standing, judge_nodes,
                                  lemons_of)
from trainctl.sweep.model import (CHECKED, ERROR, NOT_SWEPT, TIMEOUT, DrainRow, JobEventRow, NodeRow, ResultRow,
                                  SweepFailure, SweepRow)

GRID_MAX_ROWS = 200
LEMON_TIMELINES = 50      # lemons (and as many cleared nodes) whose timeline the HTML report draws
DAY_S = 86400
FLAP_CHANGES = 2
PROBLEM_ORDER = {"fail": 0, "unknown": 1, "warn": 2}
TROUBLE = frozenset({"fail", "unknown", "warn", TIMEOUT, ERROR})
SWEEP, RECHECK = "sweep", "recheck"   # kinds of history rows; the gate's drains come as "gate"
_NAME_PARTS = re.compile(r"(\D*)(\d*)")


@dataclass(frozen=True)
class ReportData:
    sweeps: list[SweepRow]        # every sweep in the history (a few hundred rows a year)
    first_sweep: int              # the first sweep of the window
    current: list[NodeRow]        # each node's newest row in the window
    problems: list[ResultRow]     # checks not ok in those rows
    check_rows: list[ResultRow]   # every row ever of each (node, check) in `problems`
    troubled: list[NodeRow]       # window rows of the nodes that were not ok at least once
    drains: list[DrainRow]        # drains trainctl holds now
    fleet: FleetData | None = None


@dataclass(frozen=True)
class FleetData:
    """The rows fleet memory needs: the window's counts, and the lemon rule's window."""
    rule: LemonRule
    counts: list[tuple[str, str, int, int]]             # (host, kind, jobs, events) in the report's window
    failed_sweeps: list[SweepFailure]                   # in the report's window
    strikes: list[JobEventRow]                          # exclusions and detections in the rule's window
    strike_sweeps: list[SweepFailure]                   # failed sweeps in the rule's window
    served: list[tuple[str, str, float]]                # (host, job, when) the struck nodes served, rule's window
    users: dict[str, int | None]                        # the user of each job in `strikes`
    timeline_events: list[JobEventRow]                  # every job event of the timelines' nodes, both windows
    timeline_passes: list[tuple[str, int, float]]       # the sweeps those nodes passed, both windows
    timeline_drains: list[DrainRow]                     # trainctl's drains of those nodes, open or lifted


def load_report_data(history: History, since: float, rule: LemonRule | None = None,
                     now: float | None = None) -> ReportData:
    sweeps = history.sweeps()
    in_window = [s.id for s in sweeps if s.started_at >= since]
    first = min(in_window) if in_window else (sweeps[-1].id + 1 if sweeps else 1)
    problems = history.current_problems(first)
    drains = history.drains(open_only=True)
    return ReportData(
        sweeps=sweeps, first_sweep=first, current=history.current_nodes(first), problems=problems,
        check_rows=history.check_history((r.host, r.check) for r in problems),
        troubled=history.troubled_node_rows(first, also_hosts=[d.host for d in drains]), drains=drains,
        fleet=None if rule is None else load_fleet_data(history, since, rule, now))


def load_fleet_data(history: History, since: float, rule: LemonRule, now: float | None) -> FleetData:
    import time

    rule_since = (time.time() if now is None else now) - rule.days * DAY_S
    both = min(since, rule_since)
    failed = history.sweep_failures(both)   # one pass over the node rows for both windows
    strikes = history.job_events(rule_since, (EXCLUSION, DETECTION))
    strike_sweeps = [failure for failure in failed if failure.at >= rule_since]
    struck = {event.host for event in strikes} | {failure.host for failure in strike_sweeps}
    served = history.served_jobs(rule_since, struck) if struck and rule.forgive_after_jobs else []
    users = history.job_users({event.job_id for event in strikes}) if strikes else {}
    shown = timeline_hosts(rule, judge_nodes(rule, strikes, strike_sweeps, served, users))
    return FleetData(rule, history.job_counts(since), [failure for failure in failed if failure.at >= since], strikes,
                     strike_sweeps, served, users,
                     history.job_events(both, (EXCLUSION, DETECTION, SERVED), shown) if shown else [],
                     history.sweep_passes(both, shown) if shown else [],
                     [drain for drain in history.drains() if drain.host in shown] if shown else [])


def timeline_hosts(rule: LemonRule, standings: list[Standing]) -> list[str]:
    """The nodes whose timeline the report draws: the lemons with the most strikes, and as many of
    the nodes that would be lemons but for the jobs they served since, and of those held back
    because too few users' jobs struck them."""
    return ([lemon.host for lemon in lemons_of(rule, standings)][:LEMON_TIMELINES]
            + [standing.host for standing in cleared_nodes(rule, standings)][:LEMON_TIMELINES]
            + [standing.host for standing in too_few_users_nodes(rule, standings)][:LEMON_TIMELINES])


def cleared_nodes(rule: LemonRule, standings: list[Standing]) -> tuple[Standing, ...]:
    """The nodes a family would make lemons but for the jobs they served since, the most strikes first."""
    return tuple(sorted((s for s in standings if s.cleared(rule)),
                        key=lambda s: (-s.cleared(rule)[0].strikes, _natural_key(s.host))))


def too_few_users_nodes(rule: LemonRule, standings: list[Standing]) -> tuple[Standing, ...]:
    """The nodes a family would make lemons but that too few users' jobs struck it (and no failed
    sweep agrees), the most strikes first."""
    return tuple(sorted((s for s in standings if s.too_few_users(rule)),
                        key=lambda s: (-s.too_few_users(rule)[0].strikes, _natural_key(s.host))))


@dataclass(frozen=True)
class Group:
    check: str
    status: str
    reason: str
    hosts: tuple[str, ...]
    since: float                  # start of the first sweep of the current streak
    since_sweep: int
    flapping: bool
    changes: int                  # ok <-> not ok changes inside the window (the most of any node)

    @functools.cached_property
    def hostlist(self) -> str:  # folded once: every format shows it, and 10,000 names take a while
        return fold_hostlist(list(self.hosts))


@dataclass(frozen=True)
class HostGroup:
    """Nodes sharing one state and one explanation (not swept: allocated; timed out: ...)."""
    label: str
    detail: str
    hosts: tuple[str, ...]

    @functools.cached_property
    def hostlist(self) -> str:  # folded once: every format shows it, and 10,000 names take a while
        return fold_hostlist(list(self.hosts))


@dataclass(frozen=True)
class Grid:
    nights: tuple[str, ...]                                  # local dates, oldest first
    rows: tuple[tuple[str, tuple[str | None, ...]], ...]     # (host, cell per night; None: no row)
    hidden_rows: int                                         # troubled nodes beyond GRID_MAX_ROWS


@dataclass(frozen=True)
class NodeNow:
    """One node's current state, as every part of the report sees it."""

    host: str
    state: str                 # ok, warn, fail, unknown (checked), timeout, error or not_swept
    sweep_id: int              # the sweep (or re-check) the state comes from
    recheck: bool              # that was a resume's re-check, not a full sweep
    slurm_state: str
    detail: str


@dataclass(frozen=True)
class NodeFleet:
    """One node over the report's window, as the jobs and the sweeps saw it."""
    host: str
    jobs_excluded: int         # jobs whose gate left it out
    detections: int            # the watch's detections naming it
    sweeps_failed: int         # full sweeps it failed
    jobs_served: int           # jobs it trained for through a step that ended well
    families: tuple[FamilyStrikes, ...]   # its strikes by family over the rule's days, the most first

    @property
    def strikes_seen(self) -> bool:
        return bool(self.jobs_excluded or self.detections or self.sweeps_failed)


@dataclass(frozen=True)
class TimelineItem:
    at: float
    source: str                # "job 1234", "sweep #56" or "drain"
    kind: str                  # exclusion, detection, served, sweep failed, sweep passed, drained, drain lifted
    text: str
    families: tuple[str, ...] = ()   # a strike's failure families


@dataclass(frozen=True)
class Fleet:
    rule: LemonRule
    nodes: tuple[NodeFleet, ...]                   # every node with a job verdict or a failed sweep, natural order
    lemons: tuple[Lemon, ...]                      # the most strikes first
    timelines: dict[str, tuple[TimelineItem, ...]]   # lemon or cleared node -> its jobs, sweeps, drains, oldest first
    cleared: tuple[Standing, ...]                  # nodes a family would make lemons but for the jobs served since
    too_few_users: tuple[Standing, ...]            # nodes a family would make lemons but for its jobs' users

    @property
    def struck(self) -> tuple[NodeFleet, ...]:
        """Nodes with a strike in the window, the most first (the rows text and Markdown show)."""
        return tuple(sorted((n for n in self.nodes if n.strikes_seen),
                            key=lambda n: (-(n.jobs_excluded + n.detections + n.sweeps_failed), _natural_key(n.host))))


@dataclass(frozen=True)
class Report:
    generated_at: float
    since: float
    sweeps: tuple[SweepRow, ...]                  # the full sweeps of the window, oldest first
    counts: dict[str, int]                        # current nodes per state, from `nodes`
    groups: tuple[Group, ...]
    unanswered: tuple[HostGroup, ...]             # timed out or no verdict
    not_swept: tuple[HostGroup, ...]
    drained: tuple[DrainRow, ...]
    grid: Grid = field(default_factory=lambda: Grid((), (), 0))
    rechecks: tuple[SweepRow, ...] = ()           # resume's re-checks of drained nodes in the window
    nodes: tuple[NodeNow, ...] = ()               # every node's current state, natural order
    fleet: Fleet | None = None                    # jobs' verdicts and lemons (None: not asked for)

    @property
    def latest(self) -> SweepRow | None:
        """The newest full sweep of the window: a re-check of a few drained nodes never is."""
        return self.sweeps[-1] if self.sweeps else None

    @property
    def incomplete(self) -> tuple[SweepRow, ...]:
        return tuple(s for s in self.sweeps + self.rechecks if not s.complete)

    @property
    def failing_hosts(self) -> tuple[str, ...]:
        """Nodes whose current state is not ok (fail, warn, unknown) or gave no verdict."""
        return tuple(n.host for n in self.nodes if n.state in TROUBLE)

    @property
    def earlier_trouble(self) -> tuple[str, ...]:
        """Grid rows that are fine now: the trouble was earlier in the window."""
        now = set(self.failing_hosts) | {d.host for d in self.drained}
        return tuple(host for host, _ in self.grid.rows if host not in now)

    @functools.cached_property
    def verdict(self) -> str:  # every format leads with it; its hostlists are folded once
        """The one-line answer every format leads with."""
        if not self.nodes:
            return "no nodes recorded"
        failing = self.failing_hosts
        if failing:
            text = (f"{len(failing)} of {len(self.nodes)} nodes need attention now: "
                    f"{fold_hostlist(list(failing))}")
        else:
            text = "every checked node passed its latest check"
        earlier = self.earlier_trouble
        if earlier:
            text += f"; earlier in the window, trouble on {fold_hostlist(list(earlier))} (see the grid)"
        return text


def build_report(data: ReportData, now: float, since: float,
                 tz: datetime.tzinfo | None = None) -> Report:
    sweeps_by_id = {s.id: s for s in data.sweeps}
    window = tuple(s for s in data.sweeps if s.id >= data.first_sweep)
    current = {row.host: row for row in data.current}
    rechecks = {s.id for s in data.sweeps if s.kind == RECHECK}
    nodes = tuple(NodeNow(host, _state(row), row.sweep_id, row.sweep_id in rechecks, row.slurm_state,
                          row.detail) for host in _natural(current) for row in (current[host],))

    counts: dict[str, int] = defaultdict(int)
    for node in nodes:
        counts[node.state] += 1

    pair_rows: dict[tuple[str, str], list[ResultRow]] = defaultdict(list)
    for row in data.check_rows:
        pair_rows[(row.host, row.check)].append(row)
    grouped: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for problem in data.problems:
        history = sorted(pair_rows.get((problem.host, problem.check), [problem]), key=lambda r: r.sweep_id)
        changes = status_changes([r for r in history if r.sweep_id >= data.first_sweep])
        key = (problem.check, problem.status, problem.reason, streak_start(history, problem),
               changes >= FLAP_CHANGES)
        grouped[key].append((problem.host, changes))
    groups = []
    for (check, status, reason, since_sweep, flapping), members in grouped.items():
        since_row = sweeps_by_id.get(since_sweep)
        groups.append(Group(check, status, reason, tuple(_natural(host for host, _ in members)),
                            since_row.started_at if since_row else 0.0, since_sweep, flapping,
                            max(changes for _, changes in members)))
    groups.sort(key=lambda g: (PROBLEM_ORDER.get(g.status, 3), -len(g.hosts), g.check, g.reason))

    return Report(
        generated_at=now, since=since, sweeps=tuple(s for s in window if s.kind == SWEEP),
        counts=dict(counts), groups=tuple(groups),
        unanswered=_host_groups(r for r in current.values() if r.outcome in (TIMEOUT, ERROR)),
        not_swept=_host_groups((r for r in current.values() if r.outcome == NOT_SWEPT), by_state=True),
        drained=tuple(sorted(data.drains, key=lambda d: d.drained_at)),
        grid=build_grid(data.troubled, tuple(s for s in window if s.kind in (SWEEP, RECHECK)), tz,
                        {d.host for d in data.drains}),
        rechecks=tuple(s for s in window if s.kind == RECHECK), nodes=nodes,
        fleet=None if data.fleet is None else build_fleet(data.fleet))


def build_fleet(data: FleetData) -> Fleet:
    standings = judge_nodes(data.rule, data.strikes, data.strike_sweeps, data.served, data.users)
    by_host = {standing.host: standing.families for standing in standings}
    per_node: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for host, kind, job_count, events in data.counts:
        per_node[host][kind] = events if kind == DETECTION else job_count
    for failure in data.failed_sweeps:
        per_node[failure.host]["sweep"] += 1
    nodes = tuple(NodeFleet(host, c[EXCLUSION], c[DETECTION], c["sweep"], c[SERVED], by_host.get(host, ()))
                  for host in _natural(per_node) for c in (per_node[host],))
    lemons = tuple(lemons_of(data.rule, standings))
    shown = set(timeline_hosts(data.rule, standings))
    timelines: dict[str, list[TimelineItem]] = defaultdict(list)
    for event in data.timeline_events:
        if event.host in shown:
            text = {EXCLUSION: f"gate left it out: {event.detail or event.what}",
                    DETECTION: f"watch: {event.what}: {event.detail}", SERVED: "trained fine"}[event.kind]
            timelines[event.host].append(TimelineItem(event.at, f"job {event.job_id}", event.kind, text,
                                                      event.families))
    failed = {(failure.host, failure.sweep_id): failure for failure in data.strike_sweeps + data.failed_sweeps}
    for failure in failed.values():
        if failure.host in shown:
            timelines[failure.host].append(TimelineItem(failure.at, f"sweep #{failure.sweep_id}", "sweep failed",
                                                        failure.text, failed_check_families(failure.failed)))
    for host, sweep_id, at in data.timeline_passes:
        if host in shown:
            timelines[host].append(TimelineItem(at, f"sweep #{sweep_id}", "sweep passed", ""))
    for drain in data.timeline_drains:
        if drain.host in shown:
            timelines[drain.host].append(TimelineItem(drain.drained_at, "drain", "drained", drain.reason))
            if drain.closed_at is not None:
                timelines[drain.host].append(TimelineItem(drain.closed_at, "drain", "drain lifted", drain.closed_how))
    return Fleet(data.rule, nodes, lemons,
                 {host: tuple(sorted(items, key=lambda i: (i.at, i.source))) for host, items in timelines.items()},
                 cleared_nodes(data.rule, standings), too_few_users_nodes(data.rule, standings))


def _state(row: NodeRow) -> str:
    return (row.status or "unknown") if row.outcome == CHECKED else row.outcome


def streak_start(history: list[ResultRow], current: ResultRow) -> int:
    """The first sweep of the unbroken run of `current.status` that ends at `current`."""
    start = current.sweep_id
    for row in reversed([r for r in history if r.sweep_id <= current.sweep_id]):
        if row.status != current.status:
            break
        start = row.sweep_id
    return start


def status_changes(rows: list[ResultRow]) -> int:
    """How often the check went from ok to not ok or back, in sweep order."""
    bad = [row.status != "ok" for row in rows]
    return sum(1 for before, after in zip(bad, bad[1:]) if before != after)


def build_grid(rows: Iterable[NodeRow], window: tuple[SweepRow, ...], tz: datetime.tzinfo | None,
               drained: set[str] = frozenset()) -> Grid:
    """Node x night: each node's last verdict of each night, for nodes with trouble or a trainctl drain.

    The last verdict, not the worst: a node that failed the nightly sweep and passed its re-check
    the same day is green that day, as it is in the rest of the report.
    """
    night_of = {s.id: night(s.started_at, tz) for s in window}
    nights = tuple(sorted(set(night_of.values())))
    cells: dict[str, dict[str, str]] = defaultdict(dict)
    troubled = set(drained)
    for row in sorted(rows, key=lambda r: r.sweep_id):
        if row.sweep_id not in night_of:
            continue
        label = _state(row)
        cells[row.host][night_of[row.sweep_id]] = label
        if label in TROUBLE:
            troubled.add(row.host)
    hosts = _natural(troubled)
    shown = hosts[:GRID_MAX_ROWS]
    return Grid(nights, tuple((h, tuple(cells[h].get(n) for n in nights)) for h in shown),
                len(hosts) - len(shown))


def night(timestamp: float, tz: datetime.tzinfo | None) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz).strftime("%Y-%m-%d")


def _host_groups(rows: Iterable[NodeRow], by_state: bool = False) -> tuple[HostGroup, ...]:
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        label = row.slurm_state if by_state else row.outcome
        grouped[(label or "?", "" if by_state else row.detail)].append(row.host)
    return tuple(HostGroup(label, detail, tuple(_natural(hosts)))
                 for (label, detail), hosts in sorted(grouped.items(), key=lambda item: (-len(item[1]), item[0])))


def _natural(hosts: Iterable[str]) -> list[str]:
    """gpu2 before gpu10: natural order, Slurm's for names of one pattern (a sort key, because
    folding and expanding 10,000 names through ClusterShell costs seconds)."""
    return sorted(set(hosts), key=_natural_key)


def _natural_key(host: str) -> tuple[tuple[str, int], ...]:
    return tuple((text, int(number) if number else -1) for text, number in _NAME_PARTS.findall(host))
