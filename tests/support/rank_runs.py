"""A training program run as a watched rank on this machine: a bound datagram socket stands in for
the node agent, and its reports are read while the program runs (a Unix datagram socket queues
only a few: net.unix.max_dgram_qlen)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from trainctl.guest import wire
from trainctl.launcher.rank_exec import BOOTSTRAP_DIR


def run_rank(tmp_path: Path, code: str, *args: str, bootstrap: bool = True, extra_path: str | None = None,
             env: dict[str, str] | None = None, watched: bool = True,
             script_name: str = "train.py", saves: list[dict] | None = None,
             timeout_s: float = 300) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run `code` as a rank's program (`watched`: with the agent's socket in its environment, as
    rank-exec gives it); the finished process and every report it sent (the saves it reported go
    into `saves`, where given)."""
    path = str(tmp_path / "agent.sock")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    reader.settimeout(0.1)
    reports, done = [], threading.Event()

    def drain():
        while True:
            try:
                datagram = reader.recv(wire.DATAGRAM_MAX)
                if wire.is_save(datagram):
                    (saves if saves is not None else []).append(wire.decode_save(datagram))
                else:
                    reports.append(wire.decode(datagram))
            except TimeoutError:
                if done.is_set():
                    return

    # as a user starts it: the script's folder first on sys.path (not the tests' PYTHONSAFEPATH;
    # it runs in tmp_path, where no trainctl/ tree can shadow the installed package)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_") and k != "PYTHONSAFEPATH"}
    child_env.update(RANK="0", TRAINCTL_PROGRESS_INTERVAL_S="0")
    if watched:
        child_env[wire.SOCKET_ENV] = path
    entries = ([BOOTSTRAP_DIR] if bootstrap else []) + ([extra_path] if extra_path else [])
    child_env.pop("PYTHONPATH", None)
    if entries:
        child_env["PYTHONPATH"] = os.pathsep.join(entries)
    child_env.update(env or {})
    script = tmp_path / script_name
    script.write_text(code)
    reading = threading.Thread(target=drain)
    reading.start()
    try:
        child = subprocess.run([sys.executable, str(script), *args], env=child_env, capture_output=True,
                               text=True, timeout=timeout_s, cwd=tmp_path)
    finally:
        done.set()
        reading.join()
        reader.close()
        os.unlink(path)
        for claim in tmp_path.glob("agent.sock" + wire.CLAIM_INFIX + "*"):
            claim.rmdir()   # as the agent removes them: the next run's rank claims itself anew
    return child, reports
