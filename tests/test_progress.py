"""`trainctl.progress`: what a rank sends the node agent, and that it costs nothing without one."""

import os
import socket
import struct
import subprocess
import sys

import pytest

from trainctl import progress
from trainctl.guest import wire

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
    records = [wire.decode(reader.recv(256)) for _ in range(4)]   # 3 steps, then the checkpoint
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
            "with p.compute(): pass\nfrom trainctl.guest import rank; print(rank.the_rank())")
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert (child.returncode, child.stdout) == (0, "None\n"), child.stderr


def test_no_reader_loses_the_report_without_raising(tmp_path):
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=str(tmp_path / "nobody.sock"), RANK="0",
               TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = subprocess.run([sys.executable, "-c", REPORTING], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr


def test_decode_refuses_what_is_not_a_report_of_this_version():
    with pytest.raises(ValueError, match="bytes"):
        wire.decode(b"\x01" * 10)
    older = struct.pack(wire.RECORD.format, wire.VERSION - 1, 0, 1, 1, 0.0, 1, 0.0, 0.0, 0.0, -1, 0)
    with pytest.raises(ValueError, match="version"):
        wire.decode(older)


# ---------------------------------------------------------------- never raises, never blocks

def _reader(tmp_path):
    path = str(tmp_path / "p.sock")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    return path, reader


def _run(code, env, *flags):
    return subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def _received(reader):
    """Every report waiting on `reader`, decoded (the child has exited: all it sent is queued),
    less the rank's activity reports (sent only when it went a second without a report: under
    load), which repeat the totals of the report before."""
    reader.setblocking(False)
    records = []
    while True:
        try:
            record = wire.decode(reader.recv(256))
        except BlockingIOError:
            return records
        totals = (record["steps"], record["checkpoint_step"])
        if record["window_steps"] or not records or totals != (records[-1]["steps"],
                                                               records[-1]["checkpoint_step"]):
            records.append(record)


def _warnings(stderr):
    return [line for line in stderr.splitlines() if "trainctl:" in line]


BAD_CHECKPOINTS = """
import trainctl.progress as progress
progress.step()
progress.checkpoint(5.0)          # a whole number of steps, as a float: counts
progress.step()
progress.checkpoint(5.5)          # dropped
progress.checkpoint(float("nan")) # dropped
progress.checkpoint(-3)           # dropped
progress.checkpoint(2**64)        # dropped
progress.checkpoint("7")          # dropped
progress.step()
"""


@pytest.mark.parametrize("flags", [(), ("-W", "error")], ids=["default", "warnings-are-errors"])
def test_a_checkpoint_that_is_no_step_number_is_dropped_with_one_warning_and_steps_go_on(tmp_path, flags):
    path, reader = _reader(tmp_path)
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK="1", TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = _run(BAD_CHECKPOINTS, env, *flags)
    assert child.returncode == 0, child.stderr
    records = _received(reader)
    assert [(r["steps"], r["checkpoint_step"]) for r in records] == [(1, -1), (1, 5), (2, 5), (3, 5)]
    assert len(_warnings(child.stderr)) == (0 if flags else 1), child.stderr


CALLS = """
import trainctl.progress as progress
for _ in range(3):
    with progress.compute():
        pass
    progress.step()
progress.checkpoint(3)
"""


def test_a_rank_beyond_what_a_report_holds_reports_nothing_and_warns_once(tmp_path):
    path, reader = _reader(tmp_path)
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK=str(2**40), TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = _run(CALLS, env)
    assert child.returncode == 0, child.stderr
    assert _received(reader) == []
    assert len(_warnings(child.stderr)) == 1, child.stderr


SPACED_STEPS = """
import time
import trainctl.progress as progress
from trainctl.guest import wire
for _ in range(3):
    time.sleep(wire.DEFAULT_INTERVAL_S * 1.2)   # longer than the default interval: one report each
    progress.step()
"""


@pytest.mark.parametrize("interval", ["nan", "inf", "-1", "1e9", "fast"])
def test_a_bad_interval_falls_back_to_the_default_so_reports_go_on(tmp_path, interval):
    path, reader = _reader(tmp_path)
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK="0", TRAINCTL_PROGRESS_INTERVAL_S=interval)
    child = _run(SPACED_STEPS, env)
    assert child.returncode == 0, child.stderr
    assert [r["steps"] for r in _received(reader)] == [1, 2, 3]
    assert len(_warnings(child.stderr)) == 1, child.stderr


# The module's code is read before the descriptors run out, then run as `import` runs it: the
# import itself then needs no descriptor, as in a program that imported trainctl earlier.
NO_DESCRIPTORS = """
import __future__, collections.abc, contextlib, importlib.util, math, os, resource, signal, socket, struct, sys
import threading, time, warnings
import trainctl.guest.rank, trainctl.guest.saves   # the guest room: imported earlier, as the program's hook does
spec = importlib.util.find_spec("trainctl.progress")
code = spec.loader.get_code(spec.name)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
while True:
    try:
        held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
exec(code, module.__dict__)
progress = module
progress.step()
progress.checkpoint(1)
for fd in held:
    os.close(fd)
progress.step()                    # a descriptor is free again: this report goes out
"""


def test_import_and_calls_with_no_descriptor_left_do_not_raise_and_report_once_one_is_free(tmp_path):
    path, reader = _reader(tmp_path)
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK="0", TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = _run(NO_DESCRIPTORS, env)
    assert child.returncode == 0, child.stderr
    assert [(r["steps"], r["checkpoint_step"]) for r in _received(reader)] == [(2, 1)]
    assert len(_warnings(child.stderr)) == 1, child.stderr


MANY_STEPS = """
import trainctl.progress as progress
for _ in range(50_000):
    progress.step()
progress.checkpoint(50_000)
print("done")
"""


def test_a_reader_that_never_reads_does_not_block_the_program(tmp_path):
    path, reader = _reader(tmp_path)   # bound, never read: its queue fills after a few hundred reports
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK="0", TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = _run(MANY_STEPS, env)
    assert (child.returncode, child.stdout, _warnings(child.stderr)) == (0, "done\n", []), child.stderr
    assert 0 < len(_received(reader)) < 50_000


def test_an_agent_gone_leaving_its_socket_file_costs_the_program_nothing(tmp_path):
    path, reader = _reader(tmp_path)
    reader.close()                     # the file stays; nobody reads it: every send is refused
    env = dict(os.environ, TRAINCTL_PROGRESS_SOCKET=path, RANK="0", TRAINCTL_PROGRESS_INTERVAL_S="0")
    child = _run(MANY_STEPS, env)
    assert (child.returncode, child.stdout, _warnings(child.stderr)) == (0, "done\n", []), child.stderr


def test_the_activity_sampler_ends_before_the_interpreter_finalizes(tmp_path):
    # a daemon thread still running when Python finalizes is stopped mid-call, which a C++ library
    # in the same process (torch, gloo) can turn into "terminate called without an active exception"
    code = ("import atexit, sys\n"   # registered first, so run last (atexit runs in reverse)
            "atexit.register(lambda: print('sampler running at exit:',\n"
            "                              sys.modules['trainctl.guest.rank']._sampler.running))\n"
            "import trainctl.progress as progress\n"
            "progress.step()\n"
            "assert sys.modules['trainctl.guest.rank']._sampler.running\n")
    env = dict(os.environ, **{wire.SOCKET_ENV: str(tmp_path / "none.sock"), "RANK": "0"})
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "sampler running at exit: False", child.stdout + child.stderr
