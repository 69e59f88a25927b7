"""Probes are hard-bounded: real processes that flood, hang, hide behind setsid, or cannot run.

Each probe here is a small script written into a temporary directory and pointed at with
TRAINCTL_BIN_<NAME>, as the README tells users to do. Processes left behind are looked for
by their command line, which carries a number no other process uses.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from support.replay import LIBRARY
from trainctl.proc import OUTPUT_CAP_BYTES, STDERR_CAP_BYTES, STREAM_LINE_CAP, StreamedRun, run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
IBSTAT = LIBRARY / "infiniband/ibstat/gpud-a100-9hca-cx6-hdr200-all-active.txt"


def probe(tmp_path, name, body, mode=0o755):
    path = tmp_path / name
    path.write_text(body)
    path.chmod(mode)
    return path


def leftovers(tag):
    """Processes still running whose command line holds `tag`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if tag in " ".join(proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def survivors(tag, *, grace=5.0):
    """Processes with `tag` still running `grace` seconds on: SIGKILL is delivered
    asynchronously, so one just killed may be listed for a moment before it is gone."""
    deadline = time.monotonic() + grace
    while (found := leftovers(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def start(*args, env):
    return subprocess.Popen([TRAINCTL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


def wait_for(tag, *, timeout=20):
    """Wait until a process with `tag` in its command line runs (the probes have started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leftovers(tag):
            return
        time.sleep(0.05)
    raise AssertionError(f"no process with {tag!r} started")


def test_flooding_probe_is_cut_to_head_and_tail_and_marked(tmp_path):
    # 40 MB of numbered lines, then a normal exit: the file keeps whole lines from both ends
    flood = probe(tmp_path, "ibstat", "#!/bin/sh\nseq 1 5000000\n")
    snap = tmp_path / "snap"
    out = subprocess.run([TRAINCTL, "health", "snapshot", "--out", str(snap), "--timeout", "30", "--json"],
                         capture_output=True, text=True, env={**os.environ, "TRAINCTL_BIN_IBSTAT": str(flood)})
    assert out.returncode == 0, out.stderr
    record = json.loads((snap / "meta.json").read_text())["probes"]["ibstat.txt"]
    written = len("\n".join(str(i) for i in range(1, 5000001))) + 1
    assert (record["exit_code"], record["truncated"], record["stdout_bytes"]) == (0, True, written)
    lines = (snap / "ibstat.txt").read_text().splitlines()
    assert lines[0] == "1" and lines[-1] == "5000000"
    numbers = [int(n) for n in lines]   # whole lines only: the cut falls between two lines
    assert numbers == sorted(numbers) and len(numbers) < 5000000
    assert (snap / "ibstat.txt").stat().st_size <= OUTPUT_CAP_BYTES


def test_exec_yes_keeps_memory_bounded_until_the_timeout(tmp_path):
    flood = probe(tmp_path, "nvidia-smi", "#!/bin/sh\nexec yes\n")
    snap = tmp_path / "snap"
    proc = start("health", "snapshot", "--out", str(snap), "--timeout", "3", "--json",
                 env={"TRAINCTL_BIN_NVIDIA_SMI": str(flood)})
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    record = json.loads((snap / "meta.json").read_text())["probes"]["nvidia-smi-q.xml"]
    assert record["timed_out"] and record["truncated"]
    # four `yes` floods for 3 s write gigabytes on a quiet machine (more than the cap even on a
    # loaded one); trainctl keeps at most 8 MiB of each
    assert record["stdout_bytes"] > OUTPUT_CAP_BYTES
    # 4 capped buffers over an interpreter of ~150 MiB with psutil and click loaded (185 MiB seen in CI)
    assert peak < 4 * OUTPUT_CAP_BYTES + (200 << 20), f"peak RSS {peak >> 20} MiB"
    assert not (snap / "nvidia-smi-q.xml").exists()


def test_setsid_grandchild_holding_stdout_does_not_hold_the_probe(tmp_path):
    tag = "31413"
    script = probe(tmp_path, "ibstat", f"#!/bin/sh\nsetsid sleep {tag} &\ncat {IBSTAT}\n")
    started = time.monotonic()
    result = run([str(script)], timeout=20)
    elapsed = time.monotonic() - started
    assert result.ok and result.stdout == IBSTAT.read_text()
    assert result.strays_killed == 1 and survivors(f"sleep {tag}") == []
    assert elapsed < 20 / 2   # it did not wait for the timeout, let alone for the grandchild


def test_hung_probe_with_a_setsid_grandchild_returns_at_its_timeout(tmp_path):
    tag = "31414"
    script = probe(tmp_path, "nvidia-smi", f"#!/bin/sh\nsetsid sleep {tag} &\nsleep {tag}\n")
    started = time.monotonic()
    result = run([str(script)], timeout=2)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.returncode is None
    assert survivors(f"sleep {tag}") == []
    assert elapsed < 2 + 1 + 1   # timeout + 1 s, and a second for a loaded machine


def test_check_with_timeout_3_ends_although_a_grandchild_keeps_stdout(tmp_path):
    # the case: `health check --timeout 3` hung for as long as the grandchild lived
    tag = "31415"
    script = probe(tmp_path, "ibstat", f"#!/bin/sh\nsetsid sleep {tag} &\nsleep {tag}\n")
    started = time.monotonic()
    out = subprocess.run([TRAINCTL, "health", "check", "--only", "ib.ports", "--timeout", "3", "--json"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TRAINCTL_BIN_IBSTAT": str(script)})
    elapsed = time.monotonic() - started
    (result,) = json.loads(out.stdout)["checks"]
    assert result["status"] == "unknown" and f"{script}: timed out after 3 s" in result["reason"]
    assert survivors(f"sleep {tag}") == []
    assert elapsed < 3 + 1 + 3   # timeout + 1 s, plus interpreter start-up on a loaded machine


@pytest.mark.parametrize("signum, code, line", [
    (signal.SIGINT, 130, "trainctl: interrupted"),
    (signal.SIGTERM, 143, "trainctl: stopped by SIGTERM"),
    (signal.SIGHUP, 129, "trainctl: stopped by SIGHUP"),
])
@pytest.mark.parametrize("command", ["check", "snapshot"])
def test_signal_mid_collect_ends_at_once_with_no_probe_left(tmp_path, signum, code, line, command):
    tag = str(31420 + signum)
    hung = probe(tmp_path, "nvidia-smi", f"#!/bin/sh\nsetsid sleep {tag} &\nsleep {tag}\n")
    args = ["health", command, "--timeout", "60"] + (["--out", str(tmp_path / "snap")] if command == "snapshot" else [])
    proc = start(*args, env={"TRAINCTL_BIN_NVIDIA_SMI": str(hung), "TRAINCTL_BIN_IBSTAT": str(hung)})
    wait_for(f"sleep {tag}")
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == code, err
    assert err.strip() == line and "Traceback" not in err
    assert survivors(f"sleep {tag}") == []
    assert took < 3, f"took {took:.2f} s"   # ~0.1 s measured; never the 60 s probe timeout


def test_three_ctrl_c_in_a_row_are_one_clean_interrupt(tmp_path):
    tag = "31430"
    hung = probe(tmp_path, "nvidia-smi", f"#!/bin/sh\nsleep {tag}\n")
    proc = start("health", "check", "--timeout", "60", env={"TRAINCTL_BIN_NVIDIA_SMI": str(hung)})
    wait_for(f"sleep {tag}")
    for _ in range(3):
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "Traceback" not in err and err.count("trainctl: interrupted") == 1
    assert survivors(f"sleep {tag}") == []


@pytest.mark.parametrize("body, mode, error", [
    ("\x7fELF\x02\x01\x01not really an ELF file", 0o755, "Exec format error"),
    ("#!/nonexistent/interpreter\necho hi\n", 0o755, "No such file or directory (a missing #! interpreter?)"),
    ("#!/bin/sh\necho hi\n", 0o644, "Permission denied"),
])
def test_unexecutable_probe_is_that_probes_failure_never_exit_70(tmp_path, body, mode, error):
    smi = probe(tmp_path, "nvidia-smi", body, mode)
    out = subprocess.run([TRAINCTL, "health", "check", "--only", "gpu.count,nvlink.links", "--json"],
                         capture_output=True, text=True, env={**os.environ, "TRAINCTL_BIN_NVIDIA_SMI": str(smi)})
    assert out.returncode == 3, out.stderr
    report = json.loads(out.stdout)
    for check in report["checks"]:
        assert check["status"] == "unknown"
        assert f"{smi}: cannot execute: {error}" in check["reason"]


def test_stdin_larger_than_a_pipe_buffer_goes_through_while_stdout_is_read():
    text = "".join(f"line {i}\n" for i in range(200000))     # ~2 MB: both pipes fill up
    result = run(["cat"], timeout=30, input_text=text)
    assert result.ok and result.stdout == text and not result.truncated


def test_small_cap_keeps_whole_lines_from_both_ends():
    result = run(["seq", "1", "100000"], timeout=30, output_cap=1000)
    lines = result.stdout.splitlines()
    assert result.truncated and result.stdout_bytes == len("".join(f"{i}\n" for i in range(1, 100001)))
    assert lines[0] == "1" and lines[-1] == "100000" and len(result.stdout) <= 1000
    assert all(a < b for a, b in zip(map(int, lines), map(int, lines[1:])))


@pytest.mark.cluster
def test_gate_nodes_with_broken_probes_are_unknown_apart_from_failures(devcluster, tmp_path):
    # node2's nvidia-smi cannot be executed; node3's hangs behind a setsid grandchild that
    # keeps stdout: each is that node's probe failure, inside a real srun step
    from support.replay import write_replay

    tag = "31440"
    healthy = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
    made = [write_replay(devcluster.node_bin_dir("node1"), "nvidia-smi", {"nvlink -s": healthy}),
            probe(devcluster.node_bin_dir("node2"), "nvidia-smi", "\x7fELF\x02\x01\x01not really an ELF file"),
            probe(devcluster.node_bin_dir("node3"), "nvidia-smi", f"#!/bin/sh\nsetsid sleep {tag} &\nsleep {tag}\n"),
            write_replay(devcluster.node_bin_dir("node4"), "nvidia-smi", {"nvlink -s": healthy})]
    gate_dir = tmp_path / "gate"
    try:
        started = time.monotonic()
        step = run(["srun", "-N4", "--ntasks-per-node=1", TRAINCTL, "gate", "node", "--site", "local-demo",
                    "--no-fabric", "--dir", str(gate_dir)], timeout=120, env=devcluster.client_env())
        took = time.monotonic() - started
    finally:
        for script in made:
            script.unlink()
    assert step.returncode == 0, step.stderr[-3000:]
    assert survivors(f"sleep {tag}") == []
    assert took < 60   # the probe timeout is 10 s (local-demo); the grandchild sleeps for hours
    nvlink = {}
    for node in ("node1", "node2", "node3", "node4"):
        report = json.loads((gate_dir / "nodes" / f"{node}.json").read_text())
        nvlink[node] = next((c["status"], c["reason"]) for c in report["checks"] if c["name"] == "nvlink.links")
    assert nvlink["node1"][0] == nvlink["node4"][0] == "ok"
    assert nvlink["node2"][0] == "unknown" and "cannot execute: Exec format error" in nvlink["node2"][1]
    assert nvlink["node3"][0] == "unknown" and "timed out after 10 s" in nvlink["node3"][1]
    # one node, so no fabric report is expected: node3 is left out as unknown, not as failed
    out = subprocess.run([TRAINCTL, "gate", "decide", "--dir", str(gate_dir), "--nodes", "1",
                          "--allocated", "node3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "only 0 of 1 nodes healthy, need 1: could not be checked: node3 nvlink.links: " in out.stderr
    decision = json.loads((gate_dir / "decision.json").read_text())
    assert [(e["host"], e["status"]) for e in decision["excluded"]] == [("node3", "unknown")]


def test_streamed_run_cuts_an_endless_line_and_keeps_only_stderrs_tail():
    """What a sweep's srun streams is read line by line; a line with no end (a task printing
    without newlines) and a stderr flood must not grow the collector's memory."""
    flood = ("import sys\n"
             "sys.stderr.write('e' * (4 << 20) + 'the reason')\n"
             "sys.stdout.write('x' * (8 << 20) + '\\n' + 'piece\\n')\n"
             "sys.exit(3)\n")
    with StreamedRun([sys.executable, "-c", flood], deadline_s=60, env=None) as stream:
        lines = list(stream.lines())
    assert [len(line) for line in lines] == [STREAM_LINE_CAP, len("piece\n")]
    assert lines[1] == "piece\n" and stream.cut_lines == 1
    assert stream.failed and stream.failure().endswith("the reason")
    assert len(stream.failure()) < STDERR_CAP_BYTES
