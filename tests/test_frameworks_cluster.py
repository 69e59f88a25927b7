"""Programs of the common frameworks, written as their docs show (CPU, gloo), run by trainctl on
the real cluster with the frameworks installed from PyPI (the `test` extra):

- Lightning with `TrainctlCallback`: a node turns sick mid-run (an Xid in its replayed kernel log),
  the watch asks for a checkpoint, Lightning saves it through its own `Trainer.save_checkpoint`,
  and the job goes on on the held spare and resumes from that save. The site's launch.signal is
  USR1@120, the signal Lightning's SLURMEnvironment takes for "save and `scontrol requeue`": the
  watch must not send it, and the job must not be requeued (Restarts=0, COMPLETED).
- Then, on two nodes each, a Hugging Face Trainer with `TrainctlCallback` (completes, its steps
  reported to the watch) and pytorch/examples' torchrun-style DDP tutorial program, unmodified
  but for CPU, given as its README runs it, after a torchrun command line with rendezvous
  options: submit translates the line (torchrun under each rank would wait for a rendezvous
  that never completes), and the program completes on 2 ranks from trainctl's env:// variables.

Assertions are about outcomes (what was journaled, which file was resumed from), never about time.
"""

from __future__ import annotations

import json
import re
import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest

from support.replay import LIBRARY, swap_replay, write_replay
from support.sites import site_variant
from support.slurm_jobs import TRAINCTL, job_output, journal, wait_for_job, wait_until
from trainctl.devcluster import faults
from trainctl.slurm import expand_hostlist

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "examples" / "frameworks"
NODES = ("node1", "node2", "node3", "node4")
CLEAN_DMESG = LIBRARY / "kernel" / "syslog" / "imbue-dmesg-mlx5-pcie-link-degraded-x8.txt"
XID_DMESG = next((LIBRARY / "kernel" / "xid").glob("gpud-xe9680-h100-dmesg-T-xid119*"))
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
LIGHTNING_STEPS = 240
STEP_S = 0.25


def submitted(devcluster, cwd: Path, *args: str) -> tuple[str, str]:
    """`trainctl submit ARGS` from `cwd`, as a user's shell would: without the PYTHONSAFEPATH that
    scripts/test sets for the tests' own Pythons (sbatch passes the environment on to the job, and
    it would keep a script's own folder off sys.path: the DDP tutorial imports its datautils.py).
    Returns the job id and what submit said on stderr."""
    env = {name: value for name, value in devcluster.client_env().items() if name != "PYTHONSAFEPATH"}
    result = subprocess.run([TRAINCTL, "submit", *args], capture_output=True, text=True, cwd=cwd, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1], result.stderr


def replay_healthy_nodes(devcluster, undo: ExitStack) -> None:
    """What the local-demo gate reads on every node, healthy: a clean kernel log and NVLink (until `undo`)."""
    for node in NODES:
        for made in (write_replay(devcluster.node_bin_dir(node), "dmesg", {"-T": CLEAN_DMESG}),
                     write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})):
            undo.callback(made.unlink, missing_ok=True)


def test_lightning_saves_on_the_watchs_request_without_a_requeue_then_hf_and_torchrun_programs_run(
        devcluster, tmp_path):
    site = site_variant(tmp_path, "local-demo", {
        "watch.hold_spares": 1,
        # the gate again after the detection takes seconds (as the watch tests run it)
        "gate.fabric_sizes": ["1M"], "gate.fabric_iters": 3, "gate.fabric_passes": 2,
    })
    lightning_dir, others_dir = tmp_path / "lightning", tmp_path / "others"
    lightning_dir.mkdir()
    others_dir.mkdir()
    with ExitStack() as undo:
        replay_healthy_nodes(devcluster, undo)
        lightning, _ = submitted(devcluster, lightning_dir, "--site", str(site), "--nodes", "2", "--spare", "1", "--",
                              str(PROGRAMS / "lightning_ddp.py"), "--nodes", "2", "--steps", str(LIGHTNING_STEPS),
                              "--step-time", str(STEP_S), "--dir", str(lightning_dir / "ck"))
        gate_dir = lightning_dir / f"trainctl-gate-{lightning}"
        wait_until("Lightning's first checkpoint", lambda: any(
            e["event"] == "checkpoint" for e in journal(gate_dir)), 300)
        events = journal(gate_dir)
        batch_host = next(e["batch_host"] for e in events if e["event"] == "job_start")
        training = next(e for e in events if e["event"] == "training_start")
        victim = next(n for n in expand_hostlist(training["nodes"]) if n != batch_host)
        swap_replay(devcluster.node_bin_dir(victim), "dmesg", {"-T": XID_DMESG})
        wait_until("the gate's judgement", lambda: any(e["event"] == "confirmation" for e in journal(gate_dir)), 240)
        swap_replay(devcluster.node_bin_dir(victim), "dmesg", {"-T": CLEAN_DMESG})
        record = wait_for_job(devcluster, lightning, timeout_s=600)
        # then the HF Trainer, then the torchrun-style program, two nodes each: one after the other,
        # since Slurm would put both on the same two nodes, and each would slow the other
        hf, _ = submitted(devcluster, others_dir, "--site", str(site), "--nodes", "2", "--",
                       str(PROGRAMS / "hf_trainer.py"), "--steps", "30", "--dir", str(others_dir / "hf"))
        hf_record = wait_for_job(devcluster, hf, timeout_s=300)
        torchrun, said = submitted(devcluster, others_dir, "--site", str(site), "--nodes", "2", "--",
                                   "torchrun", "--nproc_per_node=1", "--rdzv-backend=c10d",
                                   "--rdzv-endpoint=node1:29400", str(PROGRAMS / "ddp_tutorial" / "multinode.py"),
                                   "20", "5")
        torchrun_record = wait_for_job(devcluster, torchrun, timeout_s=300)

    events = journal(gate_dir)
    output = job_output(lightning_dir, lightning)
    assert record["JobState"] == "COMPLETED", output
    assert record["Restarts"] == "0", record
    # every request went over trainctl's channel, none as a signal; the first (the sick node's) saved
    asked = [e for e in events if e["event"] == "checkpoint_request"]
    assert asked and all(e["signal"] is None and e["listening"] for e in asked) and asked[0]["saved"], events
    assert "Handling auto-requeue signal" not in output and "Requeued SLURM job" not in output
    restart = next(e for e in events if e["event"] == "training_start" and e.get("restart"))
    assert victim not in expand_hostlist(restart["nodes"]), restart
    # the save the watch asked for holds the step the restarted program went on from (from that
    # file, or from ModelCheckpoint's last.ckpt when both saved at that step: the newer wins)
    import torch

    asked_step = torch.load(lightning_dir / "ck" / "last-trainctl.ckpt", weights_only=False)["global_step"]
    assert f"rank 0: training from step {asked_step}\n" in output, output

    hf_events = journal(others_dir / f"trainctl-gate-{hf}")
    assert hf_record["JobState"] == "COMPLETED", job_output(others_dir, hf)
    assert any(e["event"] == "first_step" for e in hf_events), hf_events   # the watch saw its steps
    # and the Trainer's last save (its checkpoint file is read once more at the step's end), seen
    # as the callback's "step N" or as a torch.save into checkpoint-N/ (each rank writes its RNG
    # state there: whichever came last in a poll is the one journaled); the watch, if a busy
    # machine made it ask for one, sends no signal
    saves = [int(found.group(1)) for e in hf_events if e["event"] == "checkpoint"
             for found in [re.match(r"step (\d+)$", e["note"]) or re.search(r"/checkpoint-(\d+)/", e["note"])]
             if found]
    assert saves and saves[-1] >= 30, hf_events
    assert all(e["signal"] is None and e["listening"] for e in hf_events if e["event"] == "checkpoint_request")
    # the Trainer's own saves (save_steps 20, and at max_steps): a busy machine may add the watch's
    # (a step the ranks agreed on), or one past max_steps where a restart resumed from checkpoint-30
    # (the Trainer's behaviour on resume, not the callback's)
    assert {"checkpoint-20", "checkpoint-30"} <= {p.name for p in (others_dir / "hf").glob("checkpoint-*")}

    torchrun_output = job_output(others_dir, torchrun)
    assert "torchrun translated" in said and "--rdzv-endpoint=node1:29400" in said, said
    assert torchrun_record["JobState"] == "COMPLETED", torchrun_output
    assert "[GPU1] Epoch 19" in torchrun_output and "Epoch 15 | Training snapshot saved" in torchrun_output
    assert (others_dir / "snapshot.pt").is_file()
    # the program knows nothing of trainctl and the job named no --checkpoints: its torch.save of
    # snapshot.pt was seen all the same, with its path
    torchrun_events = journal(others_dir / f"trainctl-gate-{torchrun}")
    assert any(e["event"] == "checkpoint" and e.get("source") == "torch.save" and e["note"].endswith("/snapshot.pt")
               for e in torchrun_events), torchrun_events


# ---------------------------------------------------------------- public job scripts, as written

JOB_SCRIPTS = REPO / "tests" / "fixtures" / "job-scripts" / "dev-cluster"
ACCELERATE_LOOP = '''\
import argparse, time, torch
from pathlib import Path
from accelerate import Accelerator
parser = argparse.ArgumentParser()
parser.add_argument("--mixed_precision", default="no")
parser.add_argument("--output_dir", default="output")
args = parser.parse_args()
accelerator = Accelerator(cpu=True, mixed_precision=args.mixed_precision)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
step = 0
saves = sorted(Path(args.output_dir).glob("step_*"), key=lambda path: int(path.name[5:]))
if saves:
    accelerator.load_state(str(saves[-1]))
    step = int(saves[-1].name[5:])
    print(f"accelerate loop: resumed from {saves[-1].name}", flush=True)
# trains until the step the test writes into stop-at-step: a run lasts until its fault, never a set time
stop = Path("stop-at-step")
while not (stop.exists() and step >= int(stop.read_text())):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    time.sleep(0.1)
    if step % 10 == 0:
        accelerator.save_state(f"{args.output_dir}/step_{step}")
accelerator.save_state(args.output_dir)
print(f"accelerate loop done: world size {accelerator.num_processes}", flush=True)
'''
TORCHTITAN_STAND_IN = '''\
import argparse, os, sys, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--module")
parser.add_argument("--config")
args, rest = parser.parse_known_args()
dist.init_process_group("gloo")
dist.barrier()
print(f"torchtitan stand-in: {args.module} {args.config} {rest} world size {dist.get_world_size()} "
      f"LOGLEVEL={os.environ.get('LOGLEVEL')}", flush=True)
dist.destroy_process_group()
'''


def freeze_a_training_node(devcluster, folder: Path, job_id: str) -> dict:
    """Once the job's loop has saved twice, freeze (SIGSTOP) its training node that is not the batch
    host until the watch has ended the step; let the successor the job submits train 20 steps past the
    last save. Returns the victim, the detection, the last save's step and the successor's job id."""
    gate_dir = folder / f"trainctl-gate-{job_id}"
    try:
        wait_until("the loop's second save", lambda: sum(e["event"] == "checkpoint" for e in journal(gate_dir)) >= 2,
                   300)
        events = journal(gate_dir)
        batch_host = next(e["batch_host"] for e in events if e["event"] == "job_start")
        training = next(e for e in events if e["event"] == "training_start")
        victim = next(n for n in expand_hostlist(training["nodes"]) if n != batch_host)
        with faults.stopped(devcluster, victim):   # hung until the watch has ended the training step
            wait_until("the step's end", lambda: any(e["event"] in ("step_end", "job_end") for e in journal(gate_dir)),
                       240)
    finally:   # the loop trains until this step, in this job (when the freeze never came) or its successor
        last_save = max((int(p.name[5:]) for p in (folder / "output").glob("step_*")), default=0)
        (folder / "stop-at-step").write_text(str(last_save + 20))
    wait_until("the successor's submission", lambda: (gate_dir / "retry.json").exists(), 120)
    successor = json.loads((gate_dir / "retry.json").read_text())["successor"]
    assert successor, (gate_dir / "retry.json").read_text()
    detection = next((e for e in journal(gate_dir) if e["event"] == "detection"), {})
    return {"victim": victim, "detection": detection, "last_save": last_save, "successor": successor}


def test_three_public_job_scripts_complete_under_trainctl_submit_on_the_gates_nodes(devcluster, tmp_path):
    """pytorch/examples' DDP tutorial sbatch_run.sh, Accelerate's submit_multinode.sh and torchtitan's
    multinode_trainer.slurm, edited only to run on CPU in the dev cluster's paths (SOURCES.md), each
    given to `trainctl submit job.sbatch` as it is: each COMPLETES on the nodes the gate chose, with
    the world size its #SBATCH lines ask for (2), its environment lines' exports reaching the ranks.
    Under Accelerate's script, a training node freezes (SIGSTOP) after the loop's second save: the
    watch names it, and the chain completes in a successor job without it, from the loop's last save."""
    site = site_variant(tmp_path, "local-demo", {"gate.fabric_sizes": ["1M"], "gate.fabric_iters": 3,
                                                 "gate.fabric_passes": 2})
    venv_bin = str(Path(TRAINCTL).parent)
    runs = {}
    for name in ("pytorch-examples-sbatch_run.sh", "accelerate-submit_multinode.sh",
                 "torchtitan-multinode_trainer.slurm"):
        folder = tmp_path / name.split("-")[0]
        folder.mkdir()
        (folder / name).write_text((JOB_SCRIPTS / name).read_text())
        runs[name] = folder
    pytorch, accelerate, torchtitan = runs.values()
    (pytorch / "multinode_torchrun.py").write_text((PROGRAMS / "ddp_tutorial" / "multinode.py").read_text())
    (pytorch / "datautils.py").write_text((PROGRAMS / "ddp_tutorial" / "datautils.py").read_text())
    (accelerate / "accelerate_loop.py").write_text(ACCELERATE_LOOP)
    # the script's own environment line: `source activateEnviroment.sh`
    (accelerate / "activateEnviroment.sh").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    (torchtitan / "torchtitan").mkdir()
    (torchtitan / "torchtitan" / "__init__.py").write_text("")
    (torchtitan / "torchtitan" / "train.py").write_text(TORCHTITAN_STAND_IN)

    env = {name: value for name, value in devcluster.client_env().items() if name != "PYTHONSAFEPATH"}
    env["PATH"] = f"{venv_bin}:{env['PATH']}"     # as a user submits from their activated environment
    records = {}
    with ExitStack() as undo:
        replay_healthy_nodes(devcluster, undo)
        for name, folder in runs.items():   # one after the other: Slurm would put all three on the same nodes
            args = ("--extra", "arg") if name.startswith("torchtitan") else ()
            saves = ("--checkpoints", "output/step_*") if folder == accelerate else ()
            result = subprocess.run([TRAINCTL, "submit", "--site", str(site), *saves, name, *args],
                                    capture_output=True, text=True, cwd=folder, env=env, timeout=120)
            assert result.returncode == 0, result.stderr
            assert "taken over" in result.stderr, result.stderr
            job_id = result.stdout.strip().splitlines()[-1]
            if folder == accelerate:
                frozen = freeze_a_training_node(devcluster, accelerate, job_id)
                job_id = frozen["successor"]
            records[name] = (job_id, wait_for_job(devcluster, job_id, timeout_s=400))
        faults.restore_node(devcluster, frozen["victim"], timeout_s=120)

    for name, folder in runs.items():
        job_id, record = records[name]
        output = job_output(folder, job_id)
        assert record["JobState"] == "COMPLETED", output
        events = journal(folder / f"trainctl-gate-{job_id}")
        training = next(e for e in events if e["event"] == "training_start")
        chosen = next(e for e in events if e["event"] == "gate_end")["chosen"]
        assert sorted(expand_hostlist(training["nodes"])) == sorted(chosen) and len(chosen) == 2, events
        assert "the job script's training line, as bash expanded it" in output, output
    assert "[GPU1] Epoch 19" in job_output(pytorch, records["pytorch-examples-sbatch_run.sh"][0])
    successor = job_output(accelerate, records["accelerate-submit_multinode.sh"][0])
    assert "accelerate loop done: world size 2" in successor, successor
    # the frozen node was named by the watch and left out; the successor went on from the loop's last save
    assert frozen["detection"]["kind"] == "hung" and frozen["detection"]["suspects"] == [frozen["victim"]], frozen
    successor_events = journal(accelerate / f"trainctl-gate-{frozen['successor']}")
    resumed_on = next(e for e in successor_events if e["event"] == "training_start")["nodes"]
    assert frozen["victim"] not in expand_hostlist(resumed_on), successor_events
    assert f"accelerate loop: resumed from step_{frozen['last_save']}" in successor, successor
    titan = job_output(torchtitan, records["torchtitan-multinode_trainer.slurm"][0])
    assert "world size 2 LOGLEVEL=INFO" in titan and "['--extra', 'arg']" in titan, titan
