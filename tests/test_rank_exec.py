"""`trainctl rank-exec`: Slurm task -> torch.distributed rank, binding from topology, then exec."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainctl.agent_socket import agent_socket_path
from trainctl.errors import UsageError
from trainctl.launcher.rank_exec import (BOOTSTRAP_DIR, auto_steps_environment, distributed_environment,
                                        placement_from_slurm, program_argv, tasks_on_node)
from trainctl.proc import run
from trainctl.slurm import job_port

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
TOPO_DIR = REPO / "tests/fixtures/library/nvidia-smi/topo"
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


DGX_HCAS = "=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_9:1,mlx5_10:1,mlx5_11:1"   # dgx-h100's list


def gate_dir_with_topo(tmp_path: Path, node: str, topo: Path, smt_offset: int | None = 112) -> Path:
    """A gate directory holding `topo` and, unless `smt_offset` is None, a sysfs copy of CPU
    siblings in which CPU n and n + smt_offset share a core. No real sibling dump of an H200
    node exists among the fixtures; the H200 recording's affinity `0-55,112-167` is that of a
    2 x 56-core machine with SMT, numbered the way Linux numbers Intel threads."""
    snapshot = tmp_path / "gate" / "snapshots" / node
    snapshot.mkdir(parents=True)
    (snapshot / "nvidia-smi-topo-m.txt").write_text(topo.read_text())
    if smt_offset is not None:
        for cpu in range(2 * smt_offset):
            core = sorted({cpu % smt_offset, cpu % smt_offset + smt_offset})
            topology = snapshot / f"sys/devices/system/cpu/cpu{cpu}/topology"
            topology.mkdir(parents=True)
            (topology / "thread_siblings_list").write_text(f"{core[0]},{core[1]}\n")
    return tmp_path / "gate"


def test_rank_gets_the_nodes_hca_list_not_its_nearest_port(tmp_path):
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    result = rank_exec(tmp_path, slurm_task(rank=13, local=5, node=1, world=16, layout="8(x2)"),
                       "--gate-dir", str(gate))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert {k: seen["env"][k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                        "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "NODE_RANK": "1",
        "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": str(job_port({"SLURM_JOB_ID": "1234"}))}
    assert seen["env"]["NCCL_IB_HCA"] == DGX_HCAS  # not GPU5's nearest port alone (NVIDIA/nccl#1478)
    assert result.stderr == ""  # only local rank 0 speaks


def test_local_rank_0_describes_the_nodes_binding_once(tmp_path):
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    result = rank_exec(tmp_path, slurm_task(rank=8, local=0, node=1, world=16, layout="8(x2)"),
                       "--gate-dir", str(gate))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("trainctl rank-exec: gpu07: local ranks 0: GPU 0 CPUs 0-13,112-125 NUMA 0 "
                               "nearest NIC mlx5_0; 1: GPU 1 CPUs 14-27,126-139 NUMA 0 nearest NIC mlx5_3;")
    assert f"; every rank NCCL_IB_HCA={DGX_HCAS} (topology from the gate's snapshot" in lines[0]
    assert "CPU cores from the gate's snapshot" in lines[0]
    assert json.loads(result.stdout)["env"]["NCCL_IB_HCA"] == DGX_HCAS


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
    from trainctl.launcher.rank_exec import gate_snapshot, read_topology

    snap = tmp_path / "snapshots" / "node1"
    snap.mkdir(parents=True)
    topo = Path(__file__).parent / "fixtures/recorded/h100-vm-2026-11-22/nvidia-smi-topo-m.txt"
    (snap / "nvidia-smi-topo-m.txt").write_bytes(topo.read_bytes())
    text, source = read_topology(gate_snapshot(str(tmp_path), ["node1"])[0], "nvidia-smi-not-installed", 5)
    assert text == topo.read_text() and source.startswith("the gate's snapshot")
    # the probe ran but failed: its (empty) output is kept, and meta.json says why
    (snap / "nvidia-smi-topo-m.txt").write_text("")
    (snap / "meta.json").write_text(json.dumps({"probes": {"nvidia-smi-topo-m.txt": {
        "command": ["nvidia-smi", "topo", "-m"], "exit_code": 9, "duration_s": 0.2, "timed_out": False,
        "error": "nvidia-smi exited with status 9: NVIDIA-SMI has failed"}}}))
    text, reason = read_topology(gate_snapshot(str(tmp_path), ["node1"])[0], "nvidia-smi-not-installed", 5)
    assert text is None
    assert reason == ("`nvidia-smi topo -m` failed when the gate ran it: "
                      "nvidia-smi exited with status 9: NVIDIA-SMI has failed")


# --- NCCL_IB_HCA: one list per node --------------------------------------------------------

EIGHT_GPU_TOPOLOGIES = ["dgx-a100-8gpu-12nic-nv12.txt", "dgx1-v100-8gpu-4nic-topo-mp-pcie-only.txt",
                        "h100-8gpu-nv18-no-nic-spaces-no-legend.txt", "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"]
ROCE_SOME_DOWN = REPO / "tests/fixtures/library/infiniband/ibstat/gpud-h100-12hca-roce-eth-400-some-down-disabled.txt"


def node_environments(topo: Path, site: str, up_ports=None, part_changes=None) -> list[dict]:
    """The environment of each local rank 0..7 of one node, as rank-exec computes it."""
    import dataclasses

    from trainctl.launcher.rank_exec import plan_node, rank_environment
    from trainctl.site import load_site, partition

    part = partition(load_site(site).config, None)[1]
    part = dataclasses.replace(part, **(part_changes or {}))
    setup = plan_node(topo.read_text(), "test", 8, part, None, None, "-", up_ports)
    assert setup.why_unbound is None
    return [rank_environment({"SLURM_JOB_ID": "7"}, placement_from_slurm(slurm_task(local, local, 0, 8, "8")),
                             "h", setup) for local in range(8)]


@pytest.mark.parametrize("topo", EIGHT_GPU_TOPOLOGIES)
@pytest.mark.parametrize("site", ["dgx-h100", "a100-roce"])
def test_every_local_rank_of_a_node_gets_the_same_hca_list(topo, site):
    from trainctl.site import load_site

    environments = node_environments(TOPO_DIR / topo, site)
    lists = {env["NCCL_IB_HCA"] for env in environments}
    site_ports = load_site(site).config.partitions[load_site(site).config.default_partition].hca_ports
    assert lists == {"=" + ",".join(site_ports)}
    assert [env["LOCAL_RANK"] for env in environments] == [str(i) for i in range(8)]


def test_drop_port_leaves_the_down_ports_out_for_every_rank_of_the_node():
    from trainctl.health.snapshot import SnapshotInputs, load_snapshot
    from trainctl.launcher.rank_exec import read_up_ports

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:   # a gate snapshot holding the node's ibstat
        (Path(tmp) / "ibstat.txt").write_text(ROCE_SOME_DOWN.read_text())
        up = read_up_ports(SnapshotInputs(load_snapshot(tmp)))
    assert ("mlx5_5", 1) not in up and ("mlx5_0", 1) in up
    dropped = node_environments(H200_TOPO, "dgx-h100", up, {"hca_port_down": "drop-port"})
    assert {env["NCCL_IB_HCA"] for env in dropped} == {"=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_6:1,mlx5_9:1,mlx5_10:1"}
    # exclude-node (the default): the gate leaves such a node out; the list stays the site's
    kept = node_environments(H200_TOPO, "dgx-h100", up)
    assert {env["NCCL_IB_HCA"] for env in kept} == {DGX_HCAS}


def test_rank_exec_names_the_dropped_ports_in_the_binding_line(tmp_path):
    site = tmp_path / "drop.toml"
    sample = (REPO / "site-configs" / "dgx-h100.toml").read_text()
    assert 'hca_port_down = "exclude-node"' in sample
    site.write_text(sample.replace('hca_port_down = "exclude-node"', 'hca_port_down = "drop-port"'))
    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    (gate / "snapshots" / "gpu07" / "ibstat.txt").write_text(ROCE_SOME_DOWN.read_text())
    result = rank_exec(tmp_path, slurm_task(rank=0, local=0, node=0, world=8, layout="8"), "--gate-dir", str(gate),
                       site=str(site))
    assert result.returncode == 0, result.stderr
    assert "(mlx5_5:1, mlx5_11:1 down, left out: hca_port_down = drop-port)" in result.stderr
    assert json.loads(result.stdout)["env"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_3:1,mlx5_4:1,mlx5_6:1,mlx5_9:1,mlx5_10:1"


def test_cores_come_from_the_gates_snapshot_then_its_lscpu_then_live_sysfs(tmp_path):
    from trainctl.health.snapshot import SnapshotInputs, load_snapshot
    from trainctl.launcher.rank_exec import read_cores

    snapshot = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO) / "snapshots" / "gpu07"
    cores, source = read_cores(SnapshotInputs(load_snapshot(snapshot)), sysfs_root=str(tmp_path / "no-sysfs"))
    assert len(cores) == 112 and cores[0] == {0, 112} and source.startswith("the gate's snapshot")
    # a snapshot without the sysfs copy: its lscpu, where that shows the cores (SMT off here)
    della = REPO / "tests/fixtures/library/cpu/princeton-della-h100-node-xeon8468-2socket-nosmt-numa-even-odd-interleaved-lscpu.txt"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "lscpu.txt").write_text(della.read_text())
    cores, source = read_cores(SnapshotInputs(load_snapshot(bare)), sysfs_root=str(tmp_path / "no-sysfs"))
    assert len(cores) == 96 and source.startswith("lscpu in the gate's snapshot")
    # nothing anywhere: not measured, and the binding line says so
    cores, source = read_cores(None, sysfs_root=str(tmp_path / "no-sysfs"))
    assert cores is None and source.startswith("not measured")


def test_a_watched_step_gives_the_program_the_node_agents_socket(tmp_path):
    task = slurm_task(rank=0, local=0, node=0, world=1, layout="1", job="4321")
    watched = rank_exec(tmp_path, {**task, "TRAINCTL_WATCH_DIR": str(tmp_path / "watch"), "TMPDIR": str(tmp_path)},
                        "--no-bind", site="local-demo")
    assert watched.returncode == 0, watched.stderr
    assert json.loads(watched.stdout)["env"]["TRAINCTL_PROGRESS_SOCKET"] == \
        f"{tmp_path}/trainctl-{os.geteuid()}/progress-4321-gpu07.sock" == \
        agent_socket_path("4321", "gpu07", {"TMPDIR": str(tmp_path)})
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINCTL_WATCH_DIR", "TRAINCTL_PROGRESS_SOCKET")}
    unwatched = subprocess.run([TRAINCTL, "rank-exec", "--site", "local-demo", "--master-addr", "h", "--no-bind",
                                "--", sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                               env={**env, **task})
    assert unwatched.returncode == 0, unwatched.stderr
    assert "TRAINCTL_PROGRESS_SOCKET" not in json.loads(unwatched.stdout)["env"]


WATCHED = {"TRAINCTL_PROGRESS_SOCKET": "/tmp/p.sock"}


@pytest.mark.parametrize("environ, site_default, on", [
    ({}, True, True),
    ({"TRAINCTL_AUTO_STEPS": "0"}, True, False),
    ({"TRAINCTL_AUTO_STEPS": "off"}, True, False),
    ({}, False, False),
    ({"TRAINCTL_AUTO_STEPS": "1"}, False, True),
])
def test_a_watched_rank_gets_the_step_hook_unless_the_site_or_the_job_turns_it_off(environ, site_default, on):
    env = auto_steps_environment(environ, WATCHED, site_default)
    assert env == ({"PYTHONPATH": BOOTSTRAP_DIR} if on else {})
    assert auto_steps_environment(environ, {}, site_default) == {}    # not a watched step: nothing


def test_the_bootstrap_goes_first_on_the_programs_own_pythonpath():
    env = auto_steps_environment({"PYTHONPATH": "/my/lib"}, WATCHED, True)
    assert env == {"PYTHONPATH": f"{BOOTSTRAP_DIR}{os.pathsep}/my/lib"}


def test_a_watched_python_rank_starts_with_the_hook_and_a_sys_path_of_its_own(tmp_path):
    task = slurm_task(rank=0, local=0, node=0, world=1, layout="1", job="4321")
    probe = "import json, sys; print(json.dumps({'path': sys.path, 'torch': 'torch' in sys.modules}))"
    result = subprocess.run([TRAINCTL, "rank-exec", "--site", "local-demo", "--master-addr", "h", "--no-bind",
                             "--", sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **task, "TRAINCTL_WATCH_DIR": str(tmp_path), "PYTHONPATH": "/my/lib"})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert BOOTSTRAP_DIR not in seen["path"] and "/my/lib" in seen["path"]
    assert seen["torch"] is False     # nothing imports torch before the program does
