"""Where the framework callbacks save when the watch asks, and that they do nothing outside a watched
job, with real Lightning and Hugging Face Trainer programs (one CPU process each, two for a process
group of two): a requested save goes only into the program's own checkpoint place; a program that
keeps no checkpoints gets none (Lightning's "hpc" file in the working folder would be resumed from by
any later Lightning run there under Slurm), and the callback says so once; outside a watched job the
callbacks run no collective, write nothing and warn of nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainctl.guest import wire
from trainctl.job.jobdir import CHECKPOINT_ENV
from trainctl.guest.wire import WATCH_DIR_ENV

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "examples" / "frameworks"
CANNOT_SAVE = "cannot save when trainctl's watch asks for a checkpoint"

# What every program below shares: the test's probes, not trainctl. `ask_again` makes a new request (a
# new token, as the node agent writes one); `AskAgain` does at step 12, so that the ranks agree on a
# request at step 10 and again at step 20; `said` lists what trainctl warned.
PROBES = """
import json, os, sys, warnings
warnings.simplefilter("always")
WARNINGS = warnings.catch_warnings(record=True)
caught = WARNINGS.__enter__()
import trainctl.progress as progress
from trainctl.guest import requests, wire
requests.POLL_S = 0.0                  # a rank looks at the request file at every step

ASKED = []

def ask_again():
    socket_path = os.environ.get(wire.SOCKET_ENV)
    if socket_path:
        ASKED.append(1)
        path = wire.request_path(socket_path)
        with open(path + ".new", "w") as out:
            out.write(f"again-{len(ASKED)}\\n")
        os.replace(path + ".new", path)

def said():
    # trainctl's own words start with its name (a framework's may quote a path that holds "trainctl")
    return [str(w.message) for w in caught if str(w.message).startswith("trainctl")]
"""

LIGHTNING_PROBES = PROBES + """
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
sys.path.insert(0, sys.argv[1])
from lightning_ddp import Regression

class AskAgain(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 12:
            ask_again()

def data():
    return DataLoader(TensorDataset(torch.randn(512, 32), torch.randn(512, 1)), batch_size=8)

QUIET = dict(accelerator="cpu", devices=1, max_steps=25, enable_progress_bar=False, logger=False,
             enable_model_summary=False)
"""


def job_env(tmp_path: Path, with_request: bool) -> dict[str, str]:
    """A rank's environment in a watched step, with the agent's request file already there."""
    socket_path = str(tmp_path / "agent.sock")
    (tmp_path / "watch").mkdir(exist_ok=True)
    if with_request:
        Path(wire.request_path(socket_path)).write_text("first\n")
    env = outside_env()
    env.update(RANK="0", **{wire.SOCKET_ENV: socket_path, WATCH_DIR_ENV: str(tmp_path / "watch"),
                            CHECKPOINT_ENV: str(tmp_path / "checkpoint.seen")})
    return env


def outside_env() -> dict[str, str]:
    """This machine's environment without trainctl's, Slurm's or torch.distributed's variables."""
    dropped = ("TRAINCTL_", "SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
               "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
    return {name: value for name, value in os.environ.items() if not name.startswith(dropped)}


def run(code: str, env: dict[str, str], cwd: Path, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-P", "-c", code, *args], env=env, cwd=cwd, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def files_under(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


# ---------------------------------------------------------------- Lightning

LIGHTNING_NO_CHECKPOINTS = LIGHTNING_PROBES + """
from trainctl.integrations.lightning import TrainctlCallback

trainer = L.Trainer(callbacks=[TrainctlCallback(), AskAgain()], enable_checkpointing=False, **QUIET)
trainer.fit(Regression(0.0), data())
print(json.dumps({"said": said(), "steps": trainer.global_step}))
"""


def test_lightning_that_keeps_no_checkpoints_gets_no_save_on_request_and_is_told_once(tmp_path):
    """No hpc_ckpt_N.ckpt in the working folder (Lightning's default_root_dir): under Slurm, any later
    Lightning run there would resume from it by itself."""
    work = tmp_path / "work"
    work.mkdir()
    out = run(LIGHTNING_NO_CHECKPOINTS, job_env(tmp_path, with_request=True), work, str(PROGRAMS))
    assert out["steps"] == 25
    assert files_under(work) == []
    # nothing saved, and no save told (checkpoint.seen)
    assert files_under(tmp_path) == ["agent.sock.checkpoint-request", f"watch/{wire.LISTENING_FILE}"]
    assert len(out["said"]) == 1 and CANNOT_SAVE in out["said"][0], out["said"]   # asked twice, said once
    assert "ModelCheckpoint" in out["said"][0]


LIGHTNING_MODEL_CHECKPOINT = LIGHTNING_PROBES + """
from lightning.pytorch.callbacks import ModelCheckpoint
from trainctl.integrations.lightning import TrainctlCallback

for index, layout in enumerate(sys.argv[2:]):
    if index:
        ask_again()                    # a request for this run, as for the first
    folder = os.path.join("..", layout)
    checkpoints = [ModelCheckpoint(dirpath=folder, every_n_train_steps=1000)]   # none of its own in 25 steps
    if layout == "after-one-that-saves-nothing":
        checkpoints.insert(0, ModelCheckpoint(dirpath=folder + "-nothing", save_top_k=0))
    trainer = L.Trainer(callbacks=[*checkpoints, TrainctlCallback(), AskAgain()], **QUIET)
    trainer.fit(Regression(0.0), data())
print(json.dumps({"said": said()}))
"""


def test_lightning_saves_on_request_only_into_its_model_checkpoints_folder(tmp_path):
    """Beside the files of the ModelCheckpoint that saves (`fit(ckpt_path="last")` finds it there), and
    never into one that saves nothing, nor into the working folder (Lightning's default_root_dir)."""
    import torch

    layouts = ("alone", "after-one-that-saves-nothing")
    work = tmp_path / "work"
    work.mkdir()
    out = run(LIGHTNING_MODEL_CHECKPOINT, job_env(tmp_path, with_request=True), work, str(PROGRAMS), *layouts)
    assert out["said"] == []
    assert files_under(tmp_path) == ["after-one-that-saves-nothing/last-trainctl.ckpt",
                                     "agent.sock.checkpoint-request", "alone/last-trainctl.ckpt",
                                     "checkpoint.seen", f"watch/{wire.LISTENING_FILE}"]
    for layout in layouts:
        assert torch.load(tmp_path / layout / "last-trainctl.ckpt", weights_only=False)["global_step"] == 20
    assert (tmp_path / "checkpoint.seen").read_text() == "step 20\n"


# ---------------------------------------------------------------- outside a watched job

# Counts the all_reduces that trainctl's code asks for (Lightning's own, from its loops, are not
# the callbacks' doing): a frame of a trainctl module on the caller's stack.
COUNT_ALL_REDUCE = """
import torch.distributed as dist
ALL_REDUCE = []
_all_reduce = dist.all_reduce

def counted(*args, **kwargs):
    frame = sys._getframe(1)
    while frame is not None and not str(frame.f_globals.get("__name__", "")).startswith("trainctl."):
        frame = frame.f_back
    if frame is not None:
        ALL_REDUCE.append(frame.f_globals["__name__"])
    return _all_reduce(*args, **kwargs)

dist.all_reduce = counted
"""

LIGHTNING_OUTSIDE = LIGHTNING_PROBES + COUNT_ALL_REDUCE + """
from trainctl.integrations.lightning import TrainctlCallback

class Group(L.Callback):
    def on_train_end(self, trainer, pl_module):
        self.size = dist.get_world_size() if dist.is_initialized() else 0

group = Group()
trainer = L.Trainer(callbacks=[TrainctlCallback(every_n_steps=5), group], strategy="ddp",
                    enable_checkpointing=False, **QUIET)
trainer.fit(Regression(0.0), data())
print(json.dumps({"said": said(), "world": group.size, "all_reduce": len(ALL_REDUCE),
                  "steps": trainer.global_step}))
"""

TRANSFORMERS_OUTSIDE = PROBES + """
import types
import torch
""" + COUNT_ALL_REDUCE + """
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
from transformers import TrainerControl, TrainerState
from trainctl.integrations.transformers import TrainctlCallback

callback = TrainctlCallback(every_n_steps=5)
args = types.SimpleNamespace(device=torch.device("cpu"), save_strategy="steps", output_dir="out")
state, control = TrainerState(), TrainerControl()
for step in range(1, 26):
    state.global_step = step
    callback.on_step_end(args, state, control)
    if control.should_save:
        callback.on_save(args, state, control)
dist.barrier()
print(json.dumps({"said": said(), "world": dist.get_world_size(), "all_reduce": len(ALL_REDUCE),
                  "should_save": control.should_save}))
dist.destroy_process_group()
"""


def test_outside_a_watched_job_the_callbacks_run_no_collective_and_write_nothing(tmp_path):
    """Lightning with its process group (DDP, gloo; its reduce_boolean_decision is a real all_reduce)
    and the Hugging Face callback's steps in a process group of two: no all_reduce, no file, no
    warning, however many steps."""
    work = tmp_path / "lightning"
    work.mkdir()
    out = run(LIGHTNING_OUTSIDE, outside_env(), work, str(PROGRAMS))
    assert (out["world"], out["steps"]) == (1, 25)
    assert (out["all_reduce"], out["said"]) == (0, [])
    assert files_under(work) == []

    work = tmp_path / "transformers"
    work.mkdir()
    env = dict(outside_env(), GLOO_SOCKET_IFNAME="lo")
    store = f"file://{tmp_path / 'store'}"
    ranks = [subprocess.Popen([sys.executable, "-P", "-c", TRANSFORMERS_OUTSIDE, store, str(rank)], env=env,
                              cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    try:
        outs = [rank.communicate(timeout=300) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    for rank, (stdout, stderr) in zip(ranks, outs):
        assert rank.returncode == 0, stderr[-4000:]
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out == {"said": [], "world": 2, "all_reduce": 0, "should_save": False}
    assert files_under(work) == []


# ---------------------------------------------------------------- Hugging Face Trainer

TRANSFORMERS_NO_CHECKPOINTS = PROBES + """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
sys.path.insert(0, sys.argv[1])
from hf_trainer import Tokens
from trainctl.integrations.transformers import TrainctlCallback

class AskAgain(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 12:
            ask_again()

config = GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=1, n_head=2)
training = TrainingArguments(output_dir="out", max_steps=25, per_device_train_batch_size=8,
                             save_strategy="no", logging_strategy="no", use_cpu=True, report_to=[],
                             dataloader_num_workers=0)
trainer = Trainer(model=GPT2LMHeadModel(config), args=training,
                  train_dataset=Tokens(256, 32, config.vocab_size),
                  callbacks=[TrainctlCallback(), AskAgain()])
trainer.train()
print(json.dumps({"said": said(), "steps": trainer.state.global_step}))
"""


def test_a_transformers_trainer_with_save_strategy_no_gets_no_save_on_request_and_is_told_once(tmp_path):
    """The Trainer saves `checkpoint-<step>` on `control.should_save` whatever its save_strategy
    (trainer.py, _maybe_log_save_evaluate): with "no" the program keeps no checkpoints, so none is
    asked for."""
    work = tmp_path / "work"
    work.mkdir()
    out = run(TRANSFORMERS_NO_CHECKPOINTS, job_env(tmp_path, with_request=True), work, str(PROGRAMS))
    assert out["steps"] == 25
    # nothing saved, and no save told (checkpoint.seen)
    assert files_under(tmp_path) == ["agent.sock.checkpoint-request", f"watch/{wire.LISTENING_FILE}"]
    assert len(out["said"]) == 1 and CANNOT_SAVE in out["said"][0], out["said"]   # asked twice, said once
    assert 'save_strategy="no"' in out["said"][0]


# ---------------------------------------------------------------- what the callbacks read, and say

def test_a_watched_step_is_one_with_the_agents_socket_and_the_watch_folder():
    from trainctl.integrations.shared import reports_saves, watched_job

    socket, watch = {wire.SOCKET_ENV: "/run/a.sock"}, {WATCH_DIR_ENV: "/gate/watch"}
    assert watched_job({**socket, **watch})
    assert not watched_job(socket) and not watched_job(watch) and not watched_job({})
    assert not watched_job({wire.SOCKET_ENV: "", WATCH_DIR_ENV: ""})
    assert reports_saves({CHECKPOINT_ENV: "/job/checkpoint.seen"})   # a step trainctl runs, not watched
    assert not reports_saves({})


def test_what_a_callback_says_it_says_once_and_never_as_an_exception():
    import warnings

    from trainctl.integrations.shared import Notice, steps_between

    notice = Notice()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notice.say("first")
        notice.say("second")
    assert [str(w.message) for w in caught] == ["first"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # a program that turns warnings into errors
        Notice().say("not raised")
    values = (5, 0, -3, "7", "x", None, float("inf"))
    assert [steps_between(value) for value in values] == [5, 1, 1, 7, 10, 10, 10]
