"""Optimizer steps as training steps, for a program that does not call `trainctl.progress`.

The bootstrap (`bootstrap/sitecustomize.py`) calls `install` once the program itself has imported
a module trainctl hooks (`INSTALLERS`: this one and `save_hooks`'). For `torch.optim.optimizer`, torch's global optimizer step hook
(`torch.optim.optimizer.register_optimizer_step_post_hook`) then counts every `optimizer.step()`
of every optimizer as one training step, until the program calls `progress.step()` itself (its own
steps win from then on). The rank is claimed at the first step (`reporter`), so a process that
imports torch and never steps an optimizer (a data loader or compile worker) claims nothing.

Caveats: a program that steps two optimizers per iteration counts two steps (the watch judges
step time relative to the job itself, so it still sees slowdowns); a step skipped by a GradScaler
(inf gradients) counts nothing.
"""

from .rank import the_rank
from .save_hooks import INSTALLERS as SAVE_INSTALLERS


def after_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    try:
        reporter = the_rank()
        if reporter is not None and not reporter.own_steps:
            reporter.step()
    except Exception:   # never into the program
        pass


# torch.compile's Dynamo runs a function with this mark as it is instead of tracing into it
# (torch._dynamo.eval_frame, DisableContext): the hook's clock calls make no graph-break warning.
after_optimizer_step._torchdynamo_disable = True


def install_step_hook(optimizer_module) -> None:
    optimizer_module.register_optimizer_step_post_hook(after_optimizer_step)


# Each module the bootstrap waits for (its _TARGETS), and what hooks it once it has run.
INSTALLERS = {"torch.optim.optimizer": install_step_hook, **SAVE_INSTALLERS}


def install(name: str, module) -> None:
    INSTALLERS[name](module)
