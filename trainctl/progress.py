"""Training progress, reported by the program itself: one call per step, framework-neutral.

    import trainctl.progress as progress

    for batch in loader:
        with progress.compute():        # optional: the rank's own compute section
            loss = model(batch) ...
        progress.step()                 # once per step
        if saved:
            progress.checkpoint(step)   # optional: the step a checkpoint now holds

Under trainctl the job gives each rank `TRAINCTL_PROGRESS_SOCKET`, the path of a Unix datagram
socket that trainctl's agent on the node reads. Elsewhere every call returns at once, so a
program can keep the calls when it runs without trainctl.

Each call is bounded: a step adds to counters in memory, and a datagram leaves at most once per
`TRAINCTL_PROGRESS_INTERVAL_S` (0.05 s unless the job sets it). Nothing here raises into the
program or blocks it; a value that cannot be reported (a RANK or interval out of range, a
checkpoint that is not a whole number of steps) is dropped with one warning per process at most.
The code behind these calls runs inside the program, in trainctl's guest room
(`trainctl.guest`), whose rules (no import-time side effects, signals left alone, nothing written
to the environment) say what the program can and cannot see of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from trainctl.guest.rank import requests, the_rank
from trainctl.guest.saves import saved


def step() -> None:
    """Mark the end of one training step."""
    try:
        reporter = the_rank()
        if reporter is not None:
            reporter.own_steps = True
            reporter.step()
    except Exception:   # never into the training program
        pass


def checkpoint(step_number: int) -> None:
    """Say that a checkpoint now holds the state after `step_number` steps (reported at once; on
    global rank 0 also to the supervisor's TRAINCTL_CHECKPOINT_FILE, in any step trainctl runs).

    Any whole number of steps, 0 or more, counts (an int, or a float, numpy or torch scalar that
    holds one); anything else is dropped with one warning."""
    try:
        saved(step_number)
    except Exception:
        pass


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Time the rank's own compute section (no waiting on other ranks inside it, ideally)."""
    try:
        reporter = the_rank()
    except Exception:
        reporter = None
    if reporter is None:
        yield
        return
    started = time.monotonic()
    try:
        yield
    finally:
        reporter.window_compute += time.monotonic() - started


def checkpoint_requested() -> bool:
    """True once for each checkpoint request of trainctl's watch, as this rank sees it (outside a
    watched job: always False). Cheap enough to call every step: it looks at a node-local file at
    most every 0.25 s. Ranks see a request at different steps: a data-parallel program agrees on
    one step before saving (trainctl.integrations does it for Lightning and Transformers).
    Calling it at all tells the supervisor that this program takes requests this way, so the job's
    --signal is no longer sent to it when the watch asks for a checkpoint."""
    try:
        reader = requests()
        return reader is not None and reader.requested()
    except Exception:   # never into the training program
        return False
