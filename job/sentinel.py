"""The sentinel: one task on the job's second node that ends the job when its batch host is lost.

The job script beats (a counter in DIR/batch-host.beat every 2 s) while its process lives. When
the beat has not changed for `silence_s`, the batch host is dead or hung, and with it the job's
supervisor: the sentinel sets the job's Comment to say so and cancels the job, retrying while
Slurm refuses (a controller busy with the node's failure). Without it, a --no-kill job (Slurm
22.05) whose batch host died stays RUNNING, with no script, until its time limit.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainctl.files import open_append_regular
from trainctl.job.jobdir import BATCH_HOST_BEAT   # a counter the job script rewrites every 2 s
from trainctl.job.jobdir import read_token

SENTINEL_POLL_S = 1.0
BEAT_MAX_BYTES = 64
CANCEL_ATTEMPTS = 10
CANCEL_RETRY_S = 5.0


@dataclass
class BeatWatch:
    """Silence of a heartbeat seen as a value that changes (a counter in a file): silent once
    the value has not changed for `silence_s` of the watcher's own clock (no clock skew)."""
    silence_s: float
    last: str | None = None
    since: float | None = None

    def silent(self, beat: str | None, now: float) -> bool:
        if self.since is None or beat != self.last:
            self.last, self.since = beat, now
            return False
        return now - self.since >= self.silence_s


def watch_batch_host(gate_dir: Path, silence_s: float, log_file: Path | None) -> int:
    """Wait until the beat falls silent, then comment and cancel the job. Returns the exit status."""
    from trainctl.errors import UsageError
    from trainctl.job.gate_cli import ignore_checkpoint_signals

    if log_file and not write_output_to(log_file):
        say(f"trainctl: sentinel: cannot write its log {log_file}: watching without it")
    beat_file = gate_dir / BATCH_HOST_BEAT
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise UsageError("gate sentinel runs inside a Slurm job (no SLURM_JOB_ID)")
    ignore_checkpoint_signals()
    say(f"trainctl: sentinel of job {job_id}: watching {beat_file} (silent after {silence_s:g} s)")
    watch = BeatWatch(silence_s)
    # read_token opens the file each poll (an NFS client revalidates its cached attributes) and
    # never waits on a FIFO put there
    while not watch.silent(read_token(beat_file, BEAT_MAX_BYTES, root=gate_dir), time.monotonic()):
        time.sleep(SENTINEL_POLL_S)
    why = f"trainctl: batch host lost: no heartbeat in {beat_file} for {silence_s:g} s; job cancelled"
    say(why)
    return cancel_job(job_id, why)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_output_to(path: Path) -> bool:
    """Point this process's stdout and stderr at `path` (appended), at the file descriptor level:
    srun writes a task's --output file itself, on the batch host, whose loss is what this reports.
    False where it cannot be written (or is not a regular file): the sentinel watches on, with
    its output where srun put it, since its log is not worth the job's safety net."""
    try:
        fd = open_append_regular(path)
    except OSError:
        return False
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    return True


def cancel_job(job_id: str, why: str) -> int:
    """Comment and scancel the job; scancel is retried (bounded) until Slurm accepts it."""
    from trainctl.job import slurm_actions as slurm

    env = dict(os.environ)
    slurm.comment_job(job_id, why, env)
    for attempt in range(1, CANCEL_ATTEMPTS + 1):
        result = slurm.cancel_job(job_id, env)
        if result.ok:
            return 0
        say(f"trainctl: scancel {job_id} failed (attempt {attempt} of {CANCEL_ATTEMPTS}): "
            f"{result.describe_failure()}")
        if attempt < CANCEL_ATTEMPTS:
            time.sleep(CANCEL_RETRY_S)
    return 4

