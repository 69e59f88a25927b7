"""Remote reads are bounded like local probes: bytes, one deadline per node, and stop signals.

Each test talks to a real SSH server on 127.0.0.1 (tests/support/ssh_server.py) or runs a
real `srun` stand-in; the answers are hostile: a flood, a 1-byte trickle, one line with no
end, a banner that never finishes, a `setsid` grandchild that keeps stdout open. Bounds on
time are stated against the hostile party's own duration (a trickle of minutes, a deadline
of a minute and a half), never as a wall-clock budget of the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.ssh_server import Behaviour, hostile_ssh_server
from test_hostile import site_file
from test_probe_bounds import probe, survivors
from trainctl.proc import OUTPUT_CAP_BYTES
from trainctl.sweep import collect
from trainctl.sweep.collect import NodeCommand, SshAccess, collect_via_slurm, ssh_node
from trainctl.sweep.model import ERROR, TIMEOUT

REPO = Path(__file__).resolve().parents[1]
# trainctl in its own interpreter, with the node task's start-up margin set from the test, and
# its peak RSS written out at the end.
RUN = """
import os, sys
import trainctl.sweep.collect
trainctl.sweep.collect.STARTUP_MARGIN_S = float(os.environ["TEST_STARTUP_MARGIN_S"])
from trainctl.cli import main
code = main(sys.argv[1:])
# VmHWM, this process's own peak: ru_maxrss would carry the parent's peak across fork and exec
# (Linux keeps the larger in the signal struct), which is pytest's, hundreds of MiB late in a run
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
with open(os.environ["TEST_PEAK_FILE"], "w") as out:
    out.write(str(int(hwm.split()[1]) * 1024))
sys.exit(code)
"""


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)   # the key file given is the only key


def node_command(timeout_s: float) -> NodeCommand:
    return NodeCommand(python="python3", site="s", partition=None, only=("host",), timeout_s=timeout_s)


def access(server) -> SshAccess:
    return SshAccess(user="me", port=server.port, key_path=str(server.client_key),
                     known_hosts=str(server.known_hosts))


def test_a_trickle_ends_at_the_node_deadline_as_a_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "STARTUP_MARGIN_S", 0.0)
    behaviour = Behaviour("trickle", trickle_s=0.2, trickle_total_s=120)
    with hostile_ssh_server(tmp_path, behaviour) as server:
        started = time.monotonic()
        outcome = ssh_node("n1", "127.0.0.1", node_command(2), access(server), "")
        elapsed = time.monotonic() - started
    assert behaviour.execs == 1 and behaviour.sent > 0        # the command ran and trickled
    assert outcome.outcome == TIMEOUT, outcome
    assert "no answer over SSH within 2 s" in outcome.detail
    assert outcome.duration_s >= 2                             # it was the deadline that ended it
    assert elapsed < behaviour.trickle_total_s / 10            # not the trickle's two minutes


def test_a_banner_sent_a_byte_at_a_time_ends_at_the_node_deadline(tmp_path, monkeypatch):
    import trainctl.ssh

    monkeypatch.setattr(collect, "STARTUP_MARGIN_S", 0.0)
    behaviour = Behaviour("banner-trickle", trickle_s=0.2)
    with hostile_ssh_server(tmp_path, behaviour) as server:
        started = time.monotonic()
        outcome = ssh_node("n1", "127.0.0.1", node_command(2), access(server), "")
        elapsed = time.monotonic() - started
    assert outcome.outcome == TIMEOUT, outcome
    # paramiko's own per-step timeouts (20 s each) are not what ended it
    assert elapsed < trainctl.ssh.SSH_CONNECT_TIMEOUT_S / 2


def test_one_line_without_end_is_cut_and_is_no_verdict(tmp_path, monkeypatch):
    behaviour = Behaviour("huge-line", huge_bytes=5 * OUTPUT_CAP_BYTES)
    with hostile_ssh_server(tmp_path, behaviour) as server:
        outcome = ssh_node("n1", "127.0.0.1", node_command(60), access(server), "")
    assert outcome.outcome == ERROR, outcome
    assert f"{5 * OUTPUT_CAP_BYTES} bytes of output, cut to its head and tail" in outcome.detail
    assert "no verdict" in outcome.detail and len(outcome.detail) < 1000


def sweep_process(tmp_path: Path, server, *args: str, margin_s: float) -> subprocess.Popen:
    site = site_file(tmp_path, db=tmp_path / "sweeps.db", port=server.port,
                     extra={"ssh_key": f'"{server.client_key}"'})
    env = {**os.environ, "PATH": "/nonexistent", "TEST_STARTUP_MARGIN_S": str(margin_s),
           "TEST_PEAK_FILE": str(tmp_path / "peak")}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.Popen([sys.executable, "-c", RUN, "sweep", "--site", str(site), "--via", "ssh",
                             "--nodes", "127.0.0.1", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def test_a_flood_keeps_the_sweeps_memory_bounded_and_ends_at_the_deadline(tmp_path):
    behaviour = Behaviour("flood")
    with hostile_ssh_server(tmp_path, behaviour) as server:
        proc = sweep_process(tmp_path, server, "--timeout", "1", margin_s=4)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err                           # no verdict: unknown
    (node,) = json.loads(out)["nodes"]
    assert node["outcome"] == "timeout", node["detail"]
    peak = int((tmp_path / "peak").read_text())
    assert behaviour.sent > 2 * OUTPUT_CAP_BYTES                # the flood outran the cap
    # the caps (8 MiB of stdout, 64 KiB of stderr) and paramiko's 2 MiB window over an
    # interpreter with paramiko and click loaded; unbounded, this reached gigabytes
    assert peak < 4 * OUTPUT_CAP_BYTES + (200 << 20), f"peak RSS {peak >> 20} MiB, {behaviour.sent >> 20} MiB sent"


@pytest.mark.parametrize("signum, code, line", [
    (signal.SIGINT, 130, "trainctl: interrupted"),
    (signal.SIGTERM, 143, "trainctl: stopped by SIGTERM"),
    (signal.SIGHUP, 129, "trainctl: stopped by SIGHUP"),
])
def test_a_stop_signal_ends_an_ssh_sweep_at_once(tmp_path, signum, code, line):
    behaviour = Behaviour("trickle", trickle_s=0.2, trickle_total_s=600)
    with hostile_ssh_server(tmp_path, behaviour) as server:
        proc = sweep_process(tmp_path, server, "--timeout", "60", margin_s=30)   # a 90 s node deadline
        assert behaviour.started.wait(60), proc.communicate(timeout=5)
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    assert proc.returncode == code, err
    assert line in err.strip().splitlines()[-1] and "Traceback" not in err
    assert took < 90 / 10, f"took {took:.2f} s"   # a fraction of the node's deadline (~0.2 s seen)


def srun_standin(tmp_path: Path, script: str) -> dict[str, str]:
    """An environment whose `srun` is `script`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    probe(bin_dir, "srun", script)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_an_srun_whose_setsid_grandchild_holds_stdout_ends_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "STARTUP_MARGIN_S", 0.0)
    monkeypatch.setattr(collect, "ALLOCATION_WAIT_S", 0)
    tag = "31431"
    env = srun_standin(tmp_path, f"#!/bin/sh\nsetsid sleep {tag} &\necho not-a-piece\nsleep {tag}\n")
    started = time.monotonic()
    outcomes = list(collect_via_slurm(["n1", "n2"], node_command(2), partition=None, extra=[], states={}, env=env))
    elapsed = time.monotonic() - started
    assert [(o.host, o.outcome) for o in outcomes] == [("n1", TIMEOUT), ("n2", TIMEOUT)]
    assert survivors(f"sleep {tag}") == []                    # the grandchild is gone too
    assert elapsed < int(tag) / 1000                           # not the grandchild's life


def test_an_srun_that_exits_while_a_grandchild_holds_stdout_is_not_held(tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "ALLOCATION_WAIT_S", 0)
    tag = "31432"
    env = srun_standin(tmp_path, f"#!/bin/sh\nsetsid sleep {tag} &\necho srun: error: no nodes >&2\nexit 1\n")
    started = time.monotonic()
    with pytest.raises(Exception, match="sweep job failed: srun exited with status 1: srun: error: no nodes"):
        list(collect_via_slurm(["n1"], node_command(60), partition=None, extra=[], states={}, env=env))
    assert survivors(f"sleep {tag}") == []
    assert time.monotonic() - started < node_command(60).deadline_s / 10
