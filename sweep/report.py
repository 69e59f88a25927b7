"""The drain report: what is broken now, grouped by check and reason, since when, and whether it flaps.

`load_report_data` reads the few rows a report needs from the history (newest row per
node, the checks that are not ok, their past rows, the open drains); `build_report` is a
pure function of those rows and `now`, so every rule below is tested without a database.

Rules:
- a node's current state is its newest row in the window: checked, timed out, error, or
  not swept (with Slurm's state);
- a group is the nodes whose current check has the same status and reason, the same
  streak start and the same flapping verdict;
- a streak is the unbroken run of the check's rows with the current status, counting
  only sweeps that checked the node (a night it was busy neither breaks nor extends it);
- a check flaps when, within the window, it changed between ok and not ok twice or more.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from trainctl.slurm import expand_hostlist, fold_hostlist
from trainctl.sweep.db import History
from trainctl.sweep.model import CHECKED, ERROR, NOT_SWEPT, TIMEOUT, DrainRow, NodeRow, ResultRow, SweepRow

GRID_MAX_ROWS = 200
FLAP_CHANGES = 2
# Worst first, for a grid cell that covers several sweeps of one night.
CELL_RANK = ("fail", TIMEOUT, ERROR, "unknown", "warn", "ok", NOT_SWEPT)
PROBLEM_ORDER = {"fail": 0, "unknown": 1, "warn": 2}


@dataclass(frozen=True)
class ReportData:
    sweeps: list[SweepRow]        # every sweep in the history (a few hundred rows a year)
    first_sweep: int              # the first sweep of the window
    current: list[NodeRow]        # each node's newest row in the window
    problems: list[ResultRow]     # checks not ok in those rows
    check_rows: list[ResultRow]   # every row ever of each (node, check) in `problems`
    troubled: list[NodeRow]       # window rows of the nodes that were not ok at least once
    drains: list[DrainRow]        # drains trainctl holds now


def load_report_data(history: History, since: float) -> ReportData:
    sweeps = history.sweeps()
    in_window = [s.id for s in sweeps if s.started_at >= since]
    first = min(in_window) if in_window else (sweeps[-1].id + 1 if sweeps else 1)
    problems = history.current_problems(first)
    return ReportData(
        sweeps=sweeps, first_sweep=first, current=history.current_nodes(first), problems=problems,
        check_rows=history.check_history((r.host, r.check) for r in problems),
        troubled=history.troubled_node_rows(first), drains=history.drains(open_only=True))


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

    @property
    def hostlist(self) -> str:
        return fold_hostlist(list(self.hosts))


@dataclass(frozen=True)
class HostGroup:
    """Nodes sharing one state and one explanation (not swept: allocated; timed out: ...)."""
    label: str
    detail: str
    hosts: tuple[str, ...]

    @property
    def hostlist(self) -> str:
        return fold_hostlist(list(self.hosts))


@dataclass(frozen=True)
class Grid:
    nights: tuple[str, ...]                                  # local dates, oldest first
    rows: tuple[tuple[str, tuple[str | None, ...]], ...]     # (host, cell per night; None: no row)
    hidden_rows: int                                         # troubled nodes beyond GRID_MAX_ROWS


@dataclass(frozen=True)
class Report:
    generated_at: float
    since: float
    sweeps: tuple[SweepRow, ...]                  # the sweeps of the window, oldest first
    counts: dict[str, int]                        # current nodes per status / outcome
    groups: tuple[Group, ...]
    unanswered: tuple[HostGroup, ...]             # timed out or no verdict
    not_swept: tuple[HostGroup, ...]
    drained: tuple[DrainRow, ...]
    grid: Grid = field(default_factory=lambda: Grid((), (), 0))

    @property
    def latest(self) -> SweepRow | None:
        return self.sweeps[-1] if self.sweeps else None

    @property
    def incomplete(self) -> tuple[SweepRow, ...]:
        return tuple(s for s in self.sweeps if not s.complete)


def build_report(data: ReportData, now: float, since: float,
                 tz: datetime.tzinfo | None = None) -> Report:
    sweeps_by_id = {s.id: s for s in data.sweeps}
    window = tuple(s for s in data.sweeps if s.id >= data.first_sweep)
    current = {row.host: row for row in data.current}

    counts: dict[str, int] = defaultdict(int)
    for row in current.values():
        counts[row.status if row.outcome == CHECKED else row.outcome] += 1

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
        generated_at=now, since=since, sweeps=window, counts=dict(counts), groups=tuple(groups),
        unanswered=_host_groups(r for r in current.values() if r.outcome in (TIMEOUT, ERROR)),
        not_swept=_host_groups((r for r in current.values() if r.outcome == NOT_SWEPT), by_state=True),
        drained=tuple(sorted(data.drains, key=lambda d: d.drained_at)),
        grid=build_grid(data.troubled, window, tz))


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


def build_grid(rows: Iterable[NodeRow], window: tuple[SweepRow, ...], tz: datetime.tzinfo | None) -> Grid:
    """Node x night: the worst thing that happened to each troubled node on each night."""
    night_of = {s.id: night(s.started_at, tz) for s in window}
    nights = tuple(sorted(set(night_of.values())))
    cells: dict[str, dict[str, str]] = defaultdict(dict)
    for row in rows:
        if row.sweep_id not in night_of:
            continue
        label = row.status if row.outcome == CHECKED else row.outcome
        day = night_of[row.sweep_id]
        previous = cells[row.host].get(day)
        if previous is None or CELL_RANK.index(label) < CELL_RANK.index(previous):
            cells[row.host][day] = label
    hosts = _natural(cells)
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
    """gpu2 before gpu10, as Slurm and ClusterShell order them."""
    hosts = list(hosts)
    return expand_hostlist(fold_hostlist(hosts)) if hosts else []
