"""trainctl's bootstrap for a watched training rank: Python's `site` imports this module at
start-up because rank-exec put its folder first on PYTHONPATH (the documented hook:
https://docs.python.org/3/library/site.html).

At start-up it imports nothing: it takes its folder off sys.path (so nothing of it stands before
the program's own directory), and in a watched step (TRAINCTL_PROGRESS_SOCKET set) puts one
finder first on sys.meta_path that waits for the program to import the modules trainctl hooks:
`torch.optim.optimizer` (its steps) and the modules that save (`trainctl.guest.save_hooks`). After
such a module has run, before the import returns it to the program, the finder loads the guest
room's modules under their dotted names `trainctl.guest.*` (no `trainctl`, no other top-level name:
a program's own `trainctl` module stays its own) and installs that module's hook
(`trainctl.guest.hook.install`). It takes itself off once every module it waits for has been
imported. A process that never imports them pays for one set lookup per import.

Last, it runs the `sitecustomize` it shadows, if the program's Python has one, as `site` would
have; where there is none it leaves no `sitecustomize` module behind, as Python does without one.
"""

import os
import sys

_machinery = sys.modules["_frozen_importlib_external"]   # importlib's own, loaded before site runs
_bootstrap = sys.modules["_frozen_importlib"]
_HERE = os.path.dirname(os.path.abspath(__file__))
_GUEST = os.path.dirname(_HERE)
_PACKAGE = "trainctl.guest"
# The modules hooked when the program imports them (trainctl.guest.hook.INSTALLERS' names).
_TARGETS = frozenset(("torch.optim.optimizer", "torch.serialization", "torch.distributed.checkpoint.filesystem",
                      "safetensors.torch", "lightning.fabric.utilities.cloud_io",
                      "lightning_fabric.utilities.cloud_io"))
# In the order they import each other: each module's relative imports find the ones before it.
_ROOM = ("wire", "warn", "reporter", "activity", "requests", "signal_judge", "rank", "save_hooks", "hook")


def _load_room():
    """The guest room's modules, reused when the program imported trainctl itself first."""
    for name in _ROOM:
        full = f"{_PACKAGE}.{name}"
        if full in sys.modules:
            continue
        spec = _machinery.spec_from_file_location(full, os.path.join(_GUEST, name + ".py"))
        module = _bootstrap.module_from_spec(spec)
        sys.modules[full] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[full]
            raise
    return sys.modules[f"{_PACKAGE}.hook"]


class _HookAtImport:
    """Finds nothing itself: when a module it waits for is about to be imported, it lets the path
    finder find it as usual and installs that module's hook once the module has run."""

    def __init__(self):
        self.waiting = set(_TARGETS)

    def find_spec(self, name, path=None, target=None):
        if name not in self.waiting:
            return None
        self.waiting.discard(name)
        if not self.waiting:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _HookingLoader(spec.loader)
        return spec


class _HookingLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # the module keeps its own loader, as if it had been imported without this one
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            _load_room().install(module.__name__, module)
        except Exception as exc:   # never into the program: it runs as it would without trainctl
            import _warnings
            _warnings.warn(f"trainctl: {module.__name__} is not watched in this process ({exc!r})",
                           RuntimeWarning, stacklevel=2)


def _start() -> None:
    sys.path[:] = [entry for entry in sys.path if entry != _HERE]
    if os.environ.get("TRAINCTL_PROGRESS_SOCKET"):   # trainctl.guest.wire.SOCKET_ENV
        sys.meta_path.insert(0, _HookAtImport())
    shadowed = _machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if shadowed is not None and shadowed.loader is not None:
        # the import of this module then yields that one (importlib takes sys.modules' entry)
        module = _bootstrap.module_from_spec(shadowed)
        sys.modules["sitecustomize"] = module
        shadowed.loader.exec_module(module)
    else:
        # What Python's site does when there is no sitecustomize: an ImportError for that name is
        # passed over in silence (site.execsitecustomize), and importlib drops the module again.
        raise ImportError("no sitecustomize besides trainctl's", name="sitecustomize")


if __name__ == "sitecustomize":   # imported by site at start-up, not as trainctl.guest.bootstrap's module
    _start()
