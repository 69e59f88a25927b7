"""The user's private directory on a node (trainctl.private_dir): made 0700, checked on every use,
refused in one line when it is not the user's alone; the agent's socket and checkpoint request
file inside it; the agent and rank-exec carrying on without them when it is refused.

Another user's directory is made here by root with os.chown to nobody (65534)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainctl.agent_socket import agent_socket_path, progress_environment
from trainctl.errors import UsageError
from trainctl.private_dir import UnsafeDir, ensure, open_checked, private_dir_path, write_file

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
NOBODY = 65534
UID = os.geteuid()
needs_root = pytest.mark.skipif(UID != 0, reason="another user's directory is made with os.chown, as root")
REMOVE = "remove it (another user may have put it there)"


def mine(tmp_path: Path) -> str:
    return private_dir_path(str(tmp_path), UID)


def test_the_directory_is_made_0700_whatever_the_umask_and_then_accepted_as_it_is(tmp_path):
    path = mine(tmp_path)
    old = os.umask(0)
    try:
        ensure(path)
    finally:
        os.umask(old)
    found = os.lstat(path)
    assert (found.st_mode & 0o7777, found.st_uid) == (0o700, UID)
    (Path(path) / "kept").write_text("x")
    ensure(path)                                   # there and fit: used as it is
    assert (Path(path) / "kept").read_text() == "x"


@needs_root
def test_a_directory_of_another_user_is_refused_naming_its_owner(tmp_path):
    path = mine(tmp_path)
    os.mkdir(path, 0o700)
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(UnsafeDir) as refused:
        ensure(path)
    assert str(refused.value) == f"{path} belongs to uid {NOBODY}, not to uid 0 (this job's user): {REMOVE}"


@pytest.mark.parametrize("mode", [0o750, 0o705, 0o701, 0o1777])
def test_a_directory_others_may_enter_is_refused_and_left_as_it_is(tmp_path, mode):
    path = mine(tmp_path)
    os.mkdir(path)
    os.chmod(path, mode)
    with pytest.raises(UnsafeDir) as refused:
        ensure(path)
    assert str(refused.value) == (f"{path} has mode {mode:04o}: group or others may enter it (it must be 0700): "
                                  f"{REMOVE}")
    assert os.stat(path).st_mode & 0o7777 == mode    # refused, never repaired


def refused_both_ways(path: str, line: str) -> None:
    """Neither making nor opening the directory takes `path`: each says `line`."""
    with pytest.raises(UnsafeDir) as refused:
        ensure(path)
    assert str(refused.value) == line
    with pytest.raises(UnsafeDir) as refused:
        os.close(open_checked(path))
    assert str(refused.value) == line


def test_a_link_is_refused_even_to_a_fit_directory(tmp_path):
    fit = tmp_path / "elsewhere"
    fit.mkdir(mode=0o700)
    path = mine(tmp_path)
    os.symlink(fit, path)
    refused_both_ways(path, f"{path} is a symbolic link, not a directory: {REMOVE}")


@pytest.mark.parametrize("kind", ["a regular file", "a FIFO", "a socket"])
def test_something_that_is_not_a_directory_is_refused_without_blocking(tmp_path, kind):
    path = mine(tmp_path)
    if kind == "a regular file":
        Path(path).write_text("")
    elif kind == "a FIFO":
        os.mkfifo(path)
    else:
        held = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        held.bind(path)
    refused_both_ways(path, f"{path} is {kind}, not a directory: {REMOVE}")


def test_a_place_where_the_directory_cannot_be_made_says_what_to_do(tmp_path):
    path = private_dir_path(str(tmp_path / "no-such-tmpdir"), UID)
    with pytest.raises(UnsafeDir) as refused:
        ensure(path)
    assert str(refused.value) == f"{path} cannot be made: No such file or directory: set TMPDIR to a directory " \
                                 "you can write"


# ---------------------------------------------------------------- writing the request file

def test_the_request_file_is_written_whole_with_no_leftovers(tmp_path):
    path = mine(tmp_path)
    ensure(path)
    write_file(path, "s.sock.checkpoint-request", "token-1\n")
    write_file(path, "s.sock.checkpoint-request", "token-2\n")
    assert os.listdir(path) == ["s.sock.checkpoint-request"]
    assert Path(path, "s.sock.checkpoint-request").read_text() == "token-2\n"
    assert os.stat(Path(path, "s.sock.checkpoint-request")).st_mode & 0o777 == 0o600


def write_within(directory: str, name: str, text: str, seconds: float = 10.0) -> BaseException | None:
    """write_file in a thread that must end within `seconds` (a write into a FIFO would wait)."""
    outcome: list[BaseException | None] = []

    def write():
        try:
            write_file(directory, name, text)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the write blocked"
    return outcome[0]


def test_a_fifo_or_a_link_at_the_request_file_is_replaced_never_opened_nor_followed(tmp_path):
    path = mine(tmp_path)
    ensure(path)
    os.mkfifo(os.path.join(path, "a.checkpoint-request"))
    assert write_within(path, "a.checkpoint-request", "token\n") is None
    assert Path(path, "a.checkpoint-request").read_text() == "token\n"
    target = tmp_path / "target"
    target.write_text("untouched\n")
    os.symlink(target, os.path.join(path, "b.checkpoint-request"))
    assert write_within(path, "b.checkpoint-request", "token\n") is None
    assert not os.path.islink(os.path.join(path, "b.checkpoint-request"))
    assert target.read_text() == "untouched\n"


@needs_root
def test_nothing_is_written_into_a_directory_that_is_refused(tmp_path):
    path = mine(tmp_path)
    os.mkdir(path, 0o700)
    os.mkfifo(os.path.join(path, "a.checkpoint-request"))   # would block a write that opened it
    os.chown(path, NOBODY, NOBODY)
    refused = write_within(path, "a.checkpoint-request", "token\n")
    assert isinstance(refused, UnsafeDir)
    assert str(refused) == f"{path} belongs to uid {NOBODY}, not to uid 0 (this job's user): {REMOVE}"
    assert os.listdir(path) == ["a.checkpoint-request"]


def test_a_directory_at_the_request_file_is_one_line(tmp_path):
    path = mine(tmp_path)
    ensure(path)
    os.mkdir(os.path.join(path, "a.checkpoint-request"))
    refused = write_within(path, "a.checkpoint-request", "token\n")
    assert isinstance(refused, UsageError) and not isinstance(refused, UnsafeDir)
    assert str(refused).startswith(f"cannot write {path}/a.checkpoint-request: ")
    assert os.listdir(path) == ["a.checkpoint-request"]


# ---------------------------------------------------------------- the socket's path

def test_the_agent_socket_lies_in_the_users_directory_and_fits_a_unix_socket_address():
    assert agent_socket_path("77", "node2", {}, uid=1000) == "/tmp/trainctl-1000/progress-77-node2.sock"
    # two clusters on one host (several slurmd there) number their jobs alike: the names keep them apart
    assert agent_socket_path("77", "node2", {"SLURM_CLUSTER_NAME": "c1"}, uid=1000) == \
        "/tmp/trainctl-1000/progress-c1-77-node2.sock"
    assert agent_socket_path("77", "node2", {"TMPDIR": "/scratch/tmp"}, uid=7) == \
        "/scratch/tmp/trainctl-7/progress-77-node2.sock"
    long_node = "gpu-" + "x" * 120
    assert agent_socket_path("77", long_node, {"SLURM_CLUSTER_NAME": "c1"}, uid=7) != \
        agent_socket_path("77", long_node, {"SLURM_CLUSTER_NAME": "c2"}, uid=7)
    hashed = agent_socket_path("77", long_node, {"TMPDIR": "/scratch/tmp"}, uid=7)
    assert hashed.startswith("/scratch/tmp/trainctl-7/progress-") and len(hashed) <= 107
    assert hashed != agent_socket_path("78", long_node, {"TMPDIR": "/scratch/tmp"}, uid=7)
    deep = agent_socket_path("77", "node2", {"TMPDIR": "/" + "d" * 100}, uid=4294967294)
    assert deep.startswith("/tmp/trainctl-4294967294/progress-") and len(deep) <= 107


def test_a_watched_rank_gets_the_socket_and_makes_the_directory_when_the_agent_has_not(tmp_path):
    environ = {"TMPDIR": str(tmp_path), "SLURM_JOB_ID": "9", "TRAINCTL_WATCH_DIR": "/gate/watch"}
    env, refused = progress_environment(environ, "node1")
    assert (env, refused) == ({"TRAINCTL_PROGRESS_SOCKET": f"{mine(tmp_path)}/progress-9-node1.sock"}, "")
    assert os.stat(mine(tmp_path)).st_mode & 0o777 == 0o700
    assert progress_environment({**environ, "TRAINCTL_WATCH_DIR": ""}, "node1") == ({}, "")


@needs_root
def test_a_watched_rank_gets_no_socket_where_the_directory_is_another_users(tmp_path):
    os.mkdir(mine(tmp_path), 0o700)
    os.chown(mine(tmp_path), NOBODY, NOBODY)
    environ = {"TMPDIR": str(tmp_path), "SLURM_JOB_ID": "9", "TRAINCTL_WATCH_DIR": "/gate/watch"}
    assert progress_environment(environ, "node1") == \
        ({}, f"{mine(tmp_path)} belongs to uid {NOBODY}, not to uid 0 (this job's user): {REMOVE}")


PROBE = "import json, os; print(json.dumps(dict(os.environ)))"


@needs_root
def test_rank_exec_gives_no_socket_and_no_bootstrap_and_local_rank_0_says_why(tmp_path):
    from trainctl.launcher.rank_exec import BOOTSTRAP_DIR

    os.mkdir(mine(tmp_path), 0o700)
    os.chown(mine(tmp_path), NOBODY, NOBODY)
    outputs = []
    for local in (0, 1):
        task = {"SLURM_PROCID": str(local), "SLURM_LOCALID": str(local), "SLURM_NODEID": "0",
                "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_ID": "9",
                "SLURMD_NODENAME": "gpu07", "TMPDIR": str(tmp_path), "TRAINCTL_WATCH_DIR": str(tmp_path / "watch")}
        env = {k: v for k, v in os.environ.items() if k not in ("TRAINCTL_PROGRESS_SOCKET", "PYTHONPATH")}
        result = subprocess.run([TRAINCTL, "rank-exec", "--site", "local-demo", "--master-addr", "h", "--no-bind",
                                 "--", sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                                env={**env, **task})
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert "TRAINCTL_PROGRESS_SOCKET" not in seen and BOOTSTRAP_DIR not in seen.get("PYTHONPATH", "")
        outputs.append(result.stderr)
    said = [line for line in outputs[0].splitlines() if "no progress" in line]
    assert said == [f"trainctl rank-exec: gpu07: the ranks report no progress (no TRAINCTL_PROGRESS_SOCKET, no "
                    f"automatic step counting): {mine(tmp_path)} belongs to uid {NOBODY}, not to uid 0 (this job's "
                    f"user): {REMOVE}"]
    assert "no progress" not in outputs[1]    # one voice per node


# ---------------------------------------------------------------- the agent without its directory

@needs_root
def test_the_agent_watches_on_without_a_socket_where_the_directory_is_another_users(tmp_path):
    """Another user's directory with a socket and a forged request file at the agent's paths: the
    agent binds nothing, writes nothing there, keeps running its checks and writing its node file,
    and leaves the other user's files alone at its end."""
    from test_job_agent import NO_XID_DMESG, poll, read_json, stage

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stage(bin_dir, NO_XID_DMESG)
    site = tmp_path / "site.toml"
    demo = (Path(__file__).resolve().parents[1] / "site-configs/local-demo.toml").read_text()
    site.write_text(re.sub(r"^check_interval_s = [^ ]*", "check_interval_s = 1.0", demo, flags=re.M))
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURMD_NODENAME="node2", TMPDIR=str(tmp_path),
               PATH=f"{bin_dir}:{os.environ['PATH']}")
    path = agent_socket_path("4242", "node2", env)
    os.mkdir(mine(tmp_path), 0o700)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    squatter.bind(path)
    Path(path + ".checkpoint-request").write_text("forged\n")
    os.chown(mine(tmp_path), NOBODY, NOBODY)
    gate = tmp_path / "gate"
    (gate / "watch").mkdir(parents=True)
    agent = subprocess.Popen([TRAINCTL, "job", "agent", "--dir", str(gate), "--site", str(site)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        node_path = gate / "watch" / "node2.json"
        first = poll(lambda: read_json(node_path), lambda d: d["checks"]["runs"] >= 1, "the baseline check run")
        (gate / "watch" / "checkpoint-request").write_text("genuine\n")
        later = poll(lambda: read_json(node_path), lambda d: d["checks"]["runs"] > first["checks"]["runs"]
                     and d["t"] > first["t"], "a later check run and node file")
        assert later["ranks"] == {} and later["checks"]["failed"] == []
        assert agent.poll() is None
    finally:
        agent.terminate()
        out, err = agent.communicate(timeout=30)
    squatter.close()
    assert agent.returncode == 143, err
    lines = err.splitlines()
    assert lines[0] == (f"trainctl job agent: node2: no progress socket for this node: {mine(tmp_path)} belongs to "
                        f"uid {NOBODY}, not to uid 0 (this job's user): {REMOVE}; the watch goes on with this node's "
                        "checks and node file, without its ranks' steps or checkpoint requests")
    assert lines[1].startswith(f"trainctl job agent: node2: writing {gate}/watch/node2.json, checks ")
    assert lines[2:] == ["trainctl: stopped by SIGTERM"], err
    assert sorted(os.listdir(mine(tmp_path))) == sorted([os.path.basename(path), os.path.basename(path)
                                                         + ".checkpoint-request"])
    assert Path(path + ".checkpoint-request").read_text() == "forged\n"
