"""Files that readers may open at any moment: written whole or not at all; and never at the cost
of something that is not a file of ours.

Every file trainctl writes for a reader (reports, node_exporter's textfile, the gate directory,
the slurm-hook's state) goes through `write_atomically`. Files that anyone else may have put in
place (the job directory's, journals handed to fleet memory) are read through `open_regular`
and `read_bytes`: a regular file only, never blocking, at most so many bytes. Where a program
may have put a FIFO or a link in place of a file trainctl writes itself, it is appended to
through `open_append_regular` (the journal), replaced through `replace_in` (the watch's
requests), or written through `write_regular` (the gate's and the agents' files in the job
directory): never written into, never waited on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from trainctl.errors import UsageError


def inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path`, symlinks resolved, lies in `root` (symlinks resolved)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def open_regular(path: str | os.PathLike, root: str | os.PathLike | None = None) -> int | None:
    """A read-only descriptor of `path` when it is a regular file (inside `root`, when given);
    None when it is missing or anything else. It never blocks: a FIFO is never opened, and the
    open is non-blocking for one swapped in meanwhile. Other errors (EACCES) are raised."""
    try:
        found = os.lstat(path)
        if stat.S_ISLNK(found.st_mode):
            if root is not None and not inside(path, root):
                return None
            found = os.stat(path)
        elif root is not None and os.path.dirname(path) != str(root).rstrip("/") and not inside(path, root):
            return None    # a folder on the way may be a link (a plain file right in `root` is cheap to tell)
        if not stat.S_ISREG(found.st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_bytes(path: str | os.PathLike, cap: int, *, root: str | os.PathLike | None = None,
               tail: bool = False) -> bytes | None:
    """At most `cap` bytes of a regular file (its last ones with `tail`); None: no such file."""
    fd = open_regular(path, root)
    if fd is None:
        return None
    try:
        if tail:
            os.lseek(fd, max(0, os.fstat(fd).st_size - cap), os.SEEK_SET)
        return read_fd(fd, cap)
    finally:
        os.close(fd)


def read_fd(fd: int, cap: int) -> bytes:
    """At most `cap` bytes from `fd`, from where it stands to its end."""
    chunks, left = [], cap
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class NotRegularFile(OSError):
    """A name that holds something other than a regular file (a FIFO, a device, a directory)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(errno.EINVAL, "not a regular file", str(path))


def open_append_regular(path: str | os.PathLike) -> int:
    """A descriptor appending to the regular file `path` (made when missing). It never blocks: a
    FIFO is opened non-blocking (with no reader that fails, with one it is refused), so nothing is
    written into it. NotRegularFile or another OSError where it cannot be."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:   # a FIFO no one reads (or a socket)
            raise NotRegularFile(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile(path)
    return fd


def open_directory(path: str | os.PathLike) -> int:
    """A descriptor of the directory `path` itself: never through a symlink (ELOOP), never blocking
    (O_DIRECTORY fails on a FIFO before opening it: ENOTDIR). Work done through it with `dir_fd`
    stays in that directory whatever is renamed meanwhile."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def replace_in(directory_fd: int, name: str, text: str, mode: int = 0o600) -> None:
    """`text` at `name` in the directory `directory_fd`, whole or not at all: a new file (O_EXCL,
    O_NOFOLLOW) renamed over the name. The rename replaces whatever entry is there, a symlink or a
    FIFO too, without following or opening it, so nothing blocks and nothing outside is written.
    OSError where it cannot be (a full disk; a directory at `name`)."""
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):   # left by a process of ours with this pid, killed
            os.unlink(tmp, dir_fd=directory_fd)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                      dir_fd=directory_fd)
        with os.fdopen(out, "w") as handle:
            os.fchmod(out, mode)       # whatever the umask
            handle.write(text)
        os.replace(tmp, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory_fd)
        raise


def write_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path`: whole or not at all where `path` is a file, straight in where it is not.

    - A regular file, or nothing yet: a temporary file beside it, renamed over it. A reader
      (node_exporter, `gate decide` while a slow node still writes, a web server) sees the old
      file or the new one, never half of one.
    - A symlink: the same, at the file it points to; the link itself stays.
    - A device, FIFO or terminal (`/dev/null`, `/dev/stdout`, a named pipe a reader waits on),
      directly or through symlinks: written into, like a shell's `>`. A rename would replace the
      device node or the link (as root, `/dev/null` or the system's `/dev/stdout`) with a file.
    - A directory: refused.
    """
    target = Path(path)
    try:
        found = os.stat(target)   # follows symlinks, /proc/self/fd/N included
    except FileNotFoundError:
        found = None
    except OSError as exc:       # a parent that is a file, a loop of links, no permission
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    if found is None or stat.S_ISREG(found.st_mode):
        real = Path(os.path.realpath(target))
        if found is not None and not _same_file(real, found):
            # /proc/self/fd/1 when stdout is a deleted file: a name that is no path; write through it
            _write_into(target, text)
            return
        _replace(real, text, shown=target)
    elif stat.S_ISDIR(found.st_mode):
        raise UsageError(f"cannot write {target}: it is a directory")
    else:
        _write_into(target, text)


def write_regular(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` whole or not at all, where `path` is a regular file or nothing yet:
    a file of trainctl's own in a directory others can write to (the job directory's). Anything
    else at `path` (a FIFO, a device, a directory, a symlink) is refused with one line
    (UsageError), never opened, followed or replaced: the writer says so and goes on."""
    target = Path(path)
    try:
        found = os.lstat(target)
    except FileNotFoundError:
        found = None
    except OSError as exc:       # a parent that is a file, no permission
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise UsageError(f"cannot write {target}: not a regular file")
    _replace(target, text, shown=target)


def write_in_root_directory(path: str | os.PathLike, text: str, mode: int = 0o644) -> None:
    """As root, `text` at `path` whole (`replace_in`), only where its directory is root's and no
    one else can write it: elsewhere a user could have put a symlink or a hard link at the name, or
    swap the directory, and root would write where the user chose. UsageError, one line, else."""
    target = Path(path)
    try:
        fd = open_directory(target.parent)     # the directory itself, never through a symlink
    except OSError as exc:
        raise UsageError(f"cannot write {target}: its directory {target.parent}: {exc.strerror or exc}") from exc
    try:
        found = os.fstat(fd)
        if found.st_uid != 0 or found.st_mode & 0o022:
            raise UsageError(f"{target} not written: its directory {target.parent} is uid {found.st_uid}'s, mode "
                             f"{stat.S_IMODE(found.st_mode):o}; as root trainctl writes only into a directory of "
                             "root's that no other user can write")
        replace_in(fd, target.name, text, mode)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _same_file(path: Path, found: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(path), found)
    except OSError:
        return False


def _write_into(target: Path, text: str) -> None:
    """Into an existing device, FIFO or file, without creating or replacing anything (a FIFO's
    open waits for its reader, as a shell's `>` does)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOCTTY)
    except OSError as exc:  # a socket (ENXIO), a device that refuses writes
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    except OSError as exc:  # /dev/full, a FIFO whose reader left (EPIPE)
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc


def _replace(real: Path, text: str, *, shown: Path) -> None:
    import tempfile   # here: the readers above are on `job show`'s path, which writes nothing

    if real.parent.exists() and not real.parent.is_dir():
        raise UsageError(f"cannot write {shown}: {real.parent} is not a directory")
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    except OSError as exc:  # a read-only or missing place is the caller's bad input, not a crash
        raise UsageError(f"cannot write {shown}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, real)
    except OSError as exc:  # the disk filled up; a directory appeared in its place meanwhile
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {shown}: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
