"""Lightning: a Callback that reports optimizer steps and saves to trainctl, and saves when trainctl's
watch asks for a checkpoint, through Lightning's own `Trainer.save_checkpoint`.

    from trainctl.integrations.lightning import TrainctlCallback
    trainer = Trainer(strategy="ddp", callbacks=[ModelCheckpoint(save_last=True), TrainctlCallback()])

Why a callback and not a signal: under srun Lightning picks SLURMEnvironment, whose
`auto_requeue=True` default makes it handle SIGUSR1 (its `requeue_signal`) by saving and running
`scontrol requeue` on the whole job (src/lightning/pytorch/trainer/connectors/signal_connector.py).
With this callback the watch asks over trainctl's own channel and sends no signal; Slurm's
time-limit signal (`--signal USR1@120`) still reaches Lightning's handler, which saves and requeues
as Lightning users expect.

A requested save goes where `fit(ckpt_path="last")` finds it: `last-trainctl.ckpt` in the first
ModelCheckpoint's folder (Lightning resumes from the newest file whose name starts with its
CHECKPOINT_NAME_LAST, "last": ModelCheckpoint._find_last_checkpoints); with no checkpoint callback,
Lightning's own HPC path, which `fit()` resumes from under Slurm by itself.
"""

from __future__ import annotations

import os

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError:   # the older package name of the same code
    from pytorch_lightning import Callback
    from pytorch_lightning.callbacks import ModelCheckpoint

from trainctl.integrations.shared import EVERY_N_STEPS, SaveRequests, report_saved, report_step

REQUESTED_NAME = "trainctl"     # last-trainctl.ckpt


class TrainctlCallback(Callback):
    """Steps (one per optimizer step), saves (Lightning's), and a save when the watch asks for one
    (agreed by all ranks every `every_n_steps` optimizer steps)."""

    def __init__(self, every_n_steps: int = EVERY_N_STEPS):
        self.requests = SaveRequests(every_n_steps)
        self.last_step = -1
        self.saved_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.last_step = trainer.global_step   # resumed: the steps before it are not this run's

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._report_save()   # a ModelCheckpoint save at the end of the last batch is written by now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self.last_step:   # gradient accumulation: no optimizer step in this batch
            return
        self.last_step = step
        report_step()
        # `due` neither raises nor skips its all-reduce on one rank only: every rank reaches it alike
        if self.requests.due(step, lambda seen: trainer.strategy.reduce_boolean_decision(seen, all=False)):
            try:
                self._save_requested(trainer)
            except Exception:
                pass

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saved_step = trainer.global_step   # reported once the file is written (the next hook)

    def on_train_end(self, trainer, pl_module) -> None:
        self._report_save()

    def _report_save(self) -> None:
        if self.saved_step is not None:
            step, self.saved_step = self.saved_step, None
            report_saved(step)

    def _save_requested(self, trainer) -> None:
        path = requested_path(trainer)
        if path is None:
            return
        trainer.save_checkpoint(path)   # on every rank: Lightning's save is collective
        self.saved_step = None
        report_saved(trainer.global_step)


def requested_path(trainer) -> str | None:
    """Where a requested save goes (see the module's docstring)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath and "{" not in callback.CHECKPOINT_NAME_LAST:
            name = f"{callback.CHECKPOINT_NAME_LAST}-{REQUESTED_NAME}{callback.FILE_EXTENSION}"
            return os.path.join(str(callback.dirpath), name)
    connector = getattr(trainer, "_checkpoint_connector", None)
    hpc_save_path = getattr(connector, "hpc_save_path", None)
    return hpc_save_path(trainer.default_root_dir) if callable(hpc_save_path) else None
