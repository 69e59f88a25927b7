"""The watch asks the training program for a checkpoint, in a way its framework will not misread.

The job's --signal (e.g. USR1@120) is what a plain program checkpoints on, and what Slurm sends
before the time limit. Lightning reads the same signal differently: its SLURMEnvironment has
`auto_requeue=True` unless the program turns it off, and then the handler it installs for
`requeue_signal` (SIGUSR1 unless set) saves an "hpc" checkpoint and runs `scontrol requeue` on
the whole job (Lightning, src/lightning/pytorch/trainer/connectors/signal_connector.py,
`register_signal_handlers` and `_slurm_sigusr_handler_fn`; plugins/environments/slurm.py). Sent
by the watch, that signal would put the job back in the queue with every node, the bad one too.

So a request goes over trainctl's own channel first: this module writes a token into the watch
folder, every node agent copies it beside its progress socket, and a rank that calls
`trainctl.progress.checkpoint_requested()` (the Lightning and Transformers callbacks in
`trainctl.integrations` do) saves through its framework's own save path. Such a rank marks the
watch folder once (`trainctl.guest.wire.LISTENING_FILE`): then no signal is sent. A program that never asks
gets the job's --signal, unless a rank said that the signal would not get a save
(`trainctl.guest.wire.SIGNAL_REFUSED_FILE`: its default action would end the rank, or it is Lightning's
requeue handler); then it gets nothing, and training resumes from the program's last save.
The job's machine decides all of that (`trainctl.job.machine`, CheckpointAsked); this module only
carries out its effects: it posts the request and reads what the ranks said, sends the signal,
and looks for the save.
Slurm's own time-limit signal is untouched either way: it is Slurm's, not the watch's, so
Lightning still saves and requeues at the time limit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from trainctl.errors import UsageError
from trainctl.job.jobdir import CHECKPOINT_LISTENING, CHECKPOINT_REQUEST, JobPaths, Save, read_signal_refusal
from trainctl.job.machine import CheckpointAsked
from trainctl.job.watch_io import post_request

POLL_S = 0.2


class Step(Protocol):
    """The training step's srun (a subprocess.Popen)."""

    def poll(self) -> int | None: ...

    def send_signal(self, signum: int) -> None: ...


def post_checkpoint_request(gate_dir: str, step: Step) -> CheckpointAsked:
    """A new request in the watch folder, where the step still runs, and what its ranks said of
    themselves: that one takes requests (the listener file), that the signal would not get a save."""
    paths = JobPaths(Path(gate_dir))
    running = step.poll() is None
    posted = False
    if running:
        try:
            post_request(gate_dir, CHECKPOINT_REQUEST)
            posted = True
        except UsageError:   # the folder cannot be written: the signal alone, as before
            posted = False
    listening = posted and os.path.isfile(os.path.join(paths.watch, CHECKPOINT_LISTENING))
    return CheckpointAsked(posted, listening, read_signal_refusal(paths) or "", running)


def send_signal(step: Step, signum: int) -> None:
    """srun forwards it to every task (srun(1), SIGNALS AND ESCAPE SEQUENCES); a step that has
    ended meanwhile gets none."""
    if step.poll() is None:
        step.send_signal(signum)


def await_save(step: Step, look: Callable[[], Save | None], wait_s: float) -> Save | None:
    """The first new save `look` sees (every POLL_S), until `wait_s` pass or the step ends."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and step.poll() is None:
        time.sleep(POLL_S)
        save = look()
        if save is not None:
            return save
    return None
