"""Run external commands as argv lists, always with a timeout, never through a shell.

`run` never raises for a failing, hung or missing command: it returns a `ProcResult`
that says what happened, because health probes record failures as data. `run_checked`
is for callers where a failure is an error (it raises `ExternalCommandError`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from trainctl.errors import ExternalCommandError

STDERR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class ProcResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when the command never ran or was killed on timeout
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    missing: bool = False  # the binary was not found on PATH
    timeout_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.missing

    def describe_failure(self) -> str:
        """One line saying why this command did not succeed."""
        name = self.argv[0]
        if self.missing:
            return self.stderr  # names the binary and the PATH searched
        if self.timed_out:
            return f"{name}: timed out after {self.timeout_s:g} s"
        tail = self.stderr.strip().splitlines()[-1:] or self.stdout.strip().splitlines()[-1:]
        detail = f": {tail[0]}" if tail else ""
        return f"{name} exited with status {self.returncode}{detail}"


def resolve(binary: str, path: str | None = None) -> str | None:
    """Absolute path of `binary` on PATH (or as given, if it contains a slash)."""
    return shutil.which(binary, path=path)


def run(argv: list[str] | tuple[str, ...], *, timeout: float, env: dict[str, str] | None = None,
        input_text: str | None = None, cwd: str | None = None) -> ProcResult:
    """Run `argv` with a hard timeout; on timeout the whole process group is killed."""
    argv = tuple(str(a) for a in argv)
    search_path = (env or os.environ).get("PATH")
    if resolve(argv[0], search_path) is None:
        return ProcResult(argv, None, "", f"{argv[0]}: not found on PATH={search_path}", 0.0,
                          missing=True, timeout_s=timeout)
    start = time.monotonic()
    # A new session makes the command its own process group, so a timeout kills the
    # grandchildren too (a hung nvidia-smi behind a wrapper script, say).
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return ProcResult(argv, None, out, err[-STDERR_TAIL_CHARS:], time.monotonic() - start,
                          timed_out=True, timeout_s=timeout)
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    return ProcResult(argv, proc.returncode, out, err, time.monotonic() - start, timeout_s=timeout)


def run_checked(argv: list[str] | tuple[str, ...], *, timeout: float, **kwargs) -> ProcResult:
    """Like `run`, but a missing binary, a timeout or a non-zero exit raises."""
    result = run(argv, timeout=timeout, **kwargs)
    if not result.ok:
        hint = None
        if result.missing:
            hint = f"PATH={(kwargs.get('env') or os.environ).get('PATH')}"
        raise ExternalCommandError(result.describe_failure(), hint=hint)
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class StreamedRun:
    """An argv run with a hard deadline whose stdout is read line by line as it comes.

    Like `run` (own process group, killed whole at the deadline, never a shell), but the
    caller reads stdout as it comes: a sweep commits each node's result the moment it arrives.
    """

    def __init__(self, argv: list[str], deadline_s: float, env: dict[str, str] | None):
        self.argv = argv
        self.deadline_s = deadline_s
        self.env = env
        self.timed_out = False
        self._stderr: list[str] = []

    def __enter__(self) -> StreamedRun:
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=self.env, text=True, errors="replace",
                                          start_new_session=True)
        except OSError as exc:
            self._proc = None
            self._start_error = f"{self.argv[0]}: {exc.strerror}"
            return self
        self._timer = threading.Timer(self.deadline_s, self._expire)
        self._timer.daemon = True
        self._timer.start()
        self._stderr_reader = threading.Thread(target=lambda: self._stderr.extend(self._proc.stderr),
                                               daemon=True)
        self._stderr_reader.start()
        return self

    def lines(self) -> Iterator[str]:
        if self._proc is not None:
            yield from self._proc.stdout

    def _expire(self) -> None:
        self.timed_out = True
        self._kill()

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    @property
    def failed(self) -> bool:
        return self._proc is None or self._proc.returncode != 0

    def failure(self) -> str:
        if self._proc is None:
            return self._start_error
        tail = "".join(self._stderr).strip()[-STDERR_TAIL_CHARS:]
        return f"{self.argv[0]} exited with status {self._proc.returncode}" + (f": {tail}" if tail else "")

    def __exit__(self, *exc_info: object) -> None:
        if self._proc is None:
            return
        if exc_info[0] is not None:  # the consumer stopped early (Ctrl-C): take srun down too
            self._kill()
        self._proc.wait()
        self._timer.cancel()
        self._stderr_reader.join(timeout=5)
