"""The job's files under hostile input: what a program, a node, Slurm or another user can leave
in a job directory, read back by `trainctl job show` and by the supervisor. Each becomes one
line and a documented exit code, or "unknown"; nothing blocks, nothing exits 70, nothing moves
the terminal, and nothing outside the job directory is read.

Real inputs: FIFOs made with mkfifo, symlinks, a Unix socket of another user in a sticky
directory, a `scontrol` on PATH that hangs or prints a job name with escape sequences.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.cli_runs import run_main
from trainctl.job.jobdir import JobPaths

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NO_BLOCK_S = 60          # a read that never returns is caught by this, not timed by it


def strict_json(text: str):
    """JSON as RFC 8259 has it: NaN and Infinity are not JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def journal(directory: Path, *lines: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "journal.jsonl").write_text("".join(line + "\n" for line in lines))


def event(t, name, **fields) -> str:
    return json.dumps({"t": t, "event": name, **fields})


def show(*args, env=None):
    """`trainctl job show` in this process, with no Slurm on PATH (only --dir tells where)."""
    return run_main("job", "show", *args, env={"PATH": "/nonexistent", **(env or {})})


def show_process(*args, path="/nonexistent"):
    """In a process of its own: for what could block forever."""
    return subprocess.run([TRAINCTL, "job", "show", *args], capture_output=True, text=True, timeout=NO_BLOCK_S,
                          env={**os.environ, "PATH": path})


def finishes(function, *args):
    """`function(*args)` in a thread: its result or its exception, or a failure where it does not return."""
    result = {}

    def call():
        try:
            result["value"] = function(*args)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(NO_BLOCK_S)
    assert not thread.is_alive(), f"{function.__name__} blocked"
    if "error" in result:
        raise result["error"]
    return result["value"]


HEALTHY = [event(100, "job_start", attempt=1), event(110, "training_start", nodes="node[1-2]")]


@pytest.mark.parametrize("bad", [
    '{"t": NaN, "event": "job_start"}', '{"t": Infinity, "event": "job_end", "status": 0}',
    '{"t": -Infinity, "event": "step_end", "status": 1}',
    '{"t": 1' + "0" * 400 + ', "event": "training_start"}',
    event(120, "step_end", status=10 ** 400, training_start_t=110, last_checkpoint_t=1e300),
    event(120, "step_end", status=1, training_start_t="110", last_checkpoint_t=[1]),
    event(120, "detection", kind="hung", suspects=5, evidence=None),
    event(120, "detection", kind="slow", suspects="node1", details={"step_s": 10 ** 400, "baseline_s": 1}),
    event(120, "confirmation", kind="hung", named=["node1"]),
    event(120, "node_verdict", node="node1", verdict="excluded", reasons=7),
    event(120, "checkpoint_request", signal=float("nan")),
    '{"t": 120, "event": "stacks", "files": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"t": 120, "event": "drain", "node": ' + "[" * 50 + "1" + "]" * 50 + "}",
    '{"t": 120, "event": "retry", "retry": true, "reason": "x", "bad_nodes": {"a": 1}, "exclude": "node1"}',
])
def test_journal_values_no_trainctl_writes_are_shown_or_skipped_never_a_crash_and_json_stays_json(tmp_path, bad):
    gate = tmp_path / "trainctl-gate-9"
    journal(gate, *HEALTHY, bad, event(130, "step_end", status=0, training_start_t=110), event(131, "job_end", status=0))
    text = show("9", "--dir", gate)
    assert text.returncode == 0, text.stderr
    assert "goodput: " in text.stdout and "job ended" in text.stdout
    data = show("9", "--dir", gate, "--json")
    assert data.returncode == 0, data.stderr
    assert strict_json(data.stdout)["goodput"]["running"] is False


@pytest.mark.parametrize("name", ["journal.jsonl", "decision.json", "retry.json", "attempt.json", "rank-node1-0.out"])
def test_a_fifo_in_a_files_place_never_blocks_job_show(tmp_path, name):
    gate = tmp_path / "trainctl-gate-9"
    journal(gate, *HEALTHY)
    (gate / name).unlink(missing_ok=True)
    os.mkfifo(gate / name)
    out = show_process("9", "--dir", str(gate))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"job 9: gate directory {gate}")


def test_a_fifo_or_garbage_as_a_node_file_never_blocks_or_kills_the_supervisors_poll(tmp_path):
    from trainctl.job.watch_io import read_node_files

    watch = tmp_path / "watch"
    watch.mkdir()
    os.mkfifo(watch / "node1.json")
    good = {"format": 1, "node": "node5", "t": 5.0, "ranks": {"0": {"steps": 4, "step_seconds": 1.0}}}
    for node, text in {"node2": '{"format": 1, "node": "node2", "t": 5, "ranks": {"0": {"steps": Infinity, '
                                '"step_seconds": 1}}}',
                       "node3": '{"format": 1, "node": "node3", "t": 5, "ranks": ' + "[" * 100_000 + "]" * 100_000
                                + "}",
                       "node4": '{"format": 1, "node": "node4", "t": 1' + "0" * 400 + "}",
                       "node5": json.dumps(good)}.items():
        (watch / f"{node}.json").write_text(text)
    (watch / "node6.json").mkdir()
    readings = finishes(read_node_files, str(tmp_path), ("node1", "node2", "node3", "node4", "node5", "node6"))
    assert [node for node, reading in readings.items() if reading] == ["node5"]
    assert readings["node5"].ranks[0].steps == 4


@pytest.mark.parametrize("kind", ["fifo", "directory", "link out"])
def test_a_checkpoint_marker_that_is_no_file_is_no_checkpoint_and_never_blocks_the_supervisor(tmp_path, kind):
    from trainctl.job.jobdir import Checkpoints, JobPaths, Journal

    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.root.mkdir()
    outside = tmp_path / "elsewhere"
    outside.write_text("secret\n")
    {"fifo": lambda: os.mkfifo(paths.checkpoint_marker), "directory": paths.checkpoint_marker.mkdir,
     "link out": lambda: paths.checkpoint_marker.symlink_to(outside)}[kind]()
    journal_file = Journal(paths.journal)
    seen = finishes(Checkpoints(paths, (), tmp_path, since=0.0).poll)
    assert seen is None and not paths.journal.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory", "link out", "huge", "control characters"])
def test_a_ranks_word_on_the_jobs_signal_is_one_printable_line_or_nothing_and_never_blocks(tmp_path, kind):
    """The watch folder is the ranks' to write: what the supervisor reads back from the signal's
    refusal file is its first line, cut short and printable; anything but a regular file inside the
    folder is no refusal (the signal is sent, as without one)."""
    from trainctl.job.jobdir import SIGNAL_REFUSED, SIGNAL_REFUSED_MAX_BYTES, JobPaths, read_signal_refusal

    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.watch.mkdir(parents=True)
    said = paths.watch / SIGNAL_REFUSED
    outside = tmp_path / "elsewhere"
    outside.write_text("secret\n")
    {"fifo": lambda: os.mkfifo(said), "directory": said.mkdir, "link out": lambda: said.symlink_to(outside),
     "huge": lambda: said.write_text("rank 0: " + "x" * 10_000_000 + "\nsecond line\n"),
     "control characters": lambda: said.write_text("rank 0: \x1b]0;owned\x07SIGUSR1\r\n")}[kind]()
    line = finishes(read_signal_refusal, paths)
    if kind in ("fifo", "directory", "link out"):
        assert line is None
    else:
        assert line.startswith("rank 0: ") and len(line) <= SIGNAL_REFUSED_MAX_BYTES * 4
        assert "\x1b" not in line and "\x07" not in line and "\n" not in line and "\r" not in line


def test_a_journal_of_any_size_is_read_whole_and_the_jobs_end_comes_from_the_events(tmp_path):
    """A 4,096-node job's gate rounds write megabytes: the end is still read."""
    gate = tmp_path / "trainctl-gate-9"
    verdicts = [event(105, "node_verdict", node=f"gpu{n:05d}", verdict="chosen", reasons=[]) for n in range(60_000)]
    journal(gate, *HEALTHY, *verdicts, event(130, "step_end", status=0, training_start_t=110),
            event(131, "job_end", status=0))
    assert (gate / "journal.jsonl").stat().st_size > 4 << 20
    data = show("9", "--dir", gate, "--json")
    assert data.returncode == 0, data.stderr
    assert strict_json(data.stdout)["goodput"]["running"] is False
    assert "still running" not in show("9", "--dir", gate).stdout


def test_still_running_is_judged_from_the_events_not_the_last_line(tmp_path):
    gate = tmp_path / "trainctl-gate-9"
    journal(gate, *HEALTHY, event(130, "step_end", status=0, training_start_t=110), event(131, "job_end", status=0),
            event(131.5, "agent_silent", node="node2", note="late"), '{"t": 132, "event": "checkpoint", "no')
    out = show("9", "--dir", gate)
    assert out.returncode == 0, out.stderr
    assert "goodput: " in out.stdout and "still running" not in out.stdout


def test_job_show_dir_reads_that_directorys_journal_not_a_siblings(tmp_path):
    mine = tmp_path / "copied-for-a-colleague"
    journal(mine, *HEALTHY, event(130, "step_end", status=0, training_start_t=110), event(131, "job_end", status=0))
    journal(tmp_path / "trainctl-gate-9", event(100, "job_start", attempt=7))
    out = show("9", "--dir", mine)
    assert out.returncode == 0, out.stderr
    assert "job started: attempt 1" in out.stdout and "attempt 7" not in out.stdout


def test_control_characters_from_the_program_and_from_slurm_never_reach_the_terminal(tmp_path):
    gate = tmp_path / "trainctl-gate-9"
    journal(gate, *HEALTHY, event(120, "checkpoint", checkpoint_t=120, note="saved\x1b]0;owned\x07\x1b[2J\r"),
            event(130, "step_end", status=0, training_start_t=110), event(131, "job_end", status=0))
    (gate / "rank-node1-0.out").write_text("step 1\x1b[31m red\x9b2J\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\nprintf 'JobId=9 JobName=run\\033]0;owned\\007 JobState=RUNNING "
                        f"WorkDir={tmp_path}\\n'\n")
    scontrol.chmod(0o755)
    out = show_process("9", path=f"{bin_dir}:/usr/bin:/bin")
    assert out.returncode == 0, out.stderr
    for char in "\x1b\x07\r\x9b":
        assert char not in out.stdout, repr(char)
    assert "job 9 (run\\x1b]0;owned\\x07)" in out.stdout and "saved\\x1b]0;owned" in out.stdout


def test_a_rank_log_linked_out_of_the_job_directory_is_not_followed(tmp_path):
    """Root running `job show` on a user's directory must not print /etc/shadow's last lines."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secrethash:19000:0:99999:7:::\n")
    gate = tmp_path / "trainctl-gate-9"
    journal(gate, *HEALTHY)
    (gate / "rank-node1-0.out").symlink_to(secret)
    (gate / "rank-node2-1.out").write_text("step 3 done\n")
    (gate / "decision.json").symlink_to(secret)
    out = show("9", "--dir", gate)
    assert out.returncode == 0, out.stderr
    assert "secrethash" not in out.stdout and "step 3 done" in out.stdout
    assert "secrethash" not in show("9", "--dir", gate, "--json").stdout


def test_a_scontrol_that_hangs_is_a_timeout_exit_4_not_no_record(tmp_path, monkeypatch):
    import trainctl.job.show

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexec sleep 600\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setattr(trainctl.job.show, "SCONTROL_TIMEOUT_S", 1.0)
    out = show("9", env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.returncode == 4, out.stderr
    assert out.stderr.count("\n") == 1 and "scontrol show job 9" in out.stderr and "no record" not in out.stderr


@pytest.mark.parametrize("field, value", [("nodes", "2"), ("retries", True), ("program", "train.py"),
                                          ("sbatch_options", [["--nodes", 2]]), ("environment", [["A"]]),
                                          ("bind", 1), ("spare", -1)])
def test_job_run_checks_the_plans_field_types(tmp_path, field, value):
    from trainctl.launcher.plan import SubmitRequest, plan_job
    from trainctl.site import load_site

    plan = plan_job(load_site("local-demo").config, SubmitRequest("local-demo", ("train.py",), 2),
                    node_trainctl="trainctl", node_python="python3", command=("trainctl",), version="0")
    document = json.loads(json.dumps(plan.to_document()))
    document[field] = value
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(document))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    out = run_main("job", "run", "--plan", plan_file, "--script", script, env={"SLURM_JOB_ID": "9"})
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and f"job plan: {field}: expected" in out.stderr


def test_settings_that_contradict_each_other_are_refused_at_load(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text((Path(__file__).resolve().parents[1] / "site-configs" / "local-demo.toml").read_text()
                    .replace("agent_silence_s = 10.0", "agent_silence_s = 1.5"))
    out = run_main("site", "show", site)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "watch.agent_silence_s = 1.5 must be more than watch.agent_write_s" in out.stderr


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's socket needs two users")


@pytest.fixture
def world_readable_dir():
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="trainctl-hostile-"))   # pytest's tmp_path is 0700 up the tree
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@needs_root
def test_the_agent_is_one_line_and_binds_nothing_when_another_user_holds_its_directory(world_readable_dir):
    """/tmp is sticky: another user may make the agent's private directory first, with a socket at
    the agent's path. The agent (nobody here) binds nothing, says so in one line and goes on."""
    from trainctl.agent_socket import agent_socket_path
    from trainctl.job.agent import Agent

    sticky = world_readable_dir / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    path = agent_socket_path("9", "node1", {"TMPDIR": str(sticky)}, uid=65534)
    os.mkdir(os.path.dirname(path), 0o700)    # root's: the agent below runs as nobody
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(path)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            agent = Agent.__new__(Agent)
            agent.socket_path, agent.request_path = path, path + ".checkpoint-request"
            lines = []
            agent._say = lines.append
            bound = agent._bind()
            said = "bound" if bound is not None else "\n".join(lines)
        except BaseException as exc:
            said = f"bug: {type(exc).__name__}: {exc}"
        os.write(write_end, said.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    squatter.close()
    assert said == (f"no progress socket for this node: {os.path.dirname(path)} belongs to uid 0, not to uid 65534 "
                    "(this job's user): remove it (another user may have put it there); the watch goes on with "
                    "this node's checks and node file, without its ranks' steps or checkpoint requests"), said


# ---------------------------------------------------------------- the job's own parts, read and written

def test_a_symlinked_watch_folder_is_refused_and_nothing_is_removed_or_written_through_it(tmp_path):
    """The supervisor empties watch/ before each training step and posts its requests there: where
    watch/ is a symlink (to the user's results, say), it says so in one line and touches nothing."""
    from trainctl.errors import UsageError
    from trainctl.job.watch_io import post_request, prepare_watch_dir

    elsewhere = tmp_path / "results"
    elsewhere.mkdir()
    kept = ["dump-request", "metrics.json", "stacks-node1.txt"]
    for name in kept:
        (elsewhere / name).write_text("mine\n")
    gate = tmp_path / "trainctl-gate-9"
    gate.mkdir()
    (gate / "watch").symlink_to(elsewhere)
    for attempt in (lambda: prepare_watch_dir(str(gate)), lambda: post_request(str(gate), "dump-request")):
        with pytest.raises(UsageError) as refused:
            finishes(attempt)
        assert str(refused.value) == f"the watch folder {gate / 'watch'} is a symbolic link: remove it"
    assert sorted(os.listdir(elsewhere)) == kept
    assert all((elsewhere / name).read_text() == "mine\n" for name in kept)


def test_a_fifo_or_a_list_as_a_nodes_compute_file_never_blocks_or_kills_gate_decide(tmp_path):
    """`gate decide` judges every node's compute/<node>.json: a FIFO there is no figures (the node is
    judged by its health report), and so is JSON that is not a report."""
    from trainctl.job.gate_compute import ComputePolicy, judge_gate_dir
    from trainctl.site import GateConfig

    compute = tmp_path / "compute"
    compute.mkdir()
    os.mkfifo(compute / "node1.json")
    (compute / "node2.json").write_text("[1, 2]\n")
    (compute / "node3.json").write_text(json.dumps({"host": "node3", "devices": [
        {"index": 0, "name": "CPU", "tflops": 1.0, "copy_gbps": 2.0, "error": ""}]}))
    verdicts, reasons = finishes(judge_gate_dir, JobPaths(tmp_path), ComputePolicy.from_gate(GateConfig()))
    assert [verdict.figures.host for verdict in verdicts] == ["node3"] and reasons == {}


def test_a_fifo_as_the_compute_turns_order_never_blocks_a_node(tmp_path, monkeypatch):
    """A node waiting its turn reads node 0's order; a FIFO there reads as no order: rank order."""
    import trainctl.job.gate_compute as gate_step

    monkeypatch.setattr(gate_step, "turn_limit_s", lambda budget_s: 0.3)
    (tmp_path / "compute").mkdir()
    os.mkfifo(tmp_path / "compute" / ".order")
    report = finishes(gate_step.run_for_gate, JobPaths(tmp_path), "node1", 1, 2, 0.1, True)
    assert report["host"] == "node1" and (tmp_path / "compute" / "node1.json").is_file()


def test_a_fifo_as_the_journal_never_blocks_the_jobs_end(tmp_path):
    """At the job's end the supervisor copies its journal to the site's journal directory: a FIFO
    in the journal's place is one line of why not, and nothing in the directory."""
    from trainctl.job.jobdir import drop_journal

    os.mkfifo(tmp_path / "journal.jsonl")
    drop = tmp_path / "drop"
    drop.mkdir()
    problem = finishes(drop_journal, str(tmp_path / "journal.jsonl"), str(drop), "9")
    assert problem == f"{tmp_path / 'journal.jsonl'}: not a regular file" and list(drop.iterdir()) == []


BAD_LINES = {"not JSON": '{"t": 105, "event": "node_verdict", "no',
             "a field of another type": event(105, "node_verdict", node=7, verdict="excluded", reasons=["gpu.xid"])}


@pytest.mark.parametrize("bad", BAD_LINES)
def test_job_show_reads_past_a_bad_journal_line_and_fleet_memory_refuses_the_journal(tmp_path, bad):
    """One reader of the journal's bytes and lines, two rules on purpose: `job show` shows what
    the other lines say; fleet memory keys its rows by line and counts what the events say, so a
    line the supervisor never writes refuses the whole journal (nothing of it is counted)."""
    from trainctl.job.jobdir import read_journal, read_journal_bytes
    from trainctl.sweep.fleet import JournalRefused, parse_journal_bytes

    gate = tmp_path / "trainctl-gate-9"
    journal(gate, event(100, "job_start", job="9", attempt=1), BAD_LINES[bad],
            event(110, "training_start", nodes="node[1-2]"), event(130, "step_end", status=0, training_start_t=110),
            event(131, "job_end", status=0))
    kinds = [str(entry["event"]) for entry in read_journal(gate / "journal.jsonl")]
    assert kinds == ["job_start", *(["node_verdict"] if bad != "not JSON" else []), "training_start", "step_end",
                     "job_end"]
    out = show("9", "--dir", gate)
    assert out.returncode == 0 and "training step started" in out.stdout and "job ended" in out.stdout, out.stderr
    with pytest.raises(JournalRefused, match="^line 2 is not a journal event: damaged$"):
        parse_journal_bytes(read_journal_bytes(gate / "journal.jsonl"), named_job="9", site="", now=200.0)


def strict_utf8_json(text: str):
    """JSON that a strict parser takes: also no lone surrogate, escaped or not (RFC 8259 §8.2)."""
    document = strict_json(text)
    json.dumps(document, ensure_ascii=False).encode("utf-8")   # UnicodeEncodeError for a lone surrogate
    return document


def test_job_show_json_is_strict_json_where_the_journal_spells_a_lone_surrogate(tmp_path):
    gate = tmp_path / "trainctl-gate-9"
    journal(gate, *HEALTHY, r'{"t": 120, "event": "checkpoint", "checkpoint_t": 120, "note": "saved \ud800",'
            r' "\udfff": "x"}', event(130, "step_end", status=0, training_start_t=110),
            event(131, "job_end", status=0))
    data = show("9", "--dir", gate, "--json")
    assert data.returncode == 0, data.stderr
    events = strict_utf8_json(data.stdout)["timeline"][0]["events"]
    assert {"note": "saved \ufffd", "\ufffd": "x"}.items() <= events[2].items()
    text = show("9", "--dir", gate)
    assert text.returncode == 0 and "saved \ufffd" in text.stdout, text.stderr


def test_a_journal_line_with_a_lone_surrogate_folds_into_fleet_memory(tmp_path):
    """SQLite takes no lone surrogate: the journal's reader makes it U+FFFD first."""
    from trainctl.sweep.db import History
    from support.slurm_records import slurm_vouching_for
    from trainctl.sweep.fleet import fold_journals

    gate = tmp_path / "trainctl-gate-9"
    journal(gate, event(100, "job_start", job="9", attempt=1),
            r'{"t": 105, "event": "node_verdict", "node": "node3", "verdict": "excluded",'
            r' "reasons": ["gpu.xid: \ud800"]}',
            event(131, "job_end", status=0))
    with History.open(tmp_path / "h.db", write=True) as history:
        result = fold_journals(history, [str(gate / "journal.jsonl")], site="", now=200.0,
                               ask=slurm_vouching_for([gate / "journal.jsonl"]))
        assert (result.folded, result.refused) == (1, [])
        assert [row.detail for row in history.job_events(0.0, ("exclusion",))] == ["gpu.xid: \ufffd"]


def test_a_fifo_as_a_nodes_compute_report_never_blocks_the_node_that_writes_it(tmp_path, capfd):
    """A node's gate step writes compute/<node>.json: a FIFO there is refused in one line, left as
    it is, and the node's gate step goes on (the node is judged by its health report)."""
    from trainctl.job.gate_compute import run_for_gate

    (tmp_path / "compute").mkdir()
    os.mkfifo(tmp_path / "compute" / "node1.json")
    report = finishes(run_for_gate, JobPaths(tmp_path), "node1", 0, 1, 0.1, False)
    assert report["host"] == "node1"
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "compute report not written" in err and "not a regular file" in err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "compute" / "node1.json").st_mode)


def test_a_fifo_as_the_compute_turns_order_never_blocks_node_0_that_writes_it(tmp_path, capfd, monkeypatch):
    import trainctl.job.gate_compute as gate_step

    monkeypatch.setattr(gate_step, "turn_limit_s", lambda budget_s: 0.3)
    (tmp_path / "compute").mkdir()
    os.mkfifo(tmp_path / "compute" / ".order")
    report = finishes(gate_step.run_for_gate, JobPaths(tmp_path), "node0", 0, 1, 0.1, True)
    assert report["host"] == "node0" and (tmp_path / "compute" / "node0.json").is_file()
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "order not written" in err and "not a regular file" in err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "compute" / ".order").st_mode)


@pytest.mark.parametrize("thing", ["fifo", "link out"])
def test_a_fifo_or_a_link_as_a_nodes_watch_file_is_refused_in_one_line_never_written(tmp_path, thing):
    """The node agent writes watch/<node>.json each second: a FIFO in its place (or a link out of the
    job directory) is one line, the agent's, and the next write tries again; nothing is written
    into it or through it."""
    from trainctl.errors import UsageError
    from trainctl.job.jobdir import JobPaths, NodeReading, write_node_file

    paths = JobPaths(tmp_path)
    paths.watch.mkdir(parents=True)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text("theirs\n")
    if thing == "fifo":
        os.mkfifo(paths.node_file("node1"))
    else:
        paths.node_file("node1").symlink_to(outside)
    with pytest.raises(UsageError) as refused:
        finishes(write_node_file, paths, NodeReading("node1", 5.0))
    assert str(refused.value) == f"cannot write {paths.node_file('node1')}: not a regular file"
    assert outside.read_text() == "theirs\n"
    assert (stat.S_ISFIFO if thing == "fifo" else stat.S_ISLNK)(os.lstat(paths.node_file("node1")).st_mode)


def fill_journal(path: Path, size: int) -> int:
    """A journal of `size` bytes in the supervisor's own line format: a job that trained, about a
    million small events between its start and its end; how many events it holds."""
    from trainctl.journal_events import Kind, journal_line

    def line(t, kind, **fields):
        return journal_line(t, kind, fields)[1] + "\n"

    start = line(100, Kind.JOB_START, attempt=1) + line(110, Kind.TRAINING_START, nodes="node[1-2]")
    end = line(9e5, Kind.STEP_END, status=0, training_start_t=110) + line(9e5, Kind.JOB_END, status=0)
    filler = line(200, Kind.STACKS)
    count = (size - len(start) - len(end)) // len(filler)
    with open(path, "w") as handle:
        handle.write(start)
        for _ in range(count // 1000):
            handle.write(filler * 1000)
        handle.write(filler * (count % 1000) + end)
    return count + 4


def show_measured(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """`trainctl job show` in a process of its own, with its peak resident memory in bytes."""
    measure = ("import resource, subprocess, sys; out = open(sys.argv[1], 'w'); "
               "code = subprocess.run(sys.argv[2:], stdout=out, env={'PATH': '/nonexistent'}).returncode; "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", measure, str(tmp_path / "out"), TRAINCTL, "job", "show", *args],
                            capture_output=True, text=True, timeout=600)
    return (subprocess.CompletedProcess(result.args, result.returncode, (tmp_path / "out").read_text(), result.stderr),
            int(result.stdout))


def test_job_show_on_a_journal_of_a_million_events_shows_both_ends_and_says_what_it_left_out(tmp_path):
    """A full journal (64 MiB, the most any reader takes) in bounded memory, with a timeline of
    its first and last events, the goodput of all of them, and one line for the rest; --json too."""
    from trainctl.journal_events import JOURNAL_MAX_BYTES

    gate = tmp_path / "trainctl-gate-9"
    gate.mkdir()
    count = fill_journal(gate / "journal.jsonl", JOURNAL_MAX_BYTES)
    out, peak = show_measured(tmp_path, "9", "--dir", str(gate))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f"timeline: 1,000 of {count:,} events shown, the first and the last; {count - 1000:,} between not shown " \
           f"({count - 1000:,} watch: every rank's stack recorded) (job show reads 64 MiB of journals at most)" in lines
    assert len(lines) < 1100 and "  ..." in lines and lines[-6].endswith("job 9: job ended: status 0")
    assert any(line.startswith("goodput: ") and "productive" in line for line in lines)
    assert peak < 4 * JOURNAL_MAX_BYTES                      # before: the whole journal as events, 10 times its size
    data, _ = show_measured(tmp_path, "9", "--dir", str(gate), "--json")
    document = strict_utf8_json(data.stdout)
    assert len(document["timeline"][0]["events"]) == 1000 and document["timeline_left_out"].startswith("timeline: 1,000 of")
    assert document["goodput"]["running"] is False and document["goodput_unknown"] is None


def test_job_show_reads_a_chains_journals_up_to_its_bound_this_jobs_first_and_says_which_it_did_not(
        tmp_path, monkeypatch):
    import trainctl.job.show

    monkeypatch.setattr(trainctl.job.show, "SHOW_JOURNAL_BYTES", 1 << 20)
    for job, previous, successor in (("7", None, "8"), ("8", "7", "9"), ("9", "8", None)):
        gate = tmp_path / f"trainctl-gate-{job}"
        gate.mkdir()
        fill_journal(gate / "journal.jsonl", 600 << 10)
        if previous:
            (gate / "attempt.json").write_text(json.dumps({"job_id": job, "attempt": int(job) - 6, "retries": 2,
                                                           "previous_job": previous, "excluded": []}))
        if successor:
            (gate / "retry.json").write_text(json.dumps({"job_id": job, "attempt": int(job) - 6, "retries": 2,
                                                         "reason": "lost", "phase": "step", "status": 1, "bad_nodes": {},
                                                         "exclude": [], "successor": successor, "retry": True}))
    out = show("8", "--dir", tmp_path / "trainctl-gate-8")
    assert out.returncode == 0, out.stderr
    summary = next(line for line in out.stdout.splitlines() if line.startswith("timeline: "))
    assert summary.endswith("read in part: the journal of job 9; not read: the journal of job 7 "
                            "(job show reads 1 MiB of journals at most)")
    assert "goodput: not computed: not every journal of the chain was read whole" in out.stdout
    data = show("8", "--dir", tmp_path / "trainctl-gate-8", "--json")
    assert strict_utf8_json(data.stdout)["goodput"] is None
