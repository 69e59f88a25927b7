"""Hostile environments on the real dev cluster (issue 12): an SSH sweep where one node's
port 22 sends sshd's banner and then stalls, beside a node with a real sshd; another user on a
job's nodes, where the node agent keeps its socket and checkpoint requests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


# ---------------------------------------------------------------- another user on the job's nodes

# The job: a node agent and one rank per node, as the supervisor runs them (tests/test_job_agent.py).
PRIVATE_JOB = """#!/bin/bash
srun --overlap --job-name=watch-agent --ntasks-per-node=1 --input=none --output={gate}/agent-%N.log {trainctl} \\
    job agent --dir {gate} --site local-demo --partition gpu &
agent=$!
TRAINCTL_WATCH_DIR={gate}/watch srun --overlap --ntasks-per-node=1 --input=none --output={gate}/rank-%N.log \\
    {trainctl} rank-exec --site local-demo --partition gpu --master-addr 127.0.0.1 --no-bind -- \\
    {python} -P {rank} {gate}
step=$(squeue --noheader --steps --jobs="$SLURM_JOB_ID" --format="%i %j" | awk '$2 == "watch-agent" {{print $1}}')
scancel --signal=TERM "$step"
wait $agent
echo "agent step status $?"
"""
# A rank that steps until told to stop and notes every checkpoint request it sees (the request
# file's token) in GATE/seen-NODE.json, written whole at each change.
PRIVATE_RANK = """
import json, os, sys, time
import trainctl.progress as progress
gate = sys.argv[1]
socket_path = os.environ.get("TRAINCTL_PROGRESS_SOCKET")
out = os.path.join(gate, "seen-" + os.environ["SLURMD_NODENAME"] + ".json")
seen = []
def note():
    with open(out + ".tmp", "w") as f:
        json.dump({"socket": socket_path, "pythonpath": os.environ.get("PYTHONPATH", ""), "seen": seen}, f)
    os.replace(out + ".tmp", out)
note()
while not os.path.exists(os.path.join(gate, "stop")):
    progress.step()
    if progress.checkpoint_requested():
        with open(socket_path + ".checkpoint-request") as f:
            seen.append(f.read().strip())
        note()
    time.sleep(0.05)
note()
"""
# The other user (nobody), inside one node: standard library only.
ATTACKER = """
import errno, json, os, socket, sys
action, directory, sock_path = sys.argv[1:]
request = sock_path + ".checkpoint-request"
done = {}
def attempt(name, act):
    try:
        act()
        done[name] = "done"
    except OSError as exc:
        done[name] = errno.errorcode.get(exc.errno, str(exc.errno))
if action == "take":      # before the job: the directory, a socket at the agent's path, a forged request
    os.mkdir(directory, 0o700)
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind(sock_path)   # the name stays after exit
    with open(request, "w") as f:
        f.write("forged\\n")
elif action == "link":    # before the job: the directory's name, a link to one of its own with a FIFO in it
    mine = directory + "-mine"
    os.mkdir(mine, 0o700)
    os.mkfifo(os.path.join(mine, os.path.basename(request)), 0o666)
    os.symlink(mine, directory)
else:                     # "plant", during the job: into the job's own directory
    attempt("request file", lambda: os.close(os.open(request, os.O_WRONLY | os.O_CREAT, 0o666)))
    attempt("fifo", lambda: os.mkfifo(request, 0o666))
    attempt("socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind(sock_path))
    attempt("unlink socket", lambda: os.unlink(sock_path))
    attempt("list", lambda: os.listdir(directory))
    attempt("move directory", lambda: os.rename(directory, directory + "-moved"))
print(json.dumps(done))
"""


def test_another_user_on_the_nodes_can_neither_forge_requests_nor_turn_the_watch_off(devcluster, tmp_path):
    """One job on node1-3, as root; nobody on the same nodes. Each node has a /tmp of its own (a
    directory bound over TMPDIR in its mount namespace, as job_container/tmpfs gives a job).
    node1: nobody made the job's directory first, with a socket at the agent's path and a forged
    request; node3: nobody put a link there, to a directory with a FIFO at the request file; node2:
    the job's own directory, which nobody then fails to plant anything in. The job runs; node1's
    and node3's agents refuse in one line and keep writing their node files; their ranks get no
    socket; node2's rank sees the watch's one request and no forged one."""
    from support.nobody import base_interpreter, setpriv_nobody
    from support.slurm_jobs import TRAINCTL, wait_for_job, wait_until
    from trainctl.agent_socket import agent_socket_path
    from trainctl.job.jobdir import CHECKPOINT_REQUEST
    from trainctl.job.watch_io import post_request
    from trainctl.launcher.rank_exec import BOOTSTRAP_DIR
    from trainctl.proc import run, run_checked

    nodes = ("node1", "node2", "node3")
    attacker = [*setpriv_nobody(), base_interpreter(), "-I", "-c", ATTACKER]
    cluster = next(line.split("=", 1)[1] for line in devcluster.slurm_conf.read_text().splitlines()
                   if line.startswith("ClusterName="))
    tmpdir = Path(tempfile.mkdtemp(prefix="tcp", dir="/tmp"))      # short: the socket path fits as is
    views = {node: Path(tempfile.mkdtemp(prefix=f"tcp-{node}-", dir="/tmp")) for node in nodes}
    for path in (tmpdir, *views.values()):
        path.chmod(0o1777)
    gate = tmp_path / "gate"
    (gate / "watch").mkdir(parents=True)
    (tmp_path / "rank.py").write_text(PRIVATE_RANK)
    script = tmp_path / "private.sh"
    script.write_text(PRIVATE_JOB.format(gate=gate, trainctl=TRAINCTL, python=sys.executable,
                                         rank=tmp_path / "rank.py"))
    env = {**devcluster.client_env(), "TMPDIR": str(tmpdir)}

    def read_json(path: Path):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def node_file(node):
        return read_json(gate / "watch" / f"{node}.json")

    mounted, job, record = [], None, None
    try:
        for node, view in views.items():
            run_checked(devcluster.exec_argv(node, ["mount", "--bind", str(view), str(tmpdir)]), timeout=30)
            mounted.append(node)
        # held until nobody has set up its traps: the paths hold the job's id
        job = run_checked(["sbatch", "--parsable", "--hold", "-N3", "-w", ",".join(nodes), "--time=5",
                           "-o", str(tmp_path / "job.out"), str(script)], timeout=30, env=env,
                          cwd=tmp_path).stdout.strip()
        paths = {node: agent_socket_path(job, node, {"TMPDIR": str(tmpdir), "SLURM_CLUSTER_NAME": cluster}, uid=0)
                 for node in nodes}
        private = os.path.dirname(paths["node1"])                 # the same name on every node
        for node, action in (("node1", "take"), ("node3", "link")):
            run_checked(devcluster.exec_argv(node, [*attacker, action, private, paths[node]]), timeout=30)
        run_checked(["scontrol", "release", job], timeout=30, env=env)

        wait_until("every agent's first check run and node2's rank stepping",
                   lambda: all((node_file(n) or {}).get("checks", {}).get("runs", 0) >= 1 for n in nodes)
                   and any(r["steps"] >= 1 for r in node_file("node2")["ranks"].values()), 60)
        planted = run_checked(devcluster.exec_argv("node2", [*attacker, "plant", private, paths["node2"]]),
                              timeout=30)
        assert json.loads(planted.stdout) == {"request file": "EACCES", "fifo": "EACCES", "socket": "EACCES",
                                              "unlink socket": "EACCES", "list": "EACCES",
                                              "move directory": "EPERM"}
        asked_t = time.time()
        token = post_request(str(gate), CHECKPOINT_REQUEST)
        wait_until("node2's rank seeing the request",
                   lambda: (read_json(gate / "seen-node2.json") or {}).get("seen") == [token], 30)
        wait_until("node1's and node3's agents writing on after the request",
                   lambda: all(node_file(n)["t"] > asked_t for n in ("node1", "node3")), 30)
        assert all(node_file(n)["ranks"] == {} for n in ("node1", "node3"))
        (gate / "stop").touch()
        record = wait_for_job(devcluster, job, timeout_s=60)
        # nobody's files are left as they were; node2's agent took its own away
        node1_dir, node3_dir = views["node1"] / "trainctl-0", views["node3"] / "trainctl-0-mine"
        name = os.path.basename(paths["node1"])
        assert sorted(os.listdir(node1_dir)) == [name, f"{name}.checkpoint-request"]
        assert (node1_dir / f"{name}.checkpoint-request").read_text() == "forged\n"
        assert os.listdir(node3_dir) == [f"{os.path.basename(paths['node3'])}.checkpoint-request"]
        assert os.listdir(views["node2"] / "trainctl-0") == []
    finally:
        (gate / "stop").touch()
        if job and record is None:
            run(["scancel", job], timeout=30, env=env)
            wait_for_job(devcluster, job, timeout_s=60)
        for node in mounted:
            run_checked(devcluster.exec_argv(node, ["umount", str(tmpdir)]), timeout=30)
        for path in (tmpdir, *views.values()):
            shutil.rmtree(path)
    output = (tmp_path / "job.out").read_text()
    assert record["JobState"] == "COMPLETED", output
    refusals = {"node1": f"{private} belongs to uid 65534, not to uid 0 (this job's user)",
                "node3": f"{private} is a symbolic link, not a directory"}
    for node, wrong in refusals.items():
        said = (gate / f"agent-{node}.log").read_text().splitlines()
        assert said[0] == (f"trainctl job agent: {node}: no progress socket for this node: {wrong}: remove it "
                           "(another user may have put it there); the watch goes on with this node's checks and "
                           "node file, without its ranks' steps or checkpoint requests"), said
        assert said[-1] == "trainctl: stopped by SIGTERM", said
        assert f"trainctl rank-exec: {node}: the ranks report no progress (no TRAINCTL_PROGRESS_SOCKET, no " \
               f"automatic step counting): {wrong}: remove it (another user may have put it there)" in \
               (gate / f"rank-{node}.log").read_text()
        rank = json.loads((gate / f"seen-{node}.json").read_text())
        assert rank["socket"] is None and BOOTSTRAP_DIR not in rank["pythonpath"] and rank["seen"] == [], rank
    said = (gate / "agent-node2.log").read_text().splitlines()
    assert said[0].startswith(f"trainctl job agent: node2: reading {paths['node2']}, "), said
    assert said[-1] == "trainctl: stopped by SIGTERM", said
    rank = json.loads((gate / "seen-node2.json").read_text())
    assert rank["socket"] == paths["node2"] and BOOTSTRAP_DIR in rank["pythonpath"] and rank["seen"] == [token]
