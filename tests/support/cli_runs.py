"""Run trainctl's `main` in this process and capture what it prints (a subprocess costs ~0.5 s)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_main(*args, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
             ssh_timeout_s: float | None = None) -> Ran:
    """`trainctl ARGS` in this process with `env` added to the environment, in `cwd` (default: the repo)."""
    import trainctl.ssh
    from trainctl.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_timeout = dict(os.environ), os.getcwd(), trainctl.ssh.SSH_CONNECT_TIMEOUT_S
    # a command may set signal dispositions for its process (`gate node` ignores SIGUSR1/SIGUSR2);
    # an ignored one would outlive the call and pass to every process the tests start after it
    saved_signals = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR1, signal.SIGUSR2)}
    os.environ.update(env or {})
    os.chdir(cwd or REPO)
    if ssh_timeout_s is not None:
        trainctl.ssh.SSH_CONNECT_TIMEOUT_S = ssh_timeout_s
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(arg) for arg in args])
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        trainctl.ssh.SSH_CONNECT_TIMEOUT_S = saved_timeout
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
    return Ran(code, out.getvalue(), err.getvalue())
