"""The watch's checkpoint requests, as the rank sees them.

When the watch wants a checkpoint, the supervisor writes a request into the watch folder, each
node agent copies its token beside its socket (`wire.request_path`, node-local, so ranks never poll
the shared filesystem), and a program that asks (`trainctl.progress.checkpoint_requested`) sees
it. A program that asks is a listener: it says so once, in the watch folder, and the supervisor
then sends it no signal (a signal is what Lightning takes for "requeue the job").

The request file is read only when it is a regular file of the job's own user, never through a
link, never blocking: one another user made is no request.
"""

import os
import stat
import time

from .wire import LISTENING_FILE, REQUEST_SUFFIX, SOCKET_ENV, WATCH_DIR_ENV

POLL_S = 0.25                        # a rank looks at the request file at most this often
TOKEN_MAX_BYTES = 200


class RequestReader:
    def __init__(self, path: str, watch_dir: str | None):
        self.path = path
        self.watch_dir = watch_dir
        self.next_look = 0.0
        self.stamp: tuple[int, int] | None = None
        self.token = ""
        self.announced = False

    def requested(self) -> bool:
        if not self.announced:
            self.announced = True
            self._announce()
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + POLL_S
        try:
            seen = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        stamp = (seen.st_ino, seen.st_mtime_ns)
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        token = read_token(self.path)
        if not token or token == self.token:
            return False
        self.token = token
        return True

    def _announce(self) -> None:
        if not self.watch_dir:
            return
        try:   # no listener file: the supervisor signals as before
            fd = os.open(os.path.join(self.watch_dir, LISTENING_FILE),
                         os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            os.close(fd)
        except OSError:
            pass


def read_token(path: str) -> str:
    """The file's first line, where it is a regular file of this user (else "")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
            return ""
        return os.read(fd, TOKEN_MAX_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def reader_from_env(environ) -> RequestReader | None:
    path = environ.get(SOCKET_ENV)
    return RequestReader(path + REQUEST_SUFFIX, environ.get(WATCH_DIR_ENV)) if path else None
