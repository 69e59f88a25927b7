"""The rank's reports to its node's agent: counters in memory, and one datagram at most every
interval (TRAINCTL_PROGRESS_INTERVAL_S, 0.05 s unless the job sets it) carrying the counts since
the last one. Sending never blocks: a full or absent reader loses a datagram, the next one
carrying the running totals.

Which process is the rank: the first process of the rank, in this Slurm step, to report (its
first step) makes its claim beside the agent's socket (`wire.claim_path`, a directory made with
mkdir in the job user's private directory). A process the rank starts (a data loader or compile worker, spawned or forked) finds
the claim made and reports nothing; a forked child also carries the parent's reporter, which sends
only from the pid that made the claim. Nothing is written to the environment for this.
"""

import _socket
import _thread
import os
import time

from .wire import (CHECKPOINT_STEPS, DEFAULT_INTERVAL_S, INTERVAL_ENV, MAX_INTERVAL_S, RANK_ENV, RANKS, RECORD,
                   SOCKET_ENV, STEP_ID_ENV, VERSION, WINDOW_STEPS_MAX, claim_path, encode_save)

SAVES_KEPT = 64                      # saves seen and not yet sent (another thread held the lock): the newest kept
from .warn import warn_once


class Reporter:
    def __init__(self, path: str, rank: int, interval_s: float, pid: int):
        self.path = path
        self.rank = rank
        self.interval_s = interval_s
        self.pid = pid                  # the rank's own process: a forked child's copy never sends
        # Made at the first report, and made again at the next one if that failed (no free fd).
        self.sock = None
        self.steps = 0
        self.last_end = time.monotonic()
        self.next_send = self.last_end
        self.last_sent = self.last_end
        self.checkpoint_step = -1
        self.own_steps = False          # the program calls progress.step() itself: optimizer steps do not count
        self.activity = 0
        self.lock = _thread.allocate_lock()   # the main thread's reports and the activity sampler's
        self.first_step_hooks = []      # run once, at the first step (the sampler starts there)
        self.saves = []                 # (wall time, API, path) of saves seen and not yet sent
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
            if self.steps == 1:
                self._first_step()
            self.send(now)

    def _first_step(self) -> None:
        hooks, self.first_step_hooks = self.first_step_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception as exc:   # e.g. no thread can be started (a limit): steps still count
                warn_once(f"the rank's activity is not watched ({exc})")

    def send(self, now: float) -> None:
        with self.lock:
            self.send_locked(now)

    def send_locked(self, now: float) -> None:
        self.next_send = now + self.interval_s
        self.last_sent = now
        if os.getpid() != self.pid:    # per report, not per step: a forked child is not the rank
            self._reset_window()
            return
        try:
            self._make_socket()
            last_end_wall = time.time() - (now - self.last_end)   # a checkpoint report comes after its step
            record = RECORD.pack(VERSION, self.rank, self.pid, self.steps, last_end_wall,
                                 min(self.window_steps, WINDOW_STEPS_MAX), self.window_sum, self.window_max,
                                 self.window_compute, self.checkpoint_step, self.activity)
            # Non-blocking: no reader, or its queue full, loses this report; the next catches up.
            self.sock.sendto(record, self.path)
            if self.saves:
                self._send_saves()
        except OSError as exc:
            if self.sock is None:   # no socket could be made (e.g. EMFILE): say so once, try again later
                warn_once(f"cannot make the progress socket ({exc.strerror or exc}): reports wait for one")
        except Exception as exc:     # a value beyond the record's fields (struct.error, OverflowError)
            warn_once(f"a report could not be built ({exc}): it is dropped")
        self._reset_window()


    def _make_socket(self) -> None:
        if self.sock is None:
            self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_NONBLOCK | _socket.SOCK_CLOEXEC)

    def saw_save(self, api: int, path: bytes) -> None:
        """A save the program completed, from any of its threads (an asynchronous save ends in one of
        torch's): sent now where no other thread is sending, else with the rank's next report.
        Never waits for the lock."""
        saves = self.saves
        if len(saves) >= SAVES_KEPT:
            del saves[0]
        saves.append((time.time(), api, path))
        if os.getpid() != self.pid or not self.lock.acquire(blocking=False):
            return
        try:
            self._make_socket()
            self._send_saves()
        except OSError:
            pass                   # kept: the next report sends it
        finally:
            self.lock.release()

    def _send_saves(self) -> None:
        """Each save seen, oldest first, as a datagram of its own (`wire.encode_save`); one the
        reader cannot take now (its queue full) is lost, as a report is."""
        while self.saves:
            wall, api, path = self.saves.pop(0)
            try:
                self.sock.sendto(encode_save(self.rank, self.pid, wall, api, path), self.path)
            except BlockingIOError:
                return


def interval_from_env(text: str | None) -> float:
    if text is None:
        return DEFAULT_INTERVAL_S
    try:
        interval = float(text)
    except ValueError:
        interval = float("nan")
    if not 0.0 <= interval <= MAX_INTERVAL_S:   # NaN fails this too
        warn_once(f"{INTERVAL_ENV}={text[:40]!r} is not 0-{MAX_INTERVAL_S:g} seconds: "
                  f"{DEFAULT_INTERVAL_S:g} s is used")
        return DEFAULT_INTERVAL_S
    return interval


def claim(path: str) -> bool:
    """Make the rank's claim; True when this process made it (it is the rank's own). A directory:
    made atomically, and with no file descriptor (a program that holds them all still claims)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False                 # a process of this rank made it first: this one was started by it
    except OSError as exc:
        warn_once(f"cannot claim the rank ({exc.strerror or exc}): no progress is reported")
        return False
    return True


def reporter_from_env(environ) -> Reporter | None:
    path = environ.get(SOCKET_ENV)
    if not path:
        return None
    text = environ.get(RANK_ENV, "-1")
    try:
        rank = int(text)
    except ValueError:
        rank = None
    if rank not in RANKS:
        # a garbled variable must never stop a training run: report nothing, say so once
        warn_once(f"{RANK_ENV}={text[:40]!r} is not a rank: no progress is reported")
        return None
    interval = interval_from_env(environ.get(INTERVAL_ENV))
    if not claim(claim_path(path, rank, environ.get(STEP_ID_ENV, ""))):
        return None
    return Reporter(path, rank, interval, os.getpid())


def whole_steps(value: object) -> int | None:
    """`value` as a number of steps (an int, or a float, numpy or torch scalar holding a whole
    number, 0 or more); None otherwise."""
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
    return steps if type(steps) is int and steps in CHECKPOINT_STEPS else None
