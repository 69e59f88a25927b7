"""The sweep history's rows, judged: what a row may hold, the same verdict for a reader that
reads it and for a writer that checks every row of the file before its first write
(`check_every_row`), so a file a report calls damaged is refused by a sweep with the same
message. The file itself (header, schema objects, version) is judged by `trainctl.sweep.db`.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from trainctl.errors import UsageError
from trainctl.text import printable
from trainctl.validate import check_node_name
from trainctl.sweep.families import FAMILIES, families_from_text_before_v4
from trainctl.sweep.model import (CHECKED, ERROR, NOT_SWEPT, STATUSES, TIMEOUT, DrainRow, JobEventRow, JobRow,
                                   NodeRow, ResultRow, SweepRow)

OUTCOMES = (CHECKED, TIMEOUT, ERROR, NOT_SWEPT)
JOB_EVENT_KINDS = ("exclusion", "detection", "served")
LATEST_TIME = 253402300799.0     # 9999-12-31: later than any sweep, and datetime can still show it
MAX_UID = 4294967294             # uid_t is 32 bits, and (uid_t) -1 is no user


# What `_check_every_row` hands to the row judges: rows of a shape trainctl never writes, and
# every row with text outside printable ASCII (it may not be UTF-8) or long details (they may
# nest deeper than the JSON parser goes). A cheap filter in SQL; the verdict is the judges'.
_TIME_SQL = "typeof({0}) NOT IN ('integer', 'real') OR {0} < 0 OR {0} > " + repr(LATEST_TIME)
_OPTIONAL_TIME_SQL = "({0} IS NOT NULL AND (" + _TIME_SQL + "))"


def _not_text(*columns: str) -> str:
    return " OR ".join([f"typeof({c}) != 'text'" for c in columns] + [f"({' || '.join(columns)}) GLOB '*[^ -~]*'"])


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


ROW_SUSPECTS = {
    "sweeps": ("SELECT id, kind, started_at, finished_at, site, via, target, checks, slurm_job_id, error FROM sweeps "
               f"WHERE {_not_text('kind', 'site', 'via', 'target', 'checks', 'slurm_job_id', 'error')} "
               f"OR {_TIME_SQL.format('started_at')} OR {_OPTIONAL_TIME_SQL.format('finished_at')}"),
    "nodes": ("SELECT sweep_id, host, outcome, status, slurm_state, detail, recorded_at FROM nodes "
              f"WHERE outcome NOT IN ({_quoted(OUTCOMES)}) OR (status IS NOT NULL AND status NOT IN "
              f"({_quoted(STATUSES)})) OR {_not_text('host', 'slurm_state', 'detail')} "
              f"OR {_TIME_SQL.format('recorded_at')}"),
    "results": ("SELECT sweep_id, host, check_name, status, reason, details, recorded_at FROM results "
                f"WHERE status NOT IN ({_quoted(STATUSES)}) OR {_not_text('host', 'check_name', 'reason', 'details')} "
                f"OR NOT json_valid(details) OR json_type(details) != 'object' OR length(details) > 1500 "
                f"OR {_TIME_SQL.format('recorded_at')}"),
    "drains": ("SELECT id, host, reason, reason_time, sweep_id, check_name, drained_at, closed_at, closed_how "
               f"FROM drains WHERE {_not_text('host', 'reason', 'reason_time', 'check_name', 'closed_how')} "
               f"OR {_TIME_SQL.format('drained_at')} OR {_OPTIONAL_TIME_SQL.format('closed_at')}"),
    "jobs": ("SELECT job_id, site, started_at, ended_at, status, source, lines, size, ingested_at FROM jobs "
             f"WHERE {_not_text('job_id', 'site', 'source')} OR {_TIME_SQL.format('started_at')} "
             f"OR {_OPTIONAL_TIME_SQL.format('ended_at')} OR {_TIME_SQL.format('ingested_at')} "
             "OR (status IS NOT NULL AND typeof(status) != 'integer') OR typeof(lines) != 'integer' "
             "OR typeof(size) != 'integer' OR lines < 0 OR size < 0"),
    # since version 3 (`users`): each job's user, where known
    "jobs.uid": f"SELECT job_id, uid FROM jobs WHERE uid IS NOT NULL AND (typeof(uid) != 'integer' OR uid < 0 "
                f"OR uid > {MAX_UID})",
    "job_events": ("SELECT job_id, line, host, kind, at, what, detail FROM job_events "
                   f"WHERE kind NOT IN ({_quoted(JOB_EVENT_KINDS)}) OR typeof(line) != 'integer' OR line < 1 "
                   f"OR {_not_text('job_id', 'host', 'what', 'detail')} OR {_TIME_SQL.format('at')}"),
    # since version 4 (`families`): each event's failure families, a JSON list of their names
    # (most are a served row's none; CASE, as SQLite's OR may read json_each of text that is no JSON)
    "job_events.families": ("SELECT job_id, line, families FROM job_events WHERE typeof(families) != 'text' "
                            "OR (families != '[]' AND CASE WHEN json_valid(families) AND json_type(families) = "
                            "'array' THEN EXISTS (SELECT 1 FROM json_each(families) WHERE typeof(value) != 'text' "
                            f"OR value NOT IN ({_quoted(FAMILIES)})) ELSE 1 END)"),
}


def check_every_row(conn: sqlite3.Connection, path: Path, tables: tuple[str, ...], *, users: bool,
                    families: bool) -> None:
    """Every row judged as a reader judges the rows it reads (the same functions, so the same
    message): the first one no trainctl could have written raises UsageError. `users`: the jobs
    table has its users' column (version 3 on); `families`: the job events theirs (version 4 on)."""
    for table, sql in ROW_SUSPECTS.items():
        if table.split(".")[0] not in tables or (table == "jobs.uid" and not users) or \
                (table == "job_events.families" and not families):
            continue
        cursor = conn.execute(sql)
        while rows := cursor.fetchmany(1000):  # a UnicodeDecodeError here: the caller calls it damage
            for row in rows:
                if table == "sweeps":
                    sweep_row(path, row)
                elif table == "nodes":
                    node_row(path, row)
                elif table == "results":
                    result_row(path, row[:6])
                    time_of(path, row[6], f"check {str(row[2])[:40]!r} of {str(row[1])[:40]!r} in sweep "
                                        f"#{row[0]} recorded_at")
                elif table == "drains":
                    drain_row(path, row)
                elif table == "jobs":
                    job_row(path, (*row, None))
                elif table == "jobs.uid":
                    user_of(path, *row)
                elif table == "job_events.families":
                    families_of(path, *row)
                else:
                    job_event_fields(path, row)
    if "job_events" in tables:   # every event belongs to a job folded in (the key folding is idempotent by)
        orphan = conn.execute("SELECT job_id, line FROM job_events WHERE job_id NOT IN (SELECT job_id FROM jobs) "
                              "LIMIT 1").fetchone()
        if orphan:
            raise damaged(path, f"event of job {printable(str(orphan[0])[:40])!r} line {str(orphan[1])[:20]}: "
                                 "no such job")
    for table in ("nodes", "results", "drains", "job_events"):  # host names: each distinct one once
        if table not in tables:
            continue
        for (host,) in conn.execute(f"SELECT DISTINCT host FROM {table}"):
            node_name_of(path, host)


def damaged(path: Path, exc: Exception | str) -> UsageError:
    return UsageError(f"{path}: damaged sweep history ({exc}); left untouched",
                      hint="move it aside or restore a backup; a new sweep starts a new history")


def time_of(path: Path, value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= LATEST_TIME:
        raise damaged(path, f"{what} {str(value)[:40]!r} is not a time")
    return float(value)


def text_of(path: Path, value: object, what: str) -> str:
    if not isinstance(value, str):
        raise damaged(path, f"{what} {str(value)[:40]!r} is not text")
    return value


@functools.lru_cache(maxsize=1 << 16)
def _is_node_name(host: str) -> bool:
    try:
        check_node_name(host, "host")
    except UsageError:
        return False
    return True


def node_name_of(path: Path, value: object) -> str:
    """A host as trainctl records it: a node name from Slurm or a hostlist. One with `[`, `]`, `^`
    or `,` never came from either, and folded into a report's hostlist it would name other nodes.
    The message names the host alone, so every reader and writer that meets it says the same."""
    if isinstance(value, str) and _is_node_name(value):
        return value
    raise damaged(path, f"host {printable(str(value)[:60])!r} is not a node name")


def sweep_row(path: Path, row: tuple) -> SweepRow:
    sweep_id, kind, started, finished, *texts = row
    where = f"sweep #{sweep_id}"
    return SweepRow(sweep_id, text_of(path, kind, f"{where} kind"), time_of(path, started, f"{where} started_at"),
                    None if finished is None else time_of(path, finished, f"{where} finished_at"),
                    *(text_of(path, value, where) for value in texts))


_NODE_STATUSES = frozenset((*STATUSES, None))


def node_row(path: Path, row: tuple) -> NodeRow:
    sweep_id, host, outcome, status, slurm_state, detail, recorded_at = row
    if (outcome in OUTCOMES and status in _NODE_STATUSES and type(host) is str and _is_node_name(host)
            and type(slurm_state) is str and type(detail) is str and type(recorded_at) in (int, float)
            and 0 <= recorded_at <= LATEST_TIME):
        return NodeRow(sweep_id, host, outcome, status, slurm_state, detail, float(recorded_at))  # the usual row
    host = node_name_of(path, host)
    where = f"node {host!r} in sweep #{sweep_id}"
    if outcome not in OUTCOMES or status not in (*STATUSES, None):
        raise damaged(path, f"{where}: outcome {outcome!r} / status {status!r} unknown")
    return NodeRow(sweep_id, host, outcome, status, text_of(path, slurm_state, where),
                   text_of(path, detail, where), time_of(path, recorded_at, f"{where} recorded_at"))


def result_row(path: Path, row: tuple) -> ResultRow:
    sweep_id, host, check, status, reason, details = row
    if status in STATUSES and type(host) is str and _is_node_name(host) and type(check) is str \
            and type(reason) is str:
        try:
            parsed = json.loads(details, parse_constant=_no_constant)
        except (TypeError, ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            return ResultRow(sweep_id, host, check, status, reason, parsed)  # the usual row: no message built
    host = node_name_of(path, host)
    where = f"check {str(check)[:40]!r} of {host!r} in sweep #{sweep_id}"
    if status not in STATUSES:
        raise damaged(path, f"{where}: status {status!r} unknown")
    try:
        parsed = json.loads(details, parse_constant=_no_constant)
    except (TypeError, ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise damaged(path, f"{where}: details are not a JSON object")
    return ResultRow(sweep_id, host, text_of(path, check, where), status, text_of(path, reason, where), parsed)


def drain_row(path: Path, row: tuple) -> DrainRow:
    drain_id, host, reason, reason_time, sweep_id, check, drained_at, closed_at, closed_how = row
    where = f"drain #{drain_id}"
    return DrainRow(drain_id, node_name_of(path, host), text_of(path, reason, where), text_of(path, reason_time, where),
                    sweep_id, text_of(path, check, where), time_of(path, drained_at, f"{where} drained_at"),
                    None if closed_at is None else time_of(path, closed_at, f"{where} closed_at"),
                    text_of(path, closed_how, where))


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def user_of(path: Path, job_id: object, uid: object) -> int | None:
    """A job's user: a uid, or None (folded in before the history kept users)."""
    if uid is None or (type(uid) is int and 0 <= uid <= MAX_UID):
        return uid
    raise damaged(path, f"job {printable(str(job_id)[:40])!r}: uid {printable(str(uid)[:20])!r} is not a user id")


def job_row(path: Path, row: tuple) -> JobRow:
    job_id, site, started, ended, status, source, lines, size, ingested, uid = row
    where = f"job {printable(str(job_id)[:40])!r}"
    if not isinstance(job_id, str) or not isinstance(site, str) or not isinstance(source, str):
        raise damaged(path, f"{where}: id, site or source is not text")
    if status is not None and (type(status) is not int):
        raise damaged(path, f"{where}: status {str(status)[:20]!r} is not an exit status")
    if type(lines) is not int or type(size) is not int or lines < 0 or size < 0:
        raise damaged(path, f"{where}: lines {str(lines)[:20]!r} / size {str(size)[:20]!r} are not counts")
    return JobRow(job_id, site, time_of(path, started, f"{where} started_at"),
                  None if ended is None else time_of(path, ended, f"{where} ended_at"), status, source, lines, size,
                  time_of(path, ingested, f"{where} ingested_at"), user_of(path, job_id, uid))


def families_of(path: Path, job_id: object, line: object, value: object) -> tuple[str, ...]:
    """A job event's failure families: a JSON list of known family names, as the fold writes them."""
    try:
        families = json.loads(value, parse_constant=_no_constant) if isinstance(value, str) else None
    except (ValueError, RecursionError):
        families = None
    if isinstance(families, list) and all(isinstance(name, str) and name in FAMILIES for name in families):
        return tuple(families)
    raise damaged(path, f"event of job {printable(str(job_id)[:40])!r} line {str(line)[:20]}: families "
                        f"{printable(str(value)[:60])!r} are not a list of failure families")


def job_event_fields(path: Path, row: tuple) -> tuple[str, int, str, str, float, str, str]:
    """A job event's columns but its families, judged: (job, line, host, kind, at, what, detail)."""
    job_id, line, host, kind, at, what, detail = row
    where = f"event of job {printable(str(job_id)[:40])!r} line {str(line)[:20]}"
    if kind not in JOB_EVENT_KINDS:
        raise damaged(path, f"{where}: kind {printable(str(kind)[:40])!r} unknown")
    if type(line) is not int or line < 1:
        raise damaged(path, f"{where}: not a journal line number")
    if not isinstance(job_id, str):
        raise damaged(path, f"{where}: job id is not text")
    return (job_id, line, node_name_of(path, host), kind, time_of(path, at, f"{where} at"), text_of(path, what, where),
            text_of(path, detail, where))


def job_event_row(path: Path, row: tuple) -> JobEventRow:
    """A job event with its families as the row keeps them (version 4 on)."""
    return JobEventRow(*job_event_fields(path, row[:7]), families_of(path, row[0], row[1], row[7]))


def job_event_row_before_v4(path: Path, row: tuple) -> JobEventRow:
    """A job event of a history written before rows kept their families (version 2 or 3): found from
    its text (`families_from_text_before_v4`), for its upgrade to store, and for a reader of it."""
    job_id, line, host, kind, at, what, detail = job_event_fields(path, row)
    return JobEventRow(job_id, line, host, kind, at, what, detail,
                       families_from_text_before_v4(kind, what, detail, host))
