"""Run external commands as argv lists, always with a timeout, never through a shell.

`run` never raises for a failing, hung, missing or unexecutable command: it returns a
`ProcResult` that says what happened, because health probes record failures as data.
`run_checked` is for callers where a failure is an error (it raises `ExternalCommandError`).

Every run is hard-bounded, whatever the command and its descendants do:
- output: stdout keeps its first and last `output_cap // 2` bytes (cut at line ends), stderr
  its last `STDERR_CAP_BYTES`; `truncated` and the full byte count say what was cut;
- time: the pipes are read with a deadline; at the timeout the command's process group is
  killed, and so is every process still carrying this run's mark in its environment (a
  grandchild that called setsid and kept stdout open), and the pipes are closed. A command
  that exits while a descendant holds its pipes open gets `LINGER_S` to finish writing;
- `abort_all()` (the CLI calls it on Ctrl-C, SIGTERM, SIGHUP) ends every run in flight at once;
  `RunGroup.abort()` ends one caller's runs (a snapshot's probes) and refuses its later ones.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from trainctl.errors import ExternalCommandError
from trainctl.signals import stop_deferred

STDERR_TAIL_CHARS = 2000
OUTPUT_CAP_BYTES = 8 << 20      # per run: 4 MiB head + 4 MiB tail of stdout
STDERR_CAP_BYTES = 64 << 10     # the end of stderr is where the reason is
LINGER_S = 1.0                  # after the command exits, for descendants still writing
SIGNAL_POLL_S = 0.2            # the main thread never waits longer than this without seeing a stop signal
REAP_S = 0.5                    # waiting for a killed process (one stuck in the kernel never dies)
POLL_S = 0.1                    # how often a run notices abort_all()
READ_CHUNK = 1 << 20
STREAM_LINE_CAP = 64 << 10      # a streamed line (sweep pieces are ~1 KB) longer than this is cut
# Set in each command's environment; descendants inherit it whatever session they move to.
RUN_MARK_ENV = "TRAINCTL_RUN_MARK"


@dataclass(frozen=True)
class ProcResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when the command never ran or was killed on timeout
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    missing: bool = False  # the binary was not found on PATH
    timeout_s: float | None = None
    exec_error: str | None = None  # the OS refused to run it (bad ELF or #! line, no x bit)
    truncated: bool = False        # stdout was longer than the cap: its middle was cut
    stdout_bytes: int = 0          # bytes the command wrote to stdout, cut or not
    strays_killed: int = 0         # descendants still running at the end, killed
    interrupted: bool = False      # abort_all() stopped it (trainctl got Ctrl-C or SIGTERM)

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and not self.missing
                and self.exec_error is None)

    def describe_failure(self) -> str:
        """One line saying why this command did not succeed."""
        name = self.argv[0]
        if self.missing:
            return self.stderr  # names the binary and the PATH searched
        if self.exec_error is not None:
            return f"{name}: cannot execute: {self.exec_error}"
        if self.interrupted:
            return f"{name}: stopped, trainctl was interrupted"
        if self.timed_out:
            return f"{name}: timed out after {self.timeout_s:g} s"
        tail = self.stderr.strip().splitlines()[-1:] or self.stdout.strip().splitlines()[-1:]
        detail = f": {tail[0]}" if tail else ""
        return f"{name} exited with status {self.returncode}{detail}"


def resolve(binary: str, path: str | None = None) -> str | None:
    """Absolute path of `binary` on PATH (or as given, if it contains a slash)."""
    return shutil.which(binary, path=path)


class RunGroup:
    """Runs that end together: `abort()` kills those in flight and refuses any started later
    (threads that had not yet reached `run` when Ctrl-C came).

    Remote reads join a group too (`closing`): what closes them (an SSH connection's `close`)
    is called on abort, so a signal ends a sweep's SSH sessions as it ends its processes.
    """

    def __init__(self) -> None:
        self.aborted = False
        self._closers: dict[int, Callable[[], None]] = {}
        with _registry():
            _GROUPS.add(self)

    def abort(self) -> None:
        _abort(lambda live: live.group is self, [self])

    @contextlib.contextmanager
    def closing(self, close: Callable[[], None]) -> Iterator[None]:
        """`close` is called if the group is aborted while the block runs (or was before it)."""
        key = id(close)
        with _registry():
            self._closers[key] = close
            aborted = self.aborted
        if aborted:
            close()
        try:
            yield
        finally:
            with _registry():
                self._closers.pop(key, None)

    def _close_all(self) -> None:
        with _registry():
            closers = list(self._closers.values())
        for close in closers:
            try:
                close()
            except Exception:  # closing what is already broken must not stop the others
                pass


def run(argv: list[str] | tuple[str, ...], *, timeout: float, env: dict[str, str] | None = None,
        input_text: str | None = None, cwd: str | None = None,
        output_cap: int = OUTPUT_CAP_BYTES, group: RunGroup | None = None) -> ProcResult:
    """Run `argv` with a hard timeout and capped output (see the module's docstring)."""
    argv = tuple(str(a) for a in argv)
    search_path = (env or os.environ).get("PATH")
    named_file = "/" in argv[0] and os.path.exists(argv[0])  # exists but maybe not executable
    if not named_file and resolve(argv[0], search_path) is None:
        return ProcResult(argv, None, "", f"{argv[0]}: not found on PATH={search_path}", 0.0,
                          missing=True, timeout_s=timeout)
    start = time.monotonic()
    live = _LiveRun(f"{os.getpid()}-{next(_RUN_IDS)}-{secrets.token_hex(8)}", output_cap, group)
    with _registry():
        if group is not None and group.aborted:
            return ProcResult(argv, None, "", "", 0.0, timeout_s=timeout, interrupted=True)
        _LIVE.add(live)
    try:
        return _run_registered(live, argv, start, timeout, env, input_text, cwd)
    finally:
        with _registry():
            _LIVE.discard(live)


def _run_registered(live: _LiveRun, argv: tuple[str, ...], start: float, timeout: float,
                    env: dict[str, str] | None, input_text: str | None, cwd: str | None) -> ProcResult:
    try:
        # A new session makes the command its own process group, so a timeout kills the
        # grandchildren too (a hung nvidia-smi behind a wrapper script, say).
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**(env if env is not None else os.environ), RUN_MARK_ENV: live.mark},
                                cwd=cwd, start_new_session=True)
    except OSError as exc:  # ENOEXEC (bad ELF), EACCES (no x bit), ENOENT (bad #! interpreter)
        why = exc.strerror or str(exc)
        if exc.errno == errno.ENOENT and (cwd is None or os.path.isdir(cwd)):  # the file is there: its #! is not
            why += " (a missing #! interpreter?)"
        return ProcResult(argv, None, "", f"{argv[0]}: cannot execute: {why}", time.monotonic() - start,
                          timeout_s=timeout, exec_error=why)
    with _registry():
        live.proc = proc
    if live.aborted:    # aborted while it started: abort() could not kill it yet
        _kill_group(proc)
    try:
        timed_out = live.pump(input_text, start + timeout)
    finally:
        strays = live.finish()
    out, err = live.stdout, live.stderr
    cut_short = timed_out or live.aborted
    return ProcResult(argv, None if cut_short else proc.returncode, out.text(), err.text(),
                      time.monotonic() - start, timed_out=timed_out, timeout_s=timeout,
                      truncated=out.cut > 0, stdout_bytes=out.total, strays_killed=strays,
                      interrupted=live.aborted and not timed_out)


def abort_all() -> None:
    """End every run in flight now, and every group's later runs (Ctrl-C, SIGTERM, SIGHUP)."""
    with _registry():
        groups = list(_GROUPS)
    _abort(lambda live: True, groups)


def _abort(selected, groups: list[RunGroup]) -> None:
    with _registry():
        for group in groups:
            group.aborted = True
        runs = [live for live in _LIVE if selected(live)]
        for live in runs:
            live.aborted = True
        started = [live for live in runs if live.proc is not None]
        for live in started:
            live.swept = True
    for live in started:
        _kill_group(live.proc)
    if started:
        _kill_marked({live.mark for live in started})   # one walk over the processes for all
    for group in groups:
        group._close_all()


_RUN_IDS = itertools.count(1)
_LIVE: set[_LiveRun] = set()
_GROUPS: weakref.WeakSet[RunGroup] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


@contextlib.contextmanager
def _registry() -> Iterator[None]:
    """The live-run registry's lock; a stop signal is not raised while it is held (trainctl.signals)."""
    with stop_deferred(), _LIVE_LOCK:
        yield


class CappedOutput:
    """A stream's bytes within a cap: the head and the tail, cut at line ends."""

    def __init__(self, cap: int, keep_head: bool):
        self.head_cap = cap // 2 if keep_head else 0
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > 2 * self.tail_cap:     # trim in batches: amortised O(1) per byte
            del self.tail[:len(self.tail) - self.tail_cap]

    @property
    def cut(self) -> int:
        return max(0, self.total - len(self.head) - min(len(self.tail), self.tail_cap))

    def text(self) -> str:
        head, tail = bytes(self.head), bytes(self.tail[-self.tail_cap:] if self.tail_cap else b"")
        if self.cut:   # whole lines only on both sides of the cut
            head = head[:head.rfind(b"\n") + 1] if self.head_cap else head
            tail = tail[tail.find(b"\n") + 1:]
        return (head + tail).decode("utf-8", "replace")


class _LiveRun:
    def __init__(self, mark: str, output_cap: int, group: RunGroup | None):
        self.proc: subprocess.Popen | None = None   # set once started
        self.mark = mark
        self.group = group
        self.aborted = False
        self.swept = False      # an abort already killed what carries the mark
        self.reached_eof = False
        self.stdout = CappedOutput(output_cap, keep_head=True)
        self.stderr = CappedOutput(STDERR_CAP_BYTES, keep_head=False)
        self._selector = selectors.DefaultSelector()

    def pump(self, input_text: str | None, deadline: float) -> bool:
        """Read (and feed stdin) until EOF, the deadline or an abort; True when the deadline hit."""
        sinks = {self.proc.stdout.fileno(): self.stdout, self.proc.stderr.fileno(): self.stderr}
        for fd in sinks:
            self._selector.register(fd, selectors.EVENT_READ)
        pending = memoryview(input_text.encode()) if input_text is not None else None
        if pending is not None:
            os.set_blocking(self.proc.stdin.fileno(), False)
            self._selector.register(self.proc.stdin.fileno(), selectors.EVENT_WRITE)
        exited_at = None
        while self._selector.get_map() and not self.aborted:
            now = time.monotonic()
            if now >= deadline:
                return True
            if exited_at is None and self.proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= LINGER_S:
                break   # a descendant holds the pipes open: it is killed in finish()
            for key, _ in self._selector.select(min(POLL_S, deadline - now)):
                fd = key.fd
                if fd in sinks:
                    data = os.read(fd, READ_CHUNK)
                    if data:
                        sinks[fd].add(data)
                    else:
                        self._selector.unregister(fd)
                        self.reached_eof = not any(other in self._selector.get_map() for other in sinks)
                    continue
                try:
                    written = os.write(fd, pending[:65536])
                except BrokenPipeError:
                    written = len(pending)
                pending = pending[written:]
                if not pending:
                    self._selector.unregister(fd)
                    self.proc.stdin.close()
        while self.proc.poll() is None and not self.aborted:   # output done: wait for the exit
            now = time.monotonic()
            if now >= deadline:
                return True
            try:
                self.proc.wait(min(POLL_S, deadline - now))
            except subprocess.TimeoutExpired:
                pass
        return False

    def finish(self) -> int:
        """Kill what is left of the command, close its pipes, reap it; how many strays were killed."""
        self._selector.close()
        # Something may be left (a descendant holding the pipes, or the run was cut short):
        # kill the group, then whatever carries the mark elsewhere. Walking every process
        # for the mark is done only then.
        strays = 0
        if self.proc.poll() is None or not self.reached_eof or self.aborted:
            _kill_group(self.proc)
            if not self.swept:
                strays = _kill_marked({self.mark})
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        try:
            self.proc.wait(REAP_S)
        except subprocess.TimeoutExpired:
            pass    # stuck in the kernel (D state): nothing more to do; Popen reaps it later
        return strays

def _kill_marked(marks: set[str]) -> int:
    """SIGKILL every process (of ours) whose environment carries one of these runs' marks.

    Reads /proc/PID/environ as bytes: five times faster than psutil's parsed environ, and
    this runs while the user waits for Ctrl-C to take effect.
    """
    wanted = [f"\0{RUN_MARK_ENV}={mark}\0".encode() for mark in marks]
    killed = 0
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = b"\0" + handle.read()
            if any(entry in environ for entry in wanted):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except OSError:
            continue    # gone, or not ours to read
    return killed


def each_completed(futures: Iterable[Future]) -> Iterator[Future]:
    """The futures as they complete, waited for in short slices.

    A stop signal the kernel hands to a worker thread only sets a flag that the main thread
    acts on between bytecodes ("Python signal handlers are always executed in the main
    Python thread", docs.python.org/3/library/signal.html); a lock wait with no timeout in
    the main thread is not interrupted by it, so Ctrl-C would wait for the slowest probe.
    The wait takes the futures' locks: a stop signal is raised between slices, not inside.
    """
    pending = set(futures)
    while pending:
        with stop_deferred():
            done, pending = wait(pending, timeout=SIGNAL_POLL_S, return_when=FIRST_COMPLETED)
        yield from done


def run_checked(argv: list[str] | tuple[str, ...], *, timeout: float, **kwargs) -> ProcResult:
    """Like `run`, but a missing binary, a timeout or a non-zero exit raises."""
    result = run(argv, timeout=timeout, **kwargs)
    if not result.ok:
        hint = None
        if result.missing:
            hint = f"PATH={(kwargs.get('env') or os.environ).get('PATH')}"
        raise ExternalCommandError(result.describe_failure(), hint=hint)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class StreamedRun:
    """An argv run with a hard deadline whose stdout is read line by line as it comes.

    Bounded like `run`, without cutting a stream of many nodes short: its own process group,
    killed whole at the deadline together with every process carrying its mark (a `setsid`
    grandchild holding stdout), and reading stops there whatever still holds the pipe;
    `abort_all()` ends it too. A line longer than `STREAM_LINE_CAP` bytes is cut there (the
    rest of it is read and dropped), and stderr keeps its last `STDERR_CAP_BYTES`. The pipes
    are read in `POLL_S` slices, so a stop signal reaches the caller between them.
    """

    def __init__(self, argv: list[str], deadline_s: float, env: dict[str, str] | None):
        self.argv = argv
        self.deadline_s = deadline_s
        self.env = env
        self.timed_out = False
        self.cut_lines = 0
        self._live: _LiveRun | None = None
        self._start_error = ""
        self._finished = False

    def __enter__(self) -> StreamedRun:
        live = _LiveRun(f"{os.getpid()}-{next(_RUN_IDS)}-{secrets.token_hex(8)}", 0, None)
        self._deadline = time.monotonic() + self.deadline_s
        with _registry():
            _LIVE.add(live)
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    env={**(self.env if self.env is not None else os.environ),
                                         RUN_MARK_ENV: live.mark})
        except OSError as exc:
            with _registry():
                _LIVE.discard(live)
            self._start_error = f"{self.argv[0]}: {exc.strerror}"
            return self
        with _registry():
            live.proc = proc
        self._live = live
        if live.aborted:    # aborted while it started
            _kill_group(proc)
        return self

    def lines(self) -> Iterator[str]:
        if self._live is None:
            return
        live, proc = self._live, self._live.proc
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        selector = live._selector
        for fd in (out_fd, err_fd):
            selector.register(fd, selectors.EVENT_READ)
        pending = bytearray()
        dropping = False    # inside a line already cut: its rest is dropped
        exited_at = None
        try:
            while selector.get_map() and not live.aborted:
                now = time.monotonic()
                if now >= self._deadline:
                    self.timed_out = True
                    break
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at >= LINGER_S:
                    break   # a descendant holds the pipes open: it is killed in _finish()
                for key, _ in selector.select(min(POLL_S, self._deadline - now)):
                    data = os.read(key.fd, READ_CHUNK)
                    if not data:
                        selector.unregister(key.fd)
                    elif key.fd == err_fd:
                        live.stderr.add(data)
                    else:
                        pending += data
                        while (end := pending.find(b"\n")) >= 0:
                            line = bytes(pending[:end + 1])
                            del pending[:end + 1]
                            if dropping:
                                dropping = False
                            else:
                                yield line.decode("utf-8", "replace")
                        if dropping:
                            pending.clear()
                        elif len(pending) >= STREAM_LINE_CAP:
                            self.cut_lines += 1
                            yield bytes(pending[:STREAM_LINE_CAP]).decode("utf-8", "replace")
                            pending.clear()
                            dropping = True
            live.reached_eof = not selector.get_map()
            if pending and not dropping and live.reached_eof:
                yield pending.decode("utf-8", "replace")    # a last line without its newline
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._live is None or self._finished:
            return
        self._finished = True
        try:
            self._live.finish()
        finally:
            with _registry():
                _LIVE.discard(self._live)

    @property
    def failed(self) -> bool:
        return self._live is None or self._live.proc.returncode != 0

    def failure(self) -> str:
        if self._live is None:
            return self._start_error
        tail = self._live.stderr.text().strip()[-STDERR_TAIL_CHARS:]
        return (f"{self.argv[0]} exited with status {self._live.proc.returncode}"
                + (f": {tail}" if tail else ""))

    def __exit__(self, *exc_info: object) -> None:
        self._finish()   # the consumer stopped early (Ctrl-C) or the stream ended: nothing is left running
