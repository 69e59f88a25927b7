"""What the framework callbacks share: reporting a save, and turning the watch's checkpoint
requests into one decision that every rank takes at the same step.

A request reaches each node through its agent, so ranks see it at different steps. A save in a
data-parallel program is collective (Lightning's `Trainer.save_checkpoint` ends in a barrier, and
is to be called on every process: its docstring), so every `every_n_steps` optimizer steps the
ranks agree, with one small all-reduce, on whether any of them has seen a request.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from trainctl import progress

EVERY_N_STEPS = 10
CHECKPOINT_ENV = "TRAINCTL_CHECKPOINT_FILE"   # trainctl.job.jobdir.CHECKPOINT_ENV: the supervisor's view of saves


class SaveRequests:
    def __init__(self, every_n_steps: int = EVERY_N_STEPS):
        self.every_n_steps = max(1, int(every_n_steps))
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
    """Tell trainctl that a checkpoint now holds `step`: the progress API (the node agent), and on
    global rank 0 the file the supervisor watches, TRAINCTL_CHECKPOINT_FILE (its mtime is the save's
    time; it holds the step)."""
    try:
        progress.checkpoint(int(step))
    except Exception:
        pass
    path = os.environ.get(CHECKPOINT_ENV)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, f"step {int(step)}\n".encode())
        finally:
            os.close(fd)
    except (OSError, ValueError):
        pass
