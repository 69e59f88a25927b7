"""Submit a rendered script: `sbatch --parsable` here, or on a login node over SSH (paramiko).

Either way the script goes to sbatch's stdin and sbatch's options are an argv list: locally
through `trainctl.proc` (no shell), remotely as one shlex-quoted command line on an SSH exec
channel whose stdin carries the script. Host keys are checked against a known_hosts file and
an unknown or changed key ends the connection (paramiko's RejectPolicy; nothing is added).
paramiko is imported only here, inside the remote path, so local commands never load it.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.launcher.launchers import PYTHON_MODULE
from trainctl.validate import not_a_regular_file

SBATCH_TIMEOUT_S = 60.0
SSH_PORT = 22
REMOTE_OUTPUT_CAP_BYTES = 1 << 20  # per stream: sbatch, scontrol and `command -v` print a few lines
REMOTE_READ_CHUNK = 32768
REMOTE_POLL_S = 0.02
_JOB_ID = re.compile(r"\d+(_\d+)?")
_REMOTE = re.compile(r"(?:(?P<user>[^@\s]+)@)?(?P<host>[^@\s:]+)(?::(?P<port>\d+))?")


class Submitted(NamedTuple):  # NamedTuples: a dry run imports this module, dataclasses cost ~1 ms each
    job_id: str
    cluster: str | None      # sbatch --parsable prints `id;cluster` on federated/multi-cluster setups
    sbatch_argv: tuple[str, ...]
    where: str               # "local" or user@host[:port]


def parse_parsable(stdout: str) -> tuple[str, str | None]:
    """`sbatch --parsable` output -> (job id, cluster or None)."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id, _, cluster = line.partition(";")
    if not _JOB_ID.fullmatch(job_id):
        raise ExternalCommandError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")
    return job_id, cluster or None


# ---------------------------------------------------------------- the script must exist


def check_local_script(script: str, base_dir: Path) -> str:
    """SCRIPT is a file under `base_dir` (the job's working directory), or a command on PATH.

    Returns the program as the job must run it, the file this check found: its absolute path.
    A bare name (`run.sh`) found in `base_dir` would otherwise be searched on PATH by the exec
    inside the job and not be found, or find another file. `-m` (a module) is Python's to find.
    """
    if script == PYTHON_MODULE:
        return script
    path = base_dir / script
    if path.is_file():
        _check_runnable(script, os.stat(path).st_mode, os.access(path, os.X_OK))
        return os.path.abspath(path)
    found = shutil.which(script) if "/" not in script else None
    if found:
        return os.path.abspath(found)
    where = f"in {base_dir}" if "/" not in script else f"(relative to {base_dir})"
    problem = not_a_regular_file(str(path))   # there, but a directory, a device or a FIFO
    raise UsageError(f"script {script!r} {problem if problem != 'does not exist' else 'does not exist ' + where}")


def _check_runnable(script: str, mode: int, executable: bool) -> None:
    if not stat.S_ISREG(mode):
        raise UsageError(f"script {script!r} is not a regular file")
    if not script.endswith(".py") and not executable:
        raise UsageError(f"script {script!r} is not executable (chmod +x, or end its name in .py)")


def submit_local(script_text: str, sbatch_argv: list[str], cwd: Path) -> Submitted:
    from trainctl.proc import run_checked  # not at the top: a dry run does without subprocess

    result = run_checked(sbatch_argv, timeout=SBATCH_TIMEOUT_S, input_text=script_text, cwd=str(cwd))
    job_id, cluster = parse_parsable(result.stdout)
    return Submitted(job_id, cluster, tuple(sbatch_argv), "local")


# ---------------------------------------------------------------- over SSH


class RemoteTarget(NamedTuple):
    user: str
    host: str
    port: int = SSH_PORT

    def __str__(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != SSH_PORT else "")


def parse_remote(text: str, default_user: str) -> RemoteTarget:
    """`[USER@]HOST[:PORT]`."""
    from trainctl.ssh import check_port  # not at the top: trainctl.ssh brings subprocess and socket

    match = _REMOTE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--remote {text!r}: expected [USER@]HOST[:PORT]")
    port = int(match["port"] or SSH_PORT)
    check_port(port, f"--remote {text!r}: port")
    return RemoteTarget(match["user"] or default_user, match["host"], port)


def submit_remote(render: Callable[[str], str], sbatch_argv: list[str], target: RemoteTarget, *, script: str | None,
                  chdir: str | None, identity: str | None, known_hosts: str) -> tuple[Submitted, str]:
    """Check SCRIPT over SFTP (None: nothing to check), render the job script for the path the check found (`render`),
    then run sbatch on `target` with it on the channel's stdin. Returns what was submitted and the script."""
    import shlex

    import paramiko

    from trainctl.ssh import connect

    client = connect(target.user, target.host, target.port, identity=identity, known_hosts=known_hosts)
    try:
        script_text = render(check_remote_script(client, script, chdir) if script is not None else "")
        command = shlex.join(sbatch_argv)
        if chdir:  # sbatch's working directory is the job's: the gate report and output land there
            command = f"cd -- {shlex.quote(chdir)} && {command}"
        status, stdout, stderr = exec_remote(client, command, script_text, SBATCH_TIMEOUT_S)
    except paramiko.SSHException as exc:
        raise ExternalCommandError(f"SSH session with {target} failed: {exc}") from exc
    finally:
        client.close()
    if status != 0:
        tail = (stderr.strip().splitlines() or stdout.strip().splitlines() or [""])[-1]
        raise ExternalCommandError(f"sbatch on {target} exited with status {status}: {tail}")
    job_id, cluster = parse_parsable(stdout)
    return Submitted(job_id, cluster, tuple(sbatch_argv), str(target)), script_text


def check_remote_script(client, script: str, chdir: str | None) -> str:
    """The remote twin of `check_local_script`: SFTP stat, or `command -v` for a bare name.
    Returns the absolute path it found (a bare name where `command -v` names no file)."""
    import shlex

    if script == PYTHON_MODULE:
        return script

    import paramiko

    try:
        sftp = client.open_sftp()
    except paramiko.SSHException as exc:
        raise ExternalCommandError(f"cannot open SFTP to check that {script!r} exists: {exc}",
                                   hint="the login node's sshd needs the sftp subsystem") from exc
    try:
        base = chdir if chdir and chdir.startswith("/") else posixpath.join(sftp.normalize("."), chdir or "")
        path = posixpath.join(base, script)
        try:
            attributes = sftp.stat(path)
        except OSError:
            attributes = None
    finally:
        sftp.close()
    if attributes is not None:
        _check_runnable(script, attributes.st_mode, bool(attributes.st_mode & 0o111))
        return path
    if "/" not in script:
        status, stdout, _ = exec_remote(client, shlex.join(["command", "-v", script]), "", SBATCH_TIMEOUT_S)
        if status == 0:
            found = stdout.strip()
            return found if found.startswith("/") else script
    raise UsageError(f"script {script!r} does not exist on the remote host (looked for {path})")


def exec_remote(client, command: str, stdin_text: str, timeout_s: float,
                cap_bytes: int = REMOTE_OUTPUT_CAP_BYTES) -> tuple[int, str, str]:
    """Run `command` on the SSH host: (exit status, stdout, stderr), each stream cut at
    `cap_bytes`. The whole exchange is bounded by `timeout_s` (paramiko's own timeout is per
    read, and waiting for the exit status has none); past it the channel is closed."""
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    try:
        stdin, stdout, _ = client.exec_command(command, timeout=timeout_s)
        channel = stdout.channel
        stdin.write(stdin_text)
        channel.shutdown_write()
        out, err = bytearray(), bytearray()
        while True:
            ready = False
            if channel.recv_ready():
                out += channel.recv(REMOTE_READ_CHUNK)[:max(0, cap_bytes - len(out))]
                ready = True
            if channel.recv_stderr_ready():
                err += channel.recv_stderr(REMOTE_READ_CHUNK)[:max(0, cap_bytes - len(err))]
                ready = True
            if not ready and (channel.exit_status_ready() or channel.closed):
                if not (channel.recv_ready() or channel.recv_stderr_ready()):
                    break
            if time.monotonic() >= deadline:
                channel.close()
                raise socket.timeout()
            if not ready:
                time.sleep(REMOTE_POLL_S)
        status = channel.recv_exit_status() if channel.exit_status_ready() else -1
        return status, out.decode(errors="replace"), err.decode(errors="replace")
    except socket.timeout as exc:
        raise ExternalCommandError(f"remote command timed out after {timeout_s:g} s: "
                                   f"{command[:200]}") from exc
