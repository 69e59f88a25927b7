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
from pathlib import Path
from typing import NamedTuple

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.ssh import connect

SBATCH_TIMEOUT_S = 60.0
SSH_PORT = 22
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


def check_local_script(script: str, base_dir: Path) -> None:
    """SCRIPT is a file under `base_dir` (the job's working directory), or a command on PATH."""
    path = base_dir / script
    if path.is_file():
        _check_runnable(script, os.stat(path).st_mode, os.access(path, os.X_OK))
        return
    if "/" not in script and shutil.which(script):
        return
    where = f"in {base_dir}" if "/" not in script else f"(relative to {base_dir})"
    raise UsageError(f"script {script!r} does not exist {where}")


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
    match = _REMOTE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--remote {text!r}: expected [USER@]HOST[:PORT]")
    return RemoteTarget(match["user"] or default_user, match["host"], int(match["port"] or SSH_PORT))


def submit_remote(script_text: str, sbatch_argv: list[str], target: RemoteTarget, *, script: str,
                  chdir: str | None, identity: str | None, known_hosts: str) -> Submitted:
    """Check SCRIPT over SFTP, then run sbatch on `target` with the script on the channel's stdin."""
    import shlex

    import paramiko

    client = connect(target.user, target.host, target.port, identity=identity, known_hosts=known_hosts)
    try:
        check_remote_script(client, script, chdir)
        command = shlex.join(sbatch_argv)
        if chdir:  # sbatch's working directory is the job's: the gate report and output land there
            command = f"cd -- {shlex.quote(chdir)} && {command}"
        status, stdout, stderr = _exec(client, command, script_text, SBATCH_TIMEOUT_S)
    except paramiko.SSHException as exc:
        raise ExternalCommandError(f"SSH session with {target} failed: {exc}") from exc
    finally:
        client.close()
    if status != 0:
        tail = (stderr.strip().splitlines() or stdout.strip().splitlines() or [""])[-1]
        raise ExternalCommandError(f"sbatch on {target} exited with status {status}: {tail}")
    job_id, cluster = parse_parsable(stdout)
    return Submitted(job_id, cluster, tuple(sbatch_argv), str(target))


def check_remote_script(client, script: str, chdir: str | None) -> None:
    """The remote twin of `check_local_script`: SFTP stat, or `command -v` for a bare name."""
    import shlex

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
        return
    if "/" not in script:
        status, _, _ = _exec(client, shlex.join(["command", "-v", script]), "", SBATCH_TIMEOUT_S)
        if status == 0:
            return
    raise UsageError(f"script {script!r} does not exist on the remote host (looked for {path})")


def _exec(client, command: str, stdin_text: str, timeout_s: float) -> tuple[int, str, str]:
    import socket

    try:
        stdin, stdout, stderr = client.exec_command(command, timeout=timeout_s)
        stdin.write(stdin_text)
        stdin.channel.shutdown_write()
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err
    except socket.timeout as exc:
        raise ExternalCommandError(f"remote command timed out after {timeout_s:g} s: "
                                   f"{command[:200]}") from exc
