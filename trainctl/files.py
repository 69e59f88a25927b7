"""Files that readers may open at any moment: written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainctl.errors import UsageError


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`.

    A reader (node_exporter, `gate decide` while a slow node still writes, a web server)
    sees the old file or the new one, never half of one.
    """
    target = Path(path)
    if target.parent.exists() and not target.parent.is_dir():
        raise UsageError(f"cannot write {target}: {target.parent} is not a directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:  # a read-only or missing place is the caller's bad input, not a crash
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:  # the disk filled up, say
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
