"""Hugging Face Transformers: a TrainerCallback that reports optimizer steps and saves to trainctl,
and asks the Trainer for a save when trainctl's watch wants a checkpoint.

    from trainctl.integrations.transformers import TrainctlCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainctlCallback()])

`on_step_end` runs once per optimizer step on every process; setting `control.should_save` there
makes the Trainer save a checkpoint (`checkpoint-<step>` in `output_dir`) right after it, as its
own save steps do, and `on_save` follows the save (transformers, trainer_callback.py:
TrainerControl.should_save, DefaultFlowCallback; trainer.py: `_maybe_log_save_evaluate`).
`trainer.train(resume_from_checkpoint=True)` resumes from the newest one.

That is the program's own place only where it keeps checkpoints. With `save_strategy="no"` it
keeps none, yet the Trainer still saves on `control.should_save` whatever the strategy
(trainer.py, `_maybe_log_save_evaluate`: `if self.control.should_save: self._save_checkpoint(...)`;
only DefaultFlowCallback looks at the strategy, to decide when to set it). So such a program gets
no save on request: the callback says so once.

Outside a step that trainctl's watch watches, the callback does nothing (shared.watched_job), but
report the program's own saves in a step trainctl runs (shared.reports_saves).
"""

from __future__ import annotations

from transformers import TrainerCallback

from trainctl.integrations.shared import (EVERY_N_STEPS, Notice, SaveRequests, no_place, report_saved,
                                          report_step, reports_saves, watched_job)

NO_CHECKPOINTS = 'TrainingArguments(save_strategy="no")'


class TrainctlCallback(TrainerCallback):
    """Steps, saves, and a save when the watch asks (agreed by all ranks every `every_n_steps` steps)."""

    def __init__(self, every_n_steps: int = EVERY_N_STEPS):
        # what the environment says, read once: every rank of a step gets the same one
        self.requests = SaveRequests(every_n_steps) if watched_job() else None
        self.reports_saves = reports_saves()
        self.notice = Notice()

    def on_step_end(self, args, state, control, **kwargs):
        if self.requests is None:
            return
        try:
            step = state.global_step
        except Exception:
            return
        report_step()
        # `due` neither raises nor skips its all-reduce on one rank only: every rank reaches it alike
        if not self.requests.due(step, lambda seen: any_rank(seen, args.device)):
            return
        try:
            if keeps_checkpoints(args):
                control.should_save = True
            else:
                self.notice.say(no_place("transformers", NO_CHECKPOINTS))
        except Exception:
            pass

    def on_save(self, args, state, control, **kwargs):
        if not self.reports_saves:
            return
        try:
            step = state.global_step
        except Exception:
            return
        report_saved(step)


def keeps_checkpoints(args) -> bool:
    """Whether the Trainer saves checkpoints of its own (into `output_dir/checkpoint-<step>`)."""
    strategy = getattr(args, "save_strategy", "no")
    return str(getattr(strategy, "value", strategy)) != "no"


def any_rank(flag: bool, device) -> bool:
    """True where some process of the default process group says True (the flag alone without one)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())
