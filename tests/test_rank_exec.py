"""`trainctl rank-exec`: Slurm task -> torch.distributed rank, binding from topology, then exec."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.errors import UsageError
from trainctl.launcher.rank_exec import (distributed_environment, hca_port_for, placement_from_slurm,
                                        program_argv, tasks_on_node)
from trainctl.proc import run
from trainctl.slurm import job_port

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
TOPO_DIR = REPO.parent / "shared" / "fixtures" / "nvidia-smi" / "topo"
H200_TOPO = TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"

# What the program sees: its environment, CPU affinity and argv.
PROBE = ("import json, os, sys; print(json.dumps({'env': dict(os.environ), "
         "'cpus': sorted(os.sched_getaffinity(0)), 'argv': sys.argv[1:]}))")


def slurm_task(rank: int, local: int, node: int, world: int, layout: str, job: str = "1234") -> dict:
    return {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
            "SLURM_STEP_NUM_TASKS": str(world), "SLURM_STEP_TASKS_PER_NODE": layout, "SLURM_JOB_ID": job,
            "SLURMD_NODENAME": "gpu07"}


def test_placement_from_a_two_node_step():
    placement = placement_from_slurm(slurm_task(rank=13, local=5, node=1, world=16, layout="8(x2)"))
    assert (placement.rank, placement.local_rank, placement.world_size, placement.local_world_size,
            placement.node_rank) == (13, 5, 16, 8, 1)


def test_placement_falls_back_to_the_job_variables():
    env = {"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_NTASKS": "3",
           "SLURM_TASKS_PER_NODE": "1(x3)"}
    assert placement_from_slurm(env).world_size == 3


def test_outside_srun_is_a_clear_usage_error():
    with pytest.raises(UsageError, match="SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID is not set"):
        placement_from_slurm({})


@pytest.mark.parametrize("layout, node, tasks", [("8(x2),4", 0, 8), ("8(x2),4", 1, 8), ("8(x2),4", 2, 4),
                                                 ("1", 0, 1), ("2,3(x2),1", 3, 1)])
def test_tasks_on_node_reads_slurms_compressed_layout(layout, node, tasks):
    assert tasks_on_node(layout, node) == tasks


@pytest.mark.parametrize("layout, node", [("8(x2)", 2), ("eight", 0), ("8(x)", 0)])
def test_tasks_on_node_refuses_what_it_cannot_read(layout, node):
    with pytest.raises(UsageError):
        tasks_on_node(layout, node)


def test_distributed_environment_is_what_torchrun_sets():
    placement = placement_from_slurm(slurm_task(rank=9, local=1, node=4, world=10, layout="2(x5)"))
    assert distributed_environment(placement, "10.0.0.5", 20469) == {
        "RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "10", "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "4",
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "20469"}


def test_master_port_is_the_jobs_port_and_not_the_fabric_tests():
    ports = {job_port({"SLURM_JOB_ID": str(job)}, offset=0) for job in range(20000)}
    assert all(20000 <= port < 30000 for port in ports)
    for job in (1, 4999, 5000, 123456):
        env = {"SLURM_JOB_ID": str(job)}
        assert job_port(env, offset=0) != job_port(env, offset=1)


def test_nic_port_matches_exactly_not_by_prefix():
    ports = ("mlx5_1:1", "mlx5_10:1", "mlx5_11:1")
    assert hca_port_for("mlx5_10", ports) == "=mlx5_10:1"
    assert hca_port_for("mlx5_1", ports) == "=mlx5_1:1"
    assert hca_port_for("mlx5_7", ports) == "=mlx5_7"


def test_memory_binding_wraps_the_program_only_when_it_can():
    program = ("python", "train.py", "--x")
    assert program_argv(program, 1, "/usr/bin/numactl") == ["/usr/bin/numactl", "--membind=1", "--", *program]
    assert program_argv(program, None, "/usr/bin/numactl") == list(program)
    assert program_argv(program, 1, None) == list(program)


def rank_exec(tmp_path: Path, task: dict, *extra: str, site: str = "dgx-h100",
              program=(sys.executable, "-c", PROBE), path_prefix: Path | None = None):
    env = dict(os.environ, **task)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    return subprocess.run([TRAINCTL, "rank-exec", "--site", site, "--master-addr", "10.1.2.3", *extra, "--",
                           *program], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)


def gate_dir_with_topo(tmp_path: Path, node: str, topo: Path) -> Path:
    snapshot = tmp_path / "gate" / "snapshots" / node
    snapshot.mkdir(parents=True)
    (snapshot / "nvidia-smi-topo-m.txt").write_text(topo.read_text())
    return tmp_path / "gate"


def test_rank_gets_its_gpus_nearest_hca_from_the_gates_snapshot(tmp_path):
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    result = rank_exec(tmp_path, slurm_task(rank=13, local=5, node=1, world=16, layout="8(x2)"),
                       "--gate-dir", str(gate))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert {k: seen["env"][k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                        "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "NODE_RANK": "1",
        "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": str(job_port({"SLURM_JOB_ID": "1234"}))}
    assert seen["env"]["NCCL_IB_HCA"] == "=mlx5_9:1"  # GPU5's PXB port on the DGX layout
    assert result.stderr == ""  # only local rank 0 speaks


def test_local_rank_0_describes_the_nodes_binding_once(tmp_path):
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    result = rank_exec(tmp_path, slurm_task(rank=8, local=0, node=1, world=16, layout="8(x2)"),
                       "--gate-dir", str(gate))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("trainctl rank-exec: gpu07: local ranks 0: GPU 0 CPUs 0-13,112-125 NUMA 0 "
                               "NIC mlx5_0; 1: GPU 1 CPUs 14-27,126-139 NUMA 0 NIC mlx5_3;")
    assert "the gate's snapshot" in lines[0]
    assert json.loads(result.stdout)["env"]["NCCL_IB_HCA"] == "=mlx5_0:1"


def test_cpu_affinity_is_the_bindings_cpus_that_slurm_allows(tmp_path):
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    allowed = os.sched_getaffinity(0)
    for local, wanted in ((0, {*range(0, 14), *range(112, 126)}), (4, {*range(56, 70), *range(168, 182)})):
        result = rank_exec(tmp_path, slurm_task(rank=local, local=local, node=0, world=8, layout="8"),
                           "--gate-dir", str(gate))
        assert result.returncode == 0, result.stderr
        expected = (wanted & allowed) or allowed   # nothing usable: left as Slurm set it
        assert set(json.loads(result.stdout)["cpus"]) == expected


def test_memory_is_bound_with_numactl_when_present(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    numactl = fake_bin / "numactl"  # records its arguments, then runs the program as numactl would
    numactl.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/numactl.args\nshift 2\nexec "$@"\n')
    numactl.chmod(0o755)
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    result = rank_exec(tmp_path, slurm_task(rank=0, local=0, node=0, world=8, layout="8"),
                       "--gate-dir", str(gate), path_prefix=fake_bin)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "numactl.args").read_text().split()[:2] == ["--membind=0", "--"]


def test_without_numactl_it_says_so_once_and_still_runs(tmp_path):
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    task = slurm_task(rank=0, local=0, node=0, world=8, layout="8")
    env_path = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "numactl").exists())
    result = subprocess.run([TRAINCTL, "rank-exec", "--site", "dgx-h100", "--master-addr", "h", "--gate-dir",
                             str(gate), "--", sys.executable, "-c", "print('ran')"], capture_output=True,
                            text=True, env=dict(os.environ, **task, PATH=env_path), timeout=60)
    assert result.stdout == "ran\n"
    assert result.stderr.count("numactl not found") == 1


def test_no_topology_means_no_binding_and_says_why(tmp_path):
    result = rank_exec(tmp_path, slurm_task(rank=0, local=0, node=0, world=1, layout="1"), site="local-demo",
                       path_prefix=tmp_path)  # no gate dir, and no nvidia-smi on this machine
    assert result.returncode == 0, result.stderr
    assert "ranks run unbound: no nvidia-smi on PATH and no gate snapshot" in result.stderr
    assert "NCCL_IB_HCA" not in json.loads(result.stdout)["env"]


def test_no_bind_skips_the_topology(tmp_path):
    result = rank_exec(tmp_path, slurm_task(rank=0, local=0, node=0, world=1, layout="1"), "--no-bind",
                       site="local-demo")
    assert result.returncode == 0, result.stderr
    assert "no binding (--no-bind" in result.stderr


def test_program_args_pass_through_untouched(tmp_path):
    args = ["--lr", "0.1", "$(touch x)", "a b", "line\nbreak", "--site", "--"]
    result = rank_exec(tmp_path, slurm_task(rank=0, local=0, node=0, world=1, layout="1"), "--no-bind",
                       site="local-demo", program=(sys.executable, "-c", PROBE, *args))
    assert json.loads(result.stdout)["argv"] == args
    assert not (tmp_path / "x").exists()


def test_a_missing_program_is_one_line_and_exit_2(tmp_path):
    result = rank_exec(tmp_path, slurm_task(rank=0, local=0, node=0, world=1, layout="1"), "--no-bind",
                       site="local-demo", program=("no-such-program-xyz",))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "trainctl: error: cannot run 'no-such-program-xyz': No such file or directory")


def test_outside_srun_rank_exec_fails_clearly(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    result = subprocess.run([TRAINCTL, "rank-exec", "--site", "local-demo", "--master-addr", "h", "--",
                             "true"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "runs as an srun task" in result.stderr


@pytest.mark.cluster
def test_train_ddp_runs_under_plain_srun_and_rank_exec(devcluster, tmp_path):
    """2 nodes x 2 ranks of examples/train_ddp.py, wired up by rank-exec alone (no gate)."""
    master = devcluster.spec.address("node1")
    argv = ["srun", "--nodelist=node1,node2", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
            "--kill-on-bad-exit=1", TRAINCTL, "rank-exec", "--site", "local-demo", "--master-addr", master,
            "--", sys.executable, str(REPO / "examples" / "train_ddp.py"), "--steps", "3"]
    env = dict(devcluster.client_env(), GLOO_SOCKET_IFNAME="eth0")
    result = run(argv, timeout=180, env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(" on ")[0] for line in lines] == [
        "rank 0/4 (local 0)", "rank 1/4 (local 1)", "rank 2/4 (local 0)", "rank 3/4 (local 1)"]
    assert all("parameters agree" in line for line in lines)
    assert {line.split(" on ")[1].split(":")[0] for line in lines} == {"node1", "node2"}
    assert len({line.split("(sum ")[1] for line in lines}) == 1


@pytest.mark.cluster
def test_train_ddp_fails_when_ranks_disagree(devcluster, tmp_path):
    master = devcluster.spec.address("node1")
    argv = ["srun", "--nodelist=node1,node2", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
            TRAINCTL, "rank-exec", "--site", "local-demo", "--master-addr", master,
            "--", sys.executable, str(REPO / "examples" / "train_ddp.py"), "--steps", "2",
            "--desync-rank", "1"]
    env = dict(devcluster.client_env(), GLOO_SOCKET_IFNAME="eth0")
    result = run(argv, timeout=180, env=env, cwd=str(tmp_path))
    assert result.returncode != 0
    assert result.stdout.count("parameters DIFFER") == 2


def test_topology_from_the_gate_snapshot_unless_the_gate_probe_failed(tmp_path):
    from trainctl.launcher.rank_exec import read_topology

    snap = tmp_path / "snapshots" / "node1"
    snap.mkdir(parents=True)
    topo = Path(__file__).parent / "fixtures/recorded/h100-vm-2026-11-22/nvidia-smi-topo-m.txt"
    (snap / "nvidia-smi-topo-m.txt").write_bytes(topo.read_bytes())
    text, source = read_topology(str(tmp_path), ["node1"], "nvidia-smi-not-installed", 5)
    assert text == topo.read_text() and source.startswith("the gate's snapshot")
    # the probe ran but failed: its (empty) output is kept, and meta.json says why
    (snap / "nvidia-smi-topo-m.txt").write_text("")
    (snap / "meta.json").write_text(json.dumps({"probes": {"nvidia-smi-topo-m.txt": {
        "error": "nvidia-smi exited with status 9: NVIDIA-SMI has failed"}}}))
    text, reason = read_topology(str(tmp_path), ["node1"], "nvidia-smi-not-installed", 5)
    assert text is None
    assert reason == ("`nvidia-smi topo -m` failed when the gate ran it: "
                      "nvidia-smi exited with status 9: NVIDIA-SMI has failed")
