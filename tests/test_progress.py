"""`trainctl.progress`: what a rank sends the node agent, and that it costs nothing without one."""

import os
import socket
import struct
import subprocess
import sys

import pytest

from trainctl import progress

REPORTING = """
import os, sys, time
import trainctl.progress as progress
for _ in range(3):
    with progress.compute():
        time.sleep(0.01)
    progress.step()
progress.checkpoint(3)
print(os.getpid())
"""


def test_each_report_carries_the_ranks_pid_running_totals_and_checkpoint(tmp_path):
    path = str(tmp_path / "p.sock")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    reader.settimeout(30)
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK="5", TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = subprocess.run([sys.executable, "-c", REPORTING], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    records = [progress.decode(reader.recv(256)) for _ in range(4)]   # 3 steps, then the checkpoint
    reader.close()
    assert {r["pid"] for r in records} == {int(child.stdout)}
    assert {r["rank"] for r in records} == {5}
    assert [r["steps"] for r in records] == [1, 2, 3, 3]
    assert [r["window_steps"] for r in records] == [1, 1, 1, 0]
    assert [r["checkpoint_step"] for r in records] == [-1, -1, -1, 3]
    assert all(r["compute_seconds"] > 0 for r in records[:3])
    assert records[3]["time"] == pytest.approx(records[2]["time"], abs=1.0)  # the last step's end, not later


def test_without_the_socket_variable_nothing_is_set_up():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINCTL_PROGRESS")}
    code = ("import trainctl.progress as p; p.step(); p.checkpoint(1)\n"
            "with p.compute(): pass\nprint(p._REPORTER)")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert (child.returncode, child.stdout) == (0, "None\n"), child.stderr


def test_no_reader_loses_the_report_without_raising(tmp_path):
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=str(tmp_path / "nobody.sock"), RANK="0",
               TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = subprocess.run([sys.executable, "-c", REPORTING], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr


def test_decode_refuses_what_is_not_a_report_of_this_version():
    with pytest.raises(ValueError, match="bytes"):
        progress.decode(b"\x01" * 10)
    older = struct.pack(progress.RECORD.format, progress.VERSION - 1, 0, 1, 1, 0.0, 1, 0.0, 0.0, 0.0, -1)
    with pytest.raises(ValueError, match="version"):
        progress.decode(older)
