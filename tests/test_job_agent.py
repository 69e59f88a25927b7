"""`trainctl job agent`: the node side of watching the training. The pure part (reports folded
into per-rank totals, a check run judged against the baseline, the node file) without sockets;
then the agent itself on this machine, fed by a real reporting process and a replayed kernel log."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.replay import LIBRARY, swap_replay
from trainctl.errors import ParseError
from trainctl.health.parse.schedstat import parse_schedstat
from trainctl.health.status import CheckResult, Status
from trainctl.job.agent import (NO_PIPE, NO_READER, ChecksState, Problem, RankProgress, ask_flight_recorder,
                                await_flight_recorder_dumps, dump_stacks, flight_recorder_text, fold, fold_save,
                                judge_run,
                                main_thread_times, node_reading, run_failed, squares, stacks_text,
                                with_main_thread_times)
from trainctl.guest import wire
from trainctl.job.jobdir import LinkReading, node_file_json, parse_node_file

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NO_XID_DMESG = LIBRARY / "kernel/syslog/imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"
XID_DMESG = LIBRARY / "kernel/xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log"


def report(rank=0, pid=100, steps=1, t=1000.0, window_steps=1, window_seconds=0.5, compute=0.1, checkpoint=-1):
    """A decoded progress report, as trainctl.progress.decode returns it."""
    return {"rank": rank, "pid": pid, "steps": steps, "time": t, "window_steps": window_steps,
            "window_seconds": window_seconds, "window_longest": window_seconds, "compute_seconds": compute,
            "checkpoint_step": checkpoint}


# ---------------------------------------------------------------- folding reports

def test_steps_are_the_reported_total_and_durations_are_summed():
    ranks = fold({}, report(steps=3, window_steps=3, window_seconds=1.5, compute=0.3, t=10.0))
    ranks = fold(ranks, report(steps=5, window_steps=2, window_seconds=1.0, compute=0.2, t=11.0))
    ranks = fold(ranks, report(rank=1, pid=200, steps=4, window_seconds=2.0, compute=0.0, t=11.5))
    assert ranks[0] == RankProgress(0, pid=100, steps=5, step_seconds=2.5, compute_seconds=pytest.approx(0.5),
                                    last_step_t=11.0, checkpoint_step=None, step_seconds_sq=1.5 ** 2 + 1.0 ** 2)
    assert ranks[1].steps == 4 and ranks[1].pid == 200


def test_a_checkpoint_report_keeps_the_step_and_a_later_report_without_one_keeps_it_too():
    ranks = fold({}, report(steps=50, t=20.0))
    ranks = fold(ranks, report(steps=50, window_steps=0, window_seconds=0.0, compute=0.0, t=20.0, checkpoint=50))
    ranks = fold(ranks, report(steps=51, t=21.0))
    assert (ranks[0].checkpoint_step, ranks[0].steps, ranks[0].last_step_t) == (50, 51, 21.0)
    assert ranks[0].checkpoint_t == 20.0     # when the agent heard of the save: the supervisor's checkpoint seen


def test_a_new_pid_for_a_rank_is_a_restarted_process_whose_counts_start_again():
    ranks = fold({}, report(pid=100, steps=80, window_seconds=40.0, checkpoint=80))
    ranks = fold(ranks, report(pid=300, steps=2, window_seconds=1.0))
    assert ranks[0] == RankProgress(0, pid=300, steps=2, step_seconds=1.0, compute_seconds=0.1, last_step_t=1000.0,
                                    step_seconds_sq=1.0)


def save_report(rank=0, pid=100, t=30.0, path="/ckpt/step_50.pt", api="torch.save"):
    """A decoded save, as trainctl.guest.wire.decode_save returns it."""
    return {"rank": rank, "pid": pid, "time": t, "api": api, "path": path}


def test_a_save_is_the_ranks_last_one_and_later_reports_keep_it():
    ranks = fold({}, report(steps=50, t=20.0))
    ranks = fold_save(ranks, save_report(t=30.0))
    ranks = fold_save(ranks, save_report(t=31.0, path="/ckpt/step_50", api="torch.distributed.checkpoint"))
    ranks = fold(ranks, report(steps=51, t=32.0))
    assert (ranks[0].save_t, ranks[0].save_api, ranks[0].save_path, ranks[0].steps) == \
        (31.0, "torch.distributed.checkpoint", "/ckpt/step_50", 51)


def test_a_save_from_a_process_that_has_not_reported_as_the_rank_is_not_the_ranks():
    ranks = fold({}, report(pid=100))
    assert fold_save(ranks, save_report(pid=999)) == ranks       # a forked child, or a process before its claim
    assert fold_save({}, save_report()) == {}
    assert fold(fold_save(ranks, save_report()), report(pid=300)) [0].save_path == ""   # a restart: none yet


def test_a_save_datagram_round_trips_and_is_told_apart_from_a_report():
    datagram = wire.encode_save(3, 77, 12.5, wire.SAVE_APIS.index("safetensors"), b"/ck/model.safetensors")
    assert wire.is_save(datagram) and not wire.is_save(wire.RECORD.pack(wire.VERSION, *[0] * 10))
    assert wire.decode_save(datagram) == {"rank": 3, "pid": 77, "time": 12.5, "api": "safetensors",
                                          "path": "/ck/model.safetensors"}
    cut = wire.decode_save(wire.encode_save(0, 1, 1.0, 0, b"/" + b"a" * 10_000))["path"]
    assert len(cut) == wire.SAVE_PATH_MAX                             # a longer path is cut, never an error
    size = wire.SAVE_RECORD.size
    for bad in (datagram[:size],                                           # no path
                datagram[:size - 1] + bytes([len(wire.SAVE_APIS)]) + datagram[size:],   # an API of no name
                bytes([wire.VERSION]) + datagram[1:]):                     # a progress report's tag
        with pytest.raises(ValueError):
            wire.decode_save(bad)


def test_a_reports_squares_are_its_longest_step_and_the_rest_as_equal_steps():
    assert squares(1, 2.0, 2.0) == 4.0
    assert squares(3, 9.0, 8.0) == pytest.approx(64.0 + 0.5)     # 8 s and two of 0.5 s
    assert squares(0, 0.0, 0.0) == 0.0 and squares(2, 1.0, 5.0) == pytest.approx(1.0)   # longest capped at the sum
    ranks = fold({}, {**report(steps=3, window_steps=3, window_seconds=9.0), "window_longest": 8.0})
    assert ranks[0].step_seconds_sq == pytest.approx(64.5)


def test_a_rank_with_no_step_yet_has_no_last_step_time():
    assert fold({}, report(steps=0, window_steps=0))[0].last_step_t == 0.0


# ---------------------------------------------------------------- judging check runs

def ok(name, **details):
    return CheckResult(name, Status.OK, "fine", details)


def failing(name, reason="Xid 79 on GPU 3"):
    return CheckResult(name, Status.FAIL, reason)


def test_the_first_run_is_the_baseline_and_a_check_failing_since_then_is_reported():
    first = judge_run(ChecksState(), [ok("gpu.xid"), ok("gpu.ecc")], t=1.0)
    assert (first.runs, first.failed, first.unknown) == (1, (), ())
    second = judge_run(first, [failing("gpu.xid"), ok("gpu.ecc")], t=2.0)
    assert second.failed == (Problem("gpu.xid", "Xid 79 on GPU 3"),)
    assert (second.runs, second.t) == (2, 2.0)


def test_a_check_that_failed_at_the_baseline_is_not_news():
    state = judge_run(ChecksState(), [failing("gpu.row_remap", "pending")], t=1.0)
    state = judge_run(state, [failing("gpu.row_remap", "pending")], t=2.0)
    assert state.failed == ()


def test_could_not_tell_is_unknown_never_failed():
    state = judge_run(ChecksState(), [ok("gpu.ecc")], t=1.0)
    state = judge_run(state, [CheckResult("gpu.ecc", Status.UNKNOWN, "nvidia-smi: timed out after 10 s")], t=2.0)
    assert state.failed == () and state.unknown == (Problem("gpu.ecc", "nvidia-smi: timed out after 10 s"),)
    assert judge_run(state, [ok("gpu.ecc")], t=3.0).unknown == ()


def test_counter_checks_are_judged_by_growth_since_the_baseline_reading():
    reading = {"counters": {"mlx5_0:1": {"link_downed": 2, "symbol_error": 7}}}
    grown = {"counters": {"mlx5_0:1": {"link_downed": 3, "symbol_error": 7}}}
    state = judge_run(ChecksState(), [ok("ib.counters", **reading)], t=1.0)
    assert judge_run(state, [ok("ib.counters", **reading)], t=2.0).failed == ()
    later = judge_run(state, [ok("ib.counters", **grown)], t=3.0)
    assert [p.check for p in later.failed] == ["ib.counters"]
    assert "link_downed +1" in later.failed[0].reason and "since the agent's first check run" in later.failed[0].reason


def test_a_counter_check_without_a_first_reading_takes_its_first_good_one_as_the_baseline():
    state = judge_run(ChecksState(), [CheckResult("ib.counters", Status.UNKNOWN, "no sysfs")], t=1.0)
    state = judge_run(state, [ok("ib.counters", counters={"mlx5_0:1": {"link_downed": 9}})], t=2.0)
    assert state.failed == () and state.unknown == ()
    state = judge_run(state, [ok("ib.counters", counters={"mlx5_0:1": {"link_downed": 10}})], t=3.0)
    assert [p.check for p in state.failed] == ["ib.counters"]


def test_a_run_that_broke_makes_its_checks_unknown_and_keeps_what_failed_before():
    state = judge_run(ChecksState(), [ok("gpu.xid")], t=1.0)
    state = judge_run(state, [failing("gpu.xid")], t=2.0)
    broken = run_failed(state, ("gpu.xid", "gpu.ecc"), "OSError: disk full", t=3.0)
    assert broken.failed == state.failed and broken.runs == 3 and broken.t == 3.0
    assert broken.unknown == (Problem("gpu.xid", "the check run failed: OSError: disk full"),
                              Problem("gpu.ecc", "the check run failed: OSError: disk full"))
    assert judge_run(broken, [ok("gpu.xid")], t=4.0).failed == ()   # a later run replaces it


# ---------------------------------------------------------------- the node file and the stacks file

def test_the_node_file_is_the_designs_document_and_the_supervisor_reads_back_what_the_agent_wrote():
    ranks = {1: RankProgress(1, pid=7, steps=3, step_seconds=1.5, compute_seconds=0.2, last_step_t=5.0,
                             checkpoint_step=2, checkpoint_t=4.5, activity=4, cpu_seconds=1.2, runq_seconds=0.25),
             0: RankProgress(0, pid=6)}
    checks = ChecksState(runs=2, t=9.0, failed=(Problem("gpu.xid", "Xid 79"),), unknown=(Problem("gpu.ecc", "?"),))
    reading = node_reading("node2", 10.0, 1.0, ranks, checks)
    assert node_file_json(reading) == {
        "format": 1, "node": "node2", "t": 10.0, "started_t": 1.0,
        "ranks": {"0": {"pid": 6, "steps": 0, "step_seconds": 0.0, "compute_seconds": 0.0, "last_step_t": None,
                        "checkpoint_step": None, "checkpoint_t": None, "activity": 0, "cpu_seconds": None,
                        "runq_seconds": None, "step_seconds_sq": 0.0},
                  "1": {"pid": 7, "steps": 3, "step_seconds": 1.5, "compute_seconds": 0.2, "last_step_t": 5.0,
                        "checkpoint_step": 2, "checkpoint_t": 4.5, "activity": 4, "cpu_seconds": 1.2,
                        "runq_seconds": 0.25, "step_seconds_sq": 0.0}},
        "checks": {"t": 9.0, "runs": 2, "failed": [{"check": "gpu.xid", "reason": "Xid 79"}],
                   "unknown": [{"check": "gpu.ecc", "reason": "?"}]}}
    assert parse_node_file(json.dumps(node_file_json(reading))) == reading   # one schema, both ends
    saved = node_reading("node2", 10.0, 1.0, {0: RankProgress(0, pid=6, save_t=8.0, save_api="safetensors",
                                                                 save_path="/ck/model.safetensors")}, checks)
    assert node_file_json(saved)["ranks"]["0"]["save"] == {"t": 8.0, "api": "safetensors",
                                                             "path": "/ck/model.safetensors"}
    assert parse_node_file(json.dumps(node_file_json(saved))) == saved
    for bad in ({"t": 8.0, "api": "pickle", "path": "/x"}, {"t": 8.0, "api": "torch.save", "path": ""},
                {"t": "soon", "api": "torch.save", "path": "/x"}, ["torch.save"]):
        document = node_file_json(saved)
        document["ranks"]["0"]["save"] = bad
        assert parse_node_file(json.dumps(document)) is None
    empty = node_file_json(node_reading("n", 1.0, 1.0, {}, ChecksState()))
    assert json.loads(json.dumps(empty))["checks"]["t"] is None


def test_the_node_files_links_are_read_back_and_a_file_without_them_has_none():
    links = (LinkReading("eth0", "qdisc", 105624843, 5712), LinkReading("mlx5_0:1", "ib", 4 << 40, 3))
    reading = node_reading("node2", 10.0, 1.0, {}, ChecksState(), links, 9.5)
    assert node_file_json(reading)["links"] == {"t": 9.5, "ports": {
        "eth0": {"source": "qdisc", "sent_bytes": 105624843, "wait": 5712},
        "mlx5_0:1": {"source": "ib", "sent_bytes": 4 << 40, "wait": 3}}}
    assert parse_node_file(json.dumps(node_file_json(reading))) == reading
    without = node_file_json(node_reading("node2", 10.0, 1.0, {}, ChecksState()))
    assert "links" not in without                    # as every agent's file before links were read
    assert parse_node_file(json.dumps(without)).links_t is None
    for port in ({"source": "tcp", "sent_bytes": 1, "wait": 1}, {"source": "qdisc", "sent_bytes": -1, "wait": 1},
                 {"source": "qdisc", "sent_bytes": 1.5, "wait": 1}, {"source": "ib", "sent_bytes": 1, "wait": True},
                 {"source": "ib", "sent_bytes": 1, "wait": 1 << 70}, {"source": "qdisc", "sent_bytes": 1}):
        data = node_file_json(reading)
        data["links"]["ports"]["eth0"] = port
        assert parse_node_file(json.dumps(data)) is None, port


def test_a_node_file_with_a_negative_or_non_numeric_thread_time_is_not_one():
    good = node_file_json(node_reading("n", 1.0, 1.0, {0: RankProgress(0, pid=6, cpu_seconds=1.0, runq_seconds=0.5)},
                                       ChecksState()))
    for bad in (-1.0, "1", float("inf"), True):
        data = json.loads(json.dumps(good))
        data["ranks"]["0"]["runq_seconds"] = bad
        assert parse_node_file(json.dumps(data)) is None, bad


def test_schedstat_is_three_counts_and_anything_else_is_one_line():
    # a bash's main thread on the development machine (Linux 6.x): 91 ms on a CPU, 7.4 ms waiting, 246 slices
    assert parse_schedstat("90982921 7437988 246\n") == (0.090982921, 0.007437988)
    for bad in ("", "1 2", "1 2 3 4", "1 -2 3", "1 2 x", "\u0661 2 3", "9" * 200 + " 1 2"):
        with pytest.raises(ParseError) as error:
            parse_schedstat(bad)
        assert "\n" not in str(error.value)


def test_the_agent_reads_a_ranks_main_thread_time_from_the_kernel():
    # this process's main thread, busy for a moment: its CPU time grows; a pid with no process reads nothing
    before = main_thread_times(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = main_thread_times(os.getpid())
    assert before is not None and after.cpu_s - before.cpu_s >= 0.04 and after.runq_s >= before.runq_s >= 0
    assert main_thread_times(0) is None and main_thread_times(2**22 + 1) is None
    ranks = with_main_thread_times({0: RankProgress(0, pid=6), 1: RankProgress(1, pid=7)}, {0: after, 1: None})
    assert (ranks[0].cpu_seconds, ranks[0].runq_seconds) == (round(after.cpu_s, 4), round(after.runq_s, 4))
    assert ranks[1].cpu_seconds is None


def test_the_stacks_file_names_each_rank_and_says_when_there_is_none():
    text = stacks_text("node2", [(0, 11, "Thread 11 (idle)\n  main (train.py:9)\n"), (1, 12, "py-spy: timed out")])
    assert text.splitlines() == ["=== node2 rank 0 pid 11 ===", "Thread 11 (idle)", "  main (train.py:9)",
                                 "=== node2 rank 1 pid 12 ===", "py-spy: timed out"]
    assert stacks_text("node2", []) == "node2: no rank has reported its pid: no stacks\n"


def test_without_py_spy_the_stacks_file_is_one_line_saying_so(tmp_path):
    text = dump_stacks("node2", {0: os.getpid()}, str(tmp_path / "py-spy"), timeout_s=5)
    assert text == f"node2: py-spy not found ({tmp_path / 'py-spy'}): no stacks (pip install 'slurm-trainctl[node]')\n"


# ---------------------------------------------------------------- the NCCL flight recorder's pipes

class PipeReader:
    """What PyTorch does with a rank's dump pipe (ProcessGroupNCCL.hpp, DumpPipe): keep the FIFO
    open O_RDONLY|O_NONBLOCK and poll it from a thread; here, whatever is read is kept and, when
    `dump` is given, written there (the flight recorder's dump)."""

    def __init__(self, fifo: Path, dump: Path | None = None):
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.dump, self.got, self.stop = dump, b"", threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            readable, _, _ = select.select([self.fd], [], [], 0.05)
            data = os.read(self.fd, 128) if readable else b""
            if data:
                self.got += data
                if self.dump is not None:
                    self.dump.write_bytes(b"flight recorder entries\n")

    def close(self) -> bytes:
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.fd)
        return self.got


def test_a_ranks_pipe_with_a_reader_gets_one_line(tmp_path):
    fifo = tmp_path / "nccl-trace-pipe-rank-0.pipe"
    os.mkfifo(fifo)
    reader = PipeReader(fifo)
    try:
        assert ask_flight_recorder(fifo) == ""
        poll(lambda: reader.got, lambda got: got.endswith(b"\n"), "the line in the pipe", deadline_s=10)
    finally:
        got = reader.close()
    assert got.count(b"\n") == 1, got


def test_a_pipe_nobody_reads_does_not_block_and_is_not_asked(tmp_path):
    fifo = tmp_path / "nccl-trace-pipe-rank-1.pipe"
    os.mkfifo(fifo)   # left by a rank that has exited: nothing holds it open
    answers = []
    asking = threading.Thread(target=lambda: answers.append(ask_flight_recorder(fifo)), daemon=True)
    asking.start()
    asking.join(timeout=2.0)   # a blocking open would wait for a reader for ever: fail, do not hang
    assert answers == [NO_READER]


def test_a_missing_pipe_or_a_file_that_is_not_one_is_reported_and_left_alone(tmp_path):
    assert ask_flight_recorder(tmp_path / "nccl-trace-pipe-rank-2.pipe") == NO_PIPE
    plain = tmp_path / "nccl-trace-pipe-rank-3.pipe"
    plain.write_text("")
    assert ask_flight_recorder(plain) == "nccl-trace-pipe-rank-3.pipe is not a pipe"
    assert plain.read_text() == ""


def test_only_a_dump_written_after_the_ask_counts(tmp_path):
    old = tmp_path / "nccl-trace-rank-0"
    old.write_text("an earlier step's dump\n")
    before = {0: (old.stat().st_ino, old.stat().st_mtime_ns, old.stat().st_size), 1: None}
    writer = threading.Timer(0.3, (tmp_path / "nccl-trace-rank-1").write_text, args=("entries\n",))
    writer.start()
    started = time.monotonic()
    assert await_flight_recorder_dumps(tmp_path, before, time.monotonic() + 1.5) == {1}
    assert time.monotonic() - started < 2.5
    writer.join()


def test_the_flight_recorder_section_says_who_was_asked_who_dumped_and_why_not():
    text = flight_recorder_text("node2", {0: "", 1: "", 2: NO_PIPE, 3: NO_PIPE}, {0})
    assert text == ("=== node2 NCCL flight recorder ===\n"
                    "flight recorder asked: ranks 0,1; dumped: rank 0 (nccl-trace-rank-<rank> in the gate dir); "
                    "no dump seen yet: rank 1\n"
                    f"not asked: ranks 2,3 ({NO_PIPE})\n")
    assert flight_recorder_text("node2", {4: NO_READER}, set()) == (
        f"=== node2 NCCL flight recorder ===\nnot asked: rank 4 ({NO_READER})\n")
    assert flight_recorder_text("node2", {}, set()) == ""


# ---------------------------------------------------------------- the agent on this machine

REPORTER = """
import os, sys, time
import trainctl.progress as progress
stop = sys.argv[1]
step = 0
while not os.path.exists(stop):
    time.sleep(0.02)
    progress.step()
    step += 1
    if step % 20 == 0:
        progress.checkpoint(step)
"""


def poll(read, until, what: str, deadline_s: float = 90.0):
    """`read()` until `until(value)`; the last value read is in the failure message."""
    deadline = time.monotonic() + deadline_s
    value = None
    while time.monotonic() < deadline:
        value = read()
        if value is not None and until(value):
            return value
        time.sleep(0.1)
    raise AssertionError(f"not seen within {deadline_s:g} s: {what}; last read: {value!r}")


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stage(bin_dir: Path, recording: Path) -> None:
    """Serve `recording` as this node's `dmesg -T`."""
    swap_replay(bin_dir, "dmesg", {"-T": recording})


def test_the_agent_counts_a_ranks_steps_reports_a_new_xid_and_dumps_stacks(tmp_path):
    from trainctl.agent_socket import agent_socket_path

    demo = (REPO / "site-configs/local-demo.toml").read_text()
    site = tmp_path / "watched.toml"
    site.write_text(re.sub(r"^check_interval_s = [^ ]*", "check_interval_s = 1.0", demo, flags=re.M))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stage(bin_dir, NO_XID_DMESG)
    gate = tmp_path / "gate"
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURMD_NODENAME="node2", TMPDIR=str(tmp_path),
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("TRAINCTL_PROGRESS_SOCKET", None)
    node_path = gate / "watch" / "node2.json"
    agent = subprocess.Popen([TRAINCTL, "job", "agent", "--dir", str(gate), "--site", str(site)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = tmp_path / "stop"
    rank = None
    try:
        first = poll(lambda: read_json(node_path), lambda d: d["checks"]["runs"] >= 1, "the baseline check run")
        assert first["checks"]["failed"] == [] and first["ranks"] == {}, first
        rank = subprocess.Popen([sys.executable, "-P", "-c", REPORTER, str(stop)],
                                env=dict(env, RANK="3", TRAINCTL_PROGRESS_SOCKET=agent_socket_path("4242", "node2", env)))
        seen = poll(lambda: read_json(node_path), lambda d: d["ranks"].get("3", {}).get("steps", 0) >= 5,
                    "rank 3's steps")
        grown = poll(lambda: read_json(node_path), lambda d: d["ranks"]["3"]["steps"] > seen["ranks"]["3"]["steps"],
                     "rank 3's steps growing")
        counted = grown["ranks"]["3"]
        assert counted["pid"] == rank.pid
        assert counted["step_seconds"] > 0 and counted["last_step_t"] > first["started_t"]
        assert grown["checks"]["failed"] == [], grown

        stage(bin_dir, XID_DMESG)
        sick = poll(lambda: read_json(node_path), lambda d: d["checks"]["failed"], "gpu.xid failing")
        assert [f["check"] for f in sick["checks"]["failed"]] == ["gpu.xid"]
        assert "Xid 119" in sick["checks"]["failed"][0]["reason"]
        assert poll(lambda: read_json(node_path), lambda d: d["ranks"]["3"]["checkpoint_step"],
                    "a checkpoint")["ranks"]["3"]["checkpoint_step"] % 20 == 0

        os.mkfifo(gate / "nccl-trace-pipe-rank-3.pipe")   # as rank 3's NCCL process group makes it
        recorder = PipeReader(gate / "nccl-trace-pipe-rank-3.pipe", dump=gate / "nccl-trace-rank-3")
        try:
            (gate / "watch" / "dump-request").write_text("token-1\n")
            poll(lambda: (gate / "watch" / "dump-done-node2").read_text()
                 if (gate / "watch" / "dump-done-node2").exists() else None,
                 lambda token: token == "token-1\n", "the dump answered")
        finally:
            asked = recorder.close()
        assert asked == b"dump\n"
        stacks = (gate / "watch" / "stacks-node2.txt").read_text()
        assert stacks.startswith(f"=== node2 rank 3 pid {rank.pid} ===\n"), stacks
        assert f"Thread {rank.pid}" in stacks and "<module> (<string>:" in stacks, stacks   # py-spy's dump
        assert stacks.endswith("=== node2 NCCL flight recorder ===\nflight recorder asked: rank 3; dumped: rank 3 "
                               "(nccl-trace-rank-<rank> in the gate dir)\n"), stacks
    finally:
        stop.touch()
        if rank is not None:
            rank.wait(timeout=30)
        agent.terminate()
        out, err = agent.communicate(timeout=30)
    assert agent.returncode == 143, err
    assert err.splitlines()[-1] == "trainctl: stopped by SIGTERM", err
    assert not os.path.exists(agent_socket_path("4242", "node2", env))


def test_the_example_reports_each_step_and_checkpoint(tmp_path):
    """examples/train_ddp.py as one gloo rank, with the watch scenarios' options on."""
    import socket

    from trainctl.guest.wire import decode

    path = str(tmp_path / "p.sock")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    reader.settimeout(60)
    with socket.socket() as probe:   # a free loopback port for the one-rank rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               TRAINCTL_PROGRESS_SOCKET=path, TRAINCTL_PROGRESS_INTERVAL_S="0")
    reports = []

    def drain():   # while the rank runs: a Unix datagram socket queues only a few (net.unix.max_dgram_qlen)
        while not reports or reports[-1]["checkpoint_step"] != 4:
            reports.append(decode(reader.recv(256)))

    reading = threading.Thread(target=drain)
    reading.start()
    result = subprocess.run([sys.executable, str(REPO / "examples/train_ddp.py"), "--steps", "4", "--grad-mb", "0.5",
                             "--slow-from-step", "2", "--slow-step-time", "0.01", "--checkpoint",
                             str(tmp_path / "ckpt.pt"), "--checkpoint-every", "2"],
                            env=env, capture_output=True, text=True, timeout=120)
    reading.join()
    reader.close()
    assert result.returncode == 0, result.stderr
    # the rank's activity reports (about one a second while it does not step) repeat the totals
    totals = [(r["steps"], r["checkpoint_step"]) for r in reports]
    totals = [t for i, t in enumerate(totals) if t[0] and (i == 0 or t != totals[i - 1])]
    assert totals == [(1, -1), (2, -1), (2, 2), (3, 2), (4, 2), (4, 4)]


# ---------------------------------------------------------------- on the dev cluster

WATCHED_JOB = """#!/bin/bash
# The node agent beside a watched step, as the supervisor runs them: the agent an overlapping step,
# the program under rank-exec with TRAINCTL_WATCH_DIR set.
srun --overlap --job-name=watch-agent --ntasks=1 --input=none --output={gate}/agent-%N.log {trainctl} job agent \\
    --dir {gate} --site local-demo --partition gpu &
agent=$!
TRAINCTL_WATCH_DIR={gate}/watch srun --overlap --ntasks=1 --input=none {trainctl} rank-exec --site local-demo \\
    --partition gpu --master-addr 127.0.0.1 --no-bind -- {python} -P {reporter} {stop}
# SIGTERM to the agent's task (srun itself, signalled, would SIGKILL it: "forcing job termination")
step=$(squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format="%i %j" | awk '$2 == "watch-agent" {{print $1}}')
scancel --signal=TERM "$step"
wait $agent
echo "agent step status $?"
"""


@pytest.mark.cluster
def test_the_agent_in_a_job_sees_the_steps_grow_and_a_replayed_xid(devcluster, tmp_path):
    from support.slurm_jobs import wait_for_job
    from trainctl.proc import run_checked

    gate, stop = tmp_path / "gate", tmp_path / "stop"
    gate.mkdir()
    (tmp_path / "reporter.py").write_text(REPORTER)
    script = tmp_path / "watched.sh"
    script.write_text(WATCHED_JOB.format(gate=gate, trainctl=TRAINCTL, python=sys.executable,
                                         reporter=tmp_path / "reporter.py", stop=stop))
    bin_dir = devcluster.node_bin_dir("node2")
    stage(bin_dir, NO_XID_DMESG)
    node_path = gate / "watch" / "node2.json"
    job = None
    try:
        job = run_checked(["sbatch", "--parsable", "-N1", "-w", "node2", "--time=10", "-o", str(tmp_path / "job.out"),
                           str(script)], timeout=30, env=devcluster.client_env(), cwd=tmp_path).stdout.strip()
        base = poll(lambda: read_json(node_path), lambda d: d["checks"]["runs"] >= 1
                    and d["ranks"].get("0", {}).get("steps", 0) >= 1, "the baseline and rank 0's first steps", 180)
        assert base["checks"]["failed"] == [], base
        poll(lambda: read_json(node_path), lambda d: d["ranks"]["0"]["steps"] > base["ranks"]["0"]["steps"],
             "rank 0's steps growing")
        stage(bin_dir, XID_DMESG)
        sick = poll(lambda: read_json(node_path), lambda d: d["checks"]["failed"], "gpu.xid failing", 120)
        assert [f["check"] for f in sick["checks"]["failed"]] == ["gpu.xid"], sick
        assert "Xid 119" in sick["checks"]["failed"][0]["reason"]
        assert sick["checks"]["runs"] >= 2 and sick["ranks"]["0"]["steps"] > base["ranks"]["0"]["steps"]
    finally:
        stop.touch()
        (bin_dir / "dmesg").unlink(missing_ok=True)
        if job:
            record = wait_for_job(devcluster, job, timeout_s=120)
    output = (tmp_path / "job.out").read_text()
    assert record["JobState"] == "COMPLETED", output
    assert "trainctl: stopped by SIGTERM" in (gate / "agent-node2.log").read_text()


def test_outside_a_job_the_agent_refuses_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    out = subprocess.run([TRAINCTL, "job", "agent", "--dir", str(tmp_path), "--site", "local-demo"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr) == (2, "trainctl: error: job agent runs as a task of a Slurm job "
                                               "(no SLURM_JOB_ID)\n")


def test_the_stacks_of_ranks_that_never_reported_are_found_by_their_environment(tmp_path):
    from trainctl.guest.wire import SOCKET_ENV
    from trainctl.job.agent import rank_processes, unreported_ranks

    mine, other = {SOCKET_ENV: "/s/a.sock"}, {SOCKET_ENV: "/s/b.sock"}
    processes = [(10, 1, {**mine, "RANK": "0"}), (11, 10, {**mine, "RANK": "0"}),   # rank 0 and its worker
                 (12, 1, {**mine, "RANK": "1"}), (13, 1, {**other, "RANK": "2"}),   # rank 1; another job's
                 (14, 1, {**mine, "RANK": "x"}), (15, 1, {"RANK": "3"})]
    assert rank_processes(processes, "/s/a.sock") == {0: 10, 1: 12}
    socket_path = str(tmp_path / "agent.sock")
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env=dict(os.environ, RANK="4", **{SOCKET_ENV: socket_path}))
    try:
        assert unreported_ranks(socket_path) == {4: waiting.pid}
    finally:
        waiting.kill()
        waiting.wait()
