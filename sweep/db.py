"""The sweep history: one SQLite file (stdlib sqlite3, WAL), written by sweeps, drains and resumes.

Tables: `sweeps` (one row per sweep; `finished_at` stays NULL when a sweep is killed),
`nodes` (one row per node and sweep: checked, timed out, error, or not swept with Slurm's
state), `results` (one row per node, check and sweep), `drains` (what trainctl drained, with
the exact reason it set), and `schema_version`. The file carries SQLite's application_id, so
a database of another program is recognised from its header and never written to.

Readers open the file read-only; writers check it (header, application id, schema version,
`PRAGMA quick_check`) through a read-only connection before opening it for writing, so a
corrupt or foreign file is refused without a single byte of it changing.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainctl.errors import TrainctlError, UsageError
from trainctl.sweep.model import CHECKED, DrainRow, NodeOutcome, NodeRow, ResultRow, SweepRow

APPLICATION_ID = 0x74635377      # "tcSw", in the header at offset 68
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
BUSY_TIMEOUT_S = 30.0            # a report may run while a sweep writes; WAL keeps both going
# WAL with synchronous=NORMAL never corrupts; a power cut loses at most the last commits, and
# a sweep commits once per node, so FULL would fsync thousands of times a night for nothing.
WAL_SYNCHRONOUS = "NORMAL"

SCHEMA = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES ({SCHEMA_VERSION});
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

# Each host's newest node row among the sweeps from :first_sweep on.
CURRENT_ROWS = """
SELECT n.sweep_id, n.host, n.outcome, n.status, n.slurm_state, n.detail, n.recorded_at
FROM nodes n JOIN (SELECT host, MAX(sweep_id) AS sid FROM nodes WHERE sweep_id >= :first_sweep
                   GROUP BY host) latest
ON n.host = latest.host AND n.sweep_id = latest.sid
"""


class History:
    """An open sweep history. Use `History.open(path, write=...)` as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path, writable: bool):
        self._conn = conn
        self.path = path
        self.writable = writable

    # -- opening
    @classmethod
    def open(cls, path: str | Path, *, write: bool = False) -> History:
        path = Path(path).expanduser()
        if not path.exists():
            if not write:
                raise UsageError(f"no sweep history at {path}",
                                 hint="run `trainctl sweep` first, or name the database with --db")
            return cls._create(path)
        inspect_file(path, thorough=write)
        try:
            conn = sqlite3.connect(path if write else _readonly_uri(path), uri=not write,
                                   timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise UsageError(f"{path}: cannot open sweep history: {exc}") from exc
        history = cls(conn, path, write)
        if write:
            history._execute("PRAGMA journal_mode = WAL")
            history._execute(f"PRAGMA synchronous = {WAL_SYNCHRONOUS}")
        return history

    @classmethod
    def _create(cls, path: Path) -> History:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise UsageError(f"cannot create sweep history {path}: {exc}") from exc
        # Schema and application_id first, in rollback mode: they reach the main file itself,
        # where the next open reads the id from the header (in WAL mode they would sit in -wal).
        conn.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {WAL_SYNCHRONOUS}")
        return cls(conn, path, True)

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
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise TrainctlError(f"{self.path}: database stayed locked for {BUSY_TIMEOUT_S:g} s "
                                    "(another sweep writing?)") from exc
            raise _damaged(self.path, exc) from exc
        except sqlite3.DatabaseError as exc:
            raise _damaged(self.path, exc) from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        if not self.writable:
            raise RuntimeError("history opened read-only")
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
        with self._transaction():
            cursor = self._execute(
                "INSERT INTO sweeps (kind, started_at, site, via, target, checks) VALUES (?, ?, ?, ?, ?, ?)",
                (kind, started_at, site, via, target, checks))
        return int(cursor.lastrowid)

    def set_slurm_job(self, sweep_id: int, job_id: str) -> None:
        with self._transaction():
            self._execute("UPDATE sweeps SET slurm_job_id = ? WHERE id = ?", (job_id, sweep_id))

    def record_node(self, sweep_id: int, node: NodeOutcome, recorded_at: float) -> None:
        """One node's outcome and its check rows, committed together."""
        with self._transaction():
            self._execute(
                "INSERT OR REPLACE INTO nodes (host, sweep_id, outcome, status, slurm_state, detail, "
                "duration_s, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (node.host, sweep_id, node.outcome, node.status, node.slurm_state, node.detail,
                 node.duration_s, recorded_at))
            self._execute(
                "INSERT OR REPLACE INTO results (host, sweep_id, check_name, status, reason, details, "
                "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(node.host, sweep_id, c.name, c.status, c.reason, json.dumps(c.details, sort_keys=True),
                  recorded_at) for c in node.checks], many=True)

    def finish_sweep(self, sweep_id: int, finished_at: float, error: str = "") -> None:
        with self._transaction():
            self._execute("UPDATE sweeps SET finished_at = ?, error = ? WHERE id = ?",
                          (finished_at, error, sweep_id))

    def record_drain(self, *, host: str, reason: str, reason_time: str, sweep_id: int, check: str,
                     drained_at: float) -> None:
        with self._transaction():
            self._execute("INSERT INTO drains (host, reason, reason_time, sweep_id, check_name, drained_at) "
                          "VALUES (?, ?, ?, ?, ?, ?)", (host, reason, reason_time, sweep_id, check, drained_at))

    def close_drain(self, drain_id: int, closed_at: float, how: str) -> None:
        with self._transaction():
            self._execute("UPDATE drains SET closed_at = ?, closed_how = ? WHERE id = ? AND closed_at IS NULL",
                          (closed_at, how, drain_id))

    # -- reading
    def sweeps(self) -> list[SweepRow]:
        rows = self._execute("SELECT id, kind, started_at, finished_at, site, via, target, checks, "
                             "slurm_job_id, error FROM sweeps ORDER BY id").fetchall()
        return [SweepRow(*row) for row in rows]

    def sweep_nodes(self, sweep_id: int) -> list[NodeRow]:
        rows = self._execute("SELECT sweep_id, host, outcome, status, slurm_state, detail, recorded_at "
                             "FROM nodes WHERE sweep_id = ? ORDER BY host", (sweep_id,)).fetchall()
        return [NodeRow(*row) for row in rows]

    def sweep_results(self, sweep_id: int) -> list[ResultRow]:
        rows = self._execute("SELECT sweep_id, host, check_name, status, reason, details FROM results "
                             "WHERE sweep_id = ? ORDER BY host, check_name", (sweep_id,)).fetchall()
        return [_result(row) for row in rows]

    def current_nodes(self, first_sweep: int) -> list[NodeRow]:
        """Each host's newest row among sweeps `first_sweep` and later."""
        rows = self._execute(CURRENT_ROWS, {"first_sweep": first_sweep}).fetchall()
        return [NodeRow(*row) for row in rows]

    def current_problems(self, first_sweep: int) -> list[ResultRow]:
        """Checks that are not ok in each host's newest row."""
        rows = self._execute(
            f"SELECT r.sweep_id, r.host, r.check_name, r.status, r.reason, r.details "
            f"FROM results r JOIN ({CURRENT_ROWS}) cur ON r.host = cur.host AND r.sweep_id = cur.sweep_id "
            f"WHERE r.status != 'ok'", {"first_sweep": first_sweep}).fetchall()
        return [_result(row) for row in rows]

    def check_history(self, pairs: Iterable[tuple[str, str]]) -> list[ResultRow]:
        """Every row ever recorded for each (host, check) pair, without details."""
        found = []
        for host, check in sorted(set(pairs)):
            found += self._execute(
                "SELECT sweep_id, host, check_name, status, reason, '{}' FROM results "
                "WHERE host = ? AND check_name = ? ORDER BY sweep_id", (host, check)).fetchall()
        return [_result(row) for row in found]

    def troubled_node_rows(self, first_sweep: int) -> list[NodeRow]:
        """All rows since `first_sweep` of the hosts that were not ok (not merely not swept) in one."""
        rows = self._execute(
            "SELECT sweep_id, host, outcome, status, slurm_state, detail, recorded_at FROM nodes "
            "WHERE sweep_id >= :first AND host IN (SELECT DISTINCT host FROM nodes WHERE sweep_id >= :first "
            "AND outcome != 'not_swept' AND (outcome != 'checked' OR status != 'ok'))",
            {"first": first_sweep}).fetchall()
        return [NodeRow(*row) for row in rows]

    def latest_checked_results(self) -> list[tuple[ResultRow, float]]:
        """Each host's results from the newest sweep that checked it (without details), and their time."""
        rows = self._execute(
            "SELECT r.sweep_id, r.host, r.check_name, r.status, r.reason, r.recorded_at FROM results r "
            "JOIN (SELECT host, MAX(sweep_id) AS sid FROM nodes WHERE outcome = ? GROUP BY host) latest "
            "ON r.host = latest.host AND r.sweep_id = latest.sid", (CHECKED,)).fetchall()
        return [(ResultRow(sweep_id, host, check, status, reason, {}), at)
                for sweep_id, host, check, status, reason, at in rows]

    def drains(self, *, open_only: bool = False) -> list[DrainRow]:
        where = "WHERE closed_at IS NULL" if open_only else ""
        rows = self._execute(f"SELECT id, host, reason, reason_time, sweep_id, check_name, drained_at, "
                             f"closed_at, closed_how FROM drains {where} ORDER BY id").fetchall()
        return [DrainRow(*row) for row in rows]


def inspect_file(path: Path, *, thorough: bool) -> None:
    """Refuse (UsageError, file untouched) anything but a readable trainctl history of a known schema."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(HEADER_BYTES)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read sweep history: {exc.strerror}") from exc
    if not header.startswith(SQLITE_MAGIC) or len(header) < HEADER_BYTES:
        raise UsageError(f"{path} is not a trainctl sweep history (not an SQLite database); left untouched")
    app_id = int.from_bytes(header[68:72], "big")
    if app_id != APPLICATION_ID:
        raise UsageError(f"{path} is an SQLite database of another program (application_id "
                         f"{app_id:#010x}, trainctl's is {APPLICATION_ID:#010x}); left untouched")
    try:
        conn = sqlite3.connect(_readonly_uri(path), uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            (version,) = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            if thorough:
                problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
                if problems != ["ok"]:
                    raise sqlite3.DatabaseError("; ".join(problems[:3]))
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise _damaged(path, exc) from exc
    if version != SCHEMA_VERSION:
        raise UsageError(f"{path}: sweep history schema version {version}; this trainctl reads version "
                         f"{SCHEMA_VERSION}", hint="use the trainctl that wrote it")


def _damaged(path: Path, exc: Exception) -> UsageError:
    return UsageError(f"{path}: damaged sweep history ({exc}); left untouched",
                      hint="move it aside or restore a backup; a new sweep starts a new history")


def _readonly_uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"


def _result(row: tuple) -> ResultRow:
    sweep_id, host, check, status, reason, details = row
    return ResultRow(sweep_id, host, check, status, reason, json.loads(details))
