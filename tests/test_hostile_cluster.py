"""Hostile environments on the real dev cluster (issue 12): an SSH sweep where one node's
port 22 sends sshd's banner and then stalls, beside a node with a real sshd."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from support.sweeps import write_site

pytestmark = pytest.mark.cluster
SSH_TIMEOUT_S = 3
# trainctl with the SSH handshake deadline cut from 20 s, so the test does not wait that long.
RUN = f"""
import sys
import trainctl.ssh
trainctl.ssh.SSH_CONNECT_TIMEOUT_S = {SSH_TIMEOUT_S}
from trainctl.cli import main
sys.exit(main(sys.argv[1:]))
"""
# What a wedged sshd looks like from outside: the banner, then silence (no key exchange).
STALLED_SSHD = """
import socket
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 22))
server.listen(16)
held = []
while True:
    conn, _ = server.accept()
    conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\\r\\n")
    held.append(conn)
"""


def wait_for_port(host: str, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {host}:{port}"
            time.sleep(0.1)


def test_an_ssh_sweep_records_a_stalled_sshd_and_checks_the_other_nodes(devcluster, tmp_path):
    endpoint = devcluster.start_sshd("node1")
    stalled = subprocess.Popen(devcluster.exec_argv("node3", [sys.executable, "-c", STALLED_SSHD]))
    try:
        wait_for_port(devcluster.spec.address("node3"), 22)
        db = tmp_path / "sweeps.db"
        site = write_site(tmp_path / "site.toml", db, checks=("host.memory", "host.defunct"), ssh=endpoint)
        out = subprocess.run([sys.executable, "-c", RUN, "sweep", "--site", str(site), "--via", "ssh",
                              "--nodes", "node[1,3]", "--json"], capture_output=True, text=True, timeout=120,
                             env=devcluster.client_env())
    finally:
        stalled.kill()
        stalled.wait()
    assert out.returncode == 3, out.stderr                      # node3 gave no verdict; not 130 "interrupted"
    nodes = {n["host"]: n for n in json.loads(out.stdout)["nodes"]}
    assert (nodes["node1"]["outcome"], nodes["node1"]["status"]) == ("checked", "ok")
    assert nodes["node3"]["outcome"] == "error"
    address = devcluster.spec.address("node3")
    assert f"ssh: handshake with {address}:22 timed out after {SSH_TIMEOUT_S} s" in nodes["node3"]["detail"]
    assert "Traceback" not in out.stderr
    report = subprocess.run([sys.executable, "-m", "trainctl.cli", "report", "--db", str(db), "--format", "json"],
                            capture_output=True, text=True, timeout=60)
    data = json.loads(report.stdout)
    (sweep,) = data["sweeps"]
    assert sweep["complete"] and sweep["error"] == ""
    assert [h for group in data["no_verdict"] for h in group["hosts"]] == ["node3"]
