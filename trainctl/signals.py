"""How Ctrl-C, SIGTERM and SIGHUP end trainctl: as an exception in the main thread, never
inside a held lock.

The handler raises KeyboardInterrupt (Ctrl-C) or `Stopped` where the main thread happens to
be. Python runs it between bytecodes, which can be just after a `with lock:` acquired its
lock and before the block that would release it (CPython bpo-29988, gh-74174): a worker
thread then waits on that lock forever and the process never ends. Code in the main thread
that takes the locks of threads or futures runs inside `stop_deferred()`: a stop signal that
comes meanwhile is raised when the block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from trainctl.errors import STOP_SIGNALS, Stopped

_deferring = 0
_pending: list[int] = []


def on_stop_signal(signum: int, frame: object) -> None:
    # The first stop signal wins: later ones (a second Ctrl-C while we clean up) are ignored,
    # so they cannot turn a clean stop into a traceback.
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    if _deferring:
        _pending.append(signum)
        return
    _raise_for(signum)


@contextlib.contextmanager
def stop_deferred() -> Iterator[None]:
    """Hold a stop signal that arrives in this block until the block ends. Only the main
    thread runs signal handlers; in another thread this does nothing."""
    global _deferring
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _pending and not _deferring:
        _raise_for(_pending.pop())


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)
