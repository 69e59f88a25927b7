"""The rank's activity, for phases without steps (evaluation, a long save, warm-up): one thread
that looks four times a second where the rank's main thread is (the code and instruction of each
frame of its stack). A rank stuck in one call (a collective that never completes, a wait) stays
put. A busy thread is seen where it hands over the GIL (calls, loop ends), so a look that finds it
where it was looks again, up to LOOKS_A_TICK times. When the main thread sends no reports (no
steps), the sampler sends one, at most every ACTIVITY_REPORT_S, after a look that saw it move. A
phase spent in one long C call reads as no activity, as a stuck collective does.

The thread is the room's only one (rule 3 and 5 of `trainctl.guest`): started at the rank's first
step from `_thread`, so `threading` neither lists nor counts it; with every signal blocked, so a
signal the program waits for with sigwait or signalfd, or handles, never lands in it; stopped
before `os.fork()` and started again in the parent after it, so a fork sees the program's own
threads only; and ended at the interpreter's exit, before Python finalizes (a thread still running
then is stopped mid-call). Each second it also asks the signal judge (`signal_judge`) to look.
"""

import _signal
import _thread
import atexit
import os
import sys
import time

LOOK_S = 0.25
REPORT_S = 1.0
LOOKS_A_TICK = 3
RELOOK_S = 0.002
STOP_WAIT_S = 1.0                    # how long the exit or a fork waits for the sampler to end
STACK_DEPTH = 64                     # frames compared, from the innermost
TASK_GONE_POLL_S = 0.0002            # between looks whether the ended thread has left the kernel


def stack_signature(frame) -> tuple | None:
    """Where a thread is: the code and instruction of each frame of its stack (None: no thread)."""
    if frame is None:
        return None
    places = []
    while frame is not None and len(places) < STACK_DEPTH:
        places.append((id(frame.f_code), frame.f_lasti))
        frame = frame.f_back
    return tuple(places)


def main_thread_ident() -> int:
    """The main thread's ident: from `threading` when the program imported it (torch does), else
    this thread's (the first step's, which a program takes on its main thread)."""
    threading = sys.modules.get("threading")
    try:
        return threading.main_thread().ident
    except Exception:
        return _thread.get_ident()


class Sampler:
    def __init__(self, reporter, judge):
        self.reporter = reporter
        self.judge = judge
        self.main = main_thread_ident()
        self.wake = None                       # released to end the thread
        self.ended = None                      # held while the thread runs
        self.running = False
        self.native_id = 0                     # the thread's id in the kernel, /proc/self/task/<id>

    def start(self) -> None:
        """Start the thread with every signal blocked (it inherits the mask of the thread that
        starts it), and see that it is paused around forks and ended at exit."""
        self._start_thread()
        atexit.register(self.stop)
        os.register_at_fork(before=self.stop, after_in_parent=self._resume)

    def _start_thread(self) -> None:
        wake, ended = _thread.allocate_lock(), _thread.allocate_lock()
        wake.acquire()
        ended.acquire()
        self.wake, self.ended = wake, ended
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
        try:
            _thread.start_new_thread(self._run, (wake, ended))
        except Exception:
            ended.release()
            raise
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old)
        self.running = True

    def _resume(self) -> None:
        try:
            if not self.running and os.getpid() == self.reporter.pid:
                self._start_thread()
        except Exception:
            pass                                # activity goes unreported; steps still count

    def stop(self) -> None:
        """End the thread and wait for it, briefly: never an error, never a long wait. Its last
        Python line is not its end in the kernel, where a fork counts the process's threads
        (Python 3.12's warning at os.fork() reads /proc/self/stat): so until its task is gone."""
        try:
            if not self.running:
                return
            self.running = False
            self.wake.release()
            deadline = time.monotonic() + STOP_WAIT_S
            if not self.ended.acquire(timeout=STOP_WAIT_S):
                return
            self.ended.release()
            task = f"/proc/self/task/{self.native_id}"
            while time.monotonic() < deadline:
                try:
                    os.stat(task)
                except OSError:
                    return
                time.sleep(TASK_GONE_POLL_S)
        except Exception:
            pass

    def _run(self, wake, ended) -> None:
        self.native_id = _thread.get_native_id()
        try:
            self._watch(wake)
        except BaseException:
            pass                                # never into the program: activity goes unreported
        finally:
            ended.release()

    def _watch(self, wake) -> None:
        reporter = self.reporter
        last = None                             # the first look is where counting starts
        while not wake.acquire(timeout=LOOK_S):
            if self.judge is not None:
                try:
                    self.judge.look(time.monotonic())
                except BaseException:           # a handler's own code that raises: the judge says nothing
                    pass
            for _ in range(LOOKS_A_TICK):
                here = stack_signature(sys._current_frames().get(self.main))
                if here != last:
                    break
                time.sleep(RELOOK_S)
            if here is None:
                return                          # the main thread has ended: the program is exiting
            if here == last or last is None:
                last = here
                continue
            last = here
            reporter.activity += 1
            now = time.monotonic()
            if now - reporter.last_sent >= REPORT_S and reporter.lock.acquire(blocking=False):
                try:
                    reporter.send_locked(now)
                finally:
                    reporter.lock.release()
