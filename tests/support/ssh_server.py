"""A real SSH server on 127.0.0.1 (paramiko's server side) whose command answers in a hostile way.

It completes the handshake (its host key is written to a known_hosts file, the client logs in
with a key file: no agent, nothing of the user's read) and answers any `exec` with one of:

    flood       stdout as fast as the connection takes it, until the client goes away
    trickle     one byte of stdout every `trickle_s`, for `trickle_total_s`
    huge-line   `huge_bytes` of stdout without a newline, then exit status 0
    banner-trickle  the SSH banner one byte every `trickle_s`: the handshake never ends

`execs` counts the commands that started, so a test can wait for the session to be running.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

CHUNK = b"x" * (1 << 16)


@dataclass
class Behaviour:
    kind: str
    trickle_s: float = 1.0
    trickle_total_s: float = 120.0
    huge_bytes: int = 64 << 20
    execs: int = 0
    sent: int = 0
    started: threading.Event = field(default_factory=threading.Event)


class _Server(paramiko.ServerInterface):
    def __init__(self, behaviour: Behaviour):
        self.behaviour = behaviour
        self.exec_event = threading.Event()

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "publickey"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        self.exec_event.set()
        return True


@dataclass
class SshServer:
    port: int
    known_hosts: Path
    client_key: Path
    behaviour: Behaviour


@contextlib.contextmanager
def hostile_ssh_server(tmp_path: Path, behaviour: Behaviour):
    host_key = paramiko.ECDSAKey.generate()
    client_key = paramiko.ECDSAKey.generate()
    key_path = tmp_path / "client_key"
    client_key.write_private_key_file(str(key_path))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    stop = threading.Event()
    held: list = []

    def serve_one(conn: socket.socket) -> None:
        if behaviour.kind == "banner-trickle":
            for byte in b"SSH-2.0-" + b"x" * 10_000:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(behaviour.trickle_s)
            return
        transport = paramiko.Transport(conn)
        held.append(transport)
        transport.add_server_key(host_key)
        server = _Server(behaviour)
        try:
            transport.start_server(server=server)
        except (paramiko.SSHException, EOFError, OSError):
            return
        channel = transport.accept(30)
        if channel is None or not server.exec_event.wait(30):
            return
        behaviour.execs += 1
        behaviour.started.set()
        try:
            _answer(channel, behaviour, stop)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        yield SshServer(port, known_hosts, key_path, behaviour)
    finally:
        stop.set()
        listener.close()
        for item in held:
            with contextlib.suppress(Exception):
                item.close()


def _answer(channel, behaviour: Behaviour, stop: threading.Event) -> None:
    if behaviour.kind == "flood":
        while not stop.is_set() and not channel.closed:
            channel.sendall(CHUNK)
            behaviour.sent += len(CHUNK)
    elif behaviour.kind == "trickle":
        ends = time.monotonic() + behaviour.trickle_total_s
        while time.monotonic() < ends and not stop.is_set() and not channel.closed:
            channel.sendall(b"x")
            behaviour.sent += 1
            time.sleep(behaviour.trickle_s)
        channel.send_exit_status(0)
    elif behaviour.kind == "huge-line":
        while behaviour.sent < behaviour.huge_bytes and not channel.closed:
            channel.sendall(CHUNK)
            behaviour.sent += len(CHUNK)
        channel.send_exit_status(0)
    channel.close()
