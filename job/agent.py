"""`trainctl job agent`: the node side of watching the training, one task per training node.

It reads the ranks' progress reports (`trainctl.progress`) from the node's socket
(`trainctl.agent_socket`), re-runs the site's `watch.checks` every `watch.check_interval_s`
through the node health path (health/node.py: collect -> load -> evaluate), and rewrites
GATE_DIR/watch/NODE.json every `watch.agent_write_s` for the supervisor (its schema, shared
with the supervisor's reader: `trainctl.job.jobdir.node_file_json`), with its ranks' main
threads' times and its own links' counters as read at that moment (`main_thread_times`,
`read_links`).

The first check run is the baseline: `failed` holds the checks that FAIL now and did not at the
baseline (counter checks: their growth since the baseline's reading). `unknown` holds what the
last run could not tell (a probe that failed, a run that raised or overran): it condemns nothing.

When GATE_DIR/watch/dump-request appears holding a token it has not answered, it asks each
rank's NCCL flight recorder for a dump (one line into the rank's pipe, GATE_DIR/nccl-trace-pipe-
rank-RANK.pipe, never blocking), dumps each rank's Python stacks (`py-spy dump --pid PID`,
bounded) into watch/stacks-NODE.txt, waits (as long as py-spy may take) for the asked ranks'
dumps, GATE_DIR/nccl-trace-rank-RANK, adds what it asked and what was dumped to the stacks file,
then writes the token into watch/dump-done-NODE.

When watch/checkpoint-request holds a token it has not passed on, it copies it beside its socket
(`trainctl.guest.wire.request_path`), where the ranks' `progress.checkpoint_requested()` looks
(`trainctl.job.checkpoint_request`).

The socket and the request file lie in the user's private directory on the node
(`trainctl.private_dir`). Where that directory is not the user's alone, the agent says so in one
line and watches on without them: it runs its checks and writes its node file, with no ranks in it.

The pure part (folding reports, judging a run against the baseline, the node file) is apart
from the I/O loop (`run_agent`), so it is tested without sockets or probes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import itertools
import os
import select
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.agent_socket import agent_socket_path
from trainctl.errors import ParseError, UsageError
from trainctl.files import write_regular
from trainctl.health.counters import COUNTER_CHECKS, judge_growth
from trainctl.health.parse.link_counters import parse_ib_xmit_counters, parse_qdisc_stats
from trainctl.health.parse.schedstat import LINE_MAX, SchedStat, parse_schedstat
from trainctl.health.status import CheckResult, Status
from trainctl.job import jobdir
from trainctl.job.jobdir import (CHECKPOINT_REQUEST, DUMP_REQUEST, JobPaths, LinkReading, NodeReading, RankProgress,
                                 dump_done_file, stacks_file)
from trainctl.launcher.plan import FLIGHT_RECORDER_PREFIX, flight_recorder_pipe
from trainctl.guest.wire import DATAGRAM_MAX, SOCKET_ENV, claims_prefix, decode, decode_save, is_save, request_path
from trainctl.private_dir import ensure, write_file

TOKEN_CHARS = 200                      # of a dump request's token, kept
SELECT_S = 0.2                         # longest wait for a report before the loop looks at its clocks
DATAGRAMS_PER_PASS = 10_000            # then the loop writes and looks at its checks before reading on
RUN_MARGIN_S = 10.0                    # a check run past 2 probe timeouts + this is reported as overrunning
STACKS_CAP_BYTES = 256 << 10           # of each rank's py-spy output
DUMP_POLL_S = 0.2                      # between looks for the flight recorder dumps asked for
ASK_LINE = b"dump\n"                   # what a rank's flight recorder pipe gets: any bytes ask for one dump
NO_PIPE = "no pipe: not an NCCL job, or its flight recorder is off"
NO_READER = "its pipe has no reader: no NCCL process group reads it now"
BASELINE_WINDOW = "since the agent's first check run"
NO_SOCKET = "no progress socket for this node"
QDISC_ARGV = ("tc", "-s", "-j", "qdisc", "show")   # every interface's qdiscs, with their counters
LINKS_TIMEOUT_S = 2.0                  # tc answers in milliseconds; a wedged one never holds the loop longer
LINKS_CAP_BYTES = 256 << 10            # of tc's output: a node with hundreds of interfaces fits
IB_COUNTER_GLOBS = tuple(f"/sys/class/infiniband/*/ports/*/counters/{name}" for name in ("port_xmit_wait",
                                                                                          "port_xmit_data"))
IB_COUNTER_FILES = 256                 # of each name read at most, each once a write
IB_COUNTER_BYTES = 64                  # one decimal count
WATCH_GOES_ON = ("; the watch goes on with this node's checks and node file, without its ranks' steps "
                 "or checkpoint requests")


# ---------------------------------------------------------------- the ranks' progress (pure)

def fold(ranks: Mapping[int, RankProgress], record: Mapping[str, Any]) -> dict[int, RankProgress]:
    """`ranks` with one decoded report (`trainctl.guest.wire.decode`) added. Steps come as a total;
    durations come per report and are summed. A report from another pid for a rank is a new
    process (a restart): its counts start again."""
    rank = int(record["rank"])
    before = ranks.get(rank)
    if before is None or before.pid != record["pid"]:
        before = RankProgress(rank, pid=int(record["pid"]))
    checkpoint = int(record["checkpoint_step"])
    saved = checkpoint >= 0 and checkpoint != before.checkpoint_step   # a new progress.checkpoint()
    after = RankProgress(
        rank, pid=before.pid, steps=int(record["steps"]),
        step_seconds=before.step_seconds + float(record["window_seconds"]),
        step_seconds_sq=before.step_seconds_sq + squares(int(record["window_steps"]), float(record["window_seconds"]),
                                                         float(record["window_longest"])),
        compute_seconds=before.compute_seconds + float(record["compute_seconds"]),
        last_step_t=float(record["time"]) if record["steps"] else before.last_step_t,
        checkpoint_step=checkpoint if checkpoint >= 0 else before.checkpoint_step,
        checkpoint_t=float(record["time"]) if saved else before.checkpoint_t,
        activity=int(record.get("activity", 0)), save_t=before.save_t, save_api=before.save_api,
        save_path=before.save_path)
    return {**ranks, rank: after}


def fold_save(ranks: Mapping[int, RankProgress], record: Mapping[str, Any]) -> dict[int, RankProgress]:
    """`ranks` with one decoded save (`trainctl.guest.wire.decode_save`): the rank's last save. A
    save from a process the agent has no report of (another pid) is not the rank's."""
    before = ranks.get(int(record["rank"]))
    if before is None or before.pid != record["pid"] or not record["path"]:
        return dict(ranks)
    return {**ranks, before.rank: before._replace(save_t=float(record["time"]), save_api=str(record["api"]),
                                                  save_path=str(record["path"]))}


def squares(steps: int, seconds: float, longest: float) -> float:
    """The summed squares of a report's step durations: its longest, and the rest as equal steps (a
    report covers the steps of about `trainctl.guest.wire.DEFAULT_INTERVAL_S`: one, unless they are
    short). With the sums they let the watch tell one long step from many slow ones."""
    if steps <= 0:
        return 0.0
    longest = min(max(longest, 0.0), seconds)
    if steps == 1:
        return seconds * seconds
    return longest * longest + (seconds - longest) ** 2 / (steps - 1)


# ---------------------------------------------------------------- the checks (pure)

@dataclass(frozen=True)
class Problem:
    check: str
    reason: str


@dataclass(frozen=True)
class ChecksState:
    """What the agent knows of its check runs."""
    baseline: Mapping[str, CheckResult] = dataclasses.field(default_factory=dict)
    runs: int = 0
    t: float | None = None                 # wall time the last run ended
    failed: tuple[Problem, ...] = ()
    unknown: tuple[Problem, ...] = ()


def _has_reading(result: CheckResult) -> bool:
    return result.status == Status.OK and "counters" in result.details


def judge_run(state: ChecksState, results: Iterable[CheckResult], t: float) -> ChecksState:
    """The state after one check run's results. A check's first result is its baseline (a counter
    check's: its first reading). FAIL now and not at the baseline is `failed`; a counter check
    is judged by the growth of its counters since the baseline's reading; UNKNOWN now is
    `unknown`, whatever the baseline said."""
    baseline = dict(state.baseline)
    failed, unknown = [], []
    for now in results:
        before = baseline.get(now.name)
        if before is None or (now.name in COUNTER_CHECKS and not _has_reading(before) and _has_reading(now)):
            baseline[now.name] = before = now
        judged = (judge_growth(now.name, before.details, now.details, BASELINE_WINDOW)
                  if now.name in COUNTER_CHECKS and _has_reading(before) and _has_reading(now) else now)
        if judged.status == Status.FAIL and before.status != Status.FAIL:
            failed.append(Problem(now.name, judged.reason))
        elif judged.status == Status.UNKNOWN:
            unknown.append(Problem(now.name, judged.reason))
    return ChecksState(baseline, state.runs + 1, t, tuple(failed), tuple(unknown))


def run_failed(state: ChecksState, checks: Iterable[str], why: str, t: float) -> ChecksState:
    """The state after a run that gave no results (it raised, or overran): every check it was to
    run could not tell. What earlier runs found failed stays reported."""
    return dataclasses.replace(state, runs=state.runs + 1, t=t,
                               unknown=tuple(Problem(name, f"the check run failed: {why}") for name in checks))


# ---------------------------------------------------------------- the node file (pure)

def node_reading(node: str, t: float, started_t: float, ranks: Mapping[int, RankProgress],
                 checks: ChecksState, links: tuple[LinkReading, ...] = (), links_t: float | None = None) -> NodeReading:
    """What the node file says (`trainctl.job.jobdir.node_file_json` writes it)."""
    return NodeReading(node, t, tuple(ranks[rank] for rank in sorted(ranks)),
                       tuple((p.check, p.reason) for p in checks.failed),
                       tuple((p.check, p.reason) for p in checks.unknown), started_t, checks.t, checks.runs,
                       links, links_t)


def with_main_thread_times(ranks: Mapping[int, RankProgress],
                            times: Mapping[int, SchedStat | None]) -> dict[int, RankProgress]:
    """Each rank with its main thread's CPU and run-queue time as read now (`main_thread_times`), to
    0.1 ms: the watch divides them over seconds of steps, and every digit is read on every poll."""
    return {rank: progress._replace(cpu_seconds=round(times[rank].cpu_s, 4), runq_seconds=round(times[rank].runq_s, 4))
            if times.get(rank) else progress for rank, progress in ranks.items()}


def stacks_text(node: str, dumps: Iterable[tuple[int, int, str]]) -> str:
    """The stacks file: for each (rank, pid, py-spy's output or why there is none), a header and it."""
    parts = [f"=== {node} rank {rank} pid {pid} ===\n{text.rstrip()}\n" for rank, pid, text in dumps]
    return "".join(parts) or f"{node}: no rank has reported its pid: no stacks\n"


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}"


def flight_recorder_text(node: str, asked: Mapping[int, str], dumped: Iterable[int]) -> str:
    """The stacks file's flight recorder section: `asked` is {rank: "" when its pipe took the line,
    else why not}; `dumped`, the asked ranks whose dump file was (re)written since."""
    if not asked:
        return ""
    lines = [f"=== {node} NCCL flight recorder ===\n"]
    took = sorted(rank for rank, why in asked.items() if not why)
    if took:
        written = sorted(set(dumped) & set(took))
        missing = sorted(set(took) - set(written))
        lines.append(f"flight recorder asked: {_ranks(took)}"
                     + (f"; dumped: {_ranks(written)} ({FLIGHT_RECORDER_PREFIX}<rank> in the gate dir)"
                        if written else "")
                     + (f"; no dump seen yet: {_ranks(missing)}" if missing else "") + "\n")
    reasons: dict[str, list[int]] = {}
    for rank, why in sorted(asked.items()):
        if why:
            reasons.setdefault(why, []).append(rank)
    lines.extend(f"not asked: {_ranks(ranks)} ({why})\n" for why, ranks in reasons.items())
    return "".join(lines)


# ---------------------------------------------------------------- I/O

class CheckRunner:
    """Runs the checks in a thread, so the reports are read and the node file written meanwhile."""

    def __init__(self, policy, node: str):
        self.policy = policy
        self.node = node
        self.thread: threading.Thread | None = None
        self.started = 0.0
        self.outcome: tuple[tuple[CheckResult, ...] | None, str] | None = None
        self.overrun_reported = False

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self) -> None:
        self.outcome, self.overrun_reported = None, False
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True, name="trainctl-watch-checks")
        self.thread.start()

    def _run(self) -> None:
        from trainctl.health.node import check_node

        try:
            with tempfile.TemporaryDirectory(prefix=f"trainctl-watch-{self.node}-") as snapshot:
                self.outcome = (check_node(snapshot, self.policy, collect=True).checks, "")
        except Exception as exc:   # a broken check is a check that could not tell, never a dead agent
            self.outcome = (None, f"{type(exc).__name__}: {exc}")

    def take(self) -> tuple[tuple[CheckResult, ...] | None, str] | None:
        """The finished run's (results, or None and why), once."""
        if self.busy or self.outcome is None:
            return None
        outcome, self.outcome, self.thread = self.outcome, None, None
        return outcome


def dump_stacks(node: str, pids: Mapping[int, int], py_spy: str, timeout_s: float) -> str:
    """py-spy dump of every rank at once, each bounded in time and output."""
    from trainctl.proc import resolve, run

    if resolve(py_spy) is None and not os.path.exists(py_spy):
        return f"{node}: py-spy not found ({py_spy}): no stacks (pip install 'slurm-trainctl[node]')\n"

    def one(item: tuple[int, int]) -> tuple[int, int, str]:
        rank, pid = item
        result = run([py_spy, "dump", "--pid", str(pid)], timeout=timeout_s, output_cap=STACKS_CAP_BYTES)
        return rank, pid, result.stdout if result.ok else f"{result.describe_failure()}\n{result.stdout}"

    if not pids:
        return stacks_text(node, ())
    with ThreadPoolExecutor(max_workers=len(pids)) as pool:
        return stacks_text(node, pool.map(one, sorted(pids.items())))


def ask_flight_recorder(pipe: Path) -> str:
    """Write one line into a rank's flight recorder pipe without ever blocking; "" when it took it,
    else why not. O_NONBLOCK makes opening a FIFO that no process reads fail with ENXIO instead of
    waiting for a reader (fifo(7)); a path that is not a FIFO is never opened."""
    try:
        if not stat.S_ISFIFO(os.lstat(pipe).st_mode):
            return f"{pipe.name} is not a pipe"
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return NO_PIPE
    except OSError as exc:
        return NO_READER if exc.errno == errno.ENXIO else f"{pipe.name}: {exc.strerror or exc}"
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return f"{pipe.name} is not a pipe"
        os.write(fd, ASK_LINE)
    except BlockingIOError:
        return "its pipe is full: earlier requests are still unread"
    except OSError as exc:
        return f"{pipe.name}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return ""


def _dump_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        seen = os.stat(path)
    except OSError:
        return None
    return seen.st_ino, seen.st_mtime_ns, seen.st_size


def await_flight_recorder_dumps(gate_dir: Path, before: Mapping[int, tuple[int, int, int] | None],
                                deadline: float) -> set[int]:
    """The ranks of `before` whose dump file, FLIGHT_RECORDER_PREFIX + rank, has changed since
    `before` was read, is not empty and stayed the same between two looks (written whole), by
    `deadline` (time.monotonic()) at the latest."""
    last: dict[int, tuple[int, int, int] | None] = dict(before)
    done: set[int] = set()
    while True:
        for rank in set(before) - done:
            now = _dump_stamp(gate_dir / f"{FLIGHT_RECORDER_PREFIX}{rank}")
            if now is not None and now != before[rank] and now == last[rank] and now[2] > 0:
                done.add(rank)
            last[rank] = now
        if done == set(before) or time.monotonic() >= deadline:
            return done
        time.sleep(DUMP_POLL_S)


class Agent:
    def __init__(self, gate_dir: str, node: str, job_id: str, config, part, environ: Mapping[str, str]):
        from trainctl.health.node import node_policy

        self.node, self.watch = node, config.watch
        self.gate_dir = Path(gate_dir)
        self.paths = JobPaths(self.gate_dir)
        self.folder = self.paths.watch
        self.node_path = self.paths.node_file(node)
        self.socket_path = agent_socket_path(job_id, node, environ)
        checks = self.watch.checks
        policy = node_policy(config, part, None)
        self.runner = (CheckRunner(dataclasses.replace(policy, only=None if "all" in checks else tuple(checks)), node)
                       if checks else None)
        self.overrun_s = 2 * policy.probe_timeout_s + RUN_MARGIN_S   # a probe and its fallback, then the rest
        self.dump_timeout_s = policy.probe_timeout_s
        self.py_spy = (config.probes.get("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
                       or "py-spy")
        self.started_t = time.time()
        self.ranks: dict[int, RankProgress] = {}
        self.checks = ChecksState()
        self.answered = _read_token(self.folder / dump_done_file(node))   # a restarted agent does not dump again
        self.request_path = request_path(self.socket_path)   # the watch's checkpoint requests, for the ranks
        self.sock: socket.socket | None = None
        self.relayed = _read_token(self.folder / CHECKPOINT_REQUEST)   # one from before this step is no request
        self.dumping: threading.Thread | None = None
        self.last_write_error = ""

    def run(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sock = self._bind()
        checks = (f", checks {','.join(self.watch.checks)} every {self.watch.check_interval_s:g} s"
                  if self.runner else ", no checks (watch.checks is empty)")
        try:
            self._say((f"reading {self.socket_path}, " if self.sock else "") + f"writing {self.node_path}" + checks)
            self._loop()
        finally:
            if self.sock is not None:
                self.sock.close()
                for path in (self.socket_path, self.request_path):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            self._remove_rank_claims()

    def _remove_rank_claims(self) -> None:
        """The ranks' claims beside the socket (`trainctl.guest.wire.claim_path`: empty directories)."""
        folder, start = os.path.split(claims_prefix(self.socket_path))
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                if name.startswith(start):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(folder, name))

    def _bind(self) -> socket.socket | None:
        """The progress socket, bound in the user's private directory; None, said in one line,
        when that directory is not the user's alone or the bind fails: the watch goes on."""
        path = self.socket_path
        try:
            ensure(os.path.dirname(path))
        except UsageError as exc:
            self._say(f"{NO_SOCKET}: {exc}{WATCH_GOES_ON}")
            return None
        # Only this user can have put anything in that directory: a socket or request file of an
        # agent that was killed, no request of this step.
        for stale in (path, self.request_path):
            with contextlib.suppress(OSError):
                os.unlink(stale)
        self._remove_rank_claims()   # likewise: a rank of this step claims itself anew
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
        except OSError as exc:   # a directory of ours in its place (EADDRINUSE), no room
            sock.close()
            self._say(f"{NO_SOCKET}: cannot bind {path}: {exc.strerror or exc}{WATCH_GOES_ON}")
            return None
        sock.setblocking(False)
        return sock

    def _loop(self) -> None:
        next_write = next_check = time.monotonic()
        while True:
            now = time.monotonic()
            wait_s = max(0.0, min(SELECT_S, next_write - now))
            if self.sock is None:
                time.sleep(wait_s)
                readable = []
            else:
                readable, _, _ = select.select([self.sock], [], [], wait_s)
            for _ in range(DATAGRAMS_PER_PASS if readable else 0):
                try:
                    datagram = self.sock.recv(DATAGRAM_MAX)
                except BlockingIOError:
                    break
                try:
                    self.ranks = (fold_save(self.ranks, decode_save(datagram)) if is_save(datagram)
                                  else fold(self.ranks, decode(datagram)))
                except ValueError:
                    continue   # not a report of this version: nothing to count
            now = time.monotonic()
            wrote_checks = self._poll_checks(now)
            if self.runner is not None and not self.runner.busy and self.runner.outcome is None and now >= next_check:
                self.runner.start()
                next_check = now + self.watch.check_interval_s
            self._poll_dump_request()
            self._relay_checkpoint_request()
            if wrote_checks or now >= next_write:
                self._write()
                next_write = now + self.watch.agent_write_s

    def _poll_checks(self, now: float) -> bool:
        """Take a finished run's results (or report an overrunning one); True when the state changed."""
        if self.runner is None:
            return False
        outcome = self.runner.take()
        if outcome is not None:
            results, why = outcome
            self.checks = (judge_run(self.checks, results, time.time()) if results is not None
                           else run_failed(self.checks, self.watch.checks, why, time.time()))
            return True
        if self.runner.busy and not self.runner.overrun_reported and now - self.runner.started > self.overrun_s:
            self.runner.overrun_reported = True   # the next results, when it ends, replace this
            self.checks = run_failed(self.checks, self.watch.checks,
                                     f"still running after {self.overrun_s:g} s", time.time())
            return True
        return False

    def _poll_dump_request(self) -> None:
        if self.dumping is not None and self.dumping.is_alive():
            return
        token = _read_token(self.folder / DUMP_REQUEST)
        if not token or token == self.answered:
            return
        self.answered = token
        # a rank that never reported (not yet at its first step) is found by its environment
        pids = {**unreported_ranks(self.socket_path), **{rank: seen.pid for rank, seen in self.ranks.items()}}
        self.dumping = threading.Thread(target=self._dump, args=(token, pids), daemon=True,
                                        name="trainctl-watch-dump")
        self.dumping.start()

    def _relay_checkpoint_request(self) -> None:
        """Copy a new checkpoint request of the watch beside the progress socket, where the ranks
        look (`trainctl.progress.checkpoint_requested`): node-local, so they never poll the shared
        filesystem. Only into the private directory, checked again for this write; without a
        socket there is no rank to tell (the agent said why when it started)."""
        token = _read_token(self.folder / CHECKPOINT_REQUEST)
        if not token or token == self.relayed:
            return
        self.relayed = token
        if self.sock is None:
            return
        directory, name = os.path.split(self.request_path)
        try:
            write_file(directory, name, token + "\n")
        except UsageError as exc:
            self._say(f"checkpoint request not passed on: {exc}")

    def _dump(self, token: str, pids: dict[int, int]) -> None:
        # The flight recorders first: their dumps are written meanwhile, by the ranks' own threads.
        ranks = sorted(pids)
        before = {rank: _dump_stamp(self.gate_dir / f"{FLIGHT_RECORDER_PREFIX}{rank}") for rank in ranks}
        asked = {rank: ask_flight_recorder(self.gate_dir / flight_recorder_pipe(rank)) for rank in ranks}
        deadline = time.monotonic() + self.dump_timeout_s
        stacks = dump_stacks(self.node, pids, self.py_spy, self.dump_timeout_s)
        took = {rank: before[rank] for rank in ranks if not asked[rank]}
        dumped = await_flight_recorder_dumps(self.gate_dir, took, deadline)
        try:
            write_regular(self.folder / stacks_file(self.node),
                             stacks + flight_recorder_text(self.node, asked, dumped))
            write_regular(self.folder / dump_done_file(self.node), token + "\n")
        except UsageError as exc:
            self._say(f"stack dump not written: {exc}")

    def _write(self) -> None:
        ranks = with_main_thread_times(self.ranks, {rank: main_thread_times(progress.pid)
                                                    for rank, progress in self.ranks.items()})
        links_t = time.time()
        links = read_links()
        reading = node_reading(self.node, time.time(), self.started_t, ranks, self.checks, links,
                               links_t if links else None)
        try:
            jobdir.write_node_file(self.paths, reading)
        except UsageError as exc:   # the gate directory's filesystem hiccups: the next write tries again
            if str(exc) != self.last_write_error:
                self._say(f"node file not written: {exc}")
            self.last_write_error = str(exc)
            return
        self.last_write_error = ""

    def _say(self, line: str) -> None:
        print(f"trainctl job agent: {self.node}: {line}", file=sys.stderr, flush=True)


def main_thread_times(pid: int) -> SchedStat | None:
    """The rank's main thread (its tid is the process's pid) as the kernel counts its time: on a CPU,
    and runnable but waiting for one. A procfs read of one short line: it never blocks."""
    if pid <= 0:
        return None
    try:
        fd = os.open(f"/proc/{pid}/task/{pid}/schedstat", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:   # the rank ended, or the kernel keeps no schedstat
        return None
    try:
        return parse_schedstat(os.read(fd, LINE_MAX + 1).decode("ascii", "replace"))
    except (OSError, ParseError):
        return None
    finally:
        os.close(fd)


def read_links() -> tuple[LinkReading, ...]:
    """The node's links as its kernel counts them now: every interface's root qdisc (`tc`, bounded
    in time and output) and every InfiniBand port's transmit counters (sysfs). Which interfaces
    carry the job's traffic is not known here: all of them are read, the watch compares each with
    itself. A source that cannot be read adds nothing."""
    from trainctl.proc import run

    found = []
    result = run(list(QDISC_ARGV), timeout=LINKS_TIMEOUT_S, output_cap=LINKS_CAP_BYTES)
    if result.ok and not result.truncated:
        with contextlib.suppress(ParseError):
            found += parse_qdisc_stats(result.stdout)
    files = {}
    for path in (path for pattern in IB_COUNTER_GLOBS for path in itertools.islice(glob.iglob(pattern), IB_COUNTER_FILES)):
        text = _read_small(path, IB_COUNTER_BYTES)
        if text is not None:
            files[path] = text
    with contextlib.suppress(ParseError):
        found += parse_ib_xmit_counters(files)
    return tuple(LinkReading(c.link, c.source, c.sent_bytes, c.wait) for c in found)


def _read_small(path: str, cap: int) -> str | None:
    """A sysfs file's first `cap` bytes; never blocks (O_NONBLOCK), None where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, cap).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def rank_processes(processes: Iterable[tuple[int, int, Mapping[str, str]]], socket_path: str) -> dict[int, int]:
    """{rank: pid} of the processes (pid, parent pid, environment) that rank-exec started for this
    node's socket, each rank's top one: a rank's own process, not the workers it started, which
    inherit its environment."""
    ranked = {pid: (parent, env.get("RANK", "")) for pid, parent, env in processes
              if env.get(SOCKET_ENV) == socket_path and env.get("RANK", "").isdigit()}
    tops: dict[int, int] = {}
    for pid, (parent, rank) in sorted(ranked.items()):
        if ranked.get(parent, (0, None))[1] != rank:   # its parent is no process of the same rank
            tops.setdefault(int(rank), pid)
    return tops


def unreported_ranks(socket_path: str) -> dict[int, int]:
    """This user's processes on the node that rank-exec started for `socket_path`, by rank (read
    from /proc with psutil; a process gone or not readable meanwhile is passed over)."""
    import psutil

    found = []
    uid = os.geteuid()
    for process in psutil.process_iter(["pid", "ppid", "uids"]):
        try:
            if process.info["uids"] is None or process.info["uids"].real != uid:
                continue
            found.append((process.info["pid"], process.info["ppid"], process.environ()))
        except (psutil.Error, OSError):
            continue
    return rank_processes(found, socket_path)


def _read_token(path: Path) -> str:
    return jobdir.read_token(path, TOKEN_CHARS, root=path.parent.parent) or ""


def run_agent(gate_dir: str, site_ref: str, partition_name: str | None, environ: Mapping[str, str]) -> int:
    """Watch this node until SIGTERM (the supervisor ends the step) or the job's end."""
    from trainctl.health.registry import check_site_check_names
    from trainctl.job.gate_cli import ignore_checkpoint_signals
    from trainctl.site import load_site, partition
    from trainctl.slurm import this_node_name

    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UsageError("job agent runs as a task of a Slurm job (no SLURM_JOB_ID)")
    loaded = load_site(site_ref)
    check_site_check_names(loaded)
    _, part = partition(loaded.config, partition_name)
    ignore_checkpoint_signals()
    Agent(gate_dir, this_node_name(environ), job_id, loaded.config, part, environ).run()
    return 0
