"""trainctl's bootstrap for a watched training rank (`trainctl.autostep`): Python's `site`
imports it at startup because rank-exec put its folder first on PYTHONPATH. It installs the
optimizer step hook (in a Python that can import trainctl), takes its folder off sys.path, and
runs the sitecustomize it shadows, if there is one, as `site` would have. Standard library only
besides trainctl, so it runs under any Python the program uses."""

import importlib.machinery
import importlib.util
import os
import sys

try:
    from trainctl import autostep as _autostep
    _autostep.install()
except Exception:
    pass

_own_dir = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [_entry for _entry in sys.path if _entry != _own_dir]
_shadowed = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
if _shadowed is not None and _shadowed.loader is not None:
    # the import of this module then yields that one (importlib takes sys.modules' entry)
    _module = importlib.util.module_from_spec(_shadowed)
    sys.modules["sitecustomize"] = _module
    _shadowed.loader.exec_module(_module)
