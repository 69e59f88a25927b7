"""The defaults keep the job going: with the shipped local-demo site, `--nodes 2 --spare 1` and
no --retries, a training node that hangs (SIGSTOP of every process in its namespace) is named by
the watch; the spare went back after the first gate and --min-nodes is 2, so the job goes on in
a successor that excludes the hung node and resumes from the checkpoint, unless the gate left the
batch host out of training: the job holds that node anyway (it runs the supervisor), so training
restarts on it inside the allocation. Either way the chain ends COMPLETED without that node.

Bound by counts and states (the checkpoint's step, the job's end), never by time. About 3 min
on the 2-core CI machine."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import pytest

from support.replay import write_replay
from support.slurm_jobs import job_output, journal, submit, wait_for_job, wait_until
from trainctl.devcluster import faults
from trainctl.slurm import expand_hostlist

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train_ddp.py")
LIBRARY = Path(__file__).resolve().parent / "fixtures" / "library"
NODES = ("node1", "node2", "node3", "node4")
# real recordings (tests/fixtures/library/SOURCES.md): a kernel log with no Xid line, healthy NVLinks
CLEAN_DMESG = LIBRARY / "kernel" / "syslog" / "imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
STEPS = 120


def checkpointed_step(gate_dir: Path) -> int:
    notes = [e.get("note", "") for e in journal(gate_dir) if e["event"] == "checkpoint"]
    return max((int(note.split()[1]) for note in notes if note.startswith("step ")), default=0)


def test_a_hung_node_with_the_sites_defaults_ends_in_a_completed_chain_without_it(devcluster, tmp_path):
    checkpoint = tmp_path / "ck.pt"
    victim = None
    with ExitStack() as undo:
        for node in NODES:
            for made in (write_replay(devcluster.node_bin_dir(node), "dmesg", {"-T": CLEAN_DMESG}),
                         write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})):
                undo.callback(made.unlink, missing_ok=True)
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--spare", "1", "--",
                        TRAIN, "--steps", str(STEPS), "--step-time", "0.25", "--checkpoint", str(checkpoint),
                        "--checkpoint-every", "10", "--timeout", "120")
        assert result.returncode == 0, result.stderr
        first = result.stdout.strip().splitlines()[-1]
        gate_dir = tmp_path / f"trainctl-gate-{first}"
        try:
            wait_until("the first checkpoint", lambda: checkpointed_step(gate_dir) >= 10, 240)
            events = journal(gate_dir)
            batch_host = next(e["batch_host"] for e in events if e["event"] == "job_start")
            training = next(e for e in events if e["event"] == "training_start")
            victim = next(n for n in expand_hostlist(training["nodes"]) if n != batch_host)
            with faults.stopped(devcluster, victim):
                record = wait_for_job(devcluster, first, timeout_s=400)
            faults.restore_node(devcluster, victim, timeout_s=120)
            events = journal(gate_dir)
            output = job_output(tmp_path, first)
            detections = [(e["kind"], e["suspects"]) for e in events if e["event"] == "detection"]
            assert detections == [("hung", [victim])], output
            if batch_host not in expand_hostlist(training["nodes"]):
                # the gate passed the batch host but did not choose it: the job holds it anyway (it
                # runs the supervisor), so it is the spare, and training restarts on it in the allocation
                restarted = [e for e in events if e["event"] == "training_start" and e.get("restart")]
                assert record["JobState"] == "COMPLETED", output
                assert len(restarted) == 1 and batch_host in expand_hostlist(restarted[0]["nodes"]), restarted
                assert victim not in expand_hostlist(restarted[0]["nodes"]), restarted
                finished = output
            else:
                # no spare left in the allocation and --min-nodes is 2: a successor without the hung node
                assert record["JobState"] != "COMPLETED", output
                retry = json.loads((gate_dir / "retry.json").read_text())
                assert retry["retry"] and retry["successor"] and victim in retry["exclude"], retry
                assert f"attempt 1 of 3 (job {first})" in output, output
                second = retry["successor"]
                record = wait_for_job(devcluster, second, timeout_s=400)
                finished = job_output(tmp_path, second)
                assert record["JobState"] == "COMPLETED", finished
                assert victim in expand_hostlist(record["ExcNodeList"]), record
                trained = [e for e in journal(tmp_path / f"trainctl-gate-{second}") if e["event"] == "training_start"]
                assert trained and all(victim not in expand_hostlist(e["nodes"]) for e in trained), trained
            assert "resumed from step" in finished and f"{STEPS} steps" in finished, finished
        finally:
            if victim:
                faults.restore_node(devcluster, victim, timeout_s=120)
