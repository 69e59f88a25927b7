"""Training progress, reported by the program itself: one call per step, framework-neutral.

    import trainctl.progress as progress

    for batch in loader:
        with progress.compute():        # optional: the rank's own compute section
            loss = model(batch) ...
        progress.step()                 # once per step
        if saved:
            progress.checkpoint(step)   # optional: the step a checkpoint now holds

Under trainctl the job gives each rank `TRAINCTL_PROGRESS_SOCKET`, the path of a Unix datagram
socket that trainctl's watcher on the node reads. Elsewhere every call returns at once, so
a program can keep the calls when it runs without trainctl.

The cost is bounded per call: a step adds to counters in memory, and a datagram leaves at most
once per `TRAINCTL_PROGRESS_INTERVAL_S` (0.05 s unless the job sets it) carrying the counts since
the last one. Nothing here raises into the program or blocks it: sending is non-blocking, and a
full or absent reader loses a datagram, the next one carrying the running totals; the socket is
made at the first report (again at the next if no descriptor was free), not at import; a value
that cannot be reported (a RANK or interval out of range, a checkpoint that is not a whole
number of steps) is dropped with one warning per process at most. Nothing here imports torch
or anything beyond the standard library, so importing it costs microseconds.

Under the job, the rank's own process also starts one daemon thread that looks four times a
second where its main thread is (`_Reporter.watch_main_thread`): the rank's activity, which
tells the watch a phase without steps (evaluation, a save) from a hang. And in a Python rank
that does not call step(), `trainctl.autostep` counts optimizer steps through this module.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
import warnings
from collections.abc import Iterator

SOCKET_ENV = "TRAINCTL_PROGRESS_SOCKET"
WATCH_DIR_ENV = "TRAINCTL_WATCH_DIR"     # set by the supervisor for the training step it watches
INTERVAL_ENV = "TRAINCTL_PROGRESS_INTERVAL_S"
RANK_ENV = "RANK"
# The pid of the rank's own process: the first under the job to import this module. Its child
# processes (data loader or compile workers, started with spawn) inherit the variable and see
# that they are not it: they report neither activity nor optimizer steps in the rank's name.
OWNER_ENV = "TRAINCTL_PROGRESS_OWNER"
# The signal the job's program is asked to checkpoint on (the job's --signal), when it has one.
SIGNAL_ENV = "TRAINCTL_CHECKPOINT_SIGNAL"
DEFAULT_INTERVAL_S = 0.05
# A longer interval would leave the watch without news for longer than its hang floors allow.
MAX_INTERVAL_S = 10.0

# How often a rank looks whether its main thread moved (`_Reporter.watch_main_thread`), and how
# often at most it reports that while it does not step.
ACTIVITY_LOOK_S = 0.25
ACTIVITY_REPORT_S = 1.0
LOOKS_A_TICK = 3
RELOOK_S = 0.002
STOP_WAIT_S = 1.0                    # at exit, how long the sampler gets to end
STACK_DEPTH = 64                      # frames compared, from the innermost

# One datagram: format version, rank, the sending process's pid (for the node's stack dumps),
# steps so far, wall time of the last step's end, steps in this report, their summed and longest
# duration, compute-section seconds in this report, the step the last checkpoint holds
# (-1: none reported), and how often the main thread was seen somewhere new (activity).
# Little-endian, fixed size.
RECORD = struct.Struct("<BiiQdIdddqQ")
VERSION = 3
_RANKS = range(-1, 2**31)             # what the rank field holds (-1: RANK not set)
_CHECKPOINT_STEPS = range(0, 2**63)   # what the checkpoint field holds
_WINDOW_STEPS_MAX = 2**32 - 1

_warned = False


def _warn_once(message: str) -> None:
    """One warning per process, whatever goes wrong how often: the program's log is not ours.
    Through `warnings` so that a program can filter it; one that turns warnings into errors
    still gets no exception from here."""
    global _warned
    if _warned:
        return
    _warned = True
    with contextlib.suppress(Exception):
        warnings.warn(f"trainctl.progress: {message}", RuntimeWarning, stacklevel=3)


class _Reporter:
    def __init__(self, path: str, rank: int, interval_s: float):
        self.path = path
        self.rank = rank
        self.interval_s = interval_s
        # Made at the first report, and made again at the next one if that failed (no free fd):
        # importing this module never opens anything.
        self.sock: socket.socket | None = None
        self.steps = 0
        self.last_end = time.monotonic()
        self.next_send = self.last_end
        self.checkpoint_step = -1
        self.own_steps = False          # the program calls step() itself: optimizer steps are not counted
        self.rank_process = True        # the rank's own process, not one it started (OWNER_ENV)
        self.activity = 0
        self.last_sent = self.last_end
        self.lock = threading.Lock()    # the main thread's reports and the activity sampler's
        self.stopping = threading.Event()   # set at the interpreter's exit: the sampler ends first
        self.watcher: threading.Thread | None = None
        self.signal_judge: _SignalJudge | None = None
        self._reset_window()

    def _reset_window(self) -> None:
        self.window_steps = 0
        self.window_sum = 0.0
        self.window_max = 0.0
        self.window_compute = 0.0

    def step(self) -> None:
        now = time.monotonic()
        duration = now - self.last_end
        self.last_end = now
        self.steps += 1
        self.window_steps += 1
        self.window_sum += duration
        if duration > self.window_max:
            self.window_max = duration
        if now >= self.next_send:
            self.send(now)

    def send(self, now: float) -> None:
        with self.lock:
            self._send(now)

    def _send(self, now: float) -> None:
        self.next_send = now + self.interval_s
        self.last_sent = now
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX,
                                          socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            last_end_wall = time.time() - (now - self.last_end)   # a checkpoint report comes after its step
            # getpid per report, not per call: a forked child that reports is itself
            record = RECORD.pack(VERSION, self.rank, os.getpid(), self.steps, last_end_wall,
                                 min(self.window_steps, _WINDOW_STEPS_MAX), self.window_sum, self.window_max,
                                 self.window_compute, self.checkpoint_step, self.activity)
            # Non-blocking: no reader, or its queue full, loses this report; the next catches up.
            self.sock.sendto(record, self.path)
        except OSError as exc:
            if self.sock is None:   # no socket could be made (e.g. EMFILE): say so once, try again later
                _warn_once(f"cannot make the progress socket ({exc.strerror or exc}): reports wait for one")
        except (ValueError, OverflowError, struct.error) as exc:
            _warn_once(f"a report could not be built ({exc}): it is dropped")
        self._reset_window()

    def watch_main_thread(self) -> None:
        """The rank's own activity, for phases without steps (evaluation, a long save, warm-up,
        compilation): every ACTIVITY_LOOK_S, whether the main thread is at another place in the
        program than at the last look (its stack: code and instruction of each frame). A rank
        stuck in one call (a collective that never completes, a wait) stays put. A busy thread
        is seen where it hands over the GIL (calls, loop ends), so a look that finds it where it
        was looks again, up to LOOKS_A_TICK times. When the main thread sends no reports (no
        steps), this thread sends one, at most every ACTIVITY_REPORT_S, after a look that saw it
        move. A phase spent in one call (one long C call) reads as no activity, as a stuck
        collective does. A step the main thread counts while this thread reports may lose its
        duration from that report's window; the step totals stay exact."""
        main = threading.main_thread().ident
        last = None                          # the first look is where counting starts
        while not self.stopping.wait(ACTIVITY_LOOK_S):
            try:
                if self.signal_judge is not None and self.steps:
                    with contextlib.suppress(Exception):   # a judge that fails says nothing; activity goes on
                        self.signal_judge.look(self.rank)
                for _ in range(LOOKS_A_TICK):
                    here = _stack_signature(sys._current_frames().get(main))
                    if here != last:
                        break
                    time.sleep(RELOOK_S)
                if here is None:
                    return                   # the main thread has ended: the program is exiting
                if here == last or last is None:
                    last = here
                    continue
                last = here
                self.activity += 1
                now = time.monotonic()
                if now - self.last_sent >= ACTIVITY_REPORT_S and self.lock.acquire(blocking=False):
                    try:
                        self._send(now)
                    finally:
                        self.lock.release()
            except Exception:
                return                       # never into the program: activity goes unreported

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()         # the parent's sampler may have held it at the fork

    def stop_watching(self) -> None:
        """At the interpreter's exit (atexit): end the sampler before Python finalizes. A daemon
        thread still running then is stopped by the interpreter mid-call, which a C++ library in
        the same process can turn into std::terminate; a short wait, never an error."""
        try:
            self.stopping.set()
            if self.watcher is not None:
                self.watcher.join(STOP_WAIT_S)
        except Exception:
            pass


def _stack_signature(frame: object) -> tuple | None:
    """Where a thread is: the code and instruction of each frame of its stack (None: no thread)."""
    if frame is None:
        return None
    places = []
    while frame is not None and len(places) < STACK_DEPTH:
        places.append((id(frame.f_code), frame.f_lasti))
        frame = frame.f_back
    return tuple(places)


def _interval_from_env(text: str | None) -> float:
    if text is None:
        return DEFAULT_INTERVAL_S
    try:
        interval = float(text)
    except ValueError:
        interval = math.nan
    if not 0.0 <= interval <= MAX_INTERVAL_S:   # NaN fails this too
        _warn_once(f"{INTERVAL_ENV}={text[:40]!r} is not 0-{MAX_INTERVAL_S:g} seconds: "
                   f"{DEFAULT_INTERVAL_S:g} s is used")
        return DEFAULT_INTERVAL_S
    return interval


def _reporter_from_env() -> _Reporter | None:
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    text = os.environ.get(RANK_ENV, "-1")
    try:
        rank = int(text)
    except ValueError:
        rank = None
    if rank not in _RANKS:
        # a garbled variable must never stop a training run: report nothing, say so once
        _warn_once(f"{RANK_ENV}={text[:40]!r} is not a rank: no progress is reported")
        return None
    reporter = _Reporter(path, rank, _interval_from_env(os.environ.get(INTERVAL_ENV)))
    owner = os.environ.get(OWNER_ENV)
    if not owner:
        os.environ[OWNER_ENV] = owner = str(os.getpid())
    reporter.rank_process = owner == str(os.getpid())
    if not reporter.rank_process:
        return reporter
    try:
        reporter.watcher = threading.Thread(target=reporter.watch_main_thread, name="trainctl-progress-activity",
                                            daemon=True)
        reporter.watcher.start()
        atexit.register(reporter.stop_watching)
        os.register_at_fork(after_in_child=reporter.after_fork_in_child)
    except Exception as exc:   # RuntimeError: no thread can be started (a limit): steps still count
        _warn_once(f"cannot watch the main thread's activity ({exc})")
    return reporter


_REPORTER = _reporter_from_env()


def step() -> None:
    """Mark the end of one training step."""
    if _REPORTER is not None:
        _REPORTER.own_steps = True
        _REPORTER.step()


def _optimizer_step_hook(reporter: _Reporter):
    """What `trainctl.autostep` registers with torch: each optimizer step counts as a training
    step until the program calls step() itself (its own steps win from then on)."""
    def after_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
        if not reporter.own_steps:
            reporter.step()
    return after_optimizer_step


def checkpoint(step_number: int) -> None:
    """Say that a checkpoint now holds the state after `step_number` steps (reported at once).

    Any whole number of steps, 0 or more, counts (an int, or a float, numpy or torch scalar that
    holds one); anything else is dropped with one warning."""
    if _REPORTER is None:
        return
    steps = _whole_steps(step_number)
    if steps is None:
        _warn_once(f"checkpoint({str(step_number)[:40]}) is not a step number (a whole number, 0 or more): "
                   f"it is dropped")
        return
    _REPORTER.checkpoint_step = steps
    _REPORTER.send(time.monotonic())


def _whole_steps(value: object) -> int | None:
    if isinstance(value, (str, bytes)):
        return None
    try:
        steps = value.__index__()        # int, numpy and torch integer scalars
    except Exception:
        try:
            number = float(value)        # 5.0, a numpy or torch float scalar
            steps = int(number) if number.is_integer() else None
        except Exception:
            return None
    return steps if type(steps) is int and steps in _CHECKPOINT_STEPS else None


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Time the rank's own compute section (no waiting on other ranks inside it, ideally)."""
    if _REPORTER is None:
        yield
        return
    started = time.monotonic()
    try:
        yield
    finally:
        _REPORTER.window_compute += time.monotonic() - started


def decode(datagram: bytes) -> dict[str, float | int]:
    """One datagram as a dict (for the watcher and tests); ValueError if it is not one."""
    if len(datagram) != RECORD.size:
        raise ValueError(f"progress datagram of {len(datagram)} bytes, expected {RECORD.size}")
    version, rank, pid, steps, wall, n, total, longest, compute_s, checkpoint_step, activity = \
        RECORD.unpack(datagram)
    if version != VERSION:
        raise ValueError(f"progress datagram version {version}, expected {VERSION}")
    return {"rank": rank, "pid": pid, "steps": steps, "time": wall, "window_steps": n, "window_seconds": total,
            "window_longest": longest, "compute_seconds": compute_s, "checkpoint_step": checkpoint_step,
            "activity": activity}


# ---------------------------------------------------------------- checkpoint requests (watch -> rank)
# When the watch wants a checkpoint (after a slowdown or a sick node, before it ends the step), the
# supervisor writes a request into the watch folder, each node agent copies it to a file beside its
# progress socket (node-local, so ranks never poll the shared filesystem), and a program that asks
# `checkpoint_requested()` sees it. A program that asks is a listener: it says so once, in the watch
# folder, and the supervisor then sends it no signal (a signal is what Lightning takes for "requeue
# the job"). Programs that never ask keep the job's --signal, as before.

REQUEST_SUFFIX = ".checkpoint-request"       # beside the progress socket: the token of the last request
LISTENING_FILE = "checkpoint-listening"      # in the watch folder: some rank asks for requests
REQUEST_POLL_S = 0.25                        # a rank looks at the request file at most this often
REQUEST_MAX_BYTES = 200


def request_path(socket_path: str) -> str:
    """The node-local file holding the last checkpoint request's token, beside the agent's socket."""
    return socket_path + REQUEST_SUFFIX


class _RequestReader:
    def __init__(self, path: str, watch_dir: str | None):
        self.path = path
        self.watch_dir = watch_dir
        self.next_look = 0.0
        self.stamp: tuple[int, int] | None = None
        self.token = ""
        self.announced = False

    def requested(self) -> bool:
        if not self.announced:
            self.announced = True
            self._announce()
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + REQUEST_POLL_S
        try:
            seen = os.stat(self.path)
        except OSError:
            return False
        stamp = (seen.st_ino, seen.st_mtime_ns)
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        token = _read_small(self.path)
        if not token or token == self.token:
            return False
        self.token = token
        return True

    def _announce(self) -> None:
        if not self.watch_dir:
            return
        with contextlib.suppress(OSError):   # no listener file: the supervisor signals as before
            fd = os.open(os.path.join(self.watch_dir, LISTENING_FILE),
                         os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            os.close(fd)


def _read_small(path: str) -> str:
    # not trainctl.files.read_bytes: this module stays standard-library only (it runs in the rank),
    # and the node-local request file is never a link (O_NOFOLLOW)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, REQUEST_MAX_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


# The job's --signal is what a plain program checkpoints on, but a program may not handle it: by
# default SIGUSR1 ends the process (signal(7)), so the watch's request would end training without
# a save, and Lightning's handler for it requeues the whole job. The rank's own process judges
# the handler it has now (signal.getsignal, from the activity sampler once the rank steps) and,
# when sending the signal would not get a save, says why once in the watch folder: then the
# supervisor asks over its channel only, and sends no signal.
SIGNAL_REFUSED_FILE = "checkpoint-signal-refused"   # in the watch folder: why the signal would not save
SIGNAL_LOOK_S = 1.0                                   # a rank looks at its handler at most this often
LIGHTNING_MODULES = ("lightning.", "pytorch_lightning.")


def signal_refusal(signum: int, handler: object) -> str | None:
    """Why sending `signum` to a process whose handler for it is `handler` (signal.getsignal's
    answer) would not get a checkpoint; None where the program handles it itself, or where the
    handler was not set from Python (None: cannot tell)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if handler == signal.SIG_DFL:
        return f"{name} has its default action (the rank would end, or go on, without a save)"
    if handler == signal.SIG_IGN:
        return f"{name} is ignored"
    if handler is signal.default_int_handler:
        return f"{name} raises KeyboardInterrupt"
    owner = getattr(handler, "__module__", None)
    if isinstance(owner, str) and owner.startswith(LIGHTNING_MODULES):
        return (f"{name} is Lightning's (its SLURMEnvironment saves and requeues the whole job on it, "
                "the bad node included)")
    return None


class _SignalJudge:
    def __init__(self, signum: int, watch_dir: str):
        self.signum = signum
        self.watch_dir = watch_dir
        self.next_look = 0.0
        self.said = False

    def look(self, rank: int) -> None:
        now = time.monotonic()
        if self.said or now < self.next_look:
            return
        self.next_look = now + SIGNAL_LOOK_S
        reason = signal_refusal(self.signum, signal.getsignal(self.signum))
        if reason is None:
            return
        self.said = True
        with contextlib.suppress(OSError):   # the first rank to judge says why; the supervisor reads one line
            fd = os.open(os.path.join(self.watch_dir, SIGNAL_REFUSED_FILE),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, f"rank {rank}: {reason}\n".encode("ascii", "replace"))
            finally:
                os.close(fd)


def _signal_judge_from_env() -> _SignalJudge | None:
    watch_dir = os.environ.get(WATCH_DIR_ENV)
    try:
        signum = int(os.environ.get(SIGNAL_ENV, ""))
    except ValueError:
        return None
    return _SignalJudge(signum, watch_dir) if watch_dir and signum > 0 else None


def _request_reader_from_env() -> _RequestReader | None:
    path = os.environ.get(SOCKET_ENV)
    return _RequestReader(request_path(path), os.environ.get(WATCH_DIR_ENV)) if path else None


_REQUESTS = _request_reader_from_env()
if _REPORTER is not None and _REPORTER.rank_process:
    _REPORTER.signal_judge = _signal_judge_from_env()


def checkpoint_requested() -> bool:
    """True once for each checkpoint request of trainctl's watch, as this rank sees it (outside a
    watched job: always False). Cheap enough to call every step: it looks at a node-local file at
    most every REQUEST_POLL_S. Ranks see a request at different steps: a data-parallel program
    agrees on one step before saving (trainctl.integrations does it for Lightning and Transformers).
    Calling it at all tells the supervisor that this program takes requests this way, so the job's
    --signal is no longer sent to it when the watch asks for a checkpoint."""
    try:
        return _REQUESTS is not None and _REQUESTS.requested()
    except Exception:   # never into the training program
        return False
