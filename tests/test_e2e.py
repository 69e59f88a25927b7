"""End to end on the real cluster, nothing staged but the recorded nvidia-smi outputs:
`trainctl submit` -> sbatch -> the real gate on every node (node checks + fabric test) ->
`gate decide` -> examples/train_ddp.py (gloo DDP) on the healthy nodes only."""

from contextlib import contextmanager
from pathlib import Path

import pytest

from support.replay import LIBRARY, write_replay
from support.slurm_jobs import submit, wait_for_job

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train_ddp.py")
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
INACTIVE_LINKS = Path(__file__).parent / "health/fixtures/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt"
NODES = ("node1", "node2", "node3", "node4")


@contextmanager
def node2_nvlink_fault_and_node3_straggler(devcluster):
    """node2's nvidia-smi replays a V100 with two inactive NVLinks; node3's link runs at 1 Gbit/s."""
    made = [write_replay(devcluster.node_bin_dir(node), "nvidia-smi",
                         {"nvlink -s": INACTIVE_LINKS if node == "node2" else HEALTHY_NVLINK}) for node in NODES]
    devcluster.set_rate("node3", "1gbit")
    try:
        yield
    finally:
        devcluster.set_rate("node3", None)
        for script in made:
            script.unlink()


def finished_job(devcluster, tmp_path, result):
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().splitlines()[-1]
    record = wait_for_job(devcluster, job_id, timeout_s=240)
    gate_dir = tmp_path / f"trainctl-gate-{job_id}"
    # The job's output, then each rank's own file (the site's launch.rank_output).
    output = "".join(path.read_text() for path in [tmp_path / f"slurm-{job_id}.out",
                                                   *sorted(gate_dir.glob("rank-*.out"))])
    return record, output, gate_dir


def assert_ran_on_node1_and_node4(record, output, gate_dir):
    assert record["JobState"] == "COMPLETED", output
    ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert len(ranks) == 2 and all("parameters agree" in line for line in ranks), output
    assert [line.split(" on ")[1].split(":")[0] for line in ranks] == ["node1", "node4"]
    report = (gate_dir / "report.txt").read_text()
    assert "excluded node2:\n  - nvlink.links: GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive" in report
    assert "excluded node3:\n  - fabric: straggler" in report
    assert "job runs on: node1, node4" in report


def test_job_runs_on_the_healthy_nodes_and_the_report_names_the_others(devcluster, tmp_path):
    with node2_nvlink_fault_and_node3_straggler(devcluster):
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--spare", "2",
                        "--", TRAIN, "--steps", "3")
        record, output, gate_dir = finished_job(devcluster, tmp_path, result)
    assert_ran_on_node1_and_node4(record, output, gate_dir)


def test_the_same_through_a_real_sshd(devcluster, tmp_path):
    login = devcluster.start_sshd("node1")
    with node2_nvlink_fault_and_node3_straggler(devcluster):
        result = submit(devcluster, tmp_path, "--remote", f"{login.user}@{login.host}", "--identity",
                        login.key_path, "--known-hosts", login.known_hosts_path, "--chdir", str(tmp_path),
                        "--site", "local-demo", "--nodes", "2", "--spare", "2", "--", TRAIN, "--steps", "3")
        record, output, gate_dir = finished_job(devcluster, tmp_path, result)
    assert_ran_on_node1_and_node4(record, output, gate_dir)


def test_too_few_healthy_nodes_fail_with_the_gates_one_line(devcluster, tmp_path):
    with node2_nvlink_fault_and_node3_straggler(devcluster):
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "3", "--spare", "1",
                        "--", TRAIN, "--steps", "3")
        record, output, _ = finished_job(devcluster, tmp_path, result)
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "2:0"
    (line,) = [l for l in output.splitlines() if l.startswith("trainctl: error: only ")]
    assert line.startswith("trainctl: error: only 2 of 4 nodes healthy, need 3: node2 nvlink.links: GPU 3 "
                           "(Tesla V100-SXM2-32GB): NVLink 3, 5 inactive; node3 fabric: straggler")
    assert not any(l.startswith("rank ") for l in output.splitlines())
