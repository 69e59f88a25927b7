"""Telling trainctl that a checkpoint now holds a step: the rank's report (the node agent), and on
global rank 0 the file the supervisor watches, TRAINCTL_CHECKPOINT_FILE (its mtime is the save's
time; it holds the step). What the framework integrations call after each save."""

import os
import time

from .rank import the_rank
from .reporter import whole_steps
from .warn import warn_once
from .wire import CHECKPOINT_ENV, RANK_ENV


def report_checkpoint(step_number: object) -> None:
    """The progress API's checkpoint(): the step a checkpoint now holds, reported at once."""
    reporter = the_rank()
    if reporter is None:
        return
    steps = whole_steps(step_number)
    if steps is None:
        warn_once(f"checkpoint({str(step_number)[:40]}) is not a step number (a whole number, 0 or more): "
                  f"it is dropped")
        return
    reporter.checkpoint_step = steps
    reporter.send(time.monotonic())


def saved(step: int) -> None:
    """A save of `step` has completed: report it, and mark it for the supervisor on rank 0."""
    report_checkpoint(step)
    path = os.environ.get(CHECKPOINT_ENV)
    if not path or os.environ.get(RANK_ENV, "0") != "0":
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
        try:
            os.write(fd, b"step %d\n" % int(step))
        finally:
            os.close(fd)
    except (OSError, ValueError, TypeError):
        pass

