"""Requeue around bad nodes, on the real cluster: a node killed during training makes a
`--retries 1` job submit its successor without that node, and the successor resumes from the
checkpoint; a gate that finds too few healthy nodes does the same around the nodes it left out;
a program that fails on healthy nodes is not retried."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from support.sites import site_variant
from support.slurm_jobs import TRAINCTL, submit, wait_for_job
from test_devcluster_jobs import HEALTHY_NVLINK, INACTIVE_LINKS, staged_nvidia_smi
from trainctl.devcluster import faults
from trainctl.proc import run_checked
from trainctl.slurm import expand_hostlist

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train_ddp.py")
NODES = ("node1", "node2", "node3", "node4")


def wait_for_text(path_glob: list[Path] | Path, pattern: str, timeout_s: float) -> str:
    """The first file (of a glob's matches, re-listed each time) whose text matches `pattern`."""
    deadline = time.monotonic() + timeout_s
    while True:
        paths = path_glob() if callable(path_glob) else [path_glob]
        for path in paths:
            text = path.read_text() if path.exists() else ""
            if re.search(pattern, text):
                return text
        assert time.monotonic() < deadline, f"no {pattern!r} in {paths} after {timeout_s} s"
        time.sleep(0.5)


def running_on(output: str) -> list[str]:
    return expand_hostlist(re.search(r"trainctl: running on (\S+),", output).group(1))


def training_with_a_checkpoint(devcluster, tmp_path: Path, checkpoint: Path) -> tuple[str, Path, str, str]:
    """A `--retries 1` job of 2 nodes and a spare, once its training wrote the checkpoint of step 10:
    its id, gate dir, output so far and batch host. The watch is off: with it, a lost node is
    restarted around inside the allocation (tests/test_watch_cluster.py), and this is the requeue."""
    site = site_variant(tmp_path, "local-demo", {"watch.enabled": False})
    result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "2", "--spare", "1",
                    "--retries", "1", "--", TRAIN, "--steps", "100", "--step-time", "0.25",
                    "--checkpoint", str(checkpoint), "--checkpoint-every", "5")
    assert result.returncode == 0, result.stderr
    first = result.stdout.strip().splitlines()[-1]
    gate_dir = tmp_path / f"trainctl-gate-{first}"
    wait_for_text(lambda: sorted(gate_dir.glob("rank-*.out")), r"checkpoint at step 10\b", 180)
    output = (tmp_path / f"slurm-{first}.out").read_text()
    job = run_checked(["scontrol", "show", "job", "-o", first], timeout=15, env=devcluster.client_env())
    return first, gate_dir, output, re.search(r"BatchHost=(\S+)", job.stdout).group(1)


def test_a_node_lost_during_training_is_excluded_and_the_successor_resumes(devcluster, tmp_path):
    checkpoint = tmp_path / "ckpt" / "train.pt"
    victim = None
    with staged_nvidia_smi(devcluster, {node: HEALTHY_NVLINK for node in NODES}):
        try:
            first, gate_dir, output, batch_host = training_with_a_checkpoint(devcluster, tmp_path, checkpoint)
            victim = next(node for node in reversed(running_on(output)) if node != batch_host)
            assert faults.kill_node(devcluster, victim)   # slurmd, slurmstepd and the rank: a dead node

            record = wait_for_job(devcluster, first, timeout_s=120)
            output = (tmp_path / f"slurm-{first}.out").read_text()
            assert record["JobState"] == "FAILED", output
            retry = json.loads((gate_dir / "retry.json").read_text())
            assert retry["retry"] and retry["successor"], retry
            assert victim in retry["bad_nodes"] and victim in retry["exclude"], retry
            assert f"submitted job {retry['successor']} excluding" in output

            second = retry["successor"]
            record2 = wait_for_job(devcluster, second, timeout_s=240)
            output2 = (tmp_path / f"slurm-{second}.out").read_text()
            ranks2 = "".join(p.read_text() for p in sorted((tmp_path / f"trainctl-gate-{second}").glob("rank-*.out")))
            assert record2["JobState"] == "COMPLETED", output2 + ranks2
            assert victim in expand_hostlist(record2["ExcNodeList"])
            comment = run_checked(["squeue", "-h", "-t", "all", "-j", second, "-o", "%k"], timeout=15,
                                  env=devcluster.client_env()).stdout  # the one-liner splits it at spaces
            assert comment.startswith(f"trainctl: attempt 2 of 2, after job {first} (a node was lost"), comment
            assert victim not in running_on(output2)
            resumed = [int(k) for k in re.findall(r"resumed from step (\d+)", ranks2)]
            assert resumed and min(resumed) >= 10, ranks2
            assert ranks2.count("100 steps") == 2 and "parameters agree" in ranks2
            attempt = json.loads((tmp_path / f"trainctl-gate-{second}" / "attempt.json").read_text())
            assert attempt["attempt"] == 2 and attempt["previous_job"] == first
            shown = subprocess.run([TRAINCTL, "job", "show", second], capture_output=True, text=True, timeout=60,
                                   env=devcluster.client_env()).stdout
            assert "submit --retries: 2 jobs, one per attempt, linked by job id:" in shown, shown
            assert f"  job {first}: attempt 1 of 2 (job {first}): a node was lost during training ({victim}" in shown
            # the chain's timeline from both jobs' journals, and its goodput
            assert re.search(rf"\+\d+:\d\d:\d\d job {first}: training step ended", shown), shown
            assert re.search(rf"\+\d+:\d\d:\d\d job {second}: training step ended: status 0", shown), shown
            assert re.search(r"goodput: \d+\.\d% \(\S+ productive of \S+ since the first submit\)", shown), shown
        finally:
            if victim:
                faults.restore_node(devcluster, victim, timeout_s=90)


def test_a_node_lost_while_the_gate_left_the_batch_host_out_of_training_is_still_excluded(devcluster, tmp_path):
    """The batch host fails the gate, so it holds the job but runs no rank: the probe after the step
    must still reach it, or the retry could not tell that the probe itself works."""
    victim = None
    replays = {node: INACTIVE_LINKS if node == "node1" else HEALTHY_NVLINK for node in NODES}
    with staged_nvidia_smi(devcluster, replays):
        try:
            first, gate_dir, output, batch_host = training_with_a_checkpoint(devcluster, tmp_path,
                                                                             tmp_path / "ckpt" / "train.pt")
            assert batch_host == "node1" and batch_host not in running_on(output), output
            victim = running_on(output)[-1]
            assert faults.kill_node(devcluster, victim)

            wait_for_job(devcluster, first, timeout_s=120)
            retry = json.loads((gate_dir / "retry.json").read_text())
            assert retry["retry"] and retry["successor"], retry
            assert victim in retry["bad_nodes"] and victim in retry["exclude"], retry
            run_checked(["scancel", retry["successor"]], timeout=15, env=devcluster.client_env())
            wait_for_job(devcluster, retry["successor"], timeout_s=120)
        finally:
            if victim:
                faults.restore_node(devcluster, victim, timeout_s=90)


def test_a_program_failing_on_healthy_nodes_is_not_retried(devcluster, tmp_path):
    with staged_nvidia_smi(devcluster, {node: HEALTHY_NVLINK for node in NODES}):
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--retries", "1",
                        "--", "false")
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        record = wait_for_job(devcluster, job_id, timeout_s=180)
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert record["JobState"] == "FAILED", output
    retry = json.loads((tmp_path / f"trainctl-gate-{job_id}" / "retry.json").read_text())
    assert not retry["retry"] and retry["successor"] is None and retry["bad_nodes"] == {}, retry
    assert "on healthy nodes" in retry["reason"]  # srun: 1 from false, or 143 for the rank it ended
    assert "not retried" in output
    assert not [d for d in tmp_path.iterdir() if d.name.startswith("trainctl-gate-") and d.name != f"trainctl-gate-{job_id}"]


def test_too_few_healthy_nodes_in_the_gate_submit_a_successor_without_them(devcluster, tmp_path):
    """node1 and node2 replay an NVLink fault; Slurm gives an idle cluster's lowest nodes first."""
    recordings = {node: INACTIVE_LINKS if node in ("node1", "node2") else HEALTHY_NVLINK for node in NODES}
    with staged_nvidia_smi(devcluster, recordings):
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--retries", "1",
                        "--", TRAIN, "--steps", "3")
        assert result.returncode == 0, result.stderr
        first = result.stdout.strip().splitlines()[-1]
        record = wait_for_job(devcluster, first, timeout_s=180)
        output = (tmp_path / f"slurm-{first}.out").read_text()
        assert record["JobState"] == "FAILED" and record["NodeList"] == "node[1-2]", output
        retry = json.loads((tmp_path / f"trainctl-gate-{first}" / "retry.json").read_text())
        assert retry["phase"] == "gate" and retry["retry"] and retry["exclude"] == ["node1", "node2"], retry
        assert "nvlink.links" in retry["bad_nodes"]["node1"]
        record2 = wait_for_job(devcluster, retry["successor"], timeout_s=240)
    output2 = (tmp_path / f"slurm-{retry['successor']}.out").read_text()
    assert record2["JobState"] == "COMPLETED", output2
    assert running_on(output2) == ["node3", "node4"]
    report = (tmp_path / f"trainctl-gate-{first}" / "report.txt").read_text()
    assert f"retry: attempt 1 of 2 (job {first}): the gate found too few healthy nodes" in report
