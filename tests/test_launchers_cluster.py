"""A torchrun command line given to `trainctl submit` on the real cluster: translated, not run, so
pytorch/examples' DDP tutorial program (unmodified but for CPU) completes on trainctl's 2 ranks
where torchrun under each rank would wait for a rendezvous that never completes."""

from __future__ import annotations

import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest

from support.replay import LIBRARY, write_replay
from support.sites import site_variant
from support.slurm_jobs import TRAINCTL, job_output, wait_for_job

pytestmark = pytest.mark.cluster

PROGRAMS = Path(__file__).resolve().parents[1] / "examples" / "frameworks"
NODES = ("node1", "node2", "node3", "node4")
# what the gate reads on every node: a healthy node's kernel log and NVLink counters
CLEAN_DMESG = LIBRARY / "kernel" / "syslog" / "imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"


def test_a_torchrun_command_line_runs_the_program_on_trainctls_ranks(devcluster, tmp_path):
    site = site_variant(tmp_path, "local-demo", {
        "gate.fabric_sizes": ["1M"], "gate.fabric_iters": 3, "gate.fabric_passes": 2})
    # as a user's shell submits: without the tests' PYTHONSAFEPATH (the program imports its datautils.py)
    env = {name: value for name, value in devcluster.client_env().items() if name != "PYTHONSAFEPATH"}
    with ExitStack() as undo:
        for node in NODES:
            for made in (write_replay(devcluster.node_bin_dir(node), "dmesg", {"-T": CLEAN_DMESG}),
                         write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})):
                undo.callback(made.unlink, missing_ok=True)
        result = subprocess.run(
            [TRAINCTL, "submit", "--site", str(site), "--nodes", "2", "--", "torchrun", "--nproc_per_node=1",
             "--rdzv-backend=c10d", "--rdzv-endpoint=node1:29400", str(PROGRAMS / "ddp_tutorial" / "multinode.py"),
             "20", "5"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "torchrun translated" in result.stderr and "--rdzv-endpoint=node1:29400" in result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        record = wait_for_job(devcluster, job_id, timeout_s=300)
    output = job_output(tmp_path, job_id)
    assert record["JobState"] == "COMPLETED", output
    assert "[GPU1] Epoch 19" in output and "Epoch 15 | Training snapshot saved" in output
