"""Submitting through `trainctl submit` on the dev cluster and waiting for the job to end; the
session's cluster started again with another spec."""

import dataclasses
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from trainctl.job.jobdir import JOURNAL, read_journal
from trainctl.proc import run
from trainctl.slurm import parse_scontrol_oneliner

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def submit(devcluster, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINCTL, "submit", *args], capture_output=True, text=True, cwd=cwd,
                          env=devcluster.client_env(), timeout=120)


def wait_for_job(devcluster, job_id: str, timeout_s: float = 150.0) -> dict:
    """The job's `scontrol show job` record once it has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = run(["scontrol", "show", "job", "-o", job_id], timeout=15, env=devcluster.client_env())
        record = {}  # a job name with a newline spreads the one-liner over two lines
        for part in parse_scontrol_oneliner(result.stdout if result.ok else ""):
            record.update(part)
        if record.get("JobState") in TERMINAL_STATES:
            return record
        # A slurmctld busy past MessageTimeout on the shared 2-core machine answers one poll with
        # "Socket timed out on send/recv operation" (seen on 24.11 with a second cluster beside
        # the session's): poll again until the deadline.
        state = record.get("JobState") or f"unknown ({result.describe_failure().strip()})"
        assert time.monotonic() < deadline, f"job {job_id} still {state} after {timeout_s} s"
        time.sleep(0.5)


def job_output(cwd: Path, job_id: str) -> str:
    """The job script's output, then each rank's own file (the site's launch.rank_output)."""
    gate_dir = cwd / f"trainctl-gate-{job_id}"
    return "".join(path.read_text() for path in [cwd / f"slurm-{job_id}.out", *sorted(gate_dir.glob("rank-*.out"))])


def journal(gate_dir: Path) -> list[dict]:
    """The job's events so far ([] before its journal exists)."""
    return read_journal(gate_dir / JOURNAL)


def wait_until(what: str, predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.5)


@contextmanager
def restarted_with(cluster, **changes):
    """The session's cluster, started again with its spec changed (`changes`); restored afterwards."""
    original = cluster.spec
    cluster.spec = dataclasses.replace(original, **changes)
    try:
        cluster.up()     # holds the session's lock already; tears the running cluster down first
        yield cluster
    finally:
        cluster.spec = original
        cluster.up()
