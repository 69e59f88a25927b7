"""Optimizer steps as training steps, for a program that does not call `trainctl.progress`.

In a watched training step, rank-exec puts `trainctl/bootstrap` first on the rank's PYTHONPATH.
Python imports the `sitecustomize` module there at startup (the `site` module's documented
hook: https://docs.python.org/3/library/site.html), before the program's first line; it calls
`install()`, takes its folder off sys.path again and runs the `sitecustomize` that it shadows,
if the program's Python has one.
The program's `__main__`, `sys.argv`, warnings filters and imports are left as they are: torch
is not imported here. The hook is registered when the program itself first imports
`torch.optim.optimizer` (which `import torch` does), with torch's global optimizer step hook
(`torch.optim.optimizer.register_optimizer_step_post_hook`): every `optimizer.step()` of every
optimizer then counts as one training step (`trainctl.progress`), until the program calls
`progress.step()` itself: its own steps win from then on.

Caveats, as the docs say: a program that steps two optimizers per iteration counts two steps
(the watch judges step time relative to the job itself, so it still sees slowdowns); a step
skipped by a GradScaler (inf gradients) counts nothing; `python -E`/`-I` ignore PYTHONPATH, so
no step is seen there; and the program's Python must be able to import trainctl (as for the
progress API), else nothing is installed and the program runs as it would without trainctl.
"""

from __future__ import annotations

import importlib.machinery
import sys
from types import ModuleType

from trainctl import progress

OPTIMIZER_MODULE = "torch.optim.optimizer"
AUTO_STEPS_ENV = "TRAINCTL_AUTO_STEPS"    # "0" turns the hook off for one job (rank-exec reads it)


def install() -> bool:
    """Count optimizer steps from the moment the program imports torch's optimizers; True when
    the hook is registered or will be. Nothing outside a watched step (no progress socket), nor
    in a process the rank's program started (`progress.OWNER_ENV`)."""
    reporter = progress._REPORTER
    if reporter is None or not reporter.rank_process:
        return False    # not a watched step, or a process the rank started (a data loader worker)
    module = sys.modules.get(OPTIMIZER_MODULE)
    if module is not None:
        return _register(module, reporter)
    sys.meta_path.insert(0, _RegisterOnImport(reporter))
    return True


def _register(module: ModuleType, reporter: object) -> bool:
    try:
        module.register_optimizer_step_post_hook(progress._optimizer_step_hook(reporter))
        return True
    except Exception:   # a torch without global optimizer hooks: no step is seen, nothing breaks
        return False


class _RegisterOnImport:
    """A meta path finder that finds nothing itself: when torch.optim.optimizer is about to be
    imported, it lets the path finder find it as usual and registers the hook once the module
    has run. It removes itself at that point, so later imports pay nothing."""

    def __init__(self, reporter: object):
        self.reporter = reporter

    def find_spec(self, name: str, path: object = None, target: object = None):
        if name != OPTIMIZER_MODULE:
            return None
        try:
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            spec.loader = _RegisteringLoader(spec.loader, self.reporter)
            return spec
        except Exception:
            return None     # the usual finders go on as if this one were not there

    def invalidate_caches(self) -> None:
        pass


class _RegisteringLoader:
    def __init__(self, loader: object, reporter: object):
        self.loader = loader
        self.reporter = reporter

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the module keeps its own loader, as if it had been imported without this one
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _register(module, self.reporter)
