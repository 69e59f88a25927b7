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
import os
import sqlite3
import stat
import urllib.parse
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainctl.errors import TrainctlError, UsageError
from trainctl.sweep.model import (CHECKED, ERROR, NOT_SWEPT, STATUSES, TIMEOUT, DrainRow, NodeOutcome, NodeRow,
                                   ResultRow, SweepRow)

APPLICATION_ID = 0x74635377      # "tcSw", in the header at offset 68
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
BUSY_TIMEOUT_S = 30.0            # a report may run while a sweep writes; WAL keeps both going
# WAL with synchronous=NORMAL never corrupts; a power cut loses at most the last commits, and
# a sweep commits as its nodes answer, so FULL would fsync hundreds of times a night for nothing.
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

# One encoder for every row (json.dumps builds one per call); compact, keys sorted.
_DETAILS_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
TABLES = ("schema_version", "sweeps", "nodes", "results", "drains")
OUTCOMES = (CHECKED, TIMEOUT, ERROR, NOT_SWEPT)
LATEST_TIME = 253402300799.0     # 9999-12-31: later than any sweep, and datetime can still show it
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


class History:
    """An open sweep history. Use `History.open(path, write=...)` as a context manager.

    One thread at a time: a sweep's writer thread uses it while the collector runs, never
    both at once (hence check_same_thread=False; SQLite itself is built serialized).
    """

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
        readonly_uri = inspect_file(path, thorough=write)
        try:
            conn = sqlite3.connect(path if write else readonly_uri, uri=not write,
                                   timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _refused(path, exc, "open") from exc
        history = cls(conn, path, write)
        if write:
            history._execute("PRAGMA journal_mode = WAL")
            history._execute(f"PRAGMA synchronous = {WAL_SYNCHRONOUS}")
        return history

    @classmethod
    def _create(cls, path: Path) -> History:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
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
        except sqlite3.DatabaseError as exc:
            raise _refused(self.path, exc, "write" if self.writable else "read") from exc
        except UnicodeDecodeError as exc:  # sqlite3 decodes TEXT as UTF-8; trainctl never wrote anything else
            raise _damaged(self.path, f"text that is not UTF-8 ({exc.reason})") from exc

    def _rows(self, sql: str, params: Iterable | dict = ()) -> list[tuple]:
        """All rows of a query: a damaged page can surface while fetching, not only when executing."""
        try:
            return self._execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _refused(self.path, exc, "write" if self.writable else "read") from exc
        except UnicodeDecodeError as exc:  # sqlite3 decodes TEXT as UTF-8; trainctl never wrote anything else
            raise _damaged(self.path, f"text that is not UTF-8 ({exc.reason})") from exc

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
        self.record_nodes(sweep_id, [node], recorded_at)

    def record_nodes(self, sweep_id: int, nodes: Iterable[NodeOutcome], recorded_at: float) -> None:
        """Several nodes' outcomes and check rows in one transaction (the write lock is taken here,
        after the rows are built, and held only while SQLite writes them)."""
        nodes = list(nodes)
        node_rows = [(node.host, sweep_id, node.outcome, node.status, node.slurm_state, node.detail,
                      node.duration_s, recorded_at) for node in nodes]
        result_rows = [(node.host, sweep_id, c.name, c.status, c.reason, _DETAILS_JSON(c.details), recorded_at)
                       for node in nodes for c in node.checks]
        with self._transaction():
            self._execute(
                "INSERT OR REPLACE INTO nodes (host, sweep_id, outcome, status, slurm_state, detail, "
                "duration_s, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", node_rows, many=True)
            self._execute(
                "INSERT OR REPLACE INTO results (host, sweep_id, check_name, status, reason, details, "
                "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)", result_rows, many=True)

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

    def prune(self, before: float) -> int:
        """Remove the sweeps started before `before` with their node and check rows, and the
        drains closed before it; a drain still held (or closed later) keeps its sweep. Returns
        the number of sweeps removed.

        SQLite keeps the freed pages in the file and the next sweeps write into them, so with a
        sweep a night the file stops growing at about `keep_days` sweeps; `vacuum()` gives the
        space back to the filesystem.
        """
        with self._transaction():
            self._execute("DELETE FROM drains WHERE closed_at IS NOT NULL AND closed_at < ?", (before,))
            old = [sweep_id for (sweep_id,) in self._rows(
                "SELECT id FROM sweeps WHERE started_at < ? AND id NOT IN (SELECT sweep_id FROM drains) "
                "ORDER BY id", (before,))]
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
        return [_sweep(self.path, row) for row in rows]

    def sweep_nodes(self, sweep_id: int) -> list[NodeRow]:
        rows = self._rows("SELECT sweep_id, host, outcome, status, slurm_state, detail, recorded_at "
                          "FROM nodes WHERE sweep_id = ? ORDER BY host", (sweep_id,))
        return [_node(self.path, row) for row in rows]

    def sweep_results(self, sweep_id: int) -> list[ResultRow]:
        rows = self._rows("SELECT sweep_id, host, check_name, status, reason, details FROM results "
                          "WHERE sweep_id = ? ORDER BY host, check_name", (sweep_id,))
        return [_result(self.path, row) for row in rows]

    def current_nodes(self, first_sweep: int) -> list[NodeRow]:
        """Each host's newest row among sweeps `first_sweep` and later."""
        rows = self._rows(CURRENT_ROWS, {"first_sweep": first_sweep})
        return [_node(self.path, row) for row in rows]

    def current_problems(self, first_sweep: int) -> list[ResultRow]:
        """Checks that are not ok in each host's newest row."""
        rows = self._rows(
            f"SELECT r.sweep_id, r.host, r.check_name, r.status, r.reason, r.details "
            f"FROM results r JOIN ({CURRENT_ROWS}) cur ON r.host = cur.host AND r.sweep_id = cur.sweep_id "
            f"WHERE r.status != 'ok'", {"first_sweep": first_sweep})
        return [_result(self.path, row) for row in rows]

    def check_history(self, pairs: Iterable[tuple[str, str]]) -> list[ResultRow]:
        """Every row ever recorded for each (host, check) pair, without details."""
        found = []
        for host, check in sorted(set(pairs)):
            found += self._rows(
                "SELECT sweep_id, host, check_name, status, reason, '{}' FROM results "
                "WHERE host = ? AND check_name = ? ORDER BY sweep_id", (host, check))
        return [_result(self.path, row) for row in found]

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
        return [_node(self.path, row) for row in rows]

    def latest_checked_results(self) -> list[tuple[ResultRow, float]]:
        """Each host's results from the newest sweep that checked it (without details), and their time."""
        rows = self._rows(
            "SELECT r.sweep_id, r.host, r.check_name, r.status, r.reason, r.recorded_at FROM results r "
            "JOIN (SELECT host, MAX(sweep_id) AS sid FROM nodes WHERE outcome = ? GROUP BY host) latest "
            "ON r.host = latest.host AND r.sweep_id = latest.sid", (CHECKED,))
        return [(_result(self.path, (sweep_id, host, check, status, reason, "{}")), _time(self.path, at, "recorded_at"))
                for sweep_id, host, check, status, reason, at in rows]

    def previous_details(self, host: str, check: str, before_sweep: int) -> tuple[int, dict] | None:
        """The details of `check` on `host` from the newest earlier sweep that judged it (not unknown)."""
        row = self._execute(
            "SELECT sweep_id, details FROM results WHERE host = ? AND check_name = ? AND sweep_id < ? "
            "AND status != 'unknown' ORDER BY sweep_id DESC LIMIT 1", (host, check, before_sweep)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]))

    def drains(self, *, open_only: bool = False) -> list[DrainRow]:
        where = "WHERE closed_at IS NULL" if open_only else ""
        rows = self._rows(f"SELECT id, host, reason, reason_time, sweep_id, check_name, drained_at, "
                          f"closed_at, closed_how FROM drains {where} ORDER BY id")
        return [_drain(self.path, row) for row in rows]


def inspect_file(path: Path, *, thorough: bool) -> str:
    """Refuse (UsageError, file untouched) anything but a readable trainctl history of a known schema.

    Returns the URI a reader opens it with: read-only, and where this user may not create the
    `-shm` file beside it (a root-owned history read by anyone) and no write-ahead log is
    pending, `immutable`: everything is in the main file, so nothing needs the shared memory.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"{path}: cannot read sweep history: {exc.strerror}") from exc
    if not stat.S_ISREG(mode):  # a FIFO would block the open below forever; a device is not a history
        raise UsageError(f"{path} is not a regular file, so not a sweep history; left untouched")
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
    uri = _readonly_uri(path)
    try:
        try:
            tables, version, problems = _look_inside(uri, thorough)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_READONLY_DIRECTORY", "SQLITE_CANTOPEN") \
                    or _wal_pending(path):
                raise
            uri += "&immutable=1"
            tables, version, problems = _look_inside(uri, thorough)
    except sqlite3.DatabaseError as exc:
        raise _refused(path, exc, "read") from exc
    except UnicodeDecodeError as exc:
        raise _damaged(path, f"text that is not UTF-8 ({exc.reason})") from exc
    missing = [name for name in TABLES if name not in tables]
    if missing:
        raise UsageError(f"{path}: not a complete trainctl sweep history (no table {', '.join(missing)}); "
                         "left untouched", hint="move it aside or restore a backup")
    if problems != ["ok"]:
        raise _damaged(path, "; ".join(problems[:3]))
    if version != SCHEMA_VERSION:
        raise UsageError(f"{path}: sweep history schema version {version}; this trainctl reads version "
                         f"{SCHEMA_VERSION}", hint="use the trainctl that wrote it")
    return uri


def _look_inside(uri: str, thorough: bool) -> tuple[set[str], object, list[str]]:
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = (conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
                   if "schema_version" in tables else None)
        problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()] if thorough else ["ok"]
        return tables, version, problems
    finally:
        conn.close()


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
    return _damaged(path, exc)


def _damaged(path: Path, exc: Exception | str) -> UsageError:
    return UsageError(f"{path}: damaged sweep history ({exc}); left untouched",
                      hint="move it aside or restore a backup; a new sweep starts a new history")


def _readonly_uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"


def _time(path: Path, value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= LATEST_TIME:
        raise _damaged(path, f"{what} {str(value)[:40]!r} is not a time")
    return float(value)


def _text(path: Path, value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _damaged(path, f"{what} {str(value)[:40]!r} is not text")
    return value


def _sweep(path: Path, row: tuple) -> SweepRow:
    sweep_id, kind, started, finished, *texts = row
    where = f"sweep #{sweep_id}"
    return SweepRow(sweep_id, _text(path, kind, f"{where} kind"), _time(path, started, f"{where} started_at"),
                    None if finished is None else _time(path, finished, f"{where} finished_at"),
                    *(_text(path, value, where) for value in texts))


_NODE_STATUSES = frozenset((*STATUSES, None))


def _node(path: Path, row: tuple) -> NodeRow:
    sweep_id, host, outcome, status, slurm_state, detail, recorded_at = row
    if (outcome in OUTCOMES and status in _NODE_STATUSES and type(host) is str and type(slurm_state) is str
            and type(detail) is str and type(recorded_at) in (int, float) and 0 <= recorded_at <= LATEST_TIME):
        return NodeRow(sweep_id, host, outcome, status, slurm_state, detail, float(recorded_at))  # the usual row
    where = f"node {str(host)[:40]!r} in sweep #{sweep_id}"
    if outcome not in OUTCOMES or status not in (*STATUSES, None):
        raise _damaged(path, f"{where}: outcome {outcome!r} / status {status!r} unknown")
    return NodeRow(sweep_id, _text(path, host, where), outcome, status, _text(path, slurm_state, where),
                   _text(path, detail, where), _time(path, recorded_at, f"{where} recorded_at"))


def _result(path: Path, row: tuple) -> ResultRow:
    sweep_id, host, check, status, reason, details = row
    if status in STATUSES and type(host) is str and type(check) is str and type(reason) is str:
        try:
            parsed = json.loads(details, parse_constant=_no_constant)
        except (TypeError, ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            return ResultRow(sweep_id, host, check, status, reason, parsed)  # the usual row: no message built
    where = f"check {str(check)[:40]!r} of {str(host)[:40]!r} in sweep #{sweep_id}"
    if status not in STATUSES:
        raise _damaged(path, f"{where}: status {status!r} unknown")
    try:
        parsed = json.loads(details, parse_constant=_no_constant)
    except (TypeError, ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise _damaged(path, f"{where}: details are not a JSON object")
    return ResultRow(sweep_id, _text(path, host, where), _text(path, check, where), status,
                     _text(path, reason, where), parsed)


def _drain(path: Path, row: tuple) -> DrainRow:
    drain_id, host, reason, reason_time, sweep_id, check, drained_at, closed_at, closed_how = row
    where = f"drain #{drain_id}"
    return DrainRow(drain_id, _text(path, host, where), _text(path, reason, where), _text(path, reason_time, where),
                    sweep_id, _text(path, check, where), _time(path, drained_at, f"{where} drained_at"),
                    None if closed_at is None else _time(path, closed_at, f"{where} closed_at"),
                    _text(path, closed_how, where))


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
