"""SSH connections for submit --remote and SSH sweeps: host keys always verified, never added."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.proc import OUTPUT_CAP_BYTES, POLL_S, READ_CHUNK, STDERR_CAP_BYTES, CappedOutput, RunGroup
from trainctl.signals import stop_deferred
from trainctl.validate import not_a_regular_file

SSH_CONNECT_TIMEOUT_S = 20.0


def quiet_paramiko() -> None:
    """paramiko logs a traceback on stderr for a server that is not SSH (an HTTP port, say);
    every failure reaches the user as one line from `connect` instead."""
    import logging  # not at the top: `submit --dry-run` imports this module and skips the cost

    logger = logging.getLogger("paramiko")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False


class Cutoff:
    """Ends one SSH exchange at its deadline, or when its group is aborted (a stop signal),
    whatever paramiko is blocked in: the TCP connect, a banner sent a byte a second, the
    handshake, a read. Shutting the socket and closing the transport make each of them fail
    at once; paramiko's own timeouts are per step and per read, never for the whole exchange.
    """

    def __init__(self, deadline_s: float, group: RunGroup | None = None):
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.expired = False        # the deadline passed (not a stop signal)
        self._group = group
        self._closers: list[Callable[[], None]] = []
        self._cut = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline_s, self.expire)
        self._timer.daemon = True
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Cutoff:
        if self._group is not None:
            self._stack.enter_context(self._group.closing(self.cut))
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        self._stack.close()

    @property
    def stopped(self) -> bool:
        return self._cut

    def remaining(self, most: float) -> float:
        """Seconds left, at most `most`, never 0 (which would make a socket non-blocking)."""
        return max(0.01, min(most, self.deadline - time.monotonic()))

    def watch(self, close: Callable[[], None]) -> None:
        """Call `close` at the cut (at once if it came already)."""
        with stop_deferred(), self._lock:
            self._closers.append(close)
            cut = self._cut
        if cut:
            _quietly(close)

    def cut(self) -> None:
        with stop_deferred(), self._lock:
            self._cut = True
            closers = list(self._closers)
        for close in closers:
            _quietly(close)

    def expire(self) -> None:
        """The deadline passed: cut, and say so."""
        self.expired = True
        self.cut()


def _quietly(close: Callable[[], None]) -> None:
    try:
        close()
    except Exception:  # closing what is already broken or closed
        pass


def connect(user: str, host: str, port: int, *, identity: str | None, known_hosts: str,
            cutoff: Cutoff | None = None):
    """An SSH connection whose host key is in `known_hosts` (never added); agent keys, or `identity`.

    With `cutoff`, every step (TCP connect, banner, handshake, authentication) ends at its
    deadline or at a stop signal, whichever comes first.
    """
    import paramiko

    quiet_paramiko()
    check_port(port, "SSH port")
    problem = not_a_regular_file(known_hosts)
    if problem:
        raise UsageError(f"known_hosts file {known_hosts} {problem}: host keys cannot be verified")
    problem = not_a_regular_file(identity) if identity is not None else None
    if problem:
        raise UsageError(f"identity file {identity} {problem}")
    if identity is not None:
        _check_identity(identity)
    client = paramiko.SSHClient()
    _load_known_hosts(client, known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    transports = []

    step_s = cutoff.remaining(SSH_CONNECT_TIMEOUT_S) if cutoff else SSH_CONNECT_TIMEOUT_S

    def transport(*args, **kwargs):  # keep a handle: after a failure it tells how far the handshake got
        made = paramiko.Transport(*args, **kwargs)
        made.handshake_timeout = step_s  # paramiko's own default is 15 s
        transports.append(made)
        if cutoff is not None:
            cutoff.watch(made.close)
        return made

    started = time.monotonic()
    try:
        sock = _tcp_connect(host, port, step_s, cutoff) if cutoff is not None else None
        client.connect(host, port=port, username=user, key_filename=identity, sock=sock,
                       allow_agent=True, look_for_keys=identity is None, timeout=step_s,
                       banner_timeout=step_s, auth_timeout=step_s, transport_factory=transport)
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


def _tcp_connect(host: str, port: int, timeout_s: float, cutoff: Cutoff) -> socket.socket:
    """A connected TCP socket, made here so that the cutoff can end a connect that hangs
    (shutdown(2) wakes a connect(2) waiting on a SYN that is never answered)."""
    last: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        cutoff.watch(lambda sock=sock: (sock.shutdown(socket.SHUT_RDWR), sock.close()))
        sock.settimeout(timeout_s)
        try:
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address for {host}")


@dataclass(frozen=True)
class RemoteResult:
    """What one remote command did, bounded as `trainctl.proc.run` bounds a local one."""

    exit_status: int | None     # None: cut short, or the connection ended without one
    stdout: str                 # its first and last output_cap // 2 bytes, cut at line ends
    stderr: str                 # its last STDERR_CAP_BYTES
    stdout_bytes: int           # what it wrote, cut or not
    truncated: bool
    cut_short: bool             # the cutoff ended it (deadline or stop signal)


def run_remote(client, command: str, cutoff: Cutoff, *, output_cap: int = OUTPUT_CAP_BYTES) -> RemoteResult:
    """Run `command` on the connection, read within the caps until it ends or the cutoff.

    Read in POLL_S slices: a flood keeps only the head and tail (`CappedOutput`, as for a
    local probe), a trickle ends at the deadline, a stop signal closes the connection.
    """
    transport = client.get_transport()
    if transport is None or cutoff.stopped:
        raise EOFError("connection closed")
    channel = transport.open_session(timeout=cutoff.remaining(SSH_CONNECT_TIMEOUT_S))
    cutoff.watch(channel.close)
    out = CappedOutput(output_cap, keep_head=True)
    err = CappedOutput(STDERR_CAP_BYTES, keep_head=False)
    channel.exec_command(command)
    channel.shutdown_write()
    stdout_done = False
    while not cutoff.stopped:
        left = cutoff.deadline - time.monotonic()
        if left <= 0:
            cutoff.expire()
            break
        while channel.recv_stderr_ready():
            err.add(channel.recv_stderr(READ_CHUNK))
        if stdout_done:
            if channel.exit_status_ready() or channel.closed:
                break
            channel.status_event.wait(min(POLL_S, left))
            continue
        channel.settimeout(min(POLL_S, left))
        try:
            data = channel.recv(READ_CHUNK)
        except TimeoutError:
            continue
        if data:
            out.add(data)
        else:
            stdout_done = True
    while channel.recv_stderr_ready() and not cutoff.stopped:
        err.add(channel.recv_stderr(READ_CHUNK))
    cut_short = cutoff.stopped
    status = channel.exit_status if channel.exit_status_ready() and not cut_short else None
    channel.close()
    return RemoteResult(status, out.text(), err.text(), out.total, out.cut > 0, cut_short)


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
