"""The program's saves, seen with no code of its own: each save is told to the node's agent when it
completes, with its path, as the rank's steps are (`reporter.Reporter.saw_save`).

The bootstrap (`bootstrap/sitecustomize.py`) calls an installer here once the program itself has
imported the module that makes a kind of save, right after that module has run and before any
other module takes its names (`from torch.serialization import save`, as torch's own __init__
does; `from safetensors.torch import save_file`, as Transformers does):

- `torch.serialization` (torch.save): a save to a path (str, bytes or os.PathLike); one into a file
  object or a buffer is not a save (Lightning serialises its checkpoint into a BytesIO first);
- `torch.distributed.checkpoint.filesystem`: the file system writer's `finish`, the last act of a
  `torch.distributed.checkpoint` save or async_save on its coordinator, which writes `.metadata`
  (torch/distributed/checkpoint/state_dict_saver.py, `finish_checkpoint`); its path is the
  checkpoint's folder;
- `safetensors.torch` (save_file, and save_model through it);
- `lightning.fabric.utilities.cloud_io` and `lightning_fabric.utilities.cloud_io` (`_atomic_save`,
  which Lightning's and Fabric's TorchCheckpointIO save through, after the BytesIO above).

Torch offers no hook for these (only the optimizer step has one), so each function is replaced by
one that calls it, then reports; it carries the function's name, module, docstring, attributes and
`__wrapped__` (inspect.signature reads the original's). Whatever it raises reaches the program as
it would have; the report after it never raises and never waits (`saw_save`). A save made before
the rank's first step, or by a process that is not the rank's own, is not reported: a save never
claims the rank.
"""

import os

from .rank import claimed_rank

# Indexes into wire.SAVE_APIS
TORCH_SAVE, DISTRIBUTED_CHECKPOINT, SAFETENSORS, LIGHTNING = range(4)
_COPIED = ("__module__", "__name__", "__qualname__", "__doc__")


def seen(api: int, target: object) -> None:
    """Tell the agent that a save of `api` to `target` has completed, where `target` is a path."""
    try:
        reporter = claimed_rank()
        if reporter is None:
            return
        path = as_path(target)
        if path is not None:
            reporter.saw_save(api, path)
    except Exception:   # never into the program
        pass


def as_path(target: object) -> bytes | None:
    """`target` as an absolute path's bytes where it is a path (a URL such as s3://... as written);
    None for anything else (a file object, a buffer)."""
    kind = type(target)
    if kind is not str and kind is not bytes:
        if not isinstance(target, os.PathLike):
            return None
        target = os.fspath(target)
    path = os.fsencode(target)
    return path if b"://" in path else os.path.abspath(path)


def wrapped(original, report):
    """`original`, then `report(args, kwargs)` once it has returned."""
    def call(*args, **kwargs):
        result = original(*args, **kwargs)
        report(args, kwargs)
        return result
    for name in _COPIED:
        try:
            setattr(call, name, getattr(original, name))
        except (AttributeError, TypeError):
            pass
    call.__dict__.update(getattr(original, "__dict__", {}))
    call.__wrapped__ = original
    return call


def argument(args: tuple, kwargs: dict, position: int, name: str) -> object:
    return args[position] if len(args) > position else kwargs.get(name)


def install_torch_save(serialization) -> None:
    serialization.save = wrapped(serialization.save,
                                 lambda args, kwargs: seen(TORCH_SAVE, argument(args, kwargs, 1, "f")))


def install_distributed_checkpoint(filesystem) -> None:
    writer = filesystem._FileSystemWriter
    writer.finish = wrapped(writer.finish,
                            lambda args, kwargs: seen(DISTRIBUTED_CHECKPOINT, getattr(args[0], "path", None)))


def install_safetensors(module) -> None:
    module.save_file = wrapped(module.save_file,
                               lambda args, kwargs: seen(SAFETENSORS, argument(args, kwargs, 1, "filename")))


def install_lightning(cloud_io) -> None:
    cloud_io._atomic_save = wrapped(cloud_io._atomic_save,
                                    lambda args, kwargs: seen(LIGHTNING, argument(args, kwargs, 1, "filepath")))


# The module whose import each installer waits for (the bootstrap's targets).
INSTALLERS = {
    "torch.serialization": install_torch_save,
    "torch.distributed.checkpoint.filesystem": install_distributed_checkpoint,
    "safetensors.torch": install_safetensors,
    "lightning.fabric.utilities.cloud_io": install_lightning,
    "lightning_fabric.utilities.cloud_io": install_lightning,
}
