"""Steps seen without code, on the real cluster: a plain DDP program that knows nothing of
trainctl (no `trainctl.progress`), submitted as it is, reports its optimizer steps to the watch,
and an evaluation phase much longer than the site's hang floor in the middle of its run is
neither a hang nor a slowdown: the job completes on its nodes, with no detection.

local-demo's hang floor is 20 s; the evaluation lasts EVAL_S (45 s, more than twice the floor,
unless TRAINCTL_AUTOSTEP_EVAL_S says otherwise, e.g. 180 for three minutes), every rank running
forward passes under no_grad, then a barrier. About 2 minutes in all on an idle machine.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import pytest

from support.replay import write_replay
from support.slurm_jobs import job_output, submit, wait_for_job
from trainctl.job.jobdir import parse_journal

pytestmark = pytest.mark.cluster

LIBRARY = Path(__file__).resolve().parent / "fixtures" / "library"
CLEAN_DMESG = LIBRARY / "kernel" / "syslog" / "imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
EVAL_S = float(os.environ.get("TRAINCTL_AUTOSTEP_EVAL_S", "45"))
HANG_FLOOR_S = 20.0      # local-demo's watch.hang_floor_s

# As PyTorch's DDP tutorial writes one (env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
# on CPU with gloo, with an evaluation phase between two training phases.
PROGRAM = """
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps, eval_s = int(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def train():
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        time.sleep(0.1)


train()
model.eval()
batches, end = 0, time.monotonic() + eval_s
with torch.no_grad():
    while time.monotonic() < end:
        model.module(torch.randn(256, 32)).sum()
        batches += 1
dist.barrier()
model.train()
train()
print(f"rank {dist.get_rank()}: evaluated {batches} batches in {eval_s:.0f} s", flush=True)
dist.destroy_process_group()
"""


def test_a_long_evaluation_in_an_unmodified_program_is_neither_a_hang_nor_a_slowdown(devcluster, tmp_path):
    assert EVAL_S >= 2 * HANG_FLOOR_S
    program = tmp_path / "train_plain.py"
    program.write_text(PROGRAM)
    with ExitStack() as undo:
        for node in ("node1", "node2", "node3", "node4"):
            for made in (write_replay(devcluster.node_bin_dir(node), "dmesg", {"-T": CLEAN_DMESG}),
                         write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})):
                undo.callback(made.unlink, missing_ok=True)
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--",
                        str(program), "100", str(EVAL_S))
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        record = wait_for_job(devcluster, job_id, timeout_s=EVAL_S + 420)
    events = parse_journal((tmp_path / f"trainctl-gate-{job_id}" / "journal.jsonl").read_text())
    output = job_output(tmp_path, job_id)
    assert record["JobState"] == "COMPLETED", output
    assert any(e["event"] == "first_step" for e in events), events      # the optimizer's steps were seen
    assert [e for e in events if e["event"] == "detection"] == [], events
    assert output.count(f"in {EVAL_S:.0f} s") == 2, output                # both ranks evaluated, to the end
