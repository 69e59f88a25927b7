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
Slurm's own time-limit signal is untouched either way: it is Slurm's, not the watch's, so
Lightning still saves and requeues at the time limit.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

from trainctl.errors import UsageError
from trainctl.job.jobdir import CHECKPOINT_LISTENING, CHECKPOINT_REQUEST, JobPaths, Kind, read_signal_refusal
from trainctl.job.watch_io import post_request

POLL_S = 0.2


class SavesSeen(Protocol):
    last: float | None

    def poll(self, journal) -> None: ...


def request_checkpoint(gate_dir: str, step, signum: int | None, seen: SavesSeen, journal, wait_s: float) -> None:
    """Ask the running training step for a checkpoint and wait up to `wait_s` for a save to be seen;
    journal how it was asked (`listening`, `signal` when one was sent, `refused` when a rank said
    the signal would not get a save) and whether it saved."""
    paths = JobPaths(Path(gate_dir))
    folder = str(paths.watch)
    before = seen.last
    channel = False
    if step.poll() is None:
        try:
            post_request(gate_dir, CHECKPOINT_REQUEST)
            channel = True
        except UsageError:   # the folder cannot be written: the signal alone, as before
            channel = False
    listening = channel and os.path.isfile(os.path.join(folder, CHECKPOINT_LISTENING))
    refused = read_signal_refusal(paths) if signum is not None and not listening else None
    sent = None
    if signum is not None and not listening and refused is None and step.poll() is None:
        step.send_signal(signum)   # srun forwards it to every task (srun(1), SIGNALS AND ESCAPE SEQUENCES)
        sent = signum
    if listening or sent is not None:
        deadline = time.monotonic() + wait_s
        while seen.last == before and time.monotonic() < deadline and step.poll() is None:
            time.sleep(POLL_S)
            seen.poll(journal)
    journal.add(Kind.CHECKPOINT_REQUEST, signal=sent, listening=listening, saved=seen.last != before,
                **({"refused": refused} if refused else {}))
