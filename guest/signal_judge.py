"""Whether the job's checkpoint signal would get a save from this rank, judged from the handler
the rank has for it now (`signal.getsignal`, read, never set).

The job's --signal is what a plain program checkpoints on, but a program may not handle it: by
default SIGUSR1 ends the process (signal(7)), and Lightning's handler for it requeues the whole
job. When sending the signal would not get a save, the rank says why in the watch folder
(`wire.SIGNAL_REFUSED_FILE`, "rank R: why"), and the supervisor then asks over trainctl's own
channel only. The verdict is judged again each second: a handler installed later, or a default
that was brief, takes the rank's line back. The supervisor clears the file at each start of the
training step.
"""

import _signal
import os

from .wire import SIGNAL_ENV, SIGNAL_REFUSED_FILE, WATCH_DIR_ENV

LOOK_S = 1.0
LIGHTNING_MODULES = ("lightning.", "pytorch_lightning.")
LINE_MAX = 400
_NAMES = {number: name for name, number in vars(_signal).items()
          if name.startswith("SIG") and not name.startswith("SIG_") and type(number) is int}


def signal_name(signum: int) -> str:
    return _NAMES.get(signum, f"signal {signum}")


class _Probe:
    def method(self) -> None:
        pass


_FUNCTION = type(signal_name)
_METHOD = type(_Probe().method)


def owner_module(handler: object) -> str | None:
    """The module a handler comes from, read from the function or the class without running any
    of the handler's own code (no __getattr__, no property, no __eq__)."""
    kind = type(handler)
    if kind is _METHOD:
        handler = handler.__func__
        kind = type(handler)
    module = handler.__module__ if kind is _FUNCTION else vars(kind).get("__module__")
    return module if type(module) is str else None


def signal_refusal(signum: int, handler: object) -> str | None:
    """Why sending `signum` to a process whose handler for it is `handler` (signal.getsignal's
    answer, raw) would not get a checkpoint; None where the program handles it itself, or where
    the handler was not set from Python (None: cannot tell)."""
    name = signal_name(signum)
    if int in type(handler).__mro__:  # SIG_DFL or SIG_IGN (raw from _signal, an enum from signal)
        if handler == _signal.SIG_DFL:
            return f"{name} has its default action (the rank would end, or go on, without a save)"
        if handler == _signal.SIG_IGN:
            return f"{name} is ignored"
        return None
    if handler is _signal.default_int_handler:
        return f"{name} raises KeyboardInterrupt"
    module = owner_module(handler)
    if module is not None and module.startswith(LIGHTNING_MODULES):
        return (f"{name} is Lightning's (its SLURMEnvironment saves and requeues the whole job on it, "
                "the bad node included)")
    return None


class SignalJudge:
    def __init__(self, signum: int, watch_dir: str, rank: int):
        self.signum = signum
        self.path = os.path.join(watch_dir, SIGNAL_REFUSED_FILE)
        self.rank = rank
        self.mine = f"rank {rank}:".encode()
        self.next_look = 0.0
        self.refused = False

    def look(self, now: float) -> None:
        """Judge the handler again, at most every LOOK_S; say a new refusal, take back a withdrawn one."""
        if now < self.next_look:
            return
        self.next_look = now + LOOK_S
        reason = signal_refusal(self.signum, _signal.getsignal(self.signum))
        if reason is not None and not self.refused:
            self.refused = True
            self._say(f"rank {self.rank}: {reason}"[:LINE_MAX] + "\n")
        elif reason is None and self.refused:
            self.refused = False
            self._take_back()

    def _say(self, line: str) -> None:
        # The first rank to refuse says why; the supervisor reads one line. Written aside, then
        # linked into place: the file never exists without its line, and a link never replaces
        # another rank's.
        aside = f"{self.path}.{os.getpid()}"
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            try:
                os.write(fd, line.encode("ascii", "replace"))
            finally:
                os.close(fd)
            os.link(aside, self.path)
        except OSError:
            pass
        finally:
            try:
                os.unlink(aside)
            except OSError:
                pass

    def _take_back(self) -> None:
        """Remove the file where this rank's line is in it (another rank that still refuses says
        so again at its next look)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            said = os.read(fd, len(self.mine))
        except OSError:
            said = b""
        finally:
            os.close(fd)
        if said == self.mine:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def judge_from_env(environ, rank: int) -> SignalJudge | None:
    watch_dir = environ.get(WATCH_DIR_ENV)
    try:
        signum = int(environ.get(SIGNAL_ENV, ""))
    except ValueError:
        return None
    return SignalJudge(signum, watch_dir, rank) if watch_dir and signum > 0 else None
