"""Sizes and numbers that cannot be true are refused early, in one line; messages name the input.

Each class is fed as a user or a machine would hand it: a hostlist on the command line or in
SLURM_JOB_NODELIST, Slurm's task variables, a 1 GB file in a snapshot directory, a site file
with a BOM or a 200,000-item array, a FIFO given as a key file. Exit 70 only ever means a bug.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from test_hostile import DEMO_SITE, demo_site_with, one_line, trainctl
from trainctl.health.snapshot import FILE_CAP_BYTES, load_snapshot
from trainctl.slurm import HOSTLIST_MAX_NODES, count_hostlist

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "fixtures" / "recorded" / "h100-vm-2026-11-22-snapshot"


# ---------------------------------------------------------------- hostlists

@pytest.mark.parametrize("hostlist, count", [
    ("n[1-100000000]", 100_000_000), ("n[1-1000000000000000000]", 10**18), ("gpu[01-08,10]", 9),
    ("n[1-4]-[1-2]", 8), ("a[1-10]!a[1-3]", 13), ("n1,n2", 2), ("n[5-1]", 5), ("n[1-8/2]", 8),
])
def test_a_hostlist_is_counted_from_its_brackets_without_expanding(hostlist, count):
    assert count_hostlist(hostlist) == count


@pytest.mark.parametrize("hostlist", ["n[1-100000000]", "n[1-1000000000000000000]", "a[1-40000],b[1-40000]"])
def test_a_hostlist_larger_than_slurm_holds_is_one_line_exit_2(tmp_path, hostlist):
    out = trainctl("sweep", "--site", "local-demo", "--via", "ssh", "--nodes", hostlist, "--db", tmp_path / "h.db")
    assert out.returncode == 2, out.stderr
    line = one_line(out.stderr)
    assert "--nodes" in line and f"more than the {HOSTLIST_MAX_NODES}" in line
    assert not (tmp_path / "h.db").exists()


def test_a_hostlist_larger_than_slurm_holds_in_the_jobs_environment_is_one_line_exit_2(tmp_path):
    env = {"SLURM_JOB_NODELIST": "n[1-1000000000000000000]", "SLURM_JOB_ID": "7"}
    out = trainctl("gate", "decide", "--dir", tmp_path, "--nodes", "1", env=env)
    assert out.returncode == 2 and "SLURM_JOB_NODELIST" in one_line(out.stderr)
    # the sweep's node task runs outside the CLI: one line there too, not a traceback and exit 1
    task = subprocess.run([sys.executable, "-m", "trainctl.sweep.node_task", "--timeout", "5", "--only", "host"],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, **env, "SLURMD_NODENAME": ""})
    assert task.returncode == 2, task.stderr
    assert "SLURM_JOB_NODELIST" in one_line(task.stderr) and task.stdout == ""


# ---------------------------------------------------------------- rank-exec and Slurm's task variables

TASK = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
        "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "node1"}


@pytest.mark.parametrize("name, value, said", [
    ("SLURM_NODEID", "x", "SLURM_NODEID='x'"), ("SLURM_NODEID", "9" * 30, "SLURM_NODEID="),
    ("SLURM_NODEID", "1", "node index 1 is outside"), ("SLURM_PROCID", "5", "SLURM_PROCID=5 is not below 1"),
    ("SLURM_PROCID", "-1", "SLURM_PROCID='-1'"), ("SLURM_NTASKS", "0", "SLURM_NTASKS=0"),
    ("SLURM_NTASKS", "1e3", "SLURM_NTASKS='1e3'"), ("SLURM_LOCALID", "3", "SLURM_LOCALID=3 is not below 1"),
    ("SLURM_JOB_ID", "abc", "SLURM_JOB_ID='abc'"), ("SLURM_JOB_ID", "9" * 30, "SLURM_JOB_ID="),
    ("SLURM_TASKS_PER_NODE", "8(x1000000000000)", f"more than {HOSTLIST_MAX_NODES} nodes"),
    ("SLURM_TASKS_PER_NODE", "9" * 40, "cannot read the task layout"),
    ("SLURM_TASKS_PER_NODE", "0", "has 0 tasks"),
])
def test_slurm_task_variables_that_cannot_be_true_are_one_line_exit_2(tmp_path, name, value, said):
    out = trainctl("rank-exec", "--site", "local-demo", "--master-addr", "127.0.0.1", "--no-bind", "--",
                   str(tmp_path / "no-such-program"), env={**TASK, name: value})
    assert out.returncode == 2, out.stderr
    assert said in one_line(out.stderr)


# ---------------------------------------------------------------- the snapshot loader

def test_a_stray_gigabyte_in_a_snapshot_costs_nothing_and_an_oversized_known_file_is_unreadable(tmp_path):
    snapshot = tmp_path / "snap"
    subprocess.run(["cp", "-r", str(SNAPSHOT), str(snapshot)], check=True)
    for name in ("core.1234", "dmesg.txt"):      # a stray file, and a known one larger than any probe writes
        with open(snapshot / name, "wb") as handle:
            handle.truncate(1 << 30)              # sparse: no disk used, 1 GB to whoever reads it
    tracemalloc.start()
    try:
        loaded = load_snapshot(snapshot)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "core.1234" not in loaded.files and "core.1234" not in loaded.oversized
    assert "dmesg.txt" not in loaded.files and loaded.oversized["dmesg.txt"] == 1 << 30
    assert peak < 4 * FILE_CAP_BYTES, f"{peak >> 20} MiB"
    out = trainctl("health", "check", "--snapshot", snapshot, "--only", "gpu.xid", "--json")
    (xid,) = json.loads(out.stdout)["checks"]
    assert xid["status"] == "unknown" and "dmesg.txt" in xid["reason"] and "not read" in xid["reason"]


def test_a_journal_past_a_journals_size_is_neither_copied_nor_read_into_memory(tmp_path):
    """The journal copied at the job's end (and folded into fleet memory) is read whole by one
    reader, up to JOURNAL_MAX_BYTES: a sparse file larger than that is one line, and no copy."""
    from trainctl.job.jobdir import drop_journal
    from trainctl.journal_events import JOURNAL_MAX_BYTES

    journal = tmp_path / "journal.jsonl"
    with open(journal, "wb") as handle:
        handle.truncate(1 << 30)
    drop = tmp_path / "drop"
    drop.mkdir()
    tracemalloc.start()
    try:
        problem = drop_journal(str(journal), str(drop), "9")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert problem == f"{journal}: {1 << 30} bytes, more than a journal's {JOURNAL_MAX_BYTES}"
    assert list(drop.iterdir()) == [] and peak < 1 << 20


# ---------------------------------------------------------------- Ctrl-C before the CLI has loaded

def test_ctrl_c_while_the_cli_is_still_importing_is_one_line_130():
    # The signal arrives after the entry point's first statement and before Click and the
    # commands are imported: the window in which a KeyboardInterrupt traceback used to print.
    code = ("import trainctl.entry, os, signal\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "import trainctl.cli\n"
            "raise SystemExit(trainctl.entry.run())\n")
    out = subprocess.run([sys.executable, "-c", code, "site", "list"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130 and out.stderr == "trainctl: interrupted\n" and out.stdout == ""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_while_the_cli_is_still_importing_is_one_line(signum, code):
    script = f"import trainctl.entry, os\nos.kill(os.getpid(), {int(signum)})\nimport trainctl.cli\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == code and out.stderr == f"trainctl: stopped by {signal.Signals(signum).name}\n"


def test_python_dash_m_trainctl_is_the_cli():
    out = subprocess.run([sys.executable, "-m", "trainctl", "--version"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0 and out.stdout.startswith("trainctl ")


# ---------------------------------------------------------------- check names, signals, option bounds

def test_an_unknown_check_in_the_sites_gate_is_refused_before_anything_is_submitted(tmp_path):
    site = demo_site_with(tmp_path, "gate", "checks", '["gpu", "gpu.xdi"]')
    (tmp_path / "train.py").write_text("print('hi')\n")
    for args in (["site", "show", site], ["submit", "--site", site, "--nodes", "1", "--dry-run", "--", "train.py"]):
        out = trainctl(*args, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        assert "gate.checks: unknown check(s) 'gpu.xdi'" in one_line(out.stderr)
        assert "#SBATCH" not in out.stdout


@pytest.mark.parametrize("value, said", [("99", "signal number 99 does not exist"), ("0", "signal number 0"),
                                         ("FOO@30", "no signal named FOO"), ("KILL", "the program cannot catch KILL")])
def test_a_bad_signal_is_blamed_on_where_it_came_from(tmp_path, value, said):
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--signal", value, "--dry-run", "--",
                   "train.py", cwd=tmp_path)
    assert out.returncode == 2 and f"--signal {value!r}: {said}" in one_line(out.stderr)
    site = demo_site_with(tmp_path, "launch", "signal", json.dumps(value))
    out = trainctl("submit", "--site", site, "--nodes", "1", "--dry-run", "--", "train.py", cwd=tmp_path)
    line = one_line(out.stderr)
    assert out.returncode == 2 and f"launch.signal = {value!r}: {said}" in line and "--signal" not in line


@pytest.mark.parametrize("args, said", [
    (["sweep", "--site", "local-demo", "--fanout", "100000"], "--fanout"),
    (["sweep", "--site", "local-demo", "--fanout", "0"], "--fanout"),
    (["submit", "--site", "local-demo", "--nodes", "99999999999999999999", "--dry-run", "--", "/bin/sh"], "--nodes"),
    (["gate", "decide", "--dir", "/", "--nodes", "10000000"], "--nodes"),
    (["health", "check", "--only", ","], "--only ','"),
    (["health", "check", "--only", "gpu,,ib"], "an empty check name"),
])
def test_options_out_of_range_are_one_line_exit_2(args, said):
    out = trainctl(*args)
    assert out.returncode == 2 and said in one_line(out.stderr)


# ---------------------------------------------------------------- site files: sizes and encodings

def test_one_bad_item_of_a_huge_array_is_named_not_printed_whole(tmp_path):
    items = ", ".join(['"gpu"'] * 200_000 + ["5"])
    site = demo_site_with(tmp_path, "gate", "checks", f"[{items}]")
    out = trainctl("site", "show", site)
    line = one_line(out.stderr)
    assert out.returncode == 2 and "gate.checks" in line and "index 200000 of 200001" in line
    assert len(line) < 1000


def test_a_huge_value_is_cut_in_the_error_line(tmp_path):
    site = demo_site_with(tmp_path, "gate", "unknown", json.dumps("x" * 100_000))
    line = one_line(trainctl("site", "show", site).stderr)
    assert "gate.unknown" in line and "100002 characters" in line and len(line) < 1000


def test_a_site_file_may_start_with_a_utf8_bom(tmp_path):
    site = tmp_path / "bom.toml"
    site.write_bytes(b"\xef\xbb\xbf" + DEMO_SITE.read_bytes())
    out = trainctl("site", "show", site, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"]["value"]


@pytest.mark.parametrize("value", ["-5", "1e308"])
def test_free_disk_minimums_are_range_checked_per_path(tmp_path, value):
    site = demo_site_with(tmp_path, "gate", "min_free_disk_gib", f'{{ "/scratch" = {value} }}')
    out = trainctl("site", "show", site)
    assert out.returncode == 2 and "gate.min_free_disk_gib./scratch: got" in one_line(out.stderr)


# ---------------------------------------------------------------- "not a regular file" is said so

def special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    return {"a character device": Path("/dev/null"), "a FIFO": fifo, "a directory": tmp_path / "dir"}


def test_a_script_that_is_not_a_regular_file_is_said_so(tmp_path):
    for kind, path in special_files(tmp_path).items():
        out = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--dry-run", "--", path, cwd=tmp_path)
        line = one_line(out.stderr)
        assert out.returncode == 2 and kind in line and "does not exist" not in line, line


@pytest.mark.parametrize("option", ["--identity", "--known-hosts"])
def test_a_key_file_that_is_not_a_regular_file_is_said_so(tmp_path, option):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "known_hosts").touch()
    for kind, path in special_files(tmp_path).items():
        if kind == "a directory":
            continue   # Click's own check says "is a directory" for a file option
        other = ["--known-hosts", tmp_path / "known_hosts"] if option == "--identity" else []
        out = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--remote", "me@127.0.0.1:1", option, path,
                       *other, "--", "train.py", cwd=tmp_path)
        line = one_line(out.stderr)
        assert out.returncode == 2 and f"is not a regular file ({kind})" in line, line
