"""SSH connections for submit --remote and SSH sweeps: host keys always verified, never added."""

from __future__ import annotations

import os
import time

from trainctl.errors import ExternalCommandError, UsageError

SSH_CONNECT_TIMEOUT_S = 20.0


def quiet_paramiko() -> None:
    """paramiko logs a traceback on stderr for a server that is not SSH (an HTTP port, say);
    every failure reaches the user as one line from `connect` instead."""
    import logging  # not at the top: `submit --dry-run` imports this module and skips the cost

    logger = logging.getLogger("paramiko")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False


def connect(user: str, host: str, port: int, *, identity: str | None, known_hosts: str):
    """An SSH connection whose host key is in `known_hosts` (never added); agent keys, or `identity`."""
    import paramiko

    quiet_paramiko()
    check_port(port, "SSH port")
    if not os.path.isfile(known_hosts):
        raise UsageError(f"known_hosts file {known_hosts} does not exist: host keys cannot be verified")
    if identity is not None and not os.path.isfile(identity):
        raise UsageError(f"identity file {identity} does not exist")
    if identity is not None:
        _check_identity(identity)
    client = paramiko.SSHClient()
    _load_known_hosts(client, known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    transports = []

    def transport(*args, **kwargs):  # keep a handle: after a failure it tells how far the handshake got
        made = paramiko.Transport(*args, **kwargs)
        made.handshake_timeout = SSH_CONNECT_TIMEOUT_S  # paramiko's own default is 15 s
        transports.append(made)
        return made

    started = time.monotonic()
    try:
        client.connect(host, port=port, username=user, key_filename=identity,
                       allow_agent=True, look_for_keys=identity is None, timeout=SSH_CONNECT_TIMEOUT_S,
                       banner_timeout=SSH_CONNECT_TIMEOUT_S, auth_timeout=SSH_CONNECT_TIMEOUT_S,
                       transport_factory=transport)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise ExternalCommandError(f"{host} offers a host key that does not match {known_hosts} "
                                   f"(got {exc.key.get_name()} {exc.key.get_fingerprint().hex()}): refusing "
                                   "to connect") from exc
    except paramiko.PasswordRequiredException as exc:
        client.close()
        raise UsageError(f"key {identity} is encrypted: load it into ssh-agent instead") from exc
    except paramiko.AuthenticationException as exc:
        client.close()
        raise ExternalCommandError(f"SSH authentication as {user}@{host} failed: {exc}",
                                   hint="give a key file or load a key into ssh-agent") from exc
    except paramiko.SSHException as exc:
        client.close()
        if "not found in known_hosts" in str(exc):
            raise ExternalCommandError(
                f"host key of {host} is not in {known_hosts}: refusing to connect",
                hint="verify the host's fingerprint out of band, then add it to that file") from exc
        raise _handshake_failure(host, port, transports, started, exc) from exc
    except EOFError as exc:  # the server closed the connection, or paramiko's handshake deadline passed
        client.close()
        raise _handshake_failure(host, port, transports, started, exc) from exc
    except OSError as exc:
        client.close()
        raise ExternalCommandError(f"cannot reach {host}:{port}: "
                                   f"{exc.strerror or exc}") from exc
    return client


def check_port(port: int, what: str) -> None:
    """TCP ports are 1-65535; a larger number would wrap around in the socket layer (67767 -> 2231)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"{what} {port!r} is outside 1-65535")


def _load_known_hosts(client, known_hosts: str) -> None:
    """paramiko skips lines it cannot parse, but raises on some (a bad base64 key, binary junk)."""
    import paramiko
    from paramiko.hostkeys import InvalidHostKey

    try:
        client.load_host_keys(known_hosts)
    except InvalidHostKey as exc:
        raise UsageError(f"known_hosts file {known_hosts}: a malformed line ({exc.line.strip()[:80]!r}: "
                         f"{exc.exc})") from exc
    except (OSError, UnicodeDecodeError, paramiko.SSHException, ValueError) as exc:
        raise UsageError(f"known_hosts file {known_hosts} cannot be read as known_hosts: "
                         f"{type(exc).__name__}: {exc}") from exc


def _check_identity(identity: str) -> None:
    """Read the key before connecting, so a file that is not a key is bad input, not a failed login."""
    import paramiko

    try:
        paramiko.PKey.from_path(identity)
    except paramiko.PasswordRequiredException as exc:
        raise UsageError(f"key {identity} is encrypted: load it into ssh-agent instead") from exc
    except (paramiko.SSHException, ValueError, OSError, UnicodeDecodeError, TypeError) as exc:
        if "password" in str(exc).lower():  # cryptography's words for an encrypted OpenSSH key
            raise UsageError(f"key {identity} is encrypted: load it into ssh-agent instead") from exc
        raise UsageError(f"identity file {identity} is not a private key trainctl can use: "
                         f"{str(exc).split('. See ')[0]}") from exc


def _handshake_failure(host: str, port: int, transports: list, started: float,
                       exc: BaseException) -> ExternalCommandError:
    """Say how far the SSH handshake got: no banner, banner then silence, or a closed connection."""
    waited = time.monotonic() - started
    banner = transports[-1].remote_version if transports else ""
    timed_out = waited >= 0.9 * SSH_CONNECT_TIMEOUT_S
    if not banner:
        if timed_out:
            return ExternalCommandError(f"ssh: no SSH banner from {host}:{port} within {SSH_CONNECT_TIMEOUT_S:g} s")
        return ExternalCommandError(f"ssh: no SSH banner from {host}:{port} "
                                    f"({str(exc) or 'connection closed'}): not an SSH server?")
    if timed_out:
        return ExternalCommandError(f"ssh: handshake with {host}:{port} timed out after "
                                    f"{SSH_CONNECT_TIMEOUT_S:g} s (banner {banner!r})")
    return ExternalCommandError(f"ssh: {host}:{port} ({banner!r}) ended the handshake: "
                                f"{str(exc) or 'connection closed'}")
