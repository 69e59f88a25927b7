"""Property test over the CLI's inputs: site files, snapshot directories, history DBs, output paths, argv.

Whatever it is handed, trainctl answers with an exit code from the README's table (0-4,
never 70), valid JSON on stdout with --json, one line on stderr for an error (after any
progress lines, all trainctl's own), no change to the input files, and in bounded time. Seeds are real: the sample site files, the snapshot this
project recorded on an H100 VM, and a history written through trainctl's own API; hypothesis
mutates them with hostile values (NaN, inf, 1e308, negatives, control characters, NUL, wrong
types, random bytes, truncation).

`TRAINCTL_FUZZ_EXAMPLES` sets the examples per input kind (CI: 60 each, 240 in all, about 30 s);
`TRAINCTL_FUZZ_RANDOM=1` draws new ones instead of CI's fixed set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from support.cli_runs import REPO, Ran, run_main
from support.sweeps import night
from trainctl.sweep.db import History

EXAMPLES = int(os.environ.get("TRAINCTL_FUZZ_EXAMPLES", "60"))
DOCUMENTED_EXIT_CODES = {0, 1, 2, 3, 4}
MAX_SECONDS = 30.0                       # per command; the slowest seen on a loaded 2-core machine is ~2 s
SITES = sorted((REPO / "site-configs").glob("*.toml"))
SNAPSHOT = REPO / "tests" / "fixtures" / "recorded" / "h100-vm-2026-11-22-snapshot"
# CI replays the same examples every run; TRAINCTL_FUZZ_RANDOM=1 explores new ones (by hand, with more examples).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("TRAINCTL_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values nobody should hand trainctl, as TOML text and as JSON text.
HOSTILE_TOML = ["nan", "-nan", "inf", "-inf", "1e308", "-1e308", "-1", "0", "-0.0", "9223372036854775807",
                "-9223372036854775808", "70000", "true", '""', '"\\u0000"', '"a\\u001b[2Jb"', '"\\u0007\\r\\n"',
                "[]", "{}", '"caf\\u00e9"', "1979-05-27T07:32:00Z", '["x", 1]']
HOSTILE_JSON = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-1", "0", "1e308", "9" * 400, "true", "null",
                '""', '"\\u0000"', '"\\u001b]0;x\\u0007"', "[]", "{}", '[1, 2]', '"2026-13-45T99:99:99"',
                '"' + "A" * 5000 + '"']


def run(*args, cwd=None) -> Ran:
    began = time.monotonic()
    # No Slurm, no ssh, no probes: a command that needs one fails (exit 4), it never reaches a cluster.
    ran = run_main(*args, env={"PATH": "/nonexistent"}, cwd=cwd)
    took = time.monotonic() - began
    assert took < MAX_SECONDS, f"{args} took {took:.1f} s"
    return ran


def check_answer(ran: Ran, args: tuple) -> None:
    event(f"exit {ran.returncode}")
    assert ran.returncode in DOCUMENTED_EXIT_CODES, (args, ran.returncode, ran.stderr)
    # One line per message, each trainctl's own (no traceback, no library's logging); at most one error,
    # and it is the last line (progress lines such as "draining from sweep #2" may come before it).
    lines = ran.stderr.splitlines()
    assert all(line.startswith("trainctl: ") for line in lines), (args, ran.stderr)
    errors = [i for i, line in enumerate(lines) if line.startswith("trainctl: error:")]
    assert errors in ([], [len(lines) - 1]), (args, ran.stderr)
    asked_json = ("--json" in args or "json" in args) and not {"--help", "-h", "--version"} & set(args)
    if asked_json:
        if ran.stdout.strip():
            json.loads(ran.stdout, parse_constant=lambda name: pytest.fail(f"{args}: {name} in JSON output"))
        else:
            assert ran.returncode != 0, (args, "exit 0 without JSON")


def digests(root: Path) -> dict[str, str]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def mutate_bytes(data: bytes, draw) -> bytes:
    """Flip, insert or delete bytes, or cut the data short."""
    kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
    if not data or kind == "truncate":
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    return data[:at] + data[at + draw(st.integers(1, 64)):]


# ---------------------------------------------------------------- site files

@st.composite
def site_texts(draw) -> bytes:
    text = draw(st.sampled_from(SITES)).read_text()
    lines = text.splitlines()
    for _ in range(draw(st.integers(0, 2))):
        assignments = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
        index = draw(st.sampled_from(assignments))
        key = lines[index].split("=")[0].rstrip()
        lines[index] = f"{key} = {draw(st.sampled_from(HOSTILE_TOML))}"
    data = ("\n".join(lines) + "\n").encode()
    return mutate_bytes(data, draw) if draw(st.booleans()) and draw(st.booleans()) else data


@FUZZ
@given(data=site_texts(), command=st.sampled_from(["show", "show-json", "submit", "submit-json", "check"]))
def test_any_site_file(tmp_path_factory, data, command):
    tmp = tmp_path_factory.mktemp("site")
    site = tmp / "site.toml"
    site.write_bytes(data)
    (tmp / "train.py").write_text("print('hi')\n")
    before = digests(tmp)
    args = {"show": ("site", "show", site), "show-json": ("site", "show", site, "--json"),
            "submit": ("submit", "--site", site, "--nodes", "1", "--dry-run", "--", "train.py"),
            "submit-json": ("submit", "--site", site, "--nodes", "2", "--spare", "1", "--dry-run", "--json", "--",
                            "train.py", "--lr", "0.1"),
            "check": ("health", "check", "--snapshot", SNAPSHOT, "--site", site, "--json")}[command]
    ran = run(*args, cwd=tmp)
    check_answer(ran, args)
    assert digests(tmp) == before


# ---------------------------------------------------------------- snapshot directories

@st.composite
def snapshot_mutations(draw) -> list[tuple[str, str, object]]:
    files = sorted(str(p.relative_to(SNAPSHOT)) for p in SNAPSHOT.rglob("*") if p.is_file())
    changes = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["json-value", "json-value", "bytes", "remove", "binary"]))
        if kind == "json-value":
            name = draw(st.sampled_from(["host.json", "meta.json"]))
            changes.append((kind, name, (draw(st.integers(0, 10_000)), draw(st.sampled_from(HOSTILE_JSON)))))
        elif kind == "bytes":
            name = draw(st.sampled_from(files))
            changes.append((kind, name, mutate_bytes((SNAPSHOT / name).read_bytes(), draw)))
        elif kind == "binary":
            changes.append((kind, draw(st.sampled_from(files)), draw(st.binary(max_size=256))))
        else:
            changes.append((kind, draw(st.sampled_from(files)), None))
    return changes


def replace_json_value(text: str, pick: int, value: str) -> str:
    """Put `value` (JSON text) in place of one of the scalar values of `text`."""
    try:
        doc = json.loads(text)
    except ValueError:  # an earlier change broke the file already
        return text
    slots = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + [i])
        else:
            slots.append(path)

    walk(doc, [])
    if not slots:
        return value
    path = slots[pick % len(slots)]
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = "@@HOSTILE@@"
    return json.dumps(doc).replace('"@@HOSTILE@@"', value)


@FUZZ
@given(changes=snapshot_mutations(), command=st.sampled_from(["check", "check-site", "topo", "check-text"]))
def test_any_snapshot_directory(tmp_path_factory, changes, command):
    snapshot = tmp_path_factory.mktemp("snap") / "snapshot"
    shutil.copytree(SNAPSHOT, snapshot)
    for kind, name, value in changes:
        path = snapshot / name
        if kind == "json-value" and path.exists():
            path.write_text(replace_json_value(path.read_bytes().decode(errors="replace"), *value))
        elif kind in ("bytes", "binary"):
            path.write_bytes(value)
        elif kind == "remove":
            path.unlink(missing_ok=True)
    before = digests(snapshot)
    args = {"check": ("health", "check", "--snapshot", snapshot, "--json"),
            "check-site": ("health", "check", "--snapshot", snapshot, "--site", "dgx-h100", "--json"),
            "check-text": ("health", "check", "--snapshot", snapshot, "--site", "local-demo"),
            "topo": ("topo", "--snapshot", snapshot, "--json")}[command]
    ran = run(*args)
    check_answer(ran, args)
    assert "\x1b" not in ran.stdout + ran.stderr
    assert digests(snapshot) == before


# ---------------------------------------------------------------- history databases

HISTORY_COLUMNS = {"sweeps": ["kind", "started_at", "finished_at", "site", "via", "target", "checks", "error"],
                   "nodes": ["host", "outcome", "status", "slurm_state", "detail", "duration_s", "recorded_at"],
                   "results": ["host", "check_name", "status", "reason", "details", "recorded_at"],
                   "drains": ["host", "reason", "reason_time", "check_name", "drained_at", "closed_at"]}
SQL_VALUES = ["NULL", "'x'", "''", "-1", "0", "1e308", "-1e308", "9223372036854775807", "'NaN'", "'{'", "'[]'",
              "'{\"a\": NaN}'", "X'00FF'", "'\u001b[2J'", "'fail'", "'ok'", "'checked'", "1.5",
              "'gpu[2'", "'gpu^2'", "'../x'", "CAST(X'6d6c7835ff' AS TEXT)", "'a\nb\u202ec'",
              "'{\"a\":' || replace(hex(zeroblob(1500)), '00', '[[') || replace(hex(zeroblob(1500)), '00', ']]') || '}'"]


@pytest.fixture(scope="module")
def seed_history(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("history") / "sweeps.db"
    now = time.time()
    with History.open(path, write=True) as history:
        night(history, now - 2 * 86400, {"gpu1": "ok", "gpu2": {"ib.ports": ("fail", "mlx5_2/1 Down")},
                                         "gpu3": "allocated"})
        night(history, now - 86400, {"gpu1": "warn", "gpu2": {"ib.ports": ("fail", "mlx5_2/1 Down")},
                                     "gpu3": "timeout"})
        night(history, now - 3600, {"gpu1": "ok", "gpu2": "error"}, finished=False)
        history.record_drain(host="gpu2", reason="trainctl: ib.ports: mlx5_2/1 Down", reason_time="2026-11-20T02:31:00",
                             sweep_id=2, check="ib.ports", drained_at=now - 80000)
    return path


@st.composite
def history_mutations(draw) -> list[tuple[str, object]]:
    changes = []
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.integers(0, 3)) == 0:
            changes.append(("bytes", draw(st.integers(0, 2**31))))
        else:
            table = draw(st.sampled_from(sorted(HISTORY_COLUMNS)))
            changes.append(("sql", f"UPDATE {table} SET {draw(st.sampled_from(HISTORY_COLUMNS[table]))} = "
                                   f"{draw(st.sampled_from(SQL_VALUES))}"))
    return changes


@FUZZ
@given(changes=history_mutations(), data=st.data(),
       command=st.sampled_from(["text", "json", "html", "markdown", "prom", "drain", "sweep"]))
def test_any_history_database(tmp_path_factory, seed_history, changes, data, command):
    tmp = tmp_path_factory.mktemp("db")
    db = tmp / "sweeps.db"
    shutil.copy(seed_history, db)
    for kind, change in changes:
        if kind == "sql":
            conn = sqlite3.connect(db)
            try:
                conn.execute(change)
                conn.commit()
            except sqlite3.Error:
                pass  # a value the column refuses: the file stays as it was
            finally:
                conn.close()
        else:
            db.write_bytes(mutate_bytes(db.read_bytes(), data.draw))
    before = digests(db)
    args = {"text": ("report", "--db", db), "json": ("report", "--db", db, "--format", "json"),
            "html": ("report", "--db", db, "--format", "html", "--out", tmp / "r.html"),
            "markdown": ("report", "--db", db, "--format", "markdown", "--since", "30d"),
            "prom": ("report", "--db", db, "--prom", tmp / "t.prom"),
            "drain": ("drain", "--db", db, "--json"),
            "sweep": ("report", "--db", db, "--since", "100000d")}[command]
    ran = run(*args)
    check_answer(ran, args)
    assert digests(db) == before
    if command == "sweep" and ran.returncode == 2:  # what a report refuses, a sweep never writes into
        from test_hostile import site_file

        args = ("sweep", "--site", site_file(tmp, db=db), "--via", "ssh", "--nodes", "127.0.0.9")
        swept = run(*args)
        check_answer(swept, args)
        assert swept.returncode == 2, swept.stderr    # the same verdict (its first bad row may be another)
        assert digests(db) == before


# ---------------------------------------------------------------- output paths

OUTPUT_PATHS = ["missing", "missing/deeper", "regular", "directory", "/dev/null", "/dev/full", "link-to-dev-null",
                "dangling-link", "link-to-directory", "under-a-file/x", "fifo"]


@FUZZ
@given(kind=st.sampled_from(OUTPUT_PATHS), option=st.sampled_from(["--out", "--prom"]))
def test_any_output_path(tmp_path_factory, seed_history, kind, option):
    import stat
    import threading

    tmp = tmp_path_factory.mktemp("out")
    (tmp / "regular").write_text("old\n")
    (tmp / "directory").mkdir()
    (tmp / "link-to-dev-null").symlink_to("/dev/null")
    (tmp / "dangling-link").symlink_to(tmp / "nowhere")
    (tmp / "link-to-directory").symlink_to(tmp / "directory")
    (tmp / "under-a-file").write_text("")
    if kind == "fifo":
        os.mkfifo(tmp / "fifo")
        threading.Thread(target=lambda: (tmp / "fifo").read_bytes(), daemon=True).start()
    target = kind if kind.startswith("/") else tmp / kind
    devices = {name: os.stat(name).st_rdev for name in ("/dev/null", "/dev/full")}
    args = ("report", "--db", seed_history, option, target)
    ran = run(*args)
    check_answer(ran, args)
    assert ran.returncode in (0, 2)
    for name, rdev in devices.items():                        # a device stays that device
        assert stat.S_ISCHR(os.stat(name).st_mode) and os.stat(name).st_rdev == rdev
    assert (tmp / "link-to-dev-null").is_symlink() and (tmp / "link-to-directory").is_symlink()
    assert list((tmp / "directory").iterdir()) == []


# ---------------------------------------------------------------- argv

WORDS = ["--json", "--site", "local-demo", "dgx-h100", "--nodes", "--spare", "--min-nodes", "--gpus-per-node",
         "--since", "--timeout", "--format", "--db", "--partition", "gpu", "nope", "--", "train.py", "-1", "0", "1",
         "nan", "inf", "1e308", "7d", "nand", "\x1b[2J", "\x00", "caf\udce9", "--help", "-h", "--version",
         "--only", "host,gpu", "--remote=me@login:67767", "--time", "1-00:00:00", "--job-name", "a b\nc",
         "--nccl-debug", "warn", "--dry-run", "--via", "ssh", "--fanout", "--out", "--prom", "--apply", ""]
COMMANDS = [["site", "show"], ["site", "list"], ["health", "check", "--snapshot", str(SNAPSHOT)], ["health", "list"],
            ["topo", "--snapshot", str(SNAPSHOT)], ["report"], ["drain"], ["submit"], ["submit", "--dry-run"],
            ["sweep"], ["resume"], ["gate", "decide"], ["--bogus"], ["frobnicate"], []]


@FUZZ
@given(command=st.sampled_from(COMMANDS), words=st.lists(st.sampled_from(WORDS), max_size=8))
def test_any_argv(tmp_path_factory, command, words):
    tmp = tmp_path_factory.mktemp("argv")
    (tmp / "train.py").write_text("print('hi')\n")
    # Outputs stay in the scratch directory; a --db or --out value that is a flag is just a file name there.
    # Every history the command may create or read is in the scratch directory (never the demo's).
    history = ["--db", str(tmp / "h.db")] if command[:1] in (["report"], ["drain"], ["sweep"], ["resume"]) else []
    args = (*command, *history, *words)
    before = digests(SNAPSHOT)
    ran = run(*args, cwd=tmp)
    check_answer(ran, args)
    assert digests(SNAPSHOT) == before


# ---------------------------------------------------------------- hostlists and Slurm's environment

@st.composite
def hostlists(draw) -> str:
    """Slurm hostlists, well-formed or not: ranges up to 10^30 wide, several bracket groups,
    ClusterShell's operators, stray brackets and junk."""
    number = st.one_of(st.integers(0, 99), st.integers(0, 10**30)).map(str)
    item = st.one_of(number, st.tuples(number, number).map("-".join),
                     st.tuples(number, number, st.integers(1, 9)).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"))
    group = st.lists(item, min_size=1, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
    name = st.tuples(st.sampled_from(["n", "gpu", "a-b", ""]), st.lists(group, max_size=3)).map(
        lambda parts: parts[0] + "".join(parts[1]))
    junk = st.sampled_from(["[", "]", "[]", "n[1-", "^", "!", "&", ",", " ", "\x00", "@grp", "n[a-b]", "n[5-1]"])
    pieces = st.lists(st.one_of(name, junk), min_size=1, max_size=4)
    return draw(st.tuples(pieces, st.sampled_from([",", "!", "&", "^", ""])).map(lambda t: t[1].join(t[0])))


SLURM_NUMBERS = st.one_of(st.integers(-3, 70).map(str), st.integers(0, 10**40).map(str),
                          st.sampled_from(["", "x", "1.5", "0x10", "١", " 3", "nan", "-0", "9" * 5000]))
TASK_LAYOUTS = st.one_of(
    st.lists(st.tuples(st.integers(0, 10**12), st.one_of(st.none(), st.integers(0, 10**20))), min_size=1, max_size=4)
    .map(lambda items: ",".join(f"{c}(x{r})" if r is not None else str(c) for c, r in items)),
    st.sampled_from(["", "(x2)", "8(x", "8(x2)x", "a,b", "1,,2"]))


def run_with_env(env: dict[str, str], *args, cwd=None) -> Ran:
    began = time.monotonic()
    ran = run_main(*args, env={"PATH": "/nonexistent", **env}, cwd=cwd)
    assert time.monotonic() - began < MAX_SECONDS, (args, env)
    return ran


@FUZZ
@given(hostlist=hostlists(), where=st.sampled_from(["--allocated", "SLURM_JOB_NODELIST", "--nodes"]))
def test_any_hostlist(tmp_path_factory, hostlist, where):
    tmp = tmp_path_factory.mktemp("hostlist")
    if where == "--nodes":   # refused or expanded before any node is reached: --fabric needs Slurm
        args = ("sweep", "--site", "local-demo", "--via", "ssh", "--fabric", "--nodes", hostlist, "--db", tmp / "h.db")
        env = {}
    else:
        args = ("gate", "decide", "--dir", tmp, "--nodes", "1") + (("--allocated", hostlist) if where[0] == "-" else ())
        env = {} if where[0] == "-" else {"SLURM_JOB_NODELIST": hostlist}
    if "\x00" in hostlist and env:
        return   # no environment can carry a NUL
    ran = run_with_env(env, *args, cwd=tmp)
    check_answer(ran, args)


@FUZZ
@given(values=st.fixed_dictionaries({}, optional={
    "SLURM_PROCID": SLURM_NUMBERS, "SLURM_LOCALID": SLURM_NUMBERS, "SLURM_NODEID": SLURM_NUMBERS,
    "SLURM_NTASKS": SLURM_NUMBERS, "SLURM_JOB_ID": SLURM_NUMBERS, "SLURM_TASKS_PER_NODE": TASK_LAYOUTS,
    "SLURM_JOB_NODELIST": hostlists()}))
def test_any_slurm_task_environment(tmp_path_factory, values):
    tmp = tmp_path_factory.mktemp("rankenv")
    env = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
           "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_ID": "7", **values}
    if any("\x00" in value for value in env.values()):
        return
    # The program does not exist, so a task that passes every check ends with "cannot run" (exit 2)
    # instead of replacing this test's process.
    args = ("rank-exec", "--site", "local-demo", "--master-addr", "127.0.0.1", "--no-bind", "--",
            str(tmp / "no-such-program"))
    ran = run_with_env(env, *args, cwd=tmp)
    event(f"exit {ran.returncode}")
    assert ran.returncode == 2, (env, ran.stderr)
    # local rank 0 says what binding it made ("trainctl rank-exec: ..."); then one error line
    lines = ran.stderr.splitlines()
    assert lines and lines[-1].startswith("trainctl: error:"), (env, ran.stderr)
    assert all(line.startswith(("trainctl: ", "trainctl rank-exec: ")) for line in lines), (env, ran.stderr)
