"""The sweep history file: schema, WAL, incomplete sweeps, and refusing corrupt or foreign files untouched."""

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from support.sweeps import DAY, night
from trainctl.errors import UsageError
from trainctl.sweep.db import APPLICATION_ID, SCHEMA_VERSION, History
from trainctl.sweep.model import CHECKED, NOT_SWEPT, TIMEOUT

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
T0 = 1_700_000_000.0


def run_cli(*args, env=None):
    return subprocess.run([TRAINCTL, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def fingerprint(path: Path) -> tuple[str, int]:
    """Its bytes and mtime: what 'left untouched' means."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_new_history_is_wal_with_schema_version_and_application_id(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        night(history, T0, {"gpu1": "ok"})
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    # one row per node, check and sweep
    assert conn.execute("SELECT host, check_name, status FROM results ORDER BY check_name").fetchall() == [
        ("gpu1", "gpu.xid", "ok"), ("gpu1", "host.memory", "ok"), ("gpu1", "ib.ports", "ok")]


def test_rows_round_trip_and_an_unfinished_sweep_stays_unfinished(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        first = night(history, T0, {"gpu1": {"ib.ports": ("fail", "mlx5_0/1 Down")}, "gpu2": "allocated"})
        second = night(history, T0 + DAY, {"gpu1": "timeout"}, finished=False)
    with History.open(db) as history:
        sweeps = history.sweeps()
        assert [(s.id, s.complete) for s in sweeps] == [(first, True), (second, False)]
        nodes = {n.host: n for n in history.sweep_nodes(first)}
        assert nodes["gpu1"].outcome == CHECKED and nodes["gpu1"].status == "fail"
        assert nodes["gpu2"].outcome == NOT_SWEPT and nodes["gpu2"].slurm_state == "allocated"
        assert [n.outcome for n in history.sweep_nodes(second)] == [TIMEOUT]
        failing = [r for r in history.sweep_results(first) if r.status != "ok"]
        assert [(r.host, r.check, r.reason) for r in failing] == [("gpu1", "ib.ports", "mlx5_0/1 Down")]


def test_reading_a_missing_history_does_not_create_it(tmp_path):
    db = tmp_path / "nope.db"
    with pytest.raises(UsageError, match="no sweep history"):
        History.open(db)
    assert not db.exists()


def test_read_only_open_cannot_write(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        night(history, T0, {"gpu1": "ok"})
    before = fingerprint(db)
    with History.open(db) as history:
        with pytest.raises(RuntimeError):
            history.start_sweep(kind="sweep", started_at=T0, site="s", via="slurm", target="gpu", checks="all")
    assert fingerprint(db) == before


def make_foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE sweeps (id INTEGER PRIMARY KEY, note TEXT); INSERT INTO sweeps VALUES (1, 'x');")
    conn.close()


def make_garbage(path: Path) -> None:
    path.write_bytes(b"these are somebody's notes, not a database\n" * 10)


def make_damaged(path: Path) -> None:
    """A real trainctl history whose data pages were overwritten (header and app id intact)."""
    with History.open(path, write=True) as history:
        for day in range(30):
            night(history, T0 + day * DAY, {f"gpu{i}": "ok" for i in range(40)})
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for offset in range(2 * page, len(data) - page, 3 * page):
        data[offset:offset + page] = b"\xa5" * page
    path.write_bytes(bytes(data))


def make_newer_schema(path: Path) -> None:
    with History.open(path, write=True) as history:
        night(history, T0, {"gpu1": "ok"})
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


@pytest.mark.parametrize("make, message", [
    (make_foreign, "SQLite database of another program"),
    (make_garbage, "not an SQLite database"),
    (make_damaged, "damaged sweep history"),
    (make_newer_schema, f"schema version {SCHEMA_VERSION + 1}"),
])
@pytest.mark.parametrize("command", [
    ["report"], ["report", "--format", "html"], ["drain", "--apply"],
    ["sweep", "--site", "local-demo"], ["resume", "--site", "local-demo", "--apply"],
])
def test_corrupt_or_foreign_file_one_line_exit_2_untouched(tmp_path, make, message, command):
    db = tmp_path / "history.db"
    make(db)
    before = fingerprint(db)
    # SLURM_CONF points nowhere: the file must be refused before Slurm is ever asked.
    out = run_cli(*command, "--db", str(db), env={"SLURM_CONF": str(tmp_path / "no-slurm.conf")})
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainctl: error: ") and message in lines[0], lines
    assert str(db) in lines[0]
    assert fingerprint(db) == before


def test_report_reads_while_a_sweep_holds_a_write_transaction(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        night(history, T0, {"gpu1": {"ib.ports": ("fail", "mlx5_0/1 Down")}})
        writer = sqlite3.connect(db, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO sweeps (kind, started_at, site, via, target, checks) "
                       "VALUES ('sweep', 1, 's', 'slurm', 'gpu', 'all')")
        out = run_cli("report", "--db", str(db), "--since", "100000d")
        writer.execute("ROLLBACK")
    assert out.returncode == 0, out.stderr
    assert "gpu1" in out.stdout and "mlx5_0/1 Down" in out.stdout
