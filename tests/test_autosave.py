"""Saves seen without code: unmodified programs under trainctl's bootstrap, as each framework's
docs write them, report each save when it completes, with its path (`trainctl.guest.save_hooks`),
and run exactly as they would without it: no module of theirs imported for it, the same save
functions as far as they can tell, the same errors."""

from __future__ import annotations

import json
import os

from support.rank_runs import run_rank

# PyTorch's "Saving and loading models" recipe: a state_dict, a general checkpoint dict, a
# pathlib.Path; a save into a buffer (no file: not a save) and one that fails. What it prints is
# what the bootstrap must leave alone.
TORCH_SAVE = """
import inspect, io, json, sys
from pathlib import Path
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
torch.save(model.state_dict(), "initial.pt")      # before the first step: the rank is not claimed yet
for epoch in range(2):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict()}, f"checkpoint_{epoch}.tar")
buffer = io.BytesIO()
torch.save(model.state_dict(), buffer)
torch.save(model, Path("model.pt"))
try:
    torch.save(model.state_dict(), "no-such-folder/model.pt")
    failed = None
except Exception as exc:
    failed = f"{type(exc).__name__}: {exc}"
print(json.dumps({"failed": failed, "name": [torch.save.__name__, torch.save.__module__, torch.save.__qualname__],
                  "same": torch.save is torch.serialization.save, "signature": str(inspect.signature(torch.save)),
                  "doc": torch.save.__doc__ == torch.serialization.save.__doc__,
                  "modules": sorted(name for name in sys.modules
                                    if name.startswith(("safetensors", "torch.distributed.checkpoint", "lightning")))}))
"""


def run(tmp_path, code, *args, bootstrap=True, env=None):
    saves: list[dict] = []
    child, reports = run_rank(tmp_path, code, *args, bootstrap=bootstrap, env=env, saves=saves)
    assert child.returncode == 0, child.stderr
    return child, reports, saves


def paths(tmp_path, saves, api):
    return [os.path.relpath(save["path"], tmp_path) for save in saves if save["api"] == api]


def test_torch_save_to_a_path_is_seen_when_it_completes_and_nothing_else_is(tmp_path):
    child, reports, saves = run(tmp_path, TORCH_SAVE)
    assert paths(tmp_path, saves, "torch.save") == ["checkpoint_0.tar", "checkpoint_1.tar", "model.pt"]
    assert {save["api"] for save in saves} == {"torch.save"}
    assert all(save["rank"] == 0 and save["pid"] == reports[0]["pid"] for save in saves)
    # each after the step before it, in the order made
    assert [save["time"] for save in saves] == sorted(save["time"] for save in saves)
    assert saves[0]["time"] >= min(r["time"] for r in reports if r["steps"] == 1)


def test_a_program_that_saves_sees_the_same_torch_save_modules_and_errors_as_without_trainctl(tmp_path):
    for folder in ("with", "without"):
        (tmp_path / folder).mkdir()
    with_it, _, _ = run(tmp_path / "with", TORCH_SAVE)
    without, _, saves = run(tmp_path / "without", TORCH_SAVE, bootstrap=False)
    assert saves == []
    seen, plain = json.loads(with_it.stdout), json.loads(without.stdout)
    assert seen == plain
    assert plain["failed"] and plain["modules"] == [] and plain["same"]
    assert with_it.stderr == without.stderr


# torch.distributed.checkpoint as its recipe writes it: a process group, dcp.save with a
# checkpoint_id, then dcp.async_save, waited on. Its folders are the saves.
DISTRIBUTED_CHECKPOINT = """
import sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
    state_dict = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if step == 0:
        dcp.save(state_dict, checkpoint_id="checkpoint/step_0")
    else:
        future = dcp.async_save(state_dict, checkpoint_id="checkpoint/step_1")
        future.result()
dist.destroy_process_group()
"""


def test_a_distributed_checkpoint_save_and_async_save_are_seen_with_their_folders(tmp_path):
    _, _, saves = run(tmp_path, DISTRIBUTED_CHECKPOINT, str(tmp_path / "store"))
    assert paths(tmp_path, saves, "torch.distributed.checkpoint") == ["checkpoint/step_0", "checkpoint/step_1"]
    assert (tmp_path / "checkpoint" / "step_1" / ".metadata").is_file()   # seen once its writing was over


SAFETENSORS = """
import torch
from safetensors.torch import save_file
model = torch.nn.Linear(4, 1)
torch.optim.SGD(model.parameters(), lr=0.1).step()
save_file(model.state_dict(), "model.safetensors", metadata={"format": "pt"})
"""


def test_a_safetensors_file_is_seen(tmp_path):
    _, _, saves = run(tmp_path, SAFETENSORS)
    assert paths(tmp_path, saves, "safetensors") == ["model.safetensors"]


# The Transformers Trainer as its docs write it, with a model built from its config (no download):
# it saves checkpoint-2/ and checkpoint-4/ (model.safetensors through safetensors, the optimizer's,
# scheduler's and RNG states through torch.save).
TRANSFORMERS = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}

model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
args = TrainingArguments(output_dir="out", max_steps=4, save_steps=2, per_device_train_batch_size=4,
                         use_cpu=True, report_to=[], dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
"""


def test_the_transformers_trainers_checkpoints_are_seen(tmp_path):
    _, _, saves = run(tmp_path, TRANSFORMERS)
    folders = {os.path.dirname(path) for path in paths(tmp_path, saves, "torch.save")}
    assert {"out/checkpoint-2", "out/checkpoint-4"} <= folders, saves
    assert {"out/checkpoint-2/model.safetensors", "out/checkpoint-4/model.safetensors"} <= \
        set(paths(tmp_path, saves, "safetensors"))


# Lightning as its docs write it: a LightningModule, Trainer.fit with its default ModelCheckpoint
# (a .ckpt at each epoch's end, serialised into a buffer and written through fsspec), then
# trainer.save_checkpoint.
LIGHTNING = """
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = DataLoader(TensorDataset(torch.randn(16, 8), torch.randn(16, 1)), batch_size=8)
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, default_root_dir="run", logger=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regression(), data)
trainer.save_checkpoint("final.ckpt")
"""


def test_lightnings_checkpoints_are_seen(tmp_path):
    _, _, saves = run(tmp_path, LIGHTNING)
    assert paths(tmp_path, saves, "lightning") == ["run/checkpoints/epoch=0-step=2.ckpt",
                                                   "run/checkpoints/epoch=1-step=4.ckpt", "final.ckpt"]
    assert paths(tmp_path, saves, "torch.save") == []          # Lightning's torch.save goes into a buffer


# Accelerate's save_state, as its checkpointing guide writes it.
ACCELERATE = """
import torch
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for _ in range(2):
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(8, 4)).sum())
    optimizer.step()
accelerator.save_state("state")
"""


def test_accelerates_save_state_is_seen(tmp_path):
    _, _, saves = run(tmp_path, ACCELERATE)
    assert "state/model.safetensors" in paths(tmp_path, saves, "safetensors"), saves
    assert "state/optimizer.bin" in paths(tmp_path, saves, "torch.save"), saves
