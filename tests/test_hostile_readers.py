"""One reader contract for every file trainctl reads from a job directory, a journal directory or
the fleet's drop directory: a regular file only (a FIFO, a device or a directory in its place is
never opened for reading or writing, never waited on), never through a link out of its directory
(another user's file), at most so many bytes, and bad content one line, never a crash.

Real inputs: FIFOs made with mkfifo, symlinks, sparse files, and the real `trainctl gate decide`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.jobdir_names import JobPaths

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NO_BLOCK_S = 60          # a read or write that never returns is caught by this, not timed by it


def node_report(host, status="ok"):
    return {"host": host, "status": status,
            "checks": [{"name": "nvlink.links", "status": status, "reason": "fine", "details": {}}]}


def event(t, name, **fields) -> str:
    return json.dumps({"t": t, "event": name, **fields})


def gate_dir(tmp_path: Path, *hosts: str) -> JobPaths:
    paths = JobPaths.of(tmp_path, "9")
    paths.node_reports.mkdir(parents=True)
    for host in hosts:
        paths.node_report(host).write_text(json.dumps(node_report(host)))
        paths.node_report_final(host).write_text(json.dumps({"host": host}))
    return paths


def decide(paths: JobPaths, *args: str) -> subprocess.CompletedProcess:
    """The real `gate decide`, in a process of its own: for what could block forever."""
    return subprocess.run([TRAINCTL, "gate", "decide", "--dir", str(paths.root), *args], capture_output=True,
                          text=True, timeout=NO_BLOCK_S, env={**os.environ, "PATH": "/nonexistent"})


def read_bytes_of(function, *args):
    """`function(*args)`, and how many bytes this process read while it ran (/proc/self/io's rchar:
    every read(2), whatever the disk holds; a sparse file's zeros count)."""
    def rchar() -> int:
        return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])

    before = rchar()
    value = function(*args)
    return value, rchar() - before


# ---------------------------------------------------------------- gate decide

def test_gate_decide_reads_no_node_report_linked_out_of_the_job_directory(tmp_path):
    """A link at nodes/<node>.json to a file elsewhere (another user's, or a report of a healthy
    node copied out of another job) is no report: the node is judged as one without a report."""
    paths = gate_dir(tmp_path, "n1")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(node_report("n2")))
    os.symlink(elsewhere, paths.node_report("n2"))
    out = decide(paths, "--nodes", "2", "--allocated", "n[1-2]")
    assert out.returncode == 2, out.stderr
    assert "n2" in out.stderr.splitlines()[-1] and "no health report" in out.stderr
    decision = json.loads(paths.decision.read_text())
    assert decision["chosen"] == [] and elsewhere.read_text() == json.dumps(node_report("n2"))


@pytest.mark.parametrize("thing", ["fifo", "directory"])
def test_a_fifo_or_a_directory_as_the_gate_report_never_blocks_or_kills_gate_decide(tmp_path, thing):
    """report.txt is the gate's words for a human: where something else is in its place, one line
    says so, it is left as it is, and the gate decides all the same (decision.json, and here, with
    a node that never reported, its one line and exit 2)."""
    paths = gate_dir(tmp_path, "n1")
    os.mkfifo(paths.report) if thing == "fifo" else paths.report.mkdir()
    out = decide(paths, "--nodes", "2", "--allocated", "n[1-2]")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert lines == [f"trainctl: warning: cannot write {paths.report}: not a regular file", lines[-1]], out.stderr
    assert lines[-1].startswith("trainctl: error: only 0 of 2 nodes healthy") and "n2 no health report" in lines[-1]
    assert json.loads(paths.decision.read_text())["chosen"] == []
    kind = stat.S_ISFIFO if thing == "fifo" else stat.S_ISDIR
    assert kind(os.lstat(paths.report).st_mode)


@pytest.mark.parametrize("content", [b"[1, 2]\n", b'{"host": ["n2"], "status": "ok", "checks": []}\n',
                                     b'{"host": "n2", "status": "ok", "checks": [{"name": 7}]}\n',
                                     bytes(range(256)) * 4])
def test_a_node_report_that_is_no_report_is_one_line_and_that_node_unreported(tmp_path, content):
    paths = gate_dir(tmp_path, "n1")
    paths.node_report("n2").write_bytes(content)
    out = decide(paths, "--nodes", "2", "--allocated", "n[1-2]")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    warnings = [line for line in out.stderr.splitlines() if str(paths.node_report("n2")) in line]
    assert len(warnings) == 1 and warnings[0].endswith("treated as missing"), out.stderr
    assert "n2 no health report" in out.stderr.splitlines()[-1]


@pytest.mark.parametrize("content, said", [("[1, 2]", "not a JSON object"),
                                           ('{"nodes": {"n1": 5}}', "not a fabric report")])
def test_a_fabric_report_that_is_no_report_is_one_line_while_gate_decide_waits(tmp_path, content, said):
    """`gate decide --wait` reads fabric.json as soon as it appears, for the nodes it says were lost."""
    paths = gate_dir(tmp_path, "n1", "n2")
    paths.fabric.write_text(content + "\n")
    out = decide(paths, "--nodes", "2", "--allocated", "n[1-2]", "--deadline", "30")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"{paths.fabric}: {said}" in out.stderr and "treated as missing" in out.stderr
    assert "n1 fabric: the fabric test's coordinator (rank 0) left no report" in out.stderr.splitlines()[-1]


# ---------------------------------------------------------------- journals

def test_an_earlier_attempts_journal_is_read_no_further_than_a_journals_size(tmp_path):
    """The supervisor reads the chain's earlier journals at its start (for its metrics and alerts):
    a sparse file of a gigabyte there costs a journal's size of reading, not the gigabyte."""
    from trainctl.job.jobdir import AttemptRecord, earlier_attempts, write_json
    from trainctl.journal_events import JOURNAL_MAX_BYTES

    first, second = JobPaths.of(tmp_path, "9"), JobPaths.of(tmp_path, "10")
    first.root.mkdir()
    second.root.mkdir()
    write_json(second.attempt, AttemptRecord("10", 2, 1, "9").to_json())
    with open(first.journal, "wb") as handle:
        handle.write((event(100, "job_start", job="9", attempt=1) + "\n").encode())
        handle.truncate(1 << 30)              # sparse: no disk used, 1 GiB of zeros to whoever reads it
    attempts, read = read_bytes_of(earlier_attempts, second)
    assert [(job, [str(e["event"]) for e in events]) for job, events in attempts] == [("9", ["job_start"])]
    assert read < JOURNAL_MAX_BYTES + (4 << 20), f"{read >> 20} MiB read"


@pytest.mark.parametrize("where", ["drop directory", "job directory"])
def test_fleet_memory_folds_no_journal_linked_out_of_the_directory_it_is_found_in(tmp_path, where):
    """The site's journal directory is everyone's to drop journals in: a link there (or at a job
    directory's journal.jsonl) to another user's journal is refused in one line, never read."""
    from trainctl.sweep.db import History
    from support.slurm_records import slurm_vouching_for
    from trainctl.sweep.fleet import fold_journals, journal_paths

    theirs = tmp_path / "theirs" / "9.jsonl"
    theirs.parent.mkdir()
    theirs.write_text("".join(line + "\n" for line in (
        event(100, "job_start", job="9", attempt=1),
        event(105, "node_verdict", node="node3", verdict="excluded", reasons=["gpu.xid: Xid 79"]),
        event(131, "job_end", status=0))))
    drop = tmp_path / "drop"
    drop.mkdir()
    link = drop / "9.jsonl" if where == "drop directory" else JobPaths.of(drop, "9").journal
    link.parent.mkdir(exist_ok=True)
    os.symlink(theirs, link)
    said: list[str] = []
    with History.open(tmp_path / "h.db", write=True) as history:
        # Slurm's accounting vouches for job 9 (its own file): the link is refused before it is read
        result = fold_journals(history, journal_paths(str(drop)), site="", now=200.0, say=said.append,
                               ask=slurm_vouching_for([theirs]))
        assert result.folded == 0 and history.job_events(0.0, ("exclusion",)) == []
    assert said == [f"journal {link}: a link out of {link.parent}, not read; skipped"]


# ---------------------------------------------------------------- the retry

def test_a_fifo_as_the_report_never_blocks_the_retry(tmp_path):
    """The retry adds its line to report.txt at the job's end: a FIFO there is left as it is, and
    the retry's record is written all the same."""
    import threading

    from trainctl.job.jobdir import read_retry
    from trainctl.job.retry import retry_around_bad_nodes

    paths = JobPaths.of(tmp_path, "9")
    paths.root.mkdir()
    os.mkfifo(paths.report)
    done = {}
    thread = threading.Thread(target=lambda: done.update(record=retry_around_bad_nodes(
        str(paths.root), "gate", 2, ["n1"], 0, str(tmp_path / "job.sh"), (), {"SLURM_JOB_ID": "9"}, (1, 1))),
        daemon=True)
    thread.start()
    thread.join(NO_BLOCK_S)
    assert not thread.is_alive(), "the retry blocked on report.txt"
    assert done["record"].retry is False and read_retry(paths) == done["record"]
    assert stat.S_ISFIFO(os.lstat(paths.report).st_mode)


# ---------------------------------------------------------------- the supervisor's own steps

@pytest.mark.parametrize("thing", ["fifo", "directory"])
def test_a_fifo_or_a_directory_as_a_steps_srun_log_never_holds_the_supervisor(tmp_path, thing):
    """srun's own messages for the gate step go to srun-trainctl-gate.log in the gate directory:
    where something else is in its place, they go to the job's output, and the step starts."""
    import threading

    from trainctl.job.machine import GATE_STEP
    from trainctl.job.slurm_actions import own_step_srun_log, start_step

    argv = ["true", f"--job-name={GATE_STEP}", f"--output={tmp_path}/node-%N.log"]
    log = Path(own_step_srun_log(argv))
    os.mkfifo(log) if thing == "fifo" else log.mkdir()
    started = {}
    thread = threading.Thread(target=lambda: started.update(step=start_step(argv, dict(os.environ))), daemon=True)
    thread.start()
    thread.join(NO_BLOCK_S)
    assert not thread.is_alive(), "the supervisor blocked on the step's srun log"
    assert started["step"].wait(NO_BLOCK_S) == 0
    kind = stat.S_ISFIFO if thing == "fifo" else stat.S_ISDIR
    assert kind(os.lstat(log).st_mode)
