"""Gated jobs that prove the dev cluster hides nothing: a command staged on one node is that
node's alone (also inside a batch job), and nodes whose hostnames differ from their Slurm
names (FQDN hostnames, `NodeHostname=`) are gated and run like any others."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest

from support.replay import LIBRARY, write_replay
from support.slurm_jobs import job_output, submit, wait_for_job
from trainctl.devcluster.cluster import ClusterSpec, DevCluster, spec_for_instance

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train_ddp.py")
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
INACTIVE_LINKS = Path(__file__).parent / "health/fixtures/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt"
NVLINK_FAULT = "nvlink.links: GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive"


@contextmanager
def staged_nvidia_smi(cluster: DevCluster, recordings: dict[str, Path]) -> Iterator[None]:
    """Stage `nvidia-smi nvlink -s` replays on the named nodes only."""
    made = [write_replay(cluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": recording})
            for node, recording in recordings.items()]
    try:
        yield
    finally:
        for script in made:
            script.unlink()


def gated_job(cluster: DevCluster, cwd: Path, *args: str) -> tuple[dict, str, Path]:
    """Submit examples/train_ddp.py through `trainctl submit`; (job record, output, gate dir)."""
    result = submit(cluster, cwd, "--site", "local-demo", *args, "--", TRAIN, "--steps", "3")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip().splitlines()[-1]
    record = wait_for_job(cluster, job_id, timeout_s=240)
    return record, job_output(cwd, job_id), cwd / f"trainctl-gate-{job_id}"


def rank_hosts(output: str) -> list[str]:
    """Hosts named by train_ddp.py's `rank i/N (local j) on HOST: ...` lines, in rank order."""
    ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert ranks and all("parameters agree" in line for line in ranks), output
    return [line.split(" on ")[1].split(":")[0] for line in ranks]


def excluded(report: str) -> dict[str, str]:
    """{node: its exclusion reasons} from report.txt's `excluded NODE:` blocks (a node that could
    not be checked is `excluded NODE (could not be checked: unknown):`)."""
    found: dict[str, str] = {}
    node = None
    for line in report.splitlines():
        if line.startswith("excluded ") and line.endswith(":"):
            node = line[len("excluded "):-1].split(" (")[0]
            found[node] = ""
        elif node and line.startswith("  - "):
            found[node] += line[4:] + "\n"
        else:
            node = None
    return found


def test_a_replay_staged_on_the_batch_host_fails_only_the_batch_host(devcluster, tmp_path):
    """node1 runs the batch script; before the fix its bin dir reached every node's PATH."""
    with staged_nvidia_smi(devcluster, {"node1": INACTIVE_LINKS, "node3": HEALTHY_NVLINK,
                                        "node4": HEALTHY_NVLINK}):
        record, output, gate_dir = gated_job(devcluster, tmp_path, "--nodes", "2", "--spare", "2")
    assert record["JobState"] == "COMPLETED", output
    assert rank_hosts(output) == ["node3", "node4"]
    report = (gate_dir / "report.txt").read_text()
    reasons = excluded(report)
    assert sorted(reasons) == ["node1", "node2"]
    assert "excluded node2 (could not be checked: unknown):" in report
    assert NVLINK_FAULT in reasons["node1"]
    # node2 has no nvidia-smi of its own: it cannot be judged, and it never sees node1's
    assert "NVLink" not in reasons["node2"] and "nvidia-smi" in reasons["node2"], reasons["node2"]


def fqdn_spec() -> ClusterSpec:
    """A small cluster beside this session's instance whose hosts are nodeN.cluster.test."""
    beside = spec_for_instance()
    return ClusterSpec(nodes=3, base_dir=f"{beside.base_dir}-fqdn",
                       subnet=f"10.79.{beside.subnet.split('.')[2]}", prefix=f"{beside.prefix}f",
                       slurmctld_port=beside.slurmctld_port + 4, gpus_per_node=2,
                       domain="cluster.test", slurm=beside.slurm)


@pytest.fixture(scope="module")
def fqdn_cluster() -> Iterator[DevCluster]:
    cluster = DevCluster(fqdn_spec())
    cluster.up(lock_wait_s=60)
    try:
        yield cluster
    finally:
        cluster.down()


def test_gated_job_on_fqdn_hosts_names_nodes_as_slurm_does(fqdn_cluster, tmp_path):
    with staged_nvidia_smi(fqdn_cluster, {"node1": HEALTHY_NVLINK, "node2": INACTIVE_LINKS,
                                          "node3": HEALTHY_NVLINK}):
        record, output, gate_dir = gated_job(fqdn_cluster, tmp_path, "--nodes", "2", "--spare", "1")
    assert record["JobState"] == "COMPLETED", output
    # the program sees its host's own name; everything trainctl files is under Slurm's
    assert rank_hosts(output) == ["node1.cluster.test", "node3.cluster.test"]
    assert sorted(p.name for p in (gate_dir / "nodes").glob("*.json")) == ["node1.json", "node2.json", "node3.json"]
    assert sorted(p.name for p in (gate_dir / "snapshots").iterdir()) == ["node1", "node2", "node3"]
    assert json.loads((gate_dir / "snapshots/node2/meta.json").read_text())["host"] == "node2"
    assert sorted(json.loads((gate_dir / "fabric.json").read_text())["nodes"]) == ["node1", "node2", "node3"]
    assert excluded((gate_dir / "report.txt").read_text()) == {"node2": NVLINK_FAULT + "\n"}
    assert "job runs on: node1, node3" in (gate_dir / "report.txt").read_text()
    # rank-exec found the gate's snapshot of its node under the Slurm name
    assert "node1: ranks run unbound: `nvidia-smi topo -m` failed when the gate ran it" in output, output


def test_sshd_on_fqdn_hosts(fqdn_cluster):
    endpoint = fqdn_cluster.start_sshd("node2")
    client = paramiko.SSHClient()
    client.load_host_keys(endpoint.known_hosts_path)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(endpoint.host, port=endpoint.port, username=endpoint.user,
                   key_filename=endpoint.key_path, look_for_keys=False, allow_agent=False, timeout=15)
    try:
        _, stdout, _ = client.exec_command("hostname; hostname -s; sinfo -h -N -o %N", timeout=30)
        output = stdout.read().decode().split()
    finally:
        client.close()
    assert output == ["node2.cluster.test", "node2", "node1", "node2", "node3"]
