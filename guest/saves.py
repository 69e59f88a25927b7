"""Telling trainctl that a checkpoint now holds a step (`trainctl.progress.checkpoint`): the rank's
report to its node's agent, and on global rank 0 the file the supervisor watches in every
training step it runs, TRAINCTL_CHECKPOINT_FILE (its mtime is the save's time; it holds the step),
written without following a link or blocking."""

import os
import time

from .rank import the_rank
from .reporter import whole_steps
from .warn import warn_once
from .wire import CHECKPOINT_ENV, RANK_ENV


def saved(step_number: object) -> None:
    steps = whole_steps(step_number)
    if steps is None:
        warn_once(f"checkpoint({str(step_number)[:40]}) is not a step number (a whole number, 0 or more): "
                  f"it is dropped")
        return
    reporter = the_rank()
    if reporter is not None:
        reporter.checkpoint_step = steps
        reporter.send(time.monotonic())
    path = os.environ.get(CHECKPOINT_ENV)
    if not path or os.environ.get(RANK_ENV, "0") != "0":
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
        try:
            os.write(fd, b"step %d\n" % steps)
        finally:
            os.close(fd)
    except OSError:
        pass
