"""Hugging Face Transformers: a TrainerCallback that reports optimizer steps and saves to trainctl,
and asks the Trainer for a save when trainctl's watch wants a checkpoint.

    from trainctl.integrations.transformers import TrainctlCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainctlCallback()])

`on_step_end` runs once per optimizer step on every process; setting `control.should_save` there
makes the Trainer save a checkpoint (`checkpoint-<step>` in `output_dir`) right after it, as its
own save steps do, and `on_save` follows the save (transformers, trainer_callback.py:
TrainerControl.should_save, DefaultFlowCallback; trainer.py: `_maybe_log_save_evaluate`).
`trainer.train(resume_from_checkpoint=True)` resumes from the newest one.
"""

from __future__ import annotations

from transformers import TrainerCallback

from trainctl.integrations.shared import EVERY_N_STEPS, SaveRequests, report_saved, report_step


class TrainctlCallback(TrainerCallback):
    """Steps, saves, and a save when the watch asks (agreed by all ranks every `every_n_steps` steps)."""

    def __init__(self, every_n_steps: int = EVERY_N_STEPS):
        self.requests = SaveRequests(every_n_steps)

    def on_step_end(self, args, state, control, **kwargs):
        report_step()
        # `due` neither raises nor skips its all-reduce on one rank only: every rank reaches it alike
        if self.requests.due(state.global_step, lambda seen: any_rank(seen, args.device)):
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        report_saved(state.global_step)


def any_rank(flag: bool, device) -> bool:
    """True where some process of the default process group says True (the flag alone without one)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    tensor = torch.tensor([int(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())
