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

A requested save goes only where the program keeps its own checkpoints, where `fit(ckpt_path="last")`
finds it: `last-trainctl.ckpt` in the folder of the first ModelCheckpoint that saves anything
(Lightning resumes from the newest file whose name starts with its CHECKPOINT_NAME_LAST, "last":
ModelCheckpoint._find_last_checkpoints). A Trainer without one (`enable_checkpointing=False`) keeps
no checkpoints, and gets no save on request: the callback says so once. It never saves Lightning's
"hpc" checkpoint (`hpc_ckpt_N.ckpt` in `default_root_dir`): under Slurm, any later `fit()` without
a `ckpt_path` in that folder resumes from the newest such file by itself
(trainer/connectors/checkpoint_connector.py: `_parse_ckpt_path` picks "hpc" where
`SLURMEnvironment.detect()` and `_hpc_resume_path` finds one), so a save there would change what a
later, unrelated run starts from.

Outside a step that trainctl's watch watches, the callback does nothing (shared.watched_job), but
report the program's own saves in a step trainctl runs (shared.reports_saves).
"""

from __future__ import annotations

import os

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError:   # the older package name of the same code
    from pytorch_lightning import Callback
    from pytorch_lightning.callbacks import ModelCheckpoint

from trainctl.integrations.shared import (EVERY_N_STEPS, Notice, SaveRequests, no_place, report_saved,
                                          report_step, reports_saves, watched_job)

REQUESTED_NAME = "trainctl"     # last-trainctl.ckpt
NO_CHECKPOINTS = "the Trainer has no ModelCheckpoint that saves into a folder"


class TrainctlCallback(Callback):
    """Steps (one per optimizer step), saves (Lightning's), and a save when the watch asks for one
    (agreed by all ranks every `every_n_steps` optimizer steps)."""

    def __init__(self, every_n_steps: int = EVERY_N_STEPS):
        # what the environment says, read once: every rank of a step gets the same one
        self.requests = SaveRequests(every_n_steps) if watched_job() else None
        self.reports_saves = reports_saves()
        self.notice = Notice()
        self.last_step = -1
        self.saved_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        try:
            self.last_step = trainer.global_step   # resumed: the steps before it are not this run's
        except Exception:
            pass

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._report_save()   # a ModelCheckpoint save at the end of the last batch is written by now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.requests is None:
            return
        try:
            step = trainer.global_step
        except Exception:
            return
        if step == self.last_step:   # gradient accumulation: no optimizer step in this batch
            return
        self.last_step = step
        report_step()
        # `due` neither raises nor skips its all-reduce on one rank only: every rank reaches it alike
        if self.requests.due(step, lambda seen: trainer.strategy.reduce_boolean_decision(seen, all=False)):
            self._save_requested(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if not self.reports_saves:
            return
        try:
            self.saved_step = trainer.global_step   # reported once the file is written (the next hook)
        except Exception:
            pass

    def on_train_end(self, trainer, pl_module) -> None:
        self._report_save()

    def _report_save(self) -> None:
        if self.saved_step is not None:
            step, self.saved_step = self.saved_step, None
            report_saved(step)

    def _save_requested(self, trainer) -> None:
        """On every rank alike: the place is the program's own, the same on all of them."""
        try:
            path = requested_path(trainer)
        except Exception:
            path = None
        if path is None:
            self.notice.say(no_place("lightning", NO_CHECKPOINTS))
            return
        try:
            trainer.save_checkpoint(path)   # on every rank: Lightning's save is collective
            step = trainer.global_step
        except Exception:
            return
        self.saved_step = None
        report_saved(step)


def requested_path(trainer) -> str | None:
    """Where a requested save goes: beside the files of the first ModelCheckpoint that saves into a
    folder; None where there is none (see the module's docstring)."""
    for callback in getattr(trainer, "checkpoint_callbacks", None) or ():
        if not isinstance(callback, ModelCheckpoint) or not callback.dirpath:
            continue
        if "{" in callback.CHECKPOINT_NAME_LAST:   # formatted: fit(ckpt_path="last") might not find ours
            continue
        if callback.save_top_k == 0 and not callback.save_last:   # it saves nothing
            continue
        name = f"{callback.CHECKPOINT_NAME_LAST}-{REQUESTED_NAME}{callback.FILE_EXTENSION}"
        return os.path.join(str(callback.dirpath), name)
    return None
