"""The dev cluster's processes: which binaries it needs, starting a self-daemonizing daemon and
waiting for its pid file, telling our live PIDs from reused ones, and stopping them."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Callable, Iterable

from trainctl.errors import ExternalCommandError, PrivilegeError
from trainctl.proc import resolve, run

CMD_TIMEOUT_S = 15.0
DAEMON_START_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0
LOG_TAIL_LINES = 8
# Daemons live in sbin, which a non-login root shell may not have on PATH.
SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin"
REQUIRED_BINARIES = ("slurmctld", "slurmd", "munged", "sinfo", "scontrol", "ip", "tc",
                     "nsenter", "unshare", "mount", "umount", "hostname")
SSHD_BINARIES = ("sshd", "ssh-keygen")
INSTALL_HINT = "Debian: apt-get install slurm-wlm munge iproute2 util-linux openssh-server"


# ---------------------------------------------------------------- prerequisites

def _which(binary: str) -> str | None:
    return resolve(binary, f"{os.environ.get('PATH', '')}:{SBIN_DIRS}")


def missing_prerequisites(*, need_sshd: bool = False, need_accounting: bool = False) -> list[str]:
    """What keeps a dev cluster from starting here, one sentence each; empty when nothing."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"not root (euid {os.geteuid()}): namespaces, bridges and Slurm "
                        "daemons need root")
    wanted = REQUIRED_BINARIES + (SSHD_BINARIES if need_sshd else ())
    missing = [binary for binary in wanted if _which(binary) is None]
    if missing:
        problems.append(f"not found on PATH or in {SBIN_DIRS}: {', '.join(missing)} ({INSTALL_HINT})")
    if need_accounting:
        from trainctl.devcluster.accounting import ACCOUNTING_BINARIES, ACCOUNTING_INSTALL_HINT

        missing = [binary for binary in ACCOUNTING_BINARIES if _which(binary) is None]
        if missing:
            problems.append(f"accounting needs {', '.join(missing)}, not found on PATH or in {SBIN_DIRS} "
                            f"({ACCOUNTING_INSTALL_HINT})")
    return problems


def check_prerequisites(*, need_sshd: bool = False, need_accounting: bool = False) -> None:
    if os.geteuid() != 0:
        raise PrivilegeError(f"the dev cluster needs root (euid is {os.geteuid()})",
                             hint="it creates network namespaces, a bridge and Slurm daemons")
    problems = missing_prerequisites(need_sshd=need_sshd, need_accounting=need_accounting)
    if problems:
        raise ExternalCommandError("; ".join(problems))


def binary(name: str) -> str:
    """Absolute path (sshd refuses to start from a relative one)."""
    path = _which(name)
    if path is None:
        raise ExternalCommandError(f"{name}: not found on PATH or in {SBIN_DIRS}", hint=INSTALL_HINT)
    return path


# ---------------------------------------------------------------- daemons

def start_daemon(daemon: str, argv: list[str], pid_file: Path, log_tails: Callable[[], str],
                 env: dict[str, str] | None = None) -> int:
    """Run a self-daemonizing `argv` and wait for its pid file to name a live process."""
    result = run(argv, timeout=DAEMON_START_TIMEOUT_S, env=env)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
    while result.ok and time.monotonic() < deadline:
        pid = read_pid(pid_file)
        if pid is not None and pid_alive(pid):
            return pid
        time.sleep(0.02)
    why = result.describe_failure() if not result.ok else f"no live pid in {pid_file}"
    raise ExternalCommandError(f"dev cluster: {daemon} did not start: {why}\n{log_tails()}")


def daemon_pids(run_dir: Path, base: Path) -> dict[str, int | None]:
    """{pid file stem: PID} for every pid file in `run_dir`, None where that daemon is not running.

    A PID counts only while it is alive and its command line names a file in `base`.
    """
    pids = {}
    for pid_file in sorted(run_dir.glob("*.pid")):
        pid = read_pid(pid_file)
        alive = pid is not None and pid_alive(pid) and pid_runs_from(pid, base)
        pids[pid_file.stem] = pid if alive else None
    return pids


def pid_alive(pid: int) -> bool:
    """Zombies count as dead: PID 1 here may reap late, and kill -0 still succeeds on them."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = re.search(r"^State:\s*(\S)", status, re.MULTILINE)
    return bool(state) and state.group(1) != "Z"


def pid_runs_from(pid: int, base: Path) -> bool:
    """The PID's command line names a file in `base`, or (slurmdbd, which takes no config path) its
    SLURM_CONF does: guards against a reused PID."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        if f"{base}/" in cmdline:
            return True
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(entry.startswith(f"SLURM_CONF={base}/".encode()) for entry in environ)


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop_pids(pids: Iterable[int], sig: int = signal.SIGTERM) -> list[int]:
    """Signal `pids`, wait up to STOP_GRACE_S, SIGKILL the rest; returns PIDs still alive."""
    pids = [pid for pid in pids if pid_alive(pid)]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.05)
    survivors = [pid for pid in pids if pid_alive(pid)]
    if survivors and sig != signal.SIGKILL:
        return stop_pids(survivors, signal.SIGKILL)
    return survivors


def log_tails(log_dir: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of every log in `log_dir`, for error messages."""
    logs = sorted(log_dir.glob("*.log")) if log_dir.is_dir() else []
    return "\n".join(f"--- {log} (last {lines} lines) ---\n{_tail(log, lines)}" for log in logs)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc.strerror})"
