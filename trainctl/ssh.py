"""SSH connections for submit --remote and SSH sweeps: host keys always verified, never added."""

from __future__ import annotations

import os

from trainctl.errors import ExternalCommandError, UsageError

SSH_CONNECT_TIMEOUT_S = 20.0


def connect(user: str, host: str, port: int, *, identity: str | None, known_hosts: str):
    """An SSH connection whose host key is in `known_hosts` (never added); agent keys, or `identity`."""
    import paramiko

    if not os.path.isfile(known_hosts):
        raise UsageError(f"known_hosts file {known_hosts} does not exist: host keys cannot be verified")
    if identity is not None and not os.path.isfile(identity):
        raise UsageError(f"identity file {identity} does not exist")
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(host, port=port, username=user, key_filename=identity,
                       allow_agent=True, look_for_keys=identity is None, timeout=SSH_CONNECT_TIMEOUT_S,
                       banner_timeout=SSH_CONNECT_TIMEOUT_S, auth_timeout=SSH_CONNECT_TIMEOUT_S)
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
        raise ExternalCommandError(f"SSH to {user}@{host}:{port}: {exc}") from exc
    except OSError as exc:
        client.close()
        raise ExternalCommandError(f"cannot reach {host}:{port}: "
                                   f"{exc.strerror or exc}") from exc
    return client
