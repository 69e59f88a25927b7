"""The node's directory for a job's own files: `$TMPDIR/trainctl-UID` (/tmp without TMPDIR), which
only the job's user can enter.

A fixed name in a shared /tmp is anyone's to take first: another user could bind the agent's
socket path before the agent, or put a file or a FIFO where the agent writes the watch's
checkpoint requests. So every per-job file on a node lives in this directory. It is made with
mode 0700 and checked on every use, as tmux checks /tmp/tmux-UID: lstat, a real directory (not a
link), owned by the effective uid, no group or other permission bits. One that fails is refused,
never repaired: whoever put it there may have put files in it too. Inside Slurm's job-private
/tmp (job_container/tmpfs) the same rule holds unchanged.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from trainctl.errors import UsageError
from trainctl.files import open_directory, replace_in

FALLBACK_BASE = "/tmp"
PRIVATE_MODE = 0o700
REMOVE = "remove it (another user may have put it there)"


class UnsafeDir(UsageError):
    """The private directory is not the user's alone, or cannot be made: one line naming the
    path, what is wrong and what to do."""


def base_dir(environ: Mapping[str, str]) -> str:
    return environ.get("TMPDIR") or FALLBACK_BASE


def private_dir_path(base: str, uid: int) -> str:
    return os.path.join(base, f"trainctl-{uid}")


_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def problem(found: os.stat_result, uid: int) -> str | None:
    """What makes a directory entry unfit to hold a job's files (pure); None when it is fit."""
    mode = found.st_mode
    if stat.S_ISLNK(mode):
        return "is a symbolic link, not a directory"
    if not stat.S_ISDIR(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a directory")
        return f"is {kind}, not a directory"
    if found.st_uid != uid:
        return f"belongs to uid {found.st_uid}, not to uid {uid} (this job's user)"
    if stat.S_IMODE(mode) & 0o077:
        return f"has mode {stat.S_IMODE(mode):04o}: group or others may enter it (it must be 0700)"
    return None


def ensure(path: str, uid: int | None = None) -> None:
    """Make `path` (mode 0700) unless it is there, then check it; UnsafeDir when it is unfit."""
    uid = os.geteuid() if uid is None else uid
    try:
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        pass
    except OSError as exc:   # TMPDIR missing, read-only or not ours to write
        raise UnsafeDir(f"{path} cannot be made: {exc.strerror or exc}: set TMPDIR to a directory you can "
                        "write") from None
    try:
        found = os.lstat(path)
    except OSError as exc:   # removed again meanwhile: only its owner or root can, in a sticky /tmp
        raise UnsafeDir(f"{path} went away as it was made ({exc.strerror or exc}): start the step again") from None
    wrong = problem(found, uid)
    if wrong:
        raise UnsafeDir(f"{path} {wrong}: {REMOVE}")


def open_checked(path: str, uid: int | None = None) -> int:
    """A descriptor of the directory `path`, checked through that descriptor (so the check and
    what is done through it concern the same directory); UnsafeDir when it is unfit. Never
    follows a link nor blocks (`trainctl.files.open_directory`)."""
    uid = os.geteuid() if uid is None else uid
    try:
        fd = open_directory(path)
    except OSError as exc:   # a link (ELOOP), not a directory (ENOTDIR), gone (ENOENT)
        try:
            wrong = problem(os.lstat(path), uid)
        except OSError:
            wrong = None
        raise UnsafeDir(f"{path} {wrong}: {REMOVE}" if wrong
                        else f"{path} cannot be opened: {exc.strerror or exc}") from None
    wrong = problem(os.fstat(fd), uid)
    if wrong:
        os.close(fd)
        raise UnsafeDir(f"{path} {wrong}: {REMOVE}")
    return fd


def write_file(directory: str, name: str, text: str) -> None:
    """`text` into `directory`/`name`, whole or not at all, only when `directory` is fit
    (`trainctl.files.replace_in`: a link or a FIFO at `name` is replaced, never followed or opened)."""
    fd = open_checked(directory)
    try:
        replace_in(fd, name, text)
    except OSError as exc:   # the disk filled up; a directory stands at `name`
        raise UsageError(f"cannot write {os.path.join(directory, name)}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
