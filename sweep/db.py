"""The sweep history: one SQLite file (stdlib sqlite3, WAL), written by sweeps, drains and resumes.

Tables: `sweeps` (one row per sweep; `finished_at` stays NULL when a sweep is killed),
`nodes` (one row per node and sweep: checked, timed out, error, or not swept with Slurm's
state), `results` (one row per node, check and sweep), `drains` (what trainctl drained, with
the exact reason it set), `jobs` and `job_events` (the jobs' verdicts on their nodes, folded in
from their journals by `trainctl.sweep.fleet`; version 2; since version 3 each job with its user,
`jobs.uid`; since version 4 each event with its failure families, `job_events.families`), and
`schema_version`. A version-1 history is read as one without job rows, a version-2 one as one
whose jobs' users are unknown, a version-2 or 3 one with its events' families found from their
text (`trainctl.sweep.db_rows.job_event_row_before_v4`); each is upgraded at its first write. The file carries SQLite's application_id, so
a database of another program is recognised from its header and never written to.

Every open goes through one verdict, `inspect_file`, on a read-only connection: the header and
application id, exactly trainctl's schema objects (a foreign trigger or view is refused by name),
the schema version. Readers then judge each row they read (`_sweep`, `_node`, `_result`,
`_drain`); writers, before their first write, also run `PRAGMA quick_check` and judge every row
of the file with those same functions (`check_every_row`, `trainctl.sweep.db_rows`), so a file a report calls damaged is
refused by a sweep with the same message, without a single byte of it changing.

A new history is built whole under a temporary name and linked into place, so two first sweeps
started together both find either nothing or a complete history.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sqlite3
import stat
import tempfile
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainctl.errors import TrainctlError, UsageError
from trainctl.files import open_regular, read_fd
from trainctl.text import printable
from trainctl.validate import check_node_name
from trainctl.sweep.db_rows import (JOB_EVENT_KINDS, check_every_row, damaged, drain_row, node_name_of, job_event_row,
                                    job_event_row_before_v4, job_row, node_row, result_row, sweep_row, text_of,
                                    time_of, user_of)
from trainctl.sweep.model import (CHECKED, DrainRow, JobEventRow, JobRow, NodeOutcome, NodeRow, ResultRow,
                                  SweepFailure, SweepRow)

APPLICATION_ID = 0x74635377      # "tcSw", in the header at offset 68
SCHEMA_VERSION = 4
FLEET_VERSION = 2            # the first version with jobs and job_events
USERS_VERSION = 3            # the first with jobs.uid (last of its columns: ALTER TABLE adds it there)
FAMILIES_VERSION = 4         # the first with job_events.families (last of its columns, likewise)
SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
BUSY_TIMEOUT_S = 30.0            # a report may run while a sweep writes; WAL keeps both going
# WAL with synchronous=NORMAL never corrupts; a power cut loses at most the last commits, and
# a sweep commits as its nodes answer, so FULL would fsync hundreds of times a night for nothing.
WAL_SYNCHRONOUS = "NORMAL"

# Jobs' verdicts: one `jobs` row per Slurm job whose journal was folded in (how much of it:
# `lines`, `size`), one `job_events` row per node an event names. The key (job, line, host) is
# what makes folding idempotent: the same journal, or a copy of it, adds nothing the second time.
FLEET_SCHEMA = """
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    status INTEGER,
    source TEXT NOT NULL,
    lines INTEGER NOT NULL,
    size INTEGER NOT NULL,
    ingested_at REAL NOT NULL,
    uid INTEGER
) WITHOUT ROWID;
CREATE TABLE job_events (
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    line INTEGER NOT NULL,
    host TEXT NOT NULL,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    what TEXT NOT NULL,
    detail TEXT NOT NULL,
    families TEXT,
    PRIMARY KEY (job_id, line, host)
) WITHOUT ROWID;
CREATE INDEX job_events_by_time ON job_events (at, kind, host, job_id);
CREATE INDEX job_events_by_host ON job_events (host, at);
"""
FLEET_TABLES = ("jobs", "job_events")

SCHEMA = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES ({SCHEMA_VERSION});
{FLEET_SCHEMA}
CREATE TABLE sweeps (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    site TEXT NOT NULL,
    via TEXT NOT NULL,
    target TEXT NOT NULL,
    checks TEXT NOT NULL,
    slurm_job_id TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT ''
);
CREATE TABLE nodes (
    host TEXT NOT NULL,
    sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    outcome TEXT NOT NULL,
    status TEXT,
    slurm_state TEXT NOT NULL,
    detail TEXT NOT NULL,
    duration_s REAL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (host, sweep_id)
) WITHOUT ROWID;
CREATE INDEX nodes_by_sweep ON nodes (sweep_id);
CREATE TABLE results (
    host TEXT NOT NULL,
    sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    check_name TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    details TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (host, sweep_id, check_name)
) WITHOUT ROWID;
CREATE TABLE drains (
    id INTEGER PRIMARY KEY,
    host TEXT NOT NULL,
    reason TEXT NOT NULL,
    reason_time TEXT NOT NULL,
    sweep_id INTEGER NOT NULL REFERENCES sweeps(id),
    check_name TEXT NOT NULL,
    drained_at REAL NOT NULL,
    closed_at REAL,
    closed_how TEXT NOT NULL DEFAULT ''
);
CREATE INDEX drains_by_host ON drains (host);
"""

# The breaker's rows (trainctl.sweep.breaker): its trips and an admin's resets are sweep rows of these
# kinds; a drain a shadow rule would have made, or a claim Slurm did not carry out, is a drain row
# closed with these, and does not count against the breaker's window.
BREAKER_TRIP = "breaker"
BREAKER_RESET = "breaker-reset"
SHADOW_CLOSE = "shadow: not drained ([breaker] shadow)"
REFUSED_CLOSE = "not drained: "

# One encoder for every row (json.dumps builds one per call); compact, keys sorted.
_DETAILS_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_FAMILIES_JSON = json.JSONEncoder(separators=(",", ":")).encode
BASE_TABLES = ("schema_version", "sweeps", "nodes", "results", "drains")
TABLES = BASE_TABLES + FLEET_TABLES
# SQLite's extended result codes that mean "you may not" or "not now", never "the file is bad".
ACCESS_ERRORS = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH", "SQLITE_IOERR_LOCK")
LOCK_ERRORS = ("SQLITE_BUSY", "SQLITE_LOCKED")

# Each host's newest node row among the sweeps from :first_sweep on.
CURRENT_ROWS = """
SELECT n.sweep_id, n.host, n.outcome, n.status, n.slurm_state, n.detail, n.recorded_at
FROM nodes n JOIN (SELECT host, MAX(sweep_id) AS sid FROM nodes WHERE sweep_id >= :first_sweep
                   GROUP BY host) latest
ON n.host = latest.host AND n.sweep_id = latest.sid
"""


@dataclass(frozen=True)
class Recorded:
    """What one `History.record_jobs` added: the jobs it wrote, and its new event rows."""
    jobs: tuple[str, ...]
    events: int


class History:
    """An open sweep history. Use `History.open(path, write=...)` as a context manager.

    One thread at a time: a sweep's writer thread uses it while the collector runs, never
    both at once (hence check_same_thread=False; SQLite itself is built serialized).
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, writable: bool, version: int = SCHEMA_VERSION):
        self._conn = conn
        self.path = path
        self.writable = writable
        self.version = version   # 1: no job tables (read as empty until the first write adds them)

    # -- opening
    @classmethod
    def open(cls, path: str | Path, *, write: bool = False, judged: tuple[str, ...] = TABLES) -> History:
        """`judged`: the tables whose every row a writer judges first (all of them, but for a writer
        that writes only the job tables: `history ingest` judges the file's pages and those tables,
        and leaves the sweeps' rows, which it neither reads nor writes, to the sweep)."""
        path = Path(path).expanduser()
        try:
            os.stat(path)
        except FileNotFoundError:
            if not write:
                raise UsageError(f"no sweep history at {path}",
                                 hint="run `trainctl sweep` first, or name the database with --db") from None
            _create(path)
        except OSError as exc:  # a directory this user cannot enter, a file where a directory should be
            raise UsageError(f"{path}: cannot {'write' if write else 'read'} sweep history: "
                             f"{exc.strerror or exc}") from exc
        readonly_uri, version = inspect_file(path, thorough=write, judged=judged)
        try:
            conn = sqlite3.connect(path if write else readonly_uri, uri=not write,
                                   timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _refused(path, exc, "open") from exc
        history = cls(conn, path, write, version)
        if write:
            history._execute("PRAGMA journal_mode = WAL")
            history._execute(f"PRAGMA synchronous = {WAL_SYNCHRONOUS}")
            if version < SCHEMA_VERSION:
                history._upgrade()
        return history

    def _upgrade(self) -> None:
        """To this version in one transaction (a reader sees the old schema or the new one): version 1
        gains the job tables, version 2 the jobs' users (unknown, NULL, for the jobs it already holds),
        versions 2 and 3 their events' families, found from the text the events kept."""
        with self.transaction():
            if self.version < FLEET_VERSION:
                for statement in FLEET_SCHEMA.split(";"):
                    if statement.strip():
                        self._execute(statement)
            else:
                if self.version < USERS_VERSION:
                    self._execute("ALTER TABLE jobs ADD COLUMN uid INTEGER")
                events = self.job_events(0.0, JOB_EVENT_KINDS)
                self._execute("ALTER TABLE job_events ADD COLUMN families TEXT")
                self._execute("UPDATE job_events SET families = ? WHERE job_id = ? AND line = ? AND host = ?",
                              [(_FAMILIES_JSON(list(e.families)), e.job_id, e.line, e.host) for e in events], many=True)
            self._execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        self.version = SCHEMA_VERSION

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- low level: every database error becomes one line that names the file
    def _execute(self, sql: str, params: Iterable | dict = (), *, many: bool = False) -> sqlite3.Cursor:
        try:
            return self._conn.executemany(sql, params) if many else self._conn.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise _refused(self.path, exc, "write" if self.writable else "read") from exc
        except UnicodeDecodeError as exc:  # sqlite3 decodes TEXT as UTF-8; trainctl never wrote anything else
            raise damaged(self.path, f"text that is not UTF-8 ({exc.reason})") from exc

    def _rows(self, sql: str, params: Iterable | dict = ()) -> list[tuple]:
        """All rows of a query: a damaged page can surface while fetching, not only when executing."""
        try:
            return self._execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _refused(self.path, exc, "write" if self.writable else "read") from exc
        except UnicodeDecodeError as exc:  # sqlite3 decodes TEXT as UTF-8; trainctl never wrote anything else
            raise damaged(self.path, f"text that is not UTF-8 ({exc.reason})") from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (BEGIN IMMEDIATE: the write lock is taken before the first read, so
        what is read inside is still true at the commit); the writes below join an open one."""
        if not self.writable:
            raise RuntimeError("history opened read-only")
        if self._conn.in_transaction:
            yield
            return
        self._execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.rollback()
            raise
        self._execute("COMMIT")

    # -- writing
    def start_sweep(self, *, kind: str, started_at: float, site: str, via: str, target: str,
                    checks: str) -> int:
        with self.transaction():
            cursor = self._execute(
                "INSERT INTO sweeps (kind, started_at, site, via, target, checks) VALUES (?, ?, ?, ?, ?, ?)",
                (kind, started_at, site, via, target, checks))
        return int(cursor.lastrowid)

    def set_slurm_job(self, sweep_id: int, job_id: str) -> None:
        with self.transaction():
            self._execute("UPDATE sweeps SET slurm_job_id = ? WHERE id = ?", (job_id, sweep_id))

    def record_nodes(self, sweep_id: int, nodes: Iterable[NodeOutcome], recorded_at: float) -> None:
        """Several nodes' outcomes and check rows in one transaction (the write lock is taken here,
        after the rows are built, and held only while SQLite writes them)."""
        nodes = list(nodes)
        for node in nodes:  # never a row this file's verdict would call damage (names come from Slurm or --nodes)
            check_node_name(node.host, "host")
        node_rows = [(node.host, sweep_id, node.outcome, node.status, node.slurm_state, node.detail,
                      node.duration_s, recorded_at) for node in nodes]
        result_rows = [(node.host, sweep_id, c.name, c.status, c.reason, _DETAILS_JSON(c.details), recorded_at)
                       for node in nodes for c in node.checks]
        with self.transaction():
            self._execute(
                "INSERT OR REPLACE INTO nodes (host, sweep_id, outcome, status, slurm_state, detail, "
                "duration_s, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", node_rows, many=True)
            self._execute(
                "INSERT OR REPLACE INTO results (host, sweep_id, check_name, status, reason, details, "
                "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)", result_rows, many=True)

    def finish_sweep(self, sweep_id: int, finished_at: float, error: str = "") -> None:
        with self.transaction():
            self._execute("UPDATE sweeps SET finished_at = ?, error = ? WHERE id = ?",
                          (finished_at, error, sweep_id))

    def record_drain(self, *, host: str, reason: str, reason_time: str, sweep_id: int, check: str,
                     drained_at: float) -> int:
        check_node_name(host, "host")
        with self.transaction():
            cursor = self._execute("INSERT INTO drains (host, reason, reason_time, sweep_id, check_name, drained_at) "
                                   "VALUES (?, ?, ?, ?, ?, ?)", (host, reason, reason_time, sweep_id, check, drained_at))
        return int(cursor.lastrowid)

    def settle_drain(self, drain_id: int, reason: str, reason_time: str) -> None:
        """A claimed drain made: the reason Slurm shows and its timestamp, read back."""
        with self.transaction():
            self._execute("UPDATE drains SET reason = ?, reason_time = ? WHERE id = ?", (reason, reason_time, drain_id))

    def record_breaker(self, kind: str, *, at: float, site: str, rule: str, target: str, line: str) -> None:
        """The breaker's trip (its line in `error`) or an admin's reset, as a sweep row that starts and ends at `at`."""
        with self.transaction():
            self._execute("INSERT INTO sweeps (kind, started_at, finished_at, site, via, target, checks, error) "
                          "VALUES (?, ?, ?, ?, ?, ?, '', ?)", (kind, at, at, site, rule, target, line))

    def close_drain(self, drain_id: int, closed_at: float, how: str) -> None:
        with self.transaction():
            self._execute("UPDATE drains SET closed_at = ?, closed_how = ? WHERE id = ? AND closed_at IS NULL",
                          (closed_at, how, drain_id))

    def prune(self, before: float) -> int:
        """Remove the sweeps started before `before` with their node and check rows, and the
        drains closed before it; a drain still held (or closed later) keeps its sweep, and the
        breaker's trips since its last reset stay. Returns
        the number of sweeps removed.

        SQLite keeps the freed pages in the file and the next sweeps write into them, so with a
        sweep a night the file stops growing at about `keep_days` sweeps; `vacuum()` gives the
        space back to the filesystem.
        """
        with self.transaction():
            self._execute("DELETE FROM drains WHERE closed_at IS NOT NULL AND closed_at < ?", (before,))
            # A job's rows go with it; its journal, if still in the drop directory, is not folded in
            # again (`trainctl.sweep.fleet` skips journals that started before the history keeps).
            self._execute("DELETE FROM job_events WHERE job_id IN (SELECT job_id FROM jobs WHERE started_at < ?)",
                          (before,))
            self._execute("DELETE FROM jobs WHERE started_at < ?", (before,))
            # A breaker trip no admin has reset yet stays: pruning must not close the breaker.
            old = [sweep_id for (sweep_id,) in self._rows(
                "SELECT id FROM sweeps WHERE started_at < ? AND id NOT IN (SELECT sweep_id FROM drains) "
                "AND NOT (kind = ? AND started_at >= (SELECT COALESCE(MAX(started_at), 0) FROM sweeps "
                "WHERE kind = ?)) ORDER BY id", (before, BREAKER_TRIP, BREAKER_RESET))]
            for sweep_id in old:
                # results has no index by sweep: reach its rows through the sweep's nodes (primary key prefix)
                hosts = self._rows("SELECT host FROM nodes WHERE sweep_id = ?", (sweep_id,))
                self._execute("DELETE FROM results WHERE host = ? AND sweep_id = ?",
                              [(host, sweep_id) for (host,) in hosts], many=True)
                self._execute("DELETE FROM nodes WHERE sweep_id = ?", (sweep_id,))
                self._execute("DELETE FROM sweeps WHERE id = ?", (sweep_id,))
        return len(old)

    def vacuum(self) -> None:
        """Rewrite the file without its free pages (needs the file's size again in free disk, and
        holds the write lock while it runs: not while a sweep writes)."""
        if not self.writable:
            raise RuntimeError("history opened read-only")
        self._execute("VACUUM")
        self._execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- reading
    def sweeps(self) -> list[SweepRow]:
        rows = self._rows("SELECT id, kind, started_at, finished_at, site, via, target, checks, "
                          "slurm_job_id, error FROM sweeps ORDER BY id")
        return [sweep_row(self.path, row) for row in rows]

    def sweep_nodes(self, sweep_id: int) -> list[NodeRow]:
        rows = self._rows("SELECT sweep_id, host, outcome, status, slurm_state, detail, recorded_at "
                          "FROM nodes WHERE sweep_id = ? ORDER BY host", (sweep_id,))
        return [node_row(self.path, row) for row in rows]

    def sweep_results(self, sweep_id: int) -> list[ResultRow]:
        rows = self._rows("SELECT sweep_id, host, check_name, status, reason, details FROM results "
                          "WHERE sweep_id = ? ORDER BY host, check_name", (sweep_id,))
        return [result_row(self.path, row) for row in rows]

    def current_nodes(self, first_sweep: int) -> list[NodeRow]:
        """Each host's newest row among sweeps `first_sweep` and later."""
        rows = self._rows(CURRENT_ROWS, {"first_sweep": first_sweep})
        return [node_row(self.path, row) for row in rows]

    def current_problems(self, first_sweep: int) -> list[ResultRow]:
        """Checks that are not ok in each host's newest row."""
        rows = self._rows(
            f"SELECT r.sweep_id, r.host, r.check_name, r.status, r.reason, r.details "
            f"FROM results r JOIN ({CURRENT_ROWS}) cur ON r.host = cur.host AND r.sweep_id = cur.sweep_id "
            f"WHERE r.status != 'ok'", {"first_sweep": first_sweep})
        return [result_row(self.path, row) for row in rows]

    def check_history(self, pairs: Iterable[tuple[str, str]]) -> list[ResultRow]:
        """Every row ever recorded for each (host, check) pair, without details."""
        found = []
        for host, check in sorted(set(pairs)):
            found += self._rows(
                "SELECT sweep_id, host, check_name, status, reason, '{}' FROM results "
                "WHERE host = ? AND check_name = ? ORDER BY sweep_id", (host, check))
        return [result_row(self.path, row) for row in found]

    def troubled_node_rows(self, first_sweep: int, also_hosts: Iterable[str] = ()) -> list[NodeRow]:
        """All rows since `first_sweep` of the hosts that were not ok (not merely not swept) in one,
        and of `also_hosts` (the nodes trainctl holds drained, whose trouble may predate the window)."""
        # Two steps: the troubled hosts (one pass over the window's node rows), then their rows by
        # primary key. As one query with `host IN (subquery)` it took 10x longer at 10,000 nodes.
        troubled = self._rows(
            "SELECT DISTINCT host FROM nodes WHERE sweep_id >= ? AND outcome != 'not_swept' "
            "AND (outcome != 'checked' OR status != 'ok')", (first_sweep,))
        hosts = sorted({host for (host,) in troubled} | set(also_hosts))
        rows = self._rows(
            "SELECT sweep_id, host, outcome, status, slurm_state, detail, recorded_at FROM nodes "
            "WHERE host IN (SELECT value FROM json_each(?)) AND sweep_id >= ?", (json.dumps(hosts), first_sweep))
        return [node_row(self.path, row) for row in rows]

    def latest_checked_results(self) -> list[tuple[ResultRow, float]]:
        """Each host's results from the newest sweep that checked it (without details), and their time."""
        rows = self._rows(
            "SELECT r.sweep_id, r.host, r.check_name, r.status, r.reason, r.recorded_at FROM results r "
            "JOIN (SELECT host, MAX(sweep_id) AS sid FROM nodes WHERE outcome = ? GROUP BY host) latest "
            "ON r.host = latest.host AND r.sweep_id = latest.sid", (CHECKED,))
        return [(result_row(self.path, (sweep_id, host, check, status, reason, "{}")), time_of(self.path, at, "recorded_at"))
                for sweep_id, host, check, status, reason, at in rows]

    def previous_details(self, host: str, check: str, before_sweep: int) -> tuple[int, dict] | None:
        """The details of `check` on `host` from the newest earlier sweep that judged it (not unknown)."""
        row = self._execute(
            "SELECT sweep_id, details FROM results WHERE host = ? AND check_name = ? AND sweep_id < ? "
            "AND status != 'unknown' ORDER BY sweep_id DESC LIMIT 1", (host, check, before_sweep)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    def breaker_reset_at(self) -> float:
        """When an admin last closed the breaker (0.0: never)."""
        row = self._rows("SELECT MAX(started_at) FROM sweeps WHERE kind = ?", (BREAKER_RESET,))[0]
        return 0.0 if row[0] is None else time_of(self.path, row[0], "breaker reset")

    def breaker_trips(self, since: float) -> list[SweepRow]:
        """The breaker's trips since `since`, oldest first."""
        rows = self._rows("SELECT id, kind, started_at, finished_at, site, via, target, checks, slurm_job_id, error "
                          "FROM sweeps WHERE kind = ? AND started_at >= ? ORDER BY id", (BREAKER_TRIP, since))
        return [sweep_row(self.path, row) for row in rows]

    def drains_made(self, since: float) -> int:
        """Drains trainctl made (or has claimed) since `since`: not a shadow rule's, not one Slurm refused."""
        return int(self._rows("SELECT COUNT(*) FROM drains WHERE drained_at >= ? AND closed_how != ? "
                              "AND closed_how NOT LIKE ?", (since, SHADOW_CLOSE, REFUSED_CLOSE + "%"))[0][0])

    def drains(self, *, open_only: bool = False) -> list[DrainRow]:
        where = "WHERE closed_at IS NULL" if open_only else ""
        rows = self._rows(f"SELECT id, host, reason, reason_time, sweep_id, check_name, drained_at, "
                          f"closed_at, closed_how FROM drains {where} ORDER BY id")
        return [drain_row(self.path, row) for row in rows]

    # -- jobs' verdicts (trainctl.sweep.fleet folds the journals in)
    def folded_jobs(self) -> dict[str, JobRow]:
        """Every job folded in so far, by id (a few tens of thousands of short rows a month)."""
        if self.version < FLEET_VERSION:
            return {}
        rows = self._rows("SELECT job_id, site, started_at, ended_at, status, source, lines, size, ingested_at, "
                          f"{'uid' if self.version >= USERS_VERSION else 'NULL'} FROM jobs")
        return {row[0]: job_row(self.path, row) for row in rows}

    def job_users(self, job_ids: Iterable[str]) -> dict[str, int | None]:
        """The user of each of `job_ids` folded in (None: folded in before the history kept users)."""
        if self.version < FLEET_VERSION:
            return {}
        rows = self._rows(f"SELECT job_id, {'uid' if self.version >= USERS_VERSION else 'NULL'} FROM jobs "
                          "WHERE job_id IN (SELECT value FROM json_each(?))", (json.dumps(sorted(set(job_ids))),))
        return {text_of(self.path, job_id, "jobs.job_id"): user_of(self.path, job_id, uid) for job_id, uid in rows}

    def record_jobs(self, jobs: list[tuple[JobRow, list[JobEventRow]]]) -> Recorded:
        """Jobs and their events in one transaction; an event already there (same job, line and
        host) is kept as it was, so folding a journal twice adds nothing. A job that a fold beside
        this one recorded first, as far (as many lines), is left as it was; what this call added is
        returned, so two folds at once each count only their own."""
        for _, events in jobs:
            for event in events:
                check_node_name(event.host, "host")
        with self.transaction():
            ids = [job.job_id for job, _ in jobs]
            have = dict(self._rows(f"SELECT job_id, lines FROM jobs WHERE job_id IN ({', '.join('?' * len(ids))})",
                                   ids))
            jobs = [(job, events) for job, events in jobs if not have.get(job.job_id, -1) >= job.lines]
            self._execute("INSERT OR REPLACE INTO jobs (job_id, site, started_at, ended_at, status, source, lines, "
                          "size, ingested_at, uid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          [(job.job_id, job.site, job.started_at, job.ended_at, job.status, job.source, job.lines,
                            job.size, job.ingested_at, job.uid) for job, _ in jobs], many=True)
            before = self._conn.total_changes
            self._execute("INSERT OR IGNORE INTO job_events (job_id, line, host, kind, at, what, detail, families) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          ((e.job_id, e.line, e.host, e.kind, e.at, e.what, e.detail, _FAMILIES_JSON(list(e.families)))
                           for _, events in jobs for e in events), many=True)
            added = self._conn.total_changes - before
        return Recorded(tuple(job.job_id for job, _ in jobs), added)

    def known_hosts(self) -> set[str]:
        """Every node a sweep recorded or a job's verdict named: the nodes the history knows."""
        rows = self._rows("SELECT host FROM nodes UNION SELECT host FROM job_events" if self.version >= FLEET_VERSION
                          else "SELECT DISTINCT host FROM nodes")
        return {node_name_of(self.path, host) for (host,) in rows}

    def job_counts(self, since: float) -> list[tuple[str, str, int, int]]:
        """(host, kind, distinct jobs, events) of the job events from `since` on."""
        if self.version < FLEET_VERSION:
            return []
        rows = self._rows("SELECT host, kind, COUNT(DISTINCT job_id), COUNT(*) FROM job_events WHERE at >= ? "
                          "GROUP BY host, kind", (since,))
        for host, kind, *_ in rows:
            node_name_of(self.path, host)
            if kind not in JOB_EVENT_KINDS:
                raise damaged(self.path, f"job event kind {printable(str(kind)[:40])!r} unknown")
        return rows

    def job_events(self, since: float, kinds: Iterable[str], hosts: Iterable[str] | None = None) -> list[JobEventRow]:
        """The job events of `kinds` from `since` on (of `hosts` only, if given), oldest first."""
        if self.version < FLEET_VERSION:
            return []
        kinds = sorted(set(kinds))
        stored = self.version >= FAMILIES_VERSION
        sql = (f"SELECT job_id, line, host, kind, at, what, detail{', families' if stored else ''} FROM job_events "
               "WHERE at >= ? AND kind IN (SELECT value FROM json_each(?))")
        params: tuple = (since, json.dumps(kinds))
        if hosts is not None:
            sql += " AND host IN (SELECT value FROM json_each(?))"
            params += (json.dumps(sorted(set(hosts))),)
        read = job_event_row if stored else job_event_row_before_v4
        return [read(self.path, row) for row in self._rows(sql + " ORDER BY at, job_id, line", params)]

    def served_jobs(self, since: float, hosts: Iterable[str]) -> list[tuple[str, str, float]]:
        """(host, job, when it last served that job) for every job `hosts` served from `since` on."""
        if self.version < FLEET_VERSION:
            return []
        rows = self._rows("SELECT host, job_id, MAX(at) FROM job_events WHERE kind = 'served' AND at >= ? "
                          "AND host IN (SELECT value FROM json_each(?)) GROUP BY host, job_id",
                          (since, json.dumps(sorted(set(hosts)))))
        return [(node_name_of(self.path, host), text_of(self.path, job_id, "job_events.job_id"),
                 time_of(self.path, at, f"job {job_id} served_at")) for host, job_id, at in rows]

    def sweep_failures(self, since: float, hosts: Iterable[str] | None = None) -> list[SweepFailure]:
        """Every full sweep from `since` on that a node failed, with the checks it failed (a row each,
        grouped here: the reasons are never joined into one text to be split again), oldest first."""
        sql = ("SELECT n.host, n.sweep_id, s.started_at, r.check_name, r.reason "
               "FROM nodes n JOIN sweeps s ON s.id = n.sweep_id "
               "LEFT JOIN results r ON r.host = n.host AND r.sweep_id = n.sweep_id AND r.status = 'fail' "
               "WHERE s.kind = 'sweep' AND s.started_at >= ? AND n.outcome = 'checked' AND n.status = 'fail'")
        params: tuple = (since,)
        if hosts is not None:
            sql += " AND n.host IN (SELECT value FROM json_each(?))"
            params += (json.dumps(sorted(set(hosts))),)
        failures: dict[tuple[str, int], SweepFailure] = {}
        for host, sweep_id, at, check, reason in self._rows(sql + " ORDER BY s.started_at, n.sweep_id, n.host, "
                                                            "r.check_name", params):
            failure = failures.get((host, sweep_id)) or SweepFailure(
                node_name_of(self.path, host), sweep_id, time_of(self.path, at, f"sweep #{sweep_id} started_at"), ())
            if check is not None:
                where = f"check of {host!r} in sweep #{sweep_id}"
                failure = dataclasses.replace(failure, failed=failure.failed + (
                    (text_of(self.path, check, where), text_of(self.path, reason, where)),))
            failures[host, sweep_id] = failure
        return list(failures.values())

    def sweep_passes(self, since: float, hosts: Iterable[str]) -> list[tuple[str, int, float]]:
        """(host, sweep, its start) for every full sweep from `since` on that `hosts` passed (ok or warn)."""
        rows = self._rows(
            "SELECT n.host, n.sweep_id, s.started_at FROM nodes n JOIN sweeps s ON s.id = n.sweep_id "
            "WHERE s.kind = 'sweep' AND s.started_at >= ? AND n.outcome = 'checked' AND n.status IN ('ok', 'warn') "
            "AND n.host IN (SELECT value FROM json_each(?)) ORDER BY s.started_at",
            (since, json.dumps(sorted(set(hosts)))))
        return [(node_name_of(self.path, host), sweep_id, time_of(self.path, at, f"sweep #{sweep_id} started_at"))
                for host, sweep_id, at in rows]


def _create(path: Path) -> None:
    """A new, empty history at `path`, or nothing if another process made one meanwhile.

    Built under a temporary name in the same directory and hard-linked into place: the link
    appears whole or not at all and never replaces a file, so a sweep started at the same moment
    finds no file, or a complete history (never an empty or half-written file).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
        os.close(fd)
    except OSError as exc:
        raise UsageError(f"cannot create sweep history {path}: {exc.strerror or exc}") from exc
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            # Schema and application_id in rollback mode: they reach the main file itself, where
            # the next open reads the id from the header; WAL mode is then recorded in the header.
            conn.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")
            conn.execute("PRAGMA journal_mode = WAL")
        finally:
            conn.close()  # the last connection: checkpoints and removes the temporary -wal and -shm
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another first sweep linked its history first: this one opens that
    except (OSError, sqlite3.Error) as exc:
        raise UsageError(f"cannot create sweep history {path}: {exc}") from exc
    finally:
        for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm"):
            with contextlib.suppress(OSError):
                os.unlink(leftover)


def inspect_file(path: Path, *, thorough: bool, judged: tuple[str, ...] = TABLES) -> tuple[str, int]:
    """Refuse (UsageError, file untouched) anything but a readable trainctl history of a known schema.

    Returns the URI a reader opens it with, and the schema version: read-only, and where this user may not create the
    `-shm` file beside it (a root-owned history read by anyone) and no write-ahead log is
    pending, `immutable`: everything is in the main file, so nothing needs the shared memory.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"{path}: cannot read sweep history: {exc.strerror}") from exc
    if not stat.S_ISREG(mode):  # a FIFO would block the open below forever; a device is not a history
        raise UsageError(f"{path} is not a regular file, so not a sweep history; left untouched")
    try:   # never blocks: a FIFO swapped in since the stat is refused as the FIFO above is
        fd = open_regular(path)
        if fd is None:
            raise UsageError(f"{path} is not a regular file, so not a sweep history; left untouched")
        try:
            header = read_fd(fd, HEADER_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read sweep history: {exc.strerror}") from exc
    if not header.startswith(SQLITE_MAGIC) or len(header) < HEADER_BYTES:
        raise UsageError(f"{path} is not a trainctl sweep history (not an SQLite database); left untouched")
    app_id = int.from_bytes(header[68:72], "big")
    if app_id != APPLICATION_ID:
        raise UsageError(f"{path} is an SQLite database of another program (application_id "
                         f"{app_id:#010x}, trainctl's is {APPLICATION_ID:#010x}); left untouched")
    uri = _readonly_uri(path)
    try:
        try:
            version = _look_inside(uri, path, thorough, judged)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_READONLY_DIRECTORY", "SQLITE_CANTOPEN") \
                    or _wal_pending(path):
                raise
            uri += "&immutable=1"
            version = _look_inside(uri, path, thorough, judged)
    except sqlite3.DatabaseError as exc:
        raise _refused(path, exc, "read") from exc
    except UnicodeDecodeError as exc:
        raise damaged(path, f"text that is not UTF-8 ({exc.reason})") from exc
    return uri, version


def _look_inside(uri: str, path: Path, thorough: bool, judged: tuple[str, ...] = TABLES) -> int:
    """The verdict on an open file: its schema objects, version and (`thorough`, for a writer)
    its pages and every row; returns the version. Raises UsageError; sqlite3 errors go to the caller."""
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        objects = {(kind, name): table for kind, name, table in
                   conn.execute("SELECT type, name, tbl_name FROM sqlite_master")}
        tables = {name for kind, name in objects if kind == "table"}
        # A version-1 history has no job tables; with any of them it must have all of them.
        expected_tables = TABLES if tables & set(FLEET_TABLES) else BASE_TABLES
        missing = [name for name in expected_tables if name not in tables]
        if missing:
            raise UsageError(f"{path}: not a complete trainctl sweep history (no table {', '.join(missing)}); "
                             "left untouched", hint="move it aside or restore a backup")
        expected = _expected_objects() if expected_tables == TABLES else _expected_objects(BASE_TABLES)
        foreign = sorted(objects.keys() - expected.keys()) or sorted(
            key for key, table in objects.items() if expected[key] != table)
        if foreign:
            kind, name = foreign[0]
            raise UsageError(f"{path}: the sweep history holds a {kind} {name!r} that trainctl never creates "
                             f"(on {objects[foreign[0]]!r}); left untouched",
                             hint="drop it, or move the file aside and restore a backup")
        version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        # Version 1 has exactly the base tables; versions 2 to 4 all of them (2 without jobs.uid, 2 and 3
        # without job_events.families).
        if (version, expected_tables) not in ((1, BASE_TABLES), (FLEET_VERSION, TABLES), (USERS_VERSION, TABLES),
                                              (SCHEMA_VERSION, TABLES)):
            raise UsageError(f"{path}: sweep history schema version {version}; this trainctl reads versions "
                             f"1 to {SCHEMA_VERSION}", hint="use the trainctl that wrote it")
        for table in expected_tables:
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            if columns != _expected_columns(version)[table]:
                raise UsageError(f"{path}: the sweep history's table {table} has columns {columns}, not "
                                 f"trainctl's {_expected_columns(version)[table]}; left untouched",
                                 hint="use the trainctl that wrote it, or restore a backup")
        problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()] if thorough else ["ok"]
        if problems != ["ok"]:
            raise damaged(path, "; ".join(problems[:3]))
        if thorough:
            check_every_row(conn, path, tuple(t for t in expected_tables if t in judged), users=version >= USERS_VERSION,
                            families=version >= FAMILIES_VERSION)
        return version
    finally:
        conn.close()


@functools.cache
def _schema_in_memory() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    conn.executescript(SCHEMA)
    return conn


@functools.cache
def _expected_objects(tables: tuple[str, ...] = TABLES) -> dict[tuple[str, str], str]:
    """(type, name) -> table of every schema object trainctl creates on `tables`, SQLite's own indexes included."""
    return {(kind, name): table for kind, name, table in
            _schema_in_memory().execute("SELECT type, name, tbl_name FROM sqlite_master") if table in tables}


@functools.cache
def _expected_columns(version: int = SCHEMA_VERSION) -> dict[str, list[str]]:
    """Each table's columns in a history of `version` (before USERS_VERSION, jobs has no uid; before
    FAMILIES_VERSION, job_events has no families)."""
    columns = {table: [row[1] for row in _schema_in_memory().execute(f"PRAGMA table_info({table})")]
               for table in TABLES}
    if version < USERS_VERSION:
        columns["jobs"].remove("uid")
    if version < FAMILIES_VERSION:
        columns["job_events"].remove("families")
    return columns


def _wal_pending(path: Path) -> bool:
    """A non-empty write-ahead log holds commits the main file does not have yet."""
    try:
        return os.stat(f"{path}-wal").st_size > 0
    except OSError:
        return False


def _refused(path: Path, exc: sqlite3.Error, doing: str) -> TrainctlError:
    """A lock is a lock (exit 4), no access is no access (exit 2); only a bad file is called damaged."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(LOCK_ERRORS) or "locked" in str(exc):
        return TrainctlError(f"{path}: sweep history stayed locked for {BUSY_TIMEOUT_S:g} s "
                             "(another sweep writing?)")
    if name.startswith(ACCESS_ERRORS):
        return UsageError(f"{path}: cannot {doing} sweep history: {exc} ({name})",
                          hint=f"{doing} access to the file and its directory is needed" if doing == "write"
                          else "read access to the file is needed")
    return damaged(path, exc)


def _readonly_uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
