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
the last one. Sending never blocks and never raises: a full or absent reader loses a datagram,
and the next one carries the running totals. Nothing here imports torch or anything beyond the
standard library, so importing it costs microseconds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import time
from collections.abc import Iterator

SOCKET_ENV = "TRAINCTL_PROGRESS_SOCKET"
INTERVAL_ENV = "TRAINCTL_PROGRESS_INTERVAL_S"
RANK_ENV = "RANK"
DEFAULT_INTERVAL_S = 0.05

# One datagram: format version, rank, the sending process's pid (for the node's stack dumps),
# steps so far, wall time of the last step's end, steps in this report, their summed and longest
# duration, compute-section seconds in this report, and the step the last checkpoint holds
# (-1: none reported). Little-endian, fixed size.
RECORD = struct.Struct("<BiiQdIdddq")
VERSION = 2


class _Reporter:
    def __init__(self, path: str, rank: int, interval_s: float):
        self.path = path
        self.rank = rank
        self.interval_s = interval_s
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.steps = 0
        self.last_end = time.monotonic()
        self.next_send = self.last_end
        self.checkpoint_step = -1
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
        self.next_send = now + self.interval_s
        last_end_wall = time.time() - (now - self.last_end)   # a checkpoint report comes after its step
        # getpid per report, not per call: a forked child that reports is itself
        record = RECORD.pack(VERSION, self.rank, os.getpid(), self.steps, last_end_wall, self.window_steps,
                             self.window_sum, self.window_max, self.window_compute, self.checkpoint_step)
        with contextlib.suppress(OSError):  # no reader, or its queue is full: the next report catches up
            self.sock.sendto(record, self.path)
        self._reset_window()


def _reporter_from_env() -> _Reporter | None:
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    try:
        rank = int(os.environ.get(RANK_ENV, "-1"))
        interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        return None  # a garbled variable must never stop a training run: report nothing
    return _Reporter(path, rank, max(interval, 0.0))


_REPORTER = _reporter_from_env()


def step() -> None:
    """Mark the end of one training step."""
    if _REPORTER is not None:
        _REPORTER.step()


def checkpoint(step_number: int) -> None:
    """Say that a checkpoint now holds the state after `step_number` steps (reported at once)."""
    if _REPORTER is not None:
        _REPORTER.checkpoint_step = step_number
        _REPORTER.send(time.monotonic())


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
    version, rank, pid, steps, wall, n, total, longest, compute_s, checkpoint_step = RECORD.unpack(datagram)
    if version != VERSION:
        raise ValueError(f"progress datagram version {version}, expected {VERSION}")
    return {"rank": rank, "pid": pid, "steps": steps, "time": wall, "window_steps": n, "window_seconds": total,
            "window_longest": longest, "compute_seconds": compute_s, "checkpoint_step": checkpoint_step}


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


def _request_reader_from_env() -> _RequestReader | None:
    path = os.environ.get(SOCKET_ENV)
    return _RequestReader(request_path(path), os.environ.get("TRAINCTL_WATCH_DIR")) if path else None


_REQUESTS = _request_reader_from_env()


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
