"""The flight recorder variables the job script sets are the ones the installed torch reads.

A rank started with the job's variables under the installed torch (2.13, CPU) runs a gloo
process group. Gloo records into the same flight recorder as NCCL (the ring buffer's size comes
from the same list of names, TORCH_FR_BUFFER_SIZE first), so the rank shows both that torch
reads our buffer size (the recorder keeps exactly that many collectives) and that it prints no
deprecation warning. The dump-file prefix, dump-on-timeout and the dump pipe are read only by
the NCCL process group, which a CPU build lacks: their names are checked against PyTorch's
source in launcher/plan.py, not here.
"""

import json
import os
import subprocess
import sys

import pytest

from trainctl.launcher.plan import flight_recorder_environment

RANK = """
import json, sys
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace_json
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
for _ in range(5):
    dist.all_reduce(torch.ones(2))
print(json.dumps({"entries": len(json.loads(_dump_fr_trace_json()).get("entries", []))}))
dist.destroy_process_group()
"""


def run_rank(tmp_path, settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    # torch's own level for its C++ warnings, as a rank starts with it: importing the fabric test's
    # runner into this process (another test does) sets TORCH_CPP_LOG_LEVEL=ERROR, which hides them
    env["TORCH_CPP_LOG_LEVEL"] = "WARNING"
    env.update(settings)
    child = subprocess.run([sys.executable, "-c", RANK, str(tmp_path / "store")], env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.splitlines()[-1])["entries"], child.stderr


def job_environment(entries, gate_dir):
    """What the job script exports, with its gate-dir paths resolved."""
    return {s.name: (os.path.join(gate_dir, s.value) if s.in_gate_dir else s.value)
            for s in flight_recorder_environment(entries)}


@pytest.mark.parametrize("entries", [3, 0])
def test_a_rank_with_the_jobs_variables_keeps_that_many_collectives_and_warns_nothing(tmp_path, entries):
    kept, stderr = run_rank(tmp_path, job_environment(entries, str(tmp_path)))
    assert kept == entries
    assert "deprecated" not in stderr, stderr


def test_the_older_name_still_works_but_warns_which_the_check_above_would_see(tmp_path):
    kept, stderr = run_rank(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "3"})
    assert kept == 3
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated" in stderr
