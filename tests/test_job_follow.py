"""`trainctl job show --follow` and `--html`: a job's chain live, and drawn on one page.

The job directories are written by the job's own writers (the supervisor's Journal, the agents'
node files, the gate round's archive); the live view runs as a real `trainctl` process, piped and
on a pseudo-terminal, while the journals grow; the page is read in headless Chromium.
"""

from __future__ import annotations

import fcntl
import os
import pty
import queue
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from support.chromium import chromium, page_dom, screenshot  # noqa: F401 (chromium: the fixture)
from trainctl.job import jobdir
from trainctl.job.follow import READ_CHUNK_BYTES, Follower, JobSoFar, follow_view, job_phase, site_watch, view_lines
from trainctl.job.jobdir import JobPaths, Journal, Kind, NodeReading, RankProgress
from trainctl.job.watch_io import archive_gate_round, prepare_watch_dir
from trainctl.site import WatchConfig

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NODES = ("node1", "node2", "node3")


class JobFiles:
    """One job's directory as the job writes it: its journal through the supervisor's Journal,
    its node files through the agents' writer, a gate round's files moved aside by the watch's."""

    def __init__(self, submit_dir: Path, job_id: str, clock=time.time):
        self.job_id = job_id
        self.paths = JobPaths.of(submit_dir, job_id)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(self.paths.journal, clock=clock)
        self.clock = clock

    def add(self, event: Kind, /, **fields) -> None:
        self.journal.add(event, **fields)

    def start(self, site: str, nodes: tuple[str, ...] = NODES, chosen: tuple[str, ...] | None = None,
              again: int = 0) -> None:
        """The job's start (or, `again`, the gate after a detection: the last round moved aside), to training."""
        chosen = nodes if chosen is None else chosen
        if again:
            evidence = archive_gate_round(str(self.paths.root), again)
            self.add(Kind.GATE_START, nodes=list(nodes), evidence=os.path.relpath(evidence, self.paths.root))
        else:
            self.add(Kind.JOB_START, job=self.job_id, site=site, attempt=1, nodes=list(nodes), batch_host=nodes[0])
            self.add(Kind.GATE_START)
        for node in nodes:
            self.add(Kind.NODE_VERDICT, node=node, verdict="chosen" if node in chosen else "excluded", reasons=[])
        self.add(Kind.GATE_END, status=0, chosen=list(chosen), master_addr="10.0.0.1")
        prepare_watch_dir(str(self.paths.root))
        self.add(Kind.TRAINING_START, nodes=",".join(chosen), master_addr="10.0.0.1", **({"restart": again} if again else {}))

    def agents(self, steps: int, step_s: dict[str, float], written: float | None = None,
               failed: dict[str, tuple] | None = None) -> None:
        """Each node's agent file: two ranks a node, `steps` steps each at the node's step time."""
        written = self.clock() if written is None else written
        for node, seconds in step_s.items():
            ranks = tuple(RankProgress(2 * NODES.index(node) + local, steps, steps * seconds, written) for local in (0, 1))
            jobdir.write_node_file(self.paths, NodeReading(node, written, ranks, (failed or {}).get(node, ())))


def fast_site(tmp_path: Path) -> str:
    """The local-demo site, polled every 0.2 s: the live view redraws at the site's watch.poll_s."""
    site = tmp_path / "fast.toml"
    text = (REPO / "site-configs" / "local-demo.toml").read_text()
    assert "poll_s = 1.0" in text
    site.write_text(text.replace("poll_s = 1.0", "poll_s = 0.2", 1))
    return str(site)


class Output:
    """What a process writes, as it writes it, read by a thread."""

    def __init__(self, read):
        self.chunks: queue.Queue[str] = queue.Queue()
        self.text = ""
        threading.Thread(target=self._pump, args=(read,), daemon=True).start()

    def _pump(self, read) -> None:
        while chunk := read():
            self.chunks.put(chunk)

    def wait_for(self, text: str, timeout: float = 30.0, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while self.text.count(text) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} (x{count}) in:\n{self.text}"
            try:
                self.text += self.chunks.get(timeout=left)
            except queue.Empty:
                continue
        return self.text


def follow(tmp_path: Path, job_id: str, gate_dir: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen([TRAINCTL, "job", "show", "--follow", job_id, "--dir", str(gate_dir)], cwd=tmp_path,
                            **popen)


# ---------------------------------------------------------------- pure

def test_the_phase_follows_the_journal_from_the_gate_to_the_end(tmp_path):
    job = JobFiles(tmp_path, "7")
    phases = []

    def phase():
        phases.append(job_phase(jobdir.read_journal(job.paths.journal)))

    phase()
    job.start("local-demo")
    phase()
    job.add(Kind.DETECTION, kind="slow", suspects=["node2"], evidence="step time 1 s, 2.00x the job's own 0.5 s")
    phase()
    job.add(Kind.STEP_END, status=143, cause="stopped after a detection")
    phase()
    job.add(Kind.RETRY, retry=True, reason="the watch named node2", successor="8")
    job.add(Kind.JOB_END, status=143)
    phase()
    assert [name for name, _ in phases] == ["queued", "training", "stopping", "restarting", "successor"]
    assert phases[2][1] == "after a detection: slow (node2)" and phases[4][1] == "job 8 submitted"
    job.add(Kind.JOB_END, status=0)
    assert job_phase(jobdir.read_journal(job.paths.journal)) == ("successor", "job 8 submitted")


def test_each_node_against_the_jobs_own_baseline_the_odd_ones_out_first(tmp_path):
    clock = [1000.0]
    job = JobFiles(tmp_path, "7", clock=lambda: clock[0])
    job.start("local-demo")
    job.agents(100, {"node1": 0.5, "node2": 0.5, "node3": 0.5})
    job.add(Kind.CHECKPOINT, checkpoint_t=990.0, note="step 90")
    before = jobdir.read_node_files(job.paths, NODES)
    clock[0] = 1010.0
    # node2 now takes 1 s a step, node3's agent fell silent 60 s ago with an Xid
    job.agents(110, {"node1": 0.5, "node2": (50 + 10) / 110})
    job.agents(100, {"node3": 0.5}, written=950.0, failed={"node3": (("gpu.xid", "Xid 79"),)})
    view = follow_view(("7",), {"7": JobSoFar.of("7", jobdir.read_journal(job.paths.journal))},
                       jobdir.read_node_files(job.paths, NODES),
                       before, 1010.0, WatchConfig())
    nodes = {node.node: node for node in view.nodes}
    assert view.phase == "training" and view.baseline_s == pytest.approx(0.5, rel=0.01)
    assert nodes["node2"].step_s == pytest.approx(1.0) and nodes["node2"].ratio == pytest.approx(2.0)
    assert nodes["node2"].steps_per_s == pytest.approx(1.0) and nodes["node1"].ratio == pytest.approx(1.0)
    assert nodes["node3"].agent == "sick: gpu.xid" and nodes["node3"].steps_per_s is None
    assert view.checkpoint_age_s == pytest.approx(20.0)
    lines = view_lines(view)
    rows = [line.split()[0] for line in lines if line.startswith("  node")]
    assert rows == ["node", "node3", "node2", "node1"]      # the header, then the odd ones out
    assert "nodes: 3 training; agents: 2 ok; 1 sick (node3)" in lines
    assert "last checkpoint: 0:00:20 ago" in "\n".join(lines)


def test_a_growing_journal_is_read_a_whole_line_at_a_time(tmp_path):
    path = tmp_path / "journal.jsonl"
    Journal(path).add(Kind.JOB_START, job="7")
    events, offset = jobdir.read_journal_since(path, 0)
    assert [event["event"] for event in events] == [Kind.JOB_START] and offset == path.stat().st_size
    with open(path, "a") as handle:
        handle.write('{"t": 5, "event": "gate_st')    # the supervisor's next line, half written
    assert jobdir.read_journal_since(path, offset) == ([], offset)
    with open(path, "a") as handle:
        handle.write('art"}\n')
    events, offset = jobdir.read_journal_since(path, offset)
    assert [event["event"] for event in events] == [Kind.GATE_START]
    path.write_text("")
    assert jobdir.read_journal_since(path, offset) == ([], 0)     # replaced: read again from the start
    os.mkfifo(tmp_path / "fifo")
    assert jobdir.read_journal_since(tmp_path / "fifo", 0) == ([], 0)   # never waited on


def test_a_node_file_is_read_again_only_where_it_changed_and_never_through_a_fifo(tmp_path):
    clock = [1000.0]
    job = JobFiles(tmp_path, "7", clock=lambda: clock[0])
    job.start("local-demo")
    job.agents(100, {"node1": 0.5, "node2": 0.5})
    files = jobdir.NodeFiles(job.paths)
    first = files.read(NODES)
    assert first["node1"].ranks[0].steps == 100 and first["node3"] is None
    clock[0] = 1001.0
    job.agents(102, {"node2": 0.5})                          # node2's agent wrote again (a new file), node1's not
    again = files.read(NODES)
    assert again["node1"] is first["node1"]                  # kept: its file is the one read before
    assert again["node2"].ranks[0].steps == 102 and again == jobdir.read_node_files(job.paths, NODES)
    node1 = job.paths.node_file("node1")
    node1.unlink()
    os.mkfifo(node1)                                         # a FIFO in its place: never opened, never waited on
    assert files.read(NODES)["node1"] is None
    node1.unlink()
    node1.write_text('{"format": 1, "node": "node1"}')      # not an agent's file
    assert files.read(NODES)["node1"] is None


def test_a_journal_of_any_length_is_followed_in_bounded_memory_each_event_printed_once(tmp_path):
    """A journal far past what goodput may count (SHOW_KEPT_MAX), over several read chunks: the
    view keeps no list of its events, says goodput is not computed and why, and each event's line
    comes out once, in order."""
    from trainctl.job.journal import SHOW_KEPT_MAX

    job = JobFiles(tmp_path, "7", clock=lambda: 1000.0)
    job.start("local-demo")
    restarts, pad = SHOW_KEPT_MAX + 500, "x" * 400
    with open(job.paths.journal, "a") as journal:   # each restart: a step's end and a training start, counted
        for n in range(1, restarts + 1):
            journal.write(f'{{"t": {1000 + n}, "event": "step_end", "status": 1, "cause": "{pad}crash {n}"}}\n'
                          f'{{"t": {1000 + n}, "event": "training_start", "nodes": "node1", "restart": {n}}}\n')
    assert job.paths.journal.stat().st_size > 2 * READ_CHUNK_BYTES
    follower = Follower(str(job.paths.root), "7", site_watch)
    printed: list[str] = []
    view = follower.read(1000.0 + restarts, on_lines=printed.extend)
    assert sum(len(so_far.counted) for so_far in follower.so_far.values()) == 0
    assert view.goodput is None and view.goodput_unknown == f"the journals hold more than {SHOW_KEPT_MAX:,} events that it counts"
    assert (view.phase, view.detail) == ("training", f"restart {restarts}")
    assert len(view.recent) == 8 and view.recent[-1].endswith(f"restart {restarts}")
    crashes = [line for line in printed if "crash" in line]
    assert len(crashes) == restarts and crashes[-1].endswith(f"crash {restarts}")
    assert f"goodput: not computed: the journals hold more than {SHOW_KEPT_MAX:,}" in "\n".join(view_lines(view))
    job.add(Kind.JOB_END, status=0)
    again: list[str] = []
    assert follower.read(1000.0 + restarts, on_lines=again.extend).ended and len(again) == 1   # only the new line


# ---------------------------------------------------------------- a real trainctl, while the job runs

def test_piped_it_prints_each_event_as_it_comes_and_exits_with_the_jobs_status(tmp_path):
    site = fast_site(tmp_path)
    job = JobFiles(tmp_path, "7")
    job.start(site)
    job.agents(50, {"node1": 0.5, "node2": 0.5, "node3": 0.5})
    process = follow(tmp_path, "7", job.paths.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Output(process.stdout.readline)
    try:
        out.wait_for("job 7: training step started")
        job.add(Kind.DETECTION, kind="slow", suspects=["node2"],
                evidence="step time 1 s over the last 60 s, 2.00x the job's own 0.5 s",
                details={"step_s": 1.0, "baseline_s": 0.5})
        out.wait_for("job 7: watch: slow (node2): step time 1 s over the last 60 s")
        job.add(Kind.STEP_END, status=143, cause="stopped after a detection")
        job.add(Kind.CONFIRMATION, kind="slow", named={"node2": "slow"}, checked=list(NODES))
        job.start(site, chosen=("node1", "node3"), again=1)
        out.wait_for("job 7: training step started", count=2)
        assert process.poll() is None           # the job goes on: so does the view
        job.add(Kind.STEP_END, status=0, cause="the program ended")
        job.add(Kind.JOB_END, status=0)
        assert process.wait(timeout=30) == 0
        text = out.wait_for("ended with status 0")
    finally:
        process.kill()
        process.wait()
    lines = text.splitlines()
    assert lines[-1].startswith("job 7 ended with status 0; goodput ")
    assert lines[-1].endswith("; the chain drawn: trainctl job show --html chain-7.html 7")
    assert "job 7: watch: left out node2: slow" in text and "job 7: training step started: nodes node1,node3" in text
    assert sum(line.endswith("job 7: gate started") for line in lines) == 1   # each event once
    assert not any("\x1b" in line for line in lines)                           # no terminal codes in a pipe


def test_it_follows_the_chain_into_the_successor_and_exits_with_its_status(tmp_path):
    site = fast_site(tmp_path)
    first = JobFiles(tmp_path, "7")
    first.start(site)
    process = follow(tmp_path, "7", first.paths.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Output(process.stdout.readline)
    try:
        out.wait_for("job 7: training step started")
        first.add(Kind.DETECTION, kind="hung", suspects=["node3"], evidence="no rank finished a step for 600 s")
        first.add(Kind.STEP_END, status=137, cause="stopped after a detection")
        # the successor as the supervisor submits it: retry.json here, attempt.json there, then the journal
        jobdir.write_json(first.paths.retry, jobdir.RetryRecord(
            "7", 1, 1, "step", 137, True, "the watch named node3", {"node3": "hung"}, ("node3",), "8").to_json())
        second = JobFiles(tmp_path, "8")
        jobdir.write_json(second.paths.attempt, jobdir.AttemptRecord("8", 2, 1, "7", ("node3",)).to_json())
        first.add(Kind.RETRY, retry=True, reason="the watch named node3", successor="8")
        first.add(Kind.JOB_END, status=137)
        out.wait_for("job 7: job ended: status 137")
        time.sleep(1.0)                           # the successor waits in the queue: the view waits too
        assert process.poll() is None
        second.start(site, nodes=("node1", "node2"))
        out.wait_for("job 8: training step started")
        second.add(Kind.STEP_END, status=1, cause="the program failed")
        second.add(Kind.JOB_END, status=1)
        assert process.wait(timeout=30) == 1
        out.wait_for("job 8 ended with status 1")
    finally:
        process.kill()
        process.wait()


def test_on_a_terminal_it_redraws_in_place_and_ctrl_c_leaves_the_job_alone(tmp_path):
    site = fast_site(tmp_path)
    job = JobFiles(tmp_path, "7")
    job.start(site)
    job.agents(50, {"node1": 0.5, "node2": 0.5, "node3": 0.5})
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = follow(tmp_path, "7", job.paths.root, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)

    def read() -> str:
        try:
            return os.read(master, 65536).decode(errors="replace")
        except OSError:       # the terminal's other side closed: the process ended
            return ""

    out = Output(read)
    try:
        out.wait_for("job 7: training")
        drawn = out.wait_for("\x1b[J", count=3)          # drawn, then redrawn over itself twice
        assert len(re.findall(r"\x1b\[\d+F\x1b\[J", drawn)) >= 2    # back up over the last drawing, cleared
        assert "nodes: 3 training; agents: 3 ok" in drawn
        job.agents(60, {"node1": 0.5, "node2": 0.5, "node3": 0.5})
        job.add(Kind.CHECKPOINT, checkpoint_t=time.time(), note="step 60")
        out.wait_for("job 7: checkpoint seen")
        before = jobdir.read_journal(job.paths.journal)
        process.send_signal(2)                            # Ctrl-C
        assert process.wait(timeout=30) == 130
    finally:
        process.kill()
        process.wait()
        os.close(master)
    assert jobdir.read_journal(job.paths.journal) == before    # nothing written, nothing signalled
    assert sorted(os.listdir(job.paths.watch)) == [f"{node}.json" for node in NODES]


def test_follow_refuses_what_it_cannot_do_in_one_line(tmp_path):
    job = JobFiles(tmp_path, "7")
    for extra in (["--json"], ["--remote", "login1"], ["--html", str(tmp_path / "page.html")]):
        out = subprocess.run([TRAINCTL, "job", "show", "--follow", "7", "--dir", str(job.paths.root), *extra],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--follow" in out.stderr, out.stderr


# ---------------------------------------------------------------- the chain on one page

class Clock:
    """A job's clock: a second passes with each event journaled, more where the test says."""

    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_the_chain_page_draws_timeline_step_time_detections_and_goodput_in_chromium(chromium, tmp_path):
    clock = Clock(time.time() - 3600)
    job = JobFiles(tmp_path, "7", clock=clock)
    job.add(Kind.SUBMITTED, submitted_t=clock.t - 120)
    job.start("local-demo")
    clock.t += 600
    job.agents(1200, {"node1": 0.5, "node2": 0.9, "node3": 0.5})
    job.add(Kind.CHECKPOINT, checkpoint_t=clock.t - 100, note="step 1000")
    job.add(Kind.DETECTION, kind="slow", suspects=["node2"], evidence="step time 1 s, 2.00x the job's own 0.5 s",
            details={"step_s": 1.0, "baseline_s": 0.5})
    clock.t += 60
    job.add(Kind.STEP_END, status=143, cause="stopped after a detection", training_start_t=clock.t - 660,
            last_checkpoint_t=clock.t - 160)
    job.add(Kind.CONFIRMATION, kind="slow", named={"node2": "slow"}, checked=list(NODES))
    clock.t += 120
    job.start("local-demo", chosen=("node1", "node3"), again=1)
    clock.t += 900
    job.agents(1800, {"node1": 0.5, "node3": 0.52})
    job.add(Kind.STEP_END, status=0, cause="the program ended", training_start_t=clock.t - 900)
    job.add(Kind.JOB_END, status=0)

    page = tmp_path / "chain.html"
    out = subprocess.run([TRAINCTL, "job", "show", "--html", str(page), "7", "--dir", str(job.paths.root)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"trainctl: wrote {page}: the chain of job 7 on one page\n"
    dom = page_dom(chromium, tmp_path, page).stdout
    assert dom.count('<svg class="chain-timeline"') == 1 and dom.count('<path class="detection"') == 1
    phases = [part.split('"')[0] for part in dom.split('data-phase="')[1:]]
    assert phases == ["queue", "gate", "training", "stopping", "restart", "gate", "training"]
    # the step time: each training step's nodes from their own files (the first moved to rounds/1/ by the gate)
    assert '<text class="slowest"' in dom and "node2 0.9 s</text>" in dom and "node3 0.52 s</text>" in dom
    assert '<text class="named"' in dom and "slow: node2</text>" in dom
    assert dom.count('<circle class="step_s"') == 1 and dom.count('<circle class="baseline_s"') == 1
    kinds = [part.split('"')[0] for part in dom.split('<tr data-kind="')[1:]]
    assert kinds == ["productive", "queue", "gate", "restart", "lost_work"]
    assert "watch: slow (node2 left out): cost " in dom
    screenshot(chromium, tmp_path, page, REPO / "test-artifacts" / "job-chain-html.png", "1280,1100")


def test_the_jobs_last_line_says_how_to_draw_its_chain(tmp_path, capsys):
    from trainctl.job import machine
    from trainctl.job.driver import JobDriver

    driver = JobDriver.__new__(JobDriver)
    driver.job_id = "7"
    driver.journal = Journal(tmp_path / "journal.jsonl")
    assert driver.carry_out(machine.Finish(0)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "trainctl: job 7 ended with status 0; the chain drawn: trainctl job show --html chain-7.html 7")
