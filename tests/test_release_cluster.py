"""Release what the job does not use, on the real cluster: after `gate decide` the job script
shrinks the allocation to the chosen nodes (`scontrol update NodeList=`), so while the program
runs Slurm shows the job on those nodes only and the others idle."""

import re

import pytest

from support.slurm_jobs import submit, wait_for_job
from test_e2e import node2_nvlink_fault_and_node3_straggler

pytestmark = pytest.mark.cluster

# Run by every rank during the training step: wait (up to 60 s) until node2 and node3 show idle,
# then rank 0 records what Slurm shows about the job and the nodes.
RECORDING_PROGRAM = r"""#!/bin/sh
out=$1
for _ in $(seq 120); do
    if [ "$(sinfo -h -N -o '%N %t' | grep -cE '^node[23] idle$')" = 2 ]; then break; fi
    sleep 0.5
done
if [ "$RANK" = 0 ]; then
    scontrol show job "$SLURM_JOB_ID" > "$out/job.txt"
    sinfo -h -N -o '%N %t' > "$out/sinfo.txt"
    squeue -h --steps --jobs "$SLURM_JOB_ID" -o '%j %N' > "$out/steps.txt"
fi
"""


def test_the_nodes_the_gate_left_out_are_idle_while_the_job_runs(devcluster, tmp_path):
    program = tmp_path / "record.sh"
    program.write_text(RECORDING_PROGRAM)
    program.chmod(0o755)
    with node2_nvlink_fault_and_node3_straggler(devcluster):  # the gate chooses node1 and node4
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--spare", "2",
                        "--", str(program), str(tmp_path))
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        record = wait_for_job(devcluster, job_id, timeout_s=240)
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert record["JobState"] == "COMPLETED", output
    assert "trainctl: released the nodes the job does not use; it now holds node[1,4]" in output
    assert "trainctl: warning" not in output  # the resize was not refused

    job = (tmp_path / "job.txt").read_text()  # `scontrol show job` during the training step
    assert re.search(r"(?<![A-Za-z])NodeList=(\S+)", job).group(1) == "node[1,4]", job
    assert re.search(r"NumNodes=(\d+)", job).group(1) == "2", job
    states = dict(line.split() for line in (tmp_path / "sinfo.txt").read_text().splitlines())
    assert states["node2"] == states["node3"] == "idle", states
    assert states["node1"] in ("alloc", "mix") and states["node4"] in ("alloc", "mix"), states
    # the sentinel ran on node2: it was cancelled before the release and started on node4
    steps = (tmp_path / "steps.txt").read_text().splitlines()
    assert [line for line in steps if line.startswith("trainctl-sentinel ")] == ["trainctl-sentinel node4"], steps
    gate_dir = tmp_path / f"trainctl-gate-{job_id}"
    assert (gate_dir / f"slurm_job_{job_id}_resize.sh").exists()
    assert not (tmp_path / f"slurm_job_{job_id}_resize.sh").exists()
