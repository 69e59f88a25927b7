"""Hostile inputs and environments (issue 12): each becomes one line and a documented exit code.

Every test feeds trainctl the real input: a TCP server that sends an SSH banner and then
stalls, a history on a read-only mount, a FIFO given as --db, a site file with NaN in it.
Exit 70 must only ever mean a bug in trainctl.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.cli_runs import Ran, run_main
from support.sweeps import night
from trainctl.sweep.db import History

REPO = Path(__file__).resolve().parents[1]
DEMO_SITE = REPO / "site-configs" / "local-demo.toml"
SSH_TIMEOUT_S = 1.5
# trainctl in a real interpreter, with the SSH handshake deadline cut from 20 s for the test.
RUN = f"""
import sys
import trainctl.ssh
trainctl.ssh.SSH_CONNECT_TIMEOUT_S = {SSH_TIMEOUT_S}
from trainctl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def trainctl(*args, env=None, cwd=None) -> Ran:
    """trainctl's `main` in this process (a subprocess per call would make this file minutes long).

    No Slurm on PATH: nodes named on the command line are outside Slurm (sinfo would look for
    a controller for a minute). The SSH handshake deadline is cut from 20 s for the tests.
    """
    return run_main(*args, env={"PATH": "/nonexistent", **(env or {})}, cwd=cwd, ssh_timeout_s=SSH_TIMEOUT_S)


def trainctl_process(*args, env=None, cwd=None, timeout=60) -> subprocess.CompletedProcess:
    """trainctl in an interpreter of its own: for pipes, argv bytes and the import path."""
    full_env = {**os.environ, "PATH": "/nonexistent", **(env or {})}
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, env=full_env,
                          timeout=timeout, cwd=cwd or REPO)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- fake servers on loopback

@contextlib.contextmanager
def tcp_server(address: str, behaviour: str, port: int = 0):
    """A server on `address` that sends an SSH banner and stalls, never speaks, or answers HTTP."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(16)
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if behaviour == "banner-then-stall":
                conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
            elif behaviour == "http":
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for conn in held:
            conn.close()


def site_file(tmp_path: Path, *, db: Path, port: int = 22, extra: dict[str, str] | None = None) -> Path:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.touch()
    text = DEMO_SITE.read_text()
    values = {"db": f'"{db}"', "ssh_port": str(port), "known_hosts": f'"{known_hosts}"', "ssh_key": '""',
              "fanout": "4", **(extra or {})}
    lines = []
    for line in text.splitlines():
        key = line.split("=")[0].strip()
        lines.append(f"{key} = {values.pop(key)}" if key in values and "=" in line else line)
    path = tmp_path / "site.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- data loss: SSH sweeps

def test_a_node_whose_sshd_stalls_after_its_banner_is_a_recorded_result_and_the_sweep_goes_on(tmp_path):
    db = tmp_path / "sweeps.db"
    with tcp_server("127.0.0.2", "banner-then-stall") as port, tcp_server("127.0.0.3", "silent", port):
        site = site_file(tmp_path, db=db, port=port)
        out = trainctl("sweep", "--site", site, "--via", "ssh", "--nodes", "127.0.0.2,127.0.0.3", "--json")
    assert out.returncode == 3, out.stderr                   # no verdict: unknown, not interrupted (130)
    nodes = {n["host"]: n for n in json.loads(out.stdout)["nodes"]}
    assert nodes["127.0.0.2"]["outcome"] == "error"
    assert f"handshake with 127.0.0.2:{port} timed out after {SSH_TIMEOUT_S:g} s" in nodes["127.0.0.2"]["detail"]
    assert nodes["127.0.0.3"]["outcome"] == "error"
    assert f"no SSH banner from 127.0.0.3:{port} within {SSH_TIMEOUT_S:g} s" in nodes["127.0.0.3"]["detail"]
    assert "Traceback" not in out.stderr
    report = json.loads(trainctl("report", "--db", db, "--format", "json").stdout)
    (sweep,) = report["sweeps"]
    assert sweep["complete"] and sweep["error"] == ""
    assert {h for group in report["no_verdict"] for h in group["hosts"]} == {"127.0.0.2", "127.0.0.3"}


def test_a_sweep_that_dies_is_never_recorded_as_complete(tmp_path):
    from trainctl.sweep.runner import record_sweep

    def answers_then(exc):
        yield from ()
        raise exc

    with History.open(tmp_path / "sweeps.db", write=True) as history:
        for exc in (EOFError(), KeyboardInterrupt()):            # EOFError's text is empty
            sweep_id = history.start_sweep(kind="sweep", started_at=time.time(), site="s", via="ssh",
                                            target="n1", checks="all")
            with pytest.raises(type(exc)):
                record_sweep(history, sweep_id=sweep_id, not_swept=[], outcomes=answers_then(exc),
                             progress=lambda line: None)
        crashed, interrupted = history.sweeps()
    assert crashed.error == "EOFError"                            # finished, with an error: not "complete"
    assert interrupted.finished_at is None                        # never finished: incomplete
    report = json.loads(trainctl("report", "--db", tmp_path / "sweeps.db", "--format", "json").stdout)
    assert [(s["complete"], s["error"]) for s in report["sweeps"]] == [(True, "EOFError"), (False, "")]
    text = trainctl("report", "--db", tmp_path / "sweeps.db").stdout
    assert "complete" not in text.replace("INCOMPLETE", "")


def test_a_stray_eof_error_is_a_bug_not_an_interruption():
    code = ("import sys, click\nimport trainctl.cli as cli\n"
            "@click.command()\ndef eof():\n    raise EOFError()\n"
            "cli.LazyGroup.get_command = lambda self, ctx, name: eof\n"
            "sys.exit(cli.main(['eof']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 70 and "interrupted" not in out.stderr


def test_a_server_that_is_not_ssh_is_one_line_without_paramiko_tracebacks(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "known_hosts").touch()
    for behaviour, expected in (("http", "no SSH banner from 127.0.0.1:{port} (Error reading SSH protocol banner)"),
                                ("silent", "no SSH banner from 127.0.0.1:{port} within")):
        with tcp_server("127.0.0.1", behaviour) as port:  # its own process: paramiko's logging untouched
            out = trainctl_process("submit", "--site", "local-demo", "--nodes", "1", "--remote",
                                   f"me@127.0.0.1:{port}", "--known-hosts", str(tmp_path / "known_hosts"), "--",
                                   "train.py", cwd=tmp_path)
        assert out.returncode == 4
        assert expected.format(port=port) in one_line(out.stderr.decode())
        assert b"No existing session" not in out.stderr


@pytest.mark.parametrize("remote", ["me@login1:67767", "me@login1:0", "me@login1:65536"])
def test_remote_ports_outside_the_tcp_range_are_refused(tmp_path, remote):
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--remote", remote, "--dry-run", "--",
                   "train.py", cwd=tmp_path)
    assert out.returncode == 2
    assert "outside 1-65535" in one_line(out.stderr)


def test_site_ssh_port_outside_the_tcp_range_is_refused(tmp_path):
    site = site_file(tmp_path, db=tmp_path / "db", port=70000)
    out = trainctl("site", "show", site)
    assert out.returncode == 2
    assert "sweep.ssh_port" in one_line(out.stderr) and "65535" in out.stderr


# ---------------------------------------------------------------- data loss: the history file

def history_with_one_sweep(path: Path) -> Path:
    with History.open(path, write=True) as history:
        night(history, time.time() - 3600, {"gpu1": "ok", "gpu2": {"ib.ports": ("fail", "mlx5_2/1 Down")}})
    return path


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a private read-only mount")
def test_reading_a_history_needs_no_write_access_to_its_directory(tmp_path):
    # As for a user reading root's history in a 755 directory: SQLite cannot create the -shm file.
    history_with_one_sweep(tmp_path / "sweeps.db")
    before = sorted(os.listdir(tmp_path))
    script = (f"mount --bind -o ro {tmp_path} {tmp_path} && {sys.executable} -c '{RUN}' "
              f"report --db {tmp_path}/sweeps.db --format json")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [g["hostlist"] for g in json.loads(out.stdout)["groups"]] == ["gpu2"]
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a private read-only mount")
def test_writing_without_write_access_is_said_so_not_called_damage(tmp_path):
    db = history_with_one_sweep(tmp_path / "sweeps.db")
    site = site_file(tmp_path, db=db)
    script = (f"mount --bind -o ro {tmp_path} {tmp_path} && PATH=/nonexistent {sys.executable} -c '{RUN}' "
              f"sweep --site {site} --via ssh --nodes 127.0.0.9")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert "cannot write sweep history" in line and "damaged" not in line


def test_a_locked_history_is_a_lock_exit_4_not_damage(tmp_path, monkeypatch):
    import trainctl.sweep.db as db_module
    from trainctl.errors import TrainctlError

    db = history_with_one_sweep(tmp_path / "sweeps.db")
    monkeypatch.setattr(db_module, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")                             # another sweep is writing
    try:
        with History.open(db, write=True) as history, pytest.raises(TrainctlError) as caught:
            history.start_sweep(kind="sweep", started_at=1.0, site="s", via="ssh", target="x", checks="all")
    finally:
        holder.rollback()
        holder.close()
    assert caught.value.exit_code == 4
    assert "locked" in str(caught.value) and "damaged" not in str(caught.value)


@pytest.mark.parametrize("kind", ["fifo", "/dev/null", "/dev/zero"])
def test_a_db_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "fifo.db"
        os.mkfifo(path)
    else:
        path = Path(kind)
    for args in (["report", "--db", path], ["drain", "--db", path]):
        if kind == "fifo":  # it used to block the open forever: in a process of its own, with a deadline
            ran = trainctl_process(*map(str, args), timeout=30)
            out = Ran(ran.returncode, ran.stdout.decode(), ran.stderr.decode())
        else:
            out = trainctl(*args)
        assert out.returncode == 2
        assert "not a regular file" in one_line(out.stderr)


def test_a_history_missing_a_table_is_refused_before_anything_is_written(tmp_path):
    db = history_with_one_sweep(tmp_path / "sweeps.db")
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE results")
    conn.commit()
    conn.close()
    before = digest(db)
    site = site_file(tmp_path, db=db)
    out = trainctl("sweep", "--site", site, "--via", "ssh", "--nodes", "127.0.0.9")
    assert out.returncode == 2
    assert "no table results" in one_line(out.stderr)
    assert digest(db) == before
    wal = Path(f"{db}-wal")
    assert not wal.exists() or wal.stat().st_size == 0           # not one page of the sweep row


@pytest.mark.parametrize("sql", [
    "UPDATE results SET details = 'not json {'",
    "UPDATE results SET details = 'NaN'",
    "UPDATE sweeps SET started_at = 'yesterday'",
    "UPDATE sweeps SET finished_at = 1e308",
    "UPDATE nodes SET recorded_at = -5",
    "UPDATE results SET status = 'great'",
    "UPDATE results SET reason = CAST(X'6d6c7835ff' AS TEXT)",   # bytes that are not UTF-8, stored as TEXT
])
def test_history_rows_that_no_trainctl_wrote_are_damage_not_a_crash(tmp_path, sql):
    db = history_with_one_sweep(tmp_path / "sweeps.db")
    conn = sqlite3.connect(db)
    conn.execute(sql)
    conn.commit()
    conn.close()
    for args in (["report", "--db", db], ["report", "--db", db, "--format", "html"], ["drain", "--db", db]):
        out = trainctl(*args)
        assert out.returncode == 2, out.stderr
        assert "damaged sweep history" in one_line(out.stderr)


# ---------------------------------------------------------------- numbers and strings

def demo_site_with(tmp_path: Path, table: str, key: str, value: str, name: str = "site.toml") -> Path:
    """The demo site with one key of one table set to `value` (TOML text)."""
    lines, current, done = [], "", False
    for line in DEMO_SITE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped.strip("[]")
        elif current == table and stripped.split("=")[0].strip() == key and not done:
            line, done = f"{key} = {value}", True
        lines.append(line)
    if not done:
        lines.insert(next(i for i, l in enumerate(lines) if l.strip() == f"[{table}]") + 1, f"{key} = {value}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("table, key, value", [
    ("gate", "probe_timeout_s", "-5"), ("gate", "probe_timeout_s", "inf"), ("gate", "probe_timeout_s", "nan"),
    ("gate", "straggler_factor", "1e308"), ("gate", "fabric_timeout_s", "0"), ("gate", "fabric_iters", "-3"),
    ("gate", "min_shm_gib", "-inf"), ("sweep", "fanout", "0"), ("sweep", "node_timeout_s", "nan"),
    ("sweep", "ssh_port", "70000"), ("partitions.gpu", "gpus_per_node", "-1"),
    ("partitions.gpu", "ib_mtu", "3000"), ("partitions.gpu", "netdev_mtu", "12"),
    ("gate", "fabric_passes", "0"), ("gate", "compute_budget_s", "-1"), ("gate", "compute_factor", "2"),
    ("gate", "dcgm_diag_level", "7"), ("gate", "probe_timeout_s", "1e-300"), ("gate", "max_retired_pages", "-2"),
    ("gate", "max_retired_pages", "9223372036854775807"), ("partitions.gpu", "nvlink_speed_gbps", "-1"),
    ("partitions.gpu", "nvlink_speed_gbps", "1e308"), ("partitions.gpu", "numa_nodes", "-1"),
    ("partitions.gpu", "numa_nodes", "9223372036854775807"), ("partitions.gpu", "nvlink_links_per_gpu", "-1"),
    ("partitions.gpu", "nvlink_links_per_gpu", "100000"),
])
def test_site_numbers_out_of_range_are_refused_naming_the_key(tmp_path, table, key, value):
    site = demo_site_with(tmp_path, table, key, value)
    (tmp_path / "train.py").write_text("print('hi')\n")
    dotted = f"{table}.{key}"
    for args in (["site", "show", site], ["submit", "--site", site, "--nodes", "1", "--dry-run", "--", "train.py"],
                 ["health", "check", "--site", site, "--snapshot", tmp_path]):
        out = trainctl(*args, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stderr)
        line = one_line(out.stderr)
        assert f"{dotted}: got" in line and "expected" in line
        assert "#SBATCH" not in out.stdout


@pytest.mark.parametrize("args", [
    ["report", "--since", "nand"], ["report", "--since", "infd"], ["report", "--since", "-3d"],
    ["health", "check", "--timeout", "nan"], ["health", "check", "--timeout", "-1"],
    ["health", "snapshot", "--timeout", "inf"], ["sweep", "--site", "local-demo", "--timeout", "inf"],
    ["resume", "--site", "local-demo", "--timeout", "nan"], ["health", "fabric", "--factor", "nan"],
    ["health", "fabric", "--floor", "1e999"], ["health", "compute", "--budget", "nan"],
    ["health", "slurm-hook", "--budget", "nan"], ["gate", "decide", "--dir", "/", "--nodes", "1", "--deadline", "nan"],
    ["gate", "sentinel", "--dir", "/", "--silence", "nan"],
])
def test_command_line_numbers_must_be_finite_and_in_range(args):
    out = trainctl(*args)
    assert out.returncode == 2
    line = one_line(out.stderr)
    assert line.startswith("trainctl: error: Invalid value for") and "--help" in line


def test_site_files_that_are_not_utf8_deeply_nested_or_carry_nul_are_bad_input(tmp_path):
    bad = {"latin1.toml": DEMO_SITE.read_bytes().replace(b"trainctl dev-cluster", b"caf\xe9 cluster"),
           "deep.toml": b"a = " + b"[" * 3000 + b"]" * 3000 + b"\n",
           "deep-tables.toml": b"a = " + b"{b = " * 2000 + b"1" + b"}" * 2000 + b"\n",
           "nul.toml": DEMO_SITE.read_bytes().replace(b'default_partition = "gpu"', b'default_partition = "g\\u0000pu"')
                       .replace(b"[partitions.gpu]", b'[partitions."g\\u0000pu"]')}
    expected = {"latin1.toml": "not UTF-8", "deep.toml": "nested too deeply", "deep-tables.toml": "nested too deeply",
                "nul.toml": "NUL"}
    (tmp_path / "train.py").write_text("print('hi')\n")
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
        for args in (["site", "show", name], ["submit", "--site", name, "--nodes", "1", "--dry-run", "--", "train.py"],
                     ["sweep", "--site", name, "--db", tmp_path / "db"]):
            out = trainctl(*args, cwd=tmp_path)
            assert out.returncode == 2, (name, args, out.stderr)
            assert expected[name] in one_line(out.stderr)


def test_control_characters_are_escaped_when_printed(tmp_path):
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    (snapshot / "meta.json").write_text(json.dumps({"format": 1, "host": "evil\x1b]0;owned\x07\x1b[2J\r"}))
    out = trainctl("health", "check", "--snapshot", snapshot, "--only", "host")
    assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout
    assert out.stdout.startswith("evil\\x1b]0;owned\\x07\\x1b[2J\\r: ")
    site = demo_site_with(tmp_path, "", "description", '"ring\\u0007 \\u001b[31mred"')
    shown = trainctl("site", "show", site)
    assert shown.returncode == 0 and "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    (tmp_path / "train.py").write_text("print('hi')\n")                 # the script quotes it as $'...\x1b...'
    dry = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--job-name", "run\x1b]0;owned\x07", "--dry-run",
                   "--", "train.py", cwd=tmp_path)
    assert dry.returncode == 0 and "\x1b" not in dry.stdout + dry.stderr and "run\\x1b]0;owned\\x07" in dry.stdout
    unknown = trainctl("site", "show", "no\x1b[2Jsuch")
    assert unknown.returncode == 2 and "\x1b" not in unknown.stderr and "no\\x1b[2Jsuch" in unknown.stderr


def test_an_argument_that_is_not_utf8_is_refused_not_mangled(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    for extra in ([], ["--json"]):
        out = trainctl_process("submit", "--site", "local-demo", "--nodes", "1", "--dry-run", *extra, "--",
                               "train.py", b"--tag=caf\xe9", cwd=tmp_path)
        assert out.returncode == 2
        line = one_line(out.stderr.decode())
        assert "'--tag=caf\\xe9' is not valid UTF-8" in line
        assert out.stdout == b""


# ---------------------------------------------------------------- exit 70 on input, no more

def snapshot_of_this_machine(tmp_path: Path) -> Path:
    out = tmp_path / "snap"
    result = trainctl("health", "snapshot", "--out", out, "--timeout", "10")
    assert result.returncode == 0, result.stderr
    return out


def test_hostile_host_json_is_a_parse_error_never_ok_and_never_invalid_json(tmp_path):
    snapshot = snapshot_of_this_machine(tmp_path)
    host = json.loads((snapshot / "host.json").read_text())
    cases = {"load NaN": ("load_avg", "[NaN, NaN, NaN]", "host.load"),
             "load 1e400": ("load_avg", "[1e400, 1, 1]", "host.load"),
             "memory NaN": ("memory", '{"total_bytes": 100, "available_bytes": NaN}', "host.memory"),
             "memory negative": ("memory", '{"total_bytes": 100, "available_bytes": -5}', "host.memory"),
             "memory 1e400": ("memory", '{"total_bytes": 1e400, "available_bytes": 5}', "host.memory"),
             "no CPUs": ("cpu_count", "0", "host.load")}
    for name, (key, text, check) in cases.items():
        raw = json.dumps({**host, key: "@"}).replace('"@"', text)
        (snapshot / "host.json").write_text(raw)
        out = trainctl("health", "check", "--snapshot", snapshot, "--only", "host", "--json")
        assert out.returncode == 3, (name, out.stderr)
        report = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"{name}: {c} in --json output"))
        (result,) = [c for c in report["checks"] if c["name"] == check]
        assert result["status"] == "unknown" and "unreadable: host.json" in result["reason"], name


def test_unreadable_and_undecodable_snapshot_files(tmp_path):
    snapshot = snapshot_of_this_machine(tmp_path)
    (snapshot / "nvidia-smi-topo-m.txt").write_bytes(b"\xff\xfe\tGPU0\x00\n")
    out = trainctl("topo", "--snapshot", snapshot, "--json")
    assert out.returncode == 3 and out.stdout == ""                # a parse error, not exit 70
    assert "nvidia-smi-topo-m.txt:1" in one_line(out.stderr)
    out = trainctl("health", "check", "--snapshot", snapshot, "--only", "topo", "--json")
    assert out.returncode == 3 and json.loads(out.stdout)["status"] == "unknown"


@pytest.mark.parametrize("content", [b"not a host key line\n127.0.0.1 ssh-ed25519 !!!notbase64!!!\n",
                                     bytes(range(256)) * 2])
def test_malformed_or_binary_known_hosts_is_bad_input(tmp_path, content):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "known_hosts").write_bytes(content)
    out = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--remote", "me@127.0.0.1:9",
                   "--known-hosts", tmp_path / "known_hosts", "--", "train.py", cwd=tmp_path)
    assert out.returncode == 2
    assert f"known_hosts file {tmp_path / 'known_hosts'}" in one_line(out.stderr)


def test_an_identity_that_is_not_a_key_is_bad_input(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "known_hosts").touch()
    (tmp_path / "id").write_bytes(bytes(range(256)) * 4)
    out = trainctl("submit", "--site", "local-demo", "--nodes", "1", "--remote", "me@127.0.0.1:9",
                   "--known-hosts", tmp_path / "known_hosts", "--identity", tmp_path / "id", "--", "train.py",
                   cwd=tmp_path)
    assert out.returncode == 2
    assert "is not a private key trainctl can use" in one_line(out.stderr)


def test_outputs_into_a_place_that_cannot_be_written_are_bad_input(tmp_path):
    db = history_with_one_sweep(tmp_path / "sweeps.db")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (["report", "--db", db, "--out", blocker / "report.html", "--format", "html"],
                 ["report", "--db", db, "--prom", blocker / "trainctl.prom"],
                 ["health", "snapshot", "--out", blocker / "snap"],
                 ["health", "check", "--keep", blocker / "snap", "--only", "host"]):
        out = trainctl(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert str(blocker) in one_line(out.stderr)


# ---------------------------------------------------------------- CLI manners

@pytest.mark.parametrize("args, where", [(["--bogus"], "trainctl"), (["frobnicate"], "trainctl"),
                                         (["submit", "--zork"], "trainctl submit"),
                                         (["health", "check", "--json", "extra"], "trainctl health check")])
def test_unknown_options_and_commands_are_one_line_with_a_pointer_to_help(args, where):
    out = trainctl(*args)
    assert out.returncode == 2
    assert one_line(out.stderr).endswith(f"(try '{where} --help')")
    assert "Usage:" not in out.stderr


@pytest.mark.parametrize("args", [["health", "list"], ["--help"], ["site", "show", "local-demo"],
                                  ["submit", "--help"]])
def test_a_closed_pipe_exits_141_quietly(args):
    proc = subprocess.Popen([sys.executable, "-c", RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                                           # the reader left before the first byte
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


def test_missing_probes_are_named_once_with_where_trainctl_looked(tmp_path):
    out = trainctl("health", "check", env={"PATH": str(tmp_path)})
    everything = out.stdout + out.stderr
    assert everything.count(str(tmp_path)) == 1, everything
    line = one_line(out.stderr)
    assert line.startswith("trainctl: probes not found: ") and "nvidia-smi" in line
    topo = trainctl("topo", "--json", env={"PATH": str(tmp_path)})
    assert topo.returncode == 4 and one_line(topo.stderr).count(str(tmp_path)) == 1


def test_site_show_is_linear_in_the_number_of_partitions(tmp_path):
    from trainctl.site import flatten, load_site

    text = DEMO_SITE.read_text()
    start = text.index("[partitions.gpu]")
    block = text[start:text.find("\n[", start + 1) if "\n[" in text[start + 1:] else len(text)]

    def show(count: int) -> float:
        path = tmp_path / f"parts{count}.toml"
        path.write_text(text + "\n" + "".join(block.replace("[partitions.gpu]", f"[partitions.p{i}]") + "\n"
                                              for i in range(count)))
        began = time.perf_counter()
        loaded = load_site(str(path))
        for key, _ in flatten(loaded.config):
            loaded.source_of(key)
        return time.perf_counter() - began

    small, large = [], []
    for _ in range(3):                                            # interleaved, best of three
        small.append(show(150))
        large.append(show(600))
    ratio = min(large) / min(small)
    assert ratio < 8, f"4x the partitions took {ratio:.1f}x as long (quadratic would be ~16x)"


# ---------------------------------------------------------------- a name that is ours

def test_another_distribution_owning_the_trainctl_package_is_named_in_one_line(tmp_path):
    # The real header of the unrelated `trainctl` 0.1.0 from the public index (its METADATA).
    other = tmp_path / "site-packages" / "trainctl-0.1.0.dist-info"
    other.mkdir(parents=True)
    (other / "METADATA").write_text("Metadata-Version: 2.5\nName: trainctl\nVersion: 0.1.0\n"
                                    "Summary: A lightweight, framework-agnostic deep-learning experiment supervisor\n"
                                    "\nlong description\n")
    out = trainctl_process("health", "list", env={"PYTHONPATH": str(tmp_path / "site-packages")})
    assert out.returncode == 2 and out.stdout == b""
    line = one_line(out.stderr.decode())
    assert "trainctl 0.1.0 ('A lightweight, framework-agnostic deep-learning experiment supervisor')" in line
    assert "pip install --force-reinstall slurm-trainctl" in line
    (other / "METADATA").write_text("Name: trainctl\nVersion: 0.1.0\nSummary: Start multi-node GPU training on "
                                    "Slurm fast, and only on healthy hardware.\n")   # this project, old name
    assert trainctl_process("health", "list", env={"PYTHONPATH": str(tmp_path / "site-packages")}).returncode == 0


def test_the_distribution_name_is_not_the_taken_one():
    import tomllib

    from trainctl.identity import DISTRIBUTION, SUMMARY

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION != "trainctl"
    assert project["description"] == SUMMARY                      # how an old install of ours is recognised
    assert project["scripts"] == {"trainctl": "trainctl.entry:run"}  # stop signals caught before other imports


# ---------------------------------------------------------------- as a user who is not root

def as_nobody(python: str, *args, env=None) -> Ran:
    """trainctl as uid/gid 65534 (nobody), run by `python` (the `nobody_python` fixture: an install
    nobody can reach). Root reads every file; the permission cases need a real non-root reader."""
    from support.nobody import setpriv_nobody

    full_env = {**os.environ, "PATH": "/nonexistent", **(env or {})}
    result = subprocess.run([*setpriv_nobody(), python, "-c", RUN, *map(str, args)], capture_output=True,
                            text=True, env=full_env, timeout=120, cwd="/")
    return Ran(result.returncode, result.stdout, result.stderr)


@pytest.fixture
def world_readable_dir():
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="trainctl-hostile-"))
    path.chmod(0o755)
    yield path
    import shutil

    shutil.rmtree(path)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="drops root to test a non-root reader")


@needs_root
def test_a_user_reads_roots_history_in_a_755_directory(world_readable_dir, nobody_python):
    db = history_with_one_sweep(world_readable_dir / "sweeps.db")
    db.chmod(0o644)
    before = sorted(os.listdir(world_readable_dir))
    out = as_nobody(nobody_python, "report", "--db", db, "--format", "json")
    assert out.returncode == 0, out.stderr                      # was: "damaged ... move it aside"
    assert [g["hostlist"] for g in json.loads(out.stdout)["groups"]] == ["gpu2"]
    assert sorted(os.listdir(world_readable_dir)) == before
    out = as_nobody(nobody_python, "report", "--db", db, "--out", world_readable_dir / "report.txt")  # root's 755 dir
    assert out.returncode == 2
    assert f"cannot write {world_readable_dir / 'report.txt'}: Permission denied" in one_line(out.stderr)
    site = site_file(world_readable_dir, db=db)
    site.chmod(0o644)
    (world_readable_dir / "known_hosts").chmod(0o644)
    sweep = as_nobody(nobody_python, "sweep", "--site", site, "--via", "ssh", "--nodes", "127.0.0.9")
    assert sweep.returncode == 2                                  # writing needs rights: said so, no damage
    assert "cannot write sweep history" in one_line(sweep.stderr) and "damaged" not in sweep.stderr


@needs_root
def test_a_site_file_in_a_directory_the_user_cannot_enter(world_readable_dir, nobody_python):
    private = world_readable_dir / "private"
    private.mkdir(mode=0o700)
    (private / "site.toml").write_text(DEMO_SITE.read_text())
    out = as_nobody(nobody_python, "site", "show", private / "site.toml")
    assert out.returncode == 2
    assert f"site file {private / 'site.toml'}: cannot read: Permission denied" in one_line(out.stderr)
    for args in (["site", "show", "local-demo"], ["site", "list"]):  # a search directory the user cannot enter
        out = as_nobody(nobody_python, *args, "--json", env={"TRAINCTL_SITE_DIR": str(private)})
        assert out.returncode == 0, (args, out.stderr)


@needs_root
def test_a_snapshot_with_a_file_the_user_cannot_read(world_readable_dir, nobody_python):
    snapshot = world_readable_dir / "snap"
    snapshot.mkdir(mode=0o755)
    (snapshot / "meta.json").write_text(json.dumps({"format": 1, "host": "node1"}))
    (snapshot / "dmesg.txt").write_text("")
    (snapshot / "dmesg.txt").chmod(0o600)
    out = as_nobody(nobody_python, "health", "check", "--snapshot", snapshot, "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert "dmesg.txt" in one_line(out.stderr) and "Permission denied" in out.stderr


# ---------------------------------------------------------------- found by tests/test_fuzz_cli.py

def test_a_history_damaged_anywhere_is_never_a_crash(tmp_path):
    # One byte set to 0xff at every 61st offset: some land in text (invalid UTF-8, which sqlite3
    # raises while fetching), some in b-tree pages ("malformed" on fetch, after execute succeeded).
    data = history_with_one_sweep(tmp_path / "seed.db").read_bytes()
    db = tmp_path / "sweeps.db"
    outcomes = {}
    for offset in range(0, len(data), 61):
        db.write_bytes(data[:offset] + b"\xff" + data[offset + 1:])
        out = trainctl("report", "--db", db, "--format", "json")
        assert out.returncode in (0, 2), (offset, out.stderr)
        assert len(out.stderr.splitlines()) <= 1
        outcomes[out.returncode] = outcomes.get(out.returncode, 0) + 1
    assert outcomes.get(2, 0) > 0                                  # some of them are refused as damaged


def test_a_meta_json_whose_probe_command_is_not_text_is_unreadable_not_a_crash(tmp_path):
    snapshot = tmp_path / "snap"
    shutil.copytree(REPO / "tests" / "fixtures" / "recorded" / "h100-vm-2026-11-22-snapshot", snapshot)
    meta = json.loads((snapshot / "meta.json").read_text())
    missing = next(name for name, probe in meta["probes"].items() if probe.get("missing"))
    meta["probes"][missing]["command"] = ["@"]
    (snapshot / "meta.json").write_text(json.dumps(meta).replace('"@"', "NaN"))
    out = trainctl("health", "check", "--snapshot", snapshot, "--json")
    assert out.returncode == 3, out.stderr
    assert json.loads(out.stdout)["status"] == "unknown"


def test_a_fabric_rank_whose_coordinator_never_answers_is_an_external_failure_not_a_bug():
    """Under load a non-zero rank's store wait can run out (seen: `DistStoreError: wait timeout
    ... keys: /retests`, exit 70 on 3 nodes); the coordinator's store is the machine's doing."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    out = trainctl_process("health", "fabric", "--timeout", "5", "--join-timeout", "1", "--no-intra",
                           env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                "TRAINCTL_FABRIC_PORT": str(port)}, timeout=120)
    assert out.returncode == 4, out.stderr
    stderr = out.stderr.decode()  # c10d's own C++ log lines come first (torch's, not trainctl's)
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("trainctl: error: fabric test ended: the coordinator's store: ")
