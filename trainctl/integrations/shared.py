"""What the framework callbacks share: reporting a save, and turning the watch's checkpoint
requests into one decision that every rank takes at the same step.

A request reaches each node through its agent, so ranks see it at different steps. A save in a
data-parallel program is collective (Lightning's `Trainer.save_checkpoint` ends in a barrier, and
is to be called on every process: its docstring), so every `every_n_steps` optimizer steps the
ranks agree, with one small all-reduce, on whether any of them has seen a request.

Only in a training step that trainctl's watch watches (`watched_job`): anywhere else a callback
takes part in no collective, writes no file and warns of nothing. Every rank of a step gets the
same environment, so all of them run the all-reduce at the same steps, or none of them does.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping

from trainctl import progress
from trainctl.guest.wire import CHECKPOINT_ENV, SOCKET_ENV, WATCH_DIR_ENV

EVERY_N_STEPS = 10


def watched_job(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a rank of a training step that trainctl's watch watches: the
    supervisor names the step's watch folder (TRAINCTL_WATCH_DIR) and rank-exec the node agent's
    socket (TRAINCTL_PROGRESS_SOCKET), beside which a request reaches the rank. Read once, when a
    callback is made."""
    return bool(environ.get(SOCKET_ENV)) and bool(environ.get(WATCH_DIR_ENV))


def reports_saves(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a save is to be reported: in a watched step, and in any training step trainctl
    runs, which names the file the supervisor watches for saves (TRAINCTL_CHECKPOINT_FILE)."""
    return watched_job(environ) or bool(environ.get(CHECKPOINT_ENV))


class Notice:
    """One warning per callback, through `warnings` so that a program can filter it; a program
    that turns warnings into errors still gets no exception from here."""

    def __init__(self) -> None:
        self.said = False

    def say(self, message: str) -> None:
        if self.said:
            return
        self.said = True
        with contextlib.suppress(Exception):
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def no_place(framework: str, why: str) -> str:
    """What a callback says when the ranks agreed on a requested save and the program keeps no
    checkpoints: a save anywhere else would be one the program never resumes from, or one that a
    later run resumes from unasked."""
    return (f"trainctl.integrations.{framework}: cannot save when trainctl's watch asks for a checkpoint: "
            f"the program keeps no checkpoints ({why}); nothing is saved")


def steps_between(every_n_steps: object) -> int:
    """`every_n_steps` as a whole number of steps, at least 1; the default where it is none
    (never an exception into the program, in a job or out of one)."""
    try:
        return max(1, int(every_n_steps))   # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return EVERY_N_STEPS


class SaveRequests:
    def __init__(self, every_n_steps: int = EVERY_N_STEPS):
        self.every_n_steps = steps_between(every_n_steps)
        self.seen = False
        self.agreed_at: int | None = None
        # at once, not when training starts: from now on the watch sends this program no signal
        # (Lightning installs its requeue handler before the first training hook runs)
        self.listen()

    def listen(self) -> None:
        """Poll for a request (and, the first time, tell the supervisor that this rank listens)."""
        self.seen = progress.checkpoint_requested() or self.seen

    def due(self, step: int, any_rank: Callable[[bool], bool]) -> bool:
        """At every `every_n_steps`-th step, whether some rank has seen a request: `any_rank` is the
        framework's all-reduce of one flag. Every rank calls this at every step, so the all-reduce
        runs at the same steps on all of them."""
        self.listen()
        if step % self.every_n_steps or step == self.agreed_at:
            return False
        self.agreed_at = step
        try:
            decided = bool(any_rank(self.seen))
        except Exception:   # a broken process group shows itself to the program on its next collective
            return False
        if decided:
            self.seen = False
        return decided


def report_step() -> None:
    try:
        progress.step()
    except Exception:   # never into the training program
        pass


def report_saved(step: int) -> None:
    """Tell trainctl that a checkpoint now holds `step` (`trainctl.progress.checkpoint`)."""
    progress.checkpoint(step)
