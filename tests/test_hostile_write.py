"""Never damage what is not ours; never write into a history we call damaged.

Output files that are devices, FIFOs or links to them; node names that would be paths; sweep
histories with rows, schema objects or permissions no trainctl made; two first sweeps at once;
text from the history that would forge lines or reorder them on screen.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.sweeps import night
from test_hostile_jobdir import finishes
from test_hostile import (as_nobody, digest, history_with_one_sweep, needs_root, one_line, site_file,  # noqa: F401
                                trainctl, trainctl_process, world_readable_dir)
from trainctl.sweep.db import History


# ---------------------------------------------------------------- the job's own files: never into a FIFO

@contextmanager
def fifo_with_reader(path: Path, reader: bool):
    """A FIFO at `path`; with `reader`, held open for reading (so a blocking open for writing succeeds
    and whatever is written into it is there to read); yields what was read from it in the end."""
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    got: list[bytes] = []
    try:
        yield got
    finally:
        if fd is not None:
            try:
                got.append(os.read(fd, 1 << 16))
            except BlockingIOError:    # a writer still holds it open, nothing written
                got.append(b"")
            os.close(fd)


@pytest.mark.parametrize("reader", [False, True], ids=["no reader", "a reader"])
def test_the_journal_writer_refuses_a_fifo_in_one_line_and_never_blocks(tmp_path, capfd, reader):
    from trainctl.job.jobdir import Journal, Kind

    path = tmp_path / "journal.jsonl"
    with fifo_with_reader(path, reader) as got:
        journal = Journal(path)
        for kind in (Kind.GATE_START, Kind.GATE_END):
            finishes(journal.add, kind)
    assert got in ([], [b""]) and stat.S_ISFIFO(os.lstat(path).st_mode)
    said = capfd.readouterr().err
    assert said == f"trainctl: warning: cannot write the journal {path}: not a regular file\n"


@pytest.mark.parametrize("reader", [False, True], ids=["no reader", "a reader"])
@pytest.mark.parametrize("name", ["checkpoint-request", "dump-request"])
def test_a_fifo_as_a_watch_request_is_replaced_never_written_into(tmp_path, name, reader):
    """The supervisor's requests to the node agents are new files renamed over their names: a FIFO
    left there (by a rank: the watch folder is the job's to write) is replaced, never opened."""
    from trainctl.job.watch_io import post_request

    watch = tmp_path / "watch"
    watch.mkdir()
    with fifo_with_reader(watch / name, reader) as got:
        token = finishes(post_request, str(tmp_path), name)
    assert got in ([], [b""])
    assert stat.S_ISREG(os.lstat(watch / name).st_mode) and (watch / name).read_text() == token + "\n"


def test_a_symlink_as_a_watch_request_is_replaced_and_its_target_kept(tmp_path):
    from trainctl.job.watch_io import post_request

    watch = tmp_path / "watch"
    watch.mkdir()
    target = tmp_path / "train.py"
    target.write_text("print('mine')\n")
    (watch / "checkpoint-request").symlink_to(target)
    token = finishes(post_request, str(tmp_path), "checkpoint-request")
    assert not (watch / "checkpoint-request").is_symlink()
    assert (watch / "checkpoint-request").read_text() == token + "\n" and target.read_text() == "print('mine')\n"


# ---------------------------------------------------------------- output files

@pytest.fixture
def history(tmp_path) -> Path:
    return history_with_one_sweep(tmp_path / "sweeps.db")


@pytest.mark.parametrize("option", ["--out", "--prom"])
def test_dev_null_stays_a_device(history, option):
    before = os.stat("/dev/null")
    out = trainctl("report", "--db", history, option, "/dev/null")
    assert out.returncode == 0, out.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def test_a_full_device_is_one_line_and_stays_a_device(history):
    out = trainctl("report", "--db", history, "--out", "/dev/full")
    assert out.returncode == 2
    assert "cannot write /dev/full: No space left on device" in one_line(out.stderr)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def read_fifo_in_background(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read():
        with open(path, "rb") as handle:
            got.append(handle.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, got


@pytest.mark.parametrize("through_symlink", [False, True])
@pytest.mark.parametrize("option", ["--out", "--prom"])
def test_a_fifo_is_written_into_not_replaced(history, tmp_path, option, through_symlink):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = fifo
    if through_symlink:
        target = tmp_path / "link"
        target.symlink_to(fifo)
    reader, got = read_fifo_in_background(fifo)
    out = trainctl("report", "--db", history, option, target)
    reader.join(timeout=30)
    assert out.returncode == 0, out.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if through_symlink:
        assert os.readlink(target) == str(fifo)               # the link itself stays
    assert (b"mlx5_2/1 Down" if option == "--out" else b"trainctl_check_status") in got[0]


def test_a_directory_is_refused_in_one_line(history, tmp_path):
    from trainctl.errors import UsageError
    from trainctl.files import write_atomically

    directory = tmp_path / "reports"
    directory.mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        write_atomically(directory, "text")
    out = trainctl("report", "--db", history, "--prom", directory)
    assert out.returncode == 2
    assert str(directory) in one_line(out.stderr)
    assert list(directory.iterdir()) == []


def test_a_regular_file_is_replaced_whole_and_a_missing_one_created(history, tmp_path):
    existing = tmp_path / "report.txt"
    existing.write_text("old\n")
    inode = existing.stat().st_ino
    assert trainctl("report", "--db", history, "--out", existing).returncode == 0
    assert "mlx5_2/1 Down" in existing.read_text() and existing.stat().st_ino != inode   # renamed over
    missing = tmp_path / "new" / "report.prom"
    assert trainctl("report", "--db", history, "--prom", missing).returncode == 0
    assert "trainctl_check_status" in missing.read_text()
    assert not [p for p in tmp_path.rglob(".*")]                     # no temporary left


def test_a_symlink_to_a_regular_file_keeps_the_link(history, tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    assert trainctl("report", "--db", history, "--out", link).returncode == 0
    assert link.is_symlink() and "mlx5_2/1 Down" in real.read_text()


def test_dev_stdout_is_written_through_not_replaced(history):
    # In a process of its own: its stdout is a pipe, /dev/stdout -> /proc/self/fd/1 -> that pipe.
    ran = trainctl_process("report", "--db", str(history), "--out", "/dev/stdout")
    assert ran.returncode == 0, ran.stderr
    assert b"mlx5_2/1 Down" in ran.stdout
    assert os.path.islink("/dev/stdout")


# ---------------------------------------------------------------- node names that become paths

def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "gpu[1-2]", "-rf", "x" * 300, "a\x1bb"])
def test_gate_node_refuses_a_node_name_that_is_a_path(tmp_path, name):
    gate_dir = tmp_path / "job" / "gate"
    gate_dir.mkdir(parents=True)
    before = tree(tmp_path)
    out = trainctl("gate", "node", "--dir", gate_dir, "--no-fabric", env={"SLURMD_NODENAME": name})
    assert out.returncode == 2
    assert "SLURMD_NODENAME" in one_line(out.stderr) and "is not a node name" in out.stderr
    assert tree(tmp_path) == before


def test_slurm_hook_refuses_a_node_name_that_is_a_path(tmp_path):
    state = tmp_path / "a" / "b" / "state"
    out = trainctl("health", "slurm-hook", "--state-dir", state, env={"SLURMD_NODENAME": "../../x"})
    assert out.returncode == 2
    assert "SLURMD_NODENAME '../../x' is not a node name" in one_line(out.stderr)
    assert tree(tmp_path) == []                                     # no lock file, no state directory


def test_node_names_as_slurm_writes_them_pass():
    from trainctl.validate import check_node_name

    for name in ("gpu07", "gpu07.cluster.example", "dgx-a", "node_1", "127.0.0.2", "GPU01"):
        assert check_node_name(name, "test") == name


# ---------------------------------------------------------------- a damaged history is never written

DAMAGE = {
    "details not JSON": "UPDATE results SET details = 'not json {' WHERE status = 'fail'",
    "details NaN": "UPDATE results SET details = '{\"x\": NaN}' WHERE status = 'fail'",
    "details nested 5000 deep": "UPDATE results SET details = '{\"a\":' || replace(hex(zeroblob(2500)), '00', "
                                "'[[') || replace(hex(zeroblob(2500)), '00', ']]') || '}' WHERE status = 'fail'",
    "started_at not a time": "UPDATE sweeps SET started_at = '2024-01-01 yesterday'",
    "started_at huge": "UPDATE sweeps SET started_at = 1e308",
    "started_at negative": "UPDATE sweeps SET started_at = -5",
    "reason not UTF-8": "UPDATE results SET reason = CAST(X'6d6c7835ff' AS TEXT) WHERE status = 'fail'",
    "host a BLOB": "UPDATE nodes SET host = X'677075' WHERE host = 'gpu1'",
    "status unknown": "UPDATE results SET status = 'great' WHERE status = 'fail'",
    "host with brackets": "UPDATE results SET host = 'gpu[2' WHERE host = 'gpu2'; "
                          "UPDATE nodes SET host = 'gpu[2' WHERE host = 'gpu2'",
    "host with a caret": "UPDATE nodes SET host = 'gpu^2' WHERE host = 'gpu2'",
    "drain host not a name": "INSERT INTO drains (host, reason, reason_time, sweep_id, check_name, drained_at) "
                             "VALUES ('../x', 'r', 't', 1, 'ib.ports', 1)",
}


def damage(db: Path, sql: str) -> None:
    conn = sqlite3.connect(db)
    conn.executescript(sql)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


@pytest.mark.parametrize("kind", DAMAGE)
def test_sweep_refuses_a_history_report_calls_damaged_with_the_same_message(tmp_path, kind):
    db = history_with_one_sweep(tmp_path / "sweeps.db")
    damage(db, DAMAGE[kind])
    report = trainctl("report", "--db", db, "--since", "100000d")
    assert report.returncode == 2, report.stderr
    refused = one_line(report.stderr)
    assert "damaged sweep history" in refused
    before = digest(db)
    sweep = trainctl("sweep", "--site", site_file(tmp_path, db=db), "--via", "ssh", "--nodes", "127.0.0.9")
    assert sweep.returncode == 2, sweep.stderr
    assert one_line(sweep.stderr) == refused
    assert digest(db) == before
    wal = Path(f"{db}-wal")
    assert not wal.exists() or wal.stat().st_size == 0


@pytest.mark.parametrize("sql, named", [
    ("CREATE TRIGGER wipe AFTER INSERT ON sweeps BEGIN DELETE FROM results; END", "trigger 'wipe'"),
    ("CREATE VIEW failing AS SELECT * FROM results WHERE status = 'fail'", "view 'failing'"),
    ("CREATE INDEX results_by_status ON results (status)", "index 'results_by_status'"),
    ("CREATE TABLE notes (text TEXT)", "table 'notes'"),
    ("ALTER TABLE results ADD COLUMN extra TEXT", "table results has columns"),
])
def test_schema_objects_trainctl_never_creates_are_refused_by_name(tmp_path, sql, named):
    db = history_with_one_sweep(tmp_path / "sweeps.db")
    damage(db, sql)
    before = digest(db)
    for args in (["report", "--db", db], ["sweep", "--site", site_file(tmp_path, db=db), "--via", "ssh",
                                          "--nodes", "127.0.0.9"]):
        out = trainctl(*args)
        assert out.returncode == 2, out.stderr
        assert named in one_line(out.stderr)
    assert digest(db) == before
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM results").fetchone()[0] > 0   # the trigger never fired
    conn.close()


def test_a_history_with_legitimate_non_ascii_text_is_still_written(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        night(history, time.time() - 60, {"gpu1": {"ib.ports": ("fail", "Port café Down ✓")}})
    with History.open(db, write=True) as history:      # the writer's verdict passes it
        assert [r.reason for r in history.sweep_results(1) if r.status == "fail"] == ["Port café Down ✓"]


# ---------------------------------------------------------------- creating a history, at once

def _first_sweep(path: str, barrier, results) -> None:
    try:
        barrier.wait(timeout=30)
        with History.open(path, write=True) as history:
            history.start_sweep(kind="sweep", started_at=time.time(), site="s", via="ssh", target="n", checks="all")
        results.put("ok")
    except BaseException as exc:  # the test shows it
        results.put(f"{type(exc).__name__}: {exc}")


def test_two_first_sweeps_at_once_both_land(tmp_path):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    for attempt in range(20):
        path = tmp_path / f"h{attempt}" / "sweeps.db"
        barrier = context.Barrier(2)
        workers = [context.Process(target=_first_sweep, args=(str(path), barrier, results)) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert sorted(results.get(timeout=5) for _ in workers) == ["ok", "ok"], attempt
        with History.open(path) as history:
            assert [s.id for s in history.sweeps()] == [1, 2]
        assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []   # no temporary left


def test_two_first_sweep_commands_at_once_both_land(tmp_path):
    db = tmp_path / "new" / "sweeps.db"
    site = site_file(tmp_path, db=db)
    run = [sys.executable, "-m", "trainctl.cli", "sweep", "--site", str(site), "--via", "ssh", "--nodes", "127.0.0.9"]
    env = {**os.environ, "PATH": "/nonexistent"}
    procs = [subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 3, err.decode()                   # the node gave no verdict; nothing refused
        assert b"not a trainctl sweep history" not in err
    with History.open(db) as history:
        assert len(history.sweeps()) == 2


# ---------------------------------------------------------------- permissions

@needs_root
def test_a_db_in_a_directory_the_user_cannot_enter_is_one_line(world_readable_dir, nobody_python):
    private = world_readable_dir / "private"
    private.mkdir(mode=0o700)
    history_with_one_sweep(private / "sweeps.db")
    for args in (["report", "--db", private / "sweeps.db"], ["drain", "--db", private / "sweeps.db"]):
        out = as_nobody(nobody_python, *args)
        assert out.returncode == 2, out.stderr
        assert "cannot read sweep history: Permission denied" in one_line(out.stderr)
    site = site_file(world_readable_dir, db=private / "sweeps.db")
    site.chmod(0o644)
    (world_readable_dir / "known_hosts").chmod(0o644)
    out = as_nobody(nobody_python, "sweep", "--site", site, "--via", "ssh", "--nodes", "127.0.0.9")
    assert out.returncode == 2
    assert "cannot write sweep history: Permission denied" in one_line(out.stderr)


# ---------------------------------------------------------------- text from the history

def test_a_reason_with_a_newline_and_a_bidi_override_stays_on_its_line(tmp_path):
    db = tmp_path / "sweeps.db"
    reason = "mlx5_0/1 Down\nFAILING CHECKS: none\u202eevil"
    with History.open(db, write=True) as history:
        night(history, time.time() - 60, {"gpu1": {"ib.ports": ("fail", reason)}})
    for fmt in ("text", "markdown"):
        out = trainctl("report", "--db", db, "--format", fmt)
        assert out.returncode == 2 or out.returncode == 0, out.stderr
        (line,) = [line for line in out.stdout.splitlines() if "mlx5_0/1 Down" in line]
        assert ("mlx5_0/1 Down\\nFAILING CHECKS: none\\u202eevil" if fmt == "text"
                else "mlx5_0/1 Down FAILING CHECKS: none\\u202eevil") in line
        assert "\u202e" not in out.stdout and "FAILING CHECKS: none" not in out.stdout.replace(line, "")
    html = trainctl("report", "--db", db, "--format", "html").stdout
    assert "\u202e" not in html and "none\\u202eevil" in html
    assert json.loads(trainctl("report", "--db", db, "--format", "json").stdout)["groups"][0]["reason"] == reason


def test_printable_escapes_every_bidi_control_and_line_separator():
    from trainctl.text import printable

    for char in ("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
                 "\u200e", "\u200f", "\u061c", "\u2028", "\u2029", "\n"):
        shown = printable(f"a{char}b")
        assert char not in shown and shown.startswith("a\\") and shown.endswith("b")
    assert printable("café ✓") == "café ✓"


def test_a_fifo_or_a_link_to_one_as_the_history_is_refused_in_one_line_and_never_opened(tmp_path):
    """`report --db` on a FIFO: refused before any open (an open would wait for a writer forever)."""
    fifo = tmp_path / "sweeps.db"
    os.mkfifo(fifo)
    (tmp_path / "link.db").symlink_to(fifo)
    for path in (fifo, tmp_path / "link.db"):
        out = trainctl("report", "--db", path, "--out", tmp_path / "report.txt")
        assert out.returncode == 2
        assert one_line(out.stderr).endswith("is not a regular file, so not a sweep history; left untouched")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and not (tmp_path / "report.txt").exists()
