"""The gate on the real dev cluster with the gray-failure checks: a GPU already taken, the odd node out."""

import sys
from pathlib import Path

import pytest

from support.replay import RECORDED, LIBRARY, write_replay
from support.sweeps import DEMO_SITE, _set
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
GRAY = RECORDED / "h100-vm-2026-11-23-gray"
APPS = "--query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv"


def gate_site(path: Path, odd_node_out: str) -> Path:
    text = _set(DEMO_SITE.read_text(), "gate", {"checks": '["gpu.processes", "node.versions", "host.memory"]'})
    path.write_text(text.replace("\n[sweep]", f'\nodd_node_out = "{odd_node_out}"\n\n[sweep]', 1))
    return path


@pytest.mark.cluster
def test_gate_leaves_out_a_taken_gpu_and_names_the_odd_node(devcluster, tmp_path):
    """node2's nvidia-smi replays the H100 recorded while a process held it; node3's replays an
    A100 with driver 535 / CUDA 12.2 where the others show the H100's 580 / 13.0."""
    made = []
    for node in ("node1", "node2", "node3", "node4"):
        query = LIBRARY / "nvidia-smi/query/a100-sxm4-80gb-1gpu-q-x-v12.xml" if node == "node3" \
            else GRAY / "nvidia-smi-q.xml"
        apps = GRAY / ("nvidia-smi-compute-apps.csv" if node == "node2" else "nvidia-smi-compute-apps-idle.csv")
        made.append(write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"-q -x": query, APPS: apps}))
    gate_dir = tmp_path / "gate"
    warn_site = gate_site(tmp_path / "warn.toml", "warn")
    try:
        step = run(["srun", "-N4", "--ntasks-per-node=1", TRAINCTL, "gate", "node", "--site", str(warn_site),
                    "--dir", str(gate_dir)], timeout=180, env=devcluster.client_env())
        assert step.returncode == 0, step.stderr[-3000:]
    finally:
        for script in made:
            script.unlink()

    def decide(site: Path):
        out = run([TRAINCTL, "gate", "decide", "--site", str(site), "--dir", str(gate_dir), "--nodes", "2",
                   "--allocated", "node[1-4]"], timeout=60, env=devcluster.client_env())
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()[0], (gate_dir / "report.txt").read_text()

    chosen, report = decide(warn_site)
    # node3 only warns, so any two of node1, node3, node4 may be chosen: the fastest the fabric
    # test measured, which on shared cores is noise
    assert chosen in ("node[1,3]", "node[1,4]", "node[3-4]")
    assert "excluded node3" not in report
    assert ("excluded node2:\n  - gpu.processes: 1 process(es) already on the GPUs: GPU 0: pid 587 python3, "
            "1542 MiB") in report
    assert "warning: node3 node.versions: odd node out: driver 535.54.03, while 3 of 4 nodes have 580.159.04" in report
    chosen, report = decide(gate_site(tmp_path / "fail.toml", "fail"))
    assert chosen == "node[1,4]"
    assert "excluded node3:\n  - node.versions: odd node out: cuda 12.2, while 3 of 4 nodes have 13.0" in report
