"""A launcher on submit's command line: recognised, translated into what trainctl runs itself, or
refused in one line (`trainctl.launcher.launchers`), and what `trainctl submit` then does with it."""

from __future__ import annotations

import json

import pytest

from test_submit import TRAIN_DDP, plan, sbatch_ran, submit
from trainctl.errors import UsageError
from trainctl.launcher.launchers import (AGENT, BINDING, HOSTS, LAYOUT, LOCAL_RANK_ENV, OUTPUT, RENDEZVOUS, RESTARTS,
                                         SRUN, Dropped, Refusal, Translation, translate)
from trainctl.launcher.plan import SubmitRequest


def translated(command: str) -> Translation:
    result = translate(command.split())
    assert isinstance(result, Translation), result
    return result


def refused(command: str) -> str:
    result = translate(command.split())
    assert isinstance(result, Refusal), result
    return result.reason


# ---------------------------------------------------------------- what is a launcher

@pytest.mark.parametrize("command", [
    "train.py --nnodes 2", "torchrun_helper.py --nnodes 2 --nproc-per-node 8", "./torchrun.sh train.py",
    "python train.py", "python -m mypkg.torchrun", "python -c pass", "accelerate env", "deepspeed_prep.py x",
    "bin/run-deepspeed train.py"])
def test_a_program_that_only_looks_like_a_launcher_is_left_alone(command):
    assert translate(command.split()) is None


@pytest.mark.parametrize("command, launcher, program", [
    ("torchrun train.py --lr 1", "torchrun", ("train.py", "--lr", "1")),
    ("/opt/env/bin/torchrun train.py", "torchrun", ("train.py",)),
    ("python -m torch.distributed.run train.py a", "python -m torch.distributed.run", ("python", "train.py", "a")),
    ("/opt/env/bin/python3.12 -u -X faulthandler -m torch.distributed.run train.py",
     "python -m torch.distributed.run", ("/opt/env/bin/python3.12", "train.py")),
    ("python3 -mtorch.distributed.run train.py", "python -m torch.distributed.run", ("python3", "train.py")),
    ("accelerate launch train.py --lr 1", "accelerate launch", ("train.py", "--lr", "1")),
    ("accelerate-launch train.py", "accelerate-launch", ("train.py",)),
    ("python -m accelerate.commands.launch train.py", "python -m accelerate.commands.launch", ("python", "train.py")),
    ("deepspeed --no_local_rank train.py --deepspeed ds.json", "deepspeed", ("train.py", "--deepspeed", "ds.json")),
])
def test_each_launcher_becomes_the_program_it_runs_with_the_programs_own_arguments(command, launcher, program):
    result = translated(command)
    assert (result.launcher, result.program) == (launcher, program)


def test_a_module_runs_as_python_would_run_it():
    assert translated("torchrun -m pkg.train --epochs 3").program == ("-m", "pkg.train", "--epochs", "3")
    assert translated("accelerate launch -m pkg.train").program == ("-m", "pkg.train")
    assert translated("deepspeed --no_local_rank --module pkg.train").program == ("-m", "pkg.train")
    assert translated("python -m torch.distributed.run --module pkg.train x").program == (
        "python", "-m", "pkg.train", "x")


def test_the_launchers_options_end_at_the_script_and_the_rest_is_the_programs():
    result = translated("torchrun --nnodes 2 train.py --nnodes 5 --rdzv-backend c10d")
    assert result.program == ("train.py", "--nnodes", "5", "--rdzv-backend", "c10d") and result.nodes == 2
    assert translated("torchrun --standalone -- train.py").program == ("train.py",)


# ---------------------------------------------------------------- counts: carried as trainctl's own

@pytest.mark.parametrize("command", ["torchrun --nnodes 2 --nproc-per-node 4 t.py",
                                     "torchrun --nnodes=2 --nproc_per_node=4 t.py",
                                     "torchrun --nnod 2 --nproc 4 t.py"])   # argparse takes a unique prefix
def test_torchrun_node_and_rank_counts_in_either_form(command):
    result = translated(command)
    assert (result.nodes, result.min_nodes, result.ranks_per_node) == (2, None, 4)
    assert [count for count, _ in result.mapped] == ["nodes", "ranks_per_node"]


def test_an_elastic_node_range_is_the_jobs_nodes_and_its_fewest():
    result = translated("torchrun --nnodes 2:4 t.py")
    assert (result.nodes, result.min_nodes, dict(result.mapped)) == (4, 2, {"nodes": "--nnodes 2:4"})


def test_accelerate_and_deepspeed_counts():
    result = translated("accelerate launch --num_machines 2 --num-processes=16 t.py")
    assert (result.nodes, result.total_ranks) == (2, 16)
    result = translated("deepspeed --no_local_rank --num_nodes 2 --num_accelerators=8 t.py")
    assert (result.nodes, result.ranks_per_node) == (2, 8)


def test_all_of_a_nodes_gpus_is_trainctls_own_layout():
    for command in ("torchrun --nproc-per-node gpu t.py", "torchrun --nproc-per-node=auto t.py",
                    "accelerate launch --gpu_ids all t.py"):
        result = translated(command)
        assert result.ranks_per_node is None and result.dropped[0].reason == LAYOUT


# ---------------------------------------------------------------- dropped, with why

@pytest.mark.parametrize("option, reason", [
    ("--rdzv-backend c10d", RENDEZVOUS), ("--rdzv_endpoint=host:29500", RENDEZVOUS), ("--rdzv-id 7", RENDEZVOUS),
    ("--master_addr host", RENDEZVOUS), ("--master-port=29500", RENDEZVOUS), ("--standalone", RENDEZVOUS),
    ("--node_rank 0", RENDEZVOUS), ("--max-restarts 3", RESTARTS), ("--monitor-interval 5", AGENT),
    ("--start_method fork", AGENT), ("--log-dir logs", OUTPUT), ("-r3", OUTPUT), ("--tee 3", OUTPUT),
    ("--numa-binding node", BINDING)])
def test_torchrun_options_trainctl_replaces_are_dropped_with_why(option, reason):
    result = translated(f"torchrun {option} t.py a")
    assert result.dropped == (Dropped(option, reason),) and result.program == ("t.py", "a")


@pytest.mark.parametrize("option, reason", [
    ("--machine_rank 0", RENDEZVOUS), ("--main_process_ip host", RENDEZVOUS), ("--main-process-port=29500", RENDEZVOUS),
    ("--same_network", RENDEZVOUS), ("--multi_gpu", LAYOUT), ("--max_restarts 1", RESTARTS)])
def test_accelerate_options_trainctl_replaces_are_dropped_with_why(option, reason):
    result = translated(f"accelerate launch {option} t.py")
    assert result.dropped[0] == Dropped(option, reason)
    assert "default file" in result.dropped[-1].option     # accelerate launch's own config is not read either


@pytest.mark.parametrize("option, reason", [
    ("--hostfile hosts", HOSTS), ("-H hosts", HOSTS), ("--num_nodes=2", None), ("--master_addr=host", RENDEZVOUS),
    ("--master_port 29500", RENDEZVOUS), ("--launcher slurm", HOSTS), ("--no_ssh", HOSTS),
    ("--bind_cores_to_rank", BINDING)])
def test_deepspeed_options_trainctl_replaces_are_dropped_with_why(option, reason):
    result = translated(f"deepspeed --no_local_rank {option} t.py")
    expected = (Dropped("--no_local_rank", LOCAL_RANK_ENV),) + ((Dropped(option, reason),) if reason else ())
    assert result.dropped == expected


def test_srun_in_front_is_a_nested_launch_too_and_is_dropped():
    result = translated("srun -N 2 --ntasks-per-node=1 torchrun --nnodes 2 train.py")
    assert result.program == ("train.py",) and result.nodes == 2
    assert result.dropped == (Dropped("srun -N 2 --ntasks-per-node=1", SRUN),)
    assert translated("/usr/bin/srun python -m torch.distributed.run t.py").program == ("python", "t.py")


# ---------------------------------------------------------------- refused: one line, what to do instead

@pytest.mark.parametrize("command, words", [
    ("torchrun --virtual-local-rank t.py", ["--virtual-local-rank", "LOCAL_RANK"]),
    ("torchrun --nproc-per-node cpu t.py", ["--nproc-per-node cpu", "one rank per GPU"]),
    ("torchrun --nnodes two t.py", ["--nnodes two", "N or MIN:MAX"]),
    ("torchrun --nnodes 4:2 t.py", ["--nnodes 4:2"]),
    ("torchrun --no-python t.py", ["--no-python", ".py"]),
    ("torchrun --no-python -m pkg.mod", ["-m"]),
    ("torchrun ./run.sh", ["./run.sh", "python ./run.sh"]),
    ("torchrun --n 2 t.py", ["--n", "ambiguous"]),
    ("torchrun --frobnicate t.py", ["--frobnicate", "not an option"]),
    ("torchrun --nnodes", ["--nnodes", "expected a value"]),
    ("torchrun --standalone=yes t.py", ["--standalone", "takes no value"]),
    ("torchrun --standalone", ["without a training script"]),
    ("python -m torch.distributed.launch --nproc_per_node 2 t.py", ["--local-rank=N", "--use-env"]),
    ("accelerate launch --config_file fsdp.yaml t.py", ["--config_file", "Accelerator("]),
    ("accelerate launch --mixed_precision bf16 t.py", ["--mixed_precision", "Accelerator("]),
    ("accelerate launch --gpu_ids 0,1 t.py", ["--gpu_ids 0,1", "--gpus-per-node"]),
    ("accelerate launch --num_mach 2 t.py", ["--num_mach"]),        # accelerate's parser takes no prefixes
    ("deepspeed t.py", ["--local_rank=N", "--no_local_rank"]),
    ("deepspeed --no_local_rank --include host1:0,1 t.py", ["--include", "--gpus-per-node"]),
    ("deepspeed --no_local_rank --elastic_training t.py", ["--elastic_training", "--min-nodes"]),
    ("deepspeed --no_local_rank --autotuning tune t.py", ["--autotuning"]),
    ("deepspeed --no_local_rank --venv_script env.sh t.py", ["--venv_script", "wrapper"]),
    ("srun python train.py", ["srun", "without srun"]),
])
def test_what_trainctl_cannot_honour_is_refused_in_one_line_naming_the_option(command, words):
    reason = refused(command)
    assert "\n" not in reason and all(word in reason for word in words), reason


def test_an_allowed_opt_out_makes_a_local_rank_launcher_translatable():
    assert translated("python -m torch.distributed.launch --use-env t.py").dropped == (
        Dropped("--use-env", LOCAL_RANK_ENV),)


# ---------------------------------------------------------------- the plan carries the counts

def request(*program: str, **fields) -> SubmitRequest:
    return SubmitRequest(site_ref="local-demo", program=program, **{"nodes": None, **fields})


def test_the_launchers_node_count_is_the_jobs_when_it_gave_none():
    planned = plan(request("torchrun", "--nnodes", "3:4", "t.py"))
    assert (planned.nodes, planned.min_nodes, planned.program) == (4, 3, ("/n/python", "t.py"))
    assert "kept --nnodes 3:4 as --nodes 4 --min-nodes 3" in planned.launcher


@pytest.mark.parametrize("fields, program, message", [
    ({"nodes": 2}, ("torchrun", "--nnodes", "3", "t.py"), "torchrun --nnodes 3 and --nodes 2 disagree"),
    ({"nodes": 4, "min_nodes": 1}, ("torchrun", "--nnodes=2:4", "t.py"), "--nnodes=2:4 and --min-nodes 1 disagree"),
    ({"nodes": 1}, ("torchrun", "--nproc-per-node", "2", "t.py"), "partition gpu has 1 per node"),
    ({"nodes": 1, "gpus_per_node": 0}, ("torchrun", "--nproc-per-node", "1", "t.py"), None),
    ({"nodes": 3}, ("accelerate", "launch", "--num_processes", "4", "t.py"), "does not split evenly over 3 nodes"),
    ({}, ("accelerate", "launch", "--num_processes", "4", "t.py"), "--num_processes 4 counts the ranks of all"),
    ({}, ("torchrun", "t.py"), "--nodes is missing"),
])
def test_counts_that_disagree_with_the_jobs_are_refused(fields, program, message):
    if message is None:
        planned = plan(request(*program, **fields))
        assert (planned.gpus_per_node, planned.tasks_per_node) == (0, 1)
        return
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        plan(request(*program, **fields))


def test_the_ranks_per_node_a_launcher_asks_for_become_the_jobs_gpus():
    planned = plan(request("accelerate", "launch", "--num_machines", "2", "--num_processes", "16", "t.py"),
                   site="dgx-h100")
    assert (planned.nodes, planned.gpus_per_node, planned.tasks_per_node) == (2, 8, 8)
    planned = plan(request("torchrun", "--nproc-per-node", "4", "t.py", nodes=1), site="dgx-h100")
    assert (planned.gpus_per_node, planned.tasks_per_node) == (4, 4)


# ---------------------------------------------------------------- through the real CLI

def test_submit_translates_torchrun_says_so_in_one_line_and_runs_the_script(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "2", "--dry-run", "--",
                    "torchrun", "--nproc_per_node=1", "--rdzv-backend=c10d", "--rdzv-endpoint", "node1:29500",
                    TRAIN_DDP, "--steps", "3")
    assert result.returncode == 0, result.stderr
    note, dry_run = result.stderr.splitlines()
    assert note.startswith("trainctl: torchrun translated, one rank per GPU started by trainctl: each runs ")
    assert note.endswith(f"{TRAIN_DDP} --steps 3; kept --nproc_per_node=1 as 1 rank per node; dropped "
                         f"--rdzv-backend=c10d, --rdzv-endpoint node1:29500 ({RENDEZVOUS})")
    assert dry_run.startswith("trainctl: dry run, nothing submitted")
    assert f"# {note.removeprefix('trainctl: ')}\n" in result.stdout          # the script says it too
    assert not sbatch_ran(tmp_path)


def test_submit_takes_the_node_count_from_the_launcher_and_json_says_what_runs(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--dry-run", "--json", "--",
                    "srun", "torchrun", "--nnodes", "2", TRAIN_DDP)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["plan"]
    assert summary["nodes"] == 2 and summary["program"][1:] == [TRAIN_DDP]
    assert summary["launcher"] in result.stderr and "srun (" + SRUN in summary["launcher"]


def test_a_refused_launcher_is_one_line_exit_2_and_nothing_submitted(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--",
                    "accelerate", "launch", "--config_file", "fsdp.yaml", TRAIN_DDP)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "trainctl: error: accelerate launch --config_file fsdp.yaml: its settings reach Accelerator() only through "
        "accelerate launch, which trainctl replaces: set them in the program (Accelerator(mixed_precision=..., ...)) "
        "and drop --config_file"]
    assert not sbatch_ran(tmp_path)


def test_a_launcher_that_is_not_installed_is_still_translated(tmp_path):
    """The launcher is never run, so it need not exist here: the script it names must."""
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--", "torchrun", "no_such.py")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"trainctl: error: script 'no_such.py' does not exist in {tmp_path}"]


def test_a_module_is_submitted_without_a_file_to_check(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--dry-run", "--json", "--",
                    "torchrun", "-m", "pkg.train", "--lr", "1")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["plan"]
    assert summary["program"][1:] == ["-m", "pkg.train", "--lr", "1"] and summary["job_name"] == "train"
