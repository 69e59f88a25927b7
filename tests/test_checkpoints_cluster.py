"""Checkpoints seen without code, on the real cluster: a program that knows nothing of trainctl
keeps its own checkpoint files; with `submit --checkpoints` the supervisor sees its save by the
file's mtime, and `job show` counts only the work after it as lost when the step fails."""

from __future__ import annotations

import json
import subprocess

import pytest

from support.slurm_jobs import TRAINCTL, submit, wait_for_job
from test_devcluster_jobs import HEALTHY_NVLINK, staged_nvidia_smi

pytestmark = pytest.mark.cluster

NODES = ("node1", "node2", "node3", "node4")
# Rank 0 saves once, after the step has started, and every rank fails a little later; the
# program reads no trainctl variable and calls no trainctl code. The wait for the save is a
# file, not a clock.
PROGRAM = """#!/bin/sh
sleep 1
if [ "$RANK" = 0 ]; then echo weights > "{dir}/ckpt/.step10.tmp" && mv "{dir}/ckpt/.step10.tmp" "{dir}/ckpt/step10.pt"; fi
while [ ! -f "{dir}/ckpt/step10.pt" ]; do sleep 0.2; done
sleep 2
exit 1
"""


def test_an_unmodified_programs_own_checkpoint_file_is_seen_and_only_the_work_after_it_is_lost(devcluster, tmp_path):
    (tmp_path / "ckpt").mkdir()
    program = tmp_path / "train.sh"
    program.write_text(PROGRAM.format(dir=tmp_path))
    program.chmod(0o755)
    with staged_nvidia_smi(devcluster, {node: HEALTHY_NVLINK for node in NODES}):
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--checkpoints", "ckpt/*.pt",
                        "--", str(program))
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        record = wait_for_job(devcluster, job_id, timeout_s=180)
    assert record["JobState"] == "FAILED", (tmp_path / f"slurm-{job_id}.out").read_text()
    shown = subprocess.run([TRAINCTL, "job", "show", job_id, "--json"], capture_output=True, text=True, timeout=60,
                           env=devcluster.client_env())
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    events = data["timeline"][0]["events"]
    (saved,) = [event for event in events if event["event"] == "checkpoint"]
    assert saved["source"] == "ckpt/*.pt" and saved["note"] == "ckpt/step10.pt"
    assert saved["checkpoint_t"] == (tmp_path / "ckpt" / "step10.pt").stat().st_mtime
    (ended,) = [event for event in events if event["event"] == "step_end"]
    assert ended["last_checkpoint_t"] == saved["checkpoint_t"] > ended["training_start_t"]
    assert data["goodput"]["lost_s"]["lost_work"] == round(ended["t"] - saved["checkpoint_t"], 1)
    assert data["goodput"]["productive_s"] > 0           # before: the whole step was lost work
