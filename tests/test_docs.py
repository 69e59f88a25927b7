"""The user docs (README.md and docs/) stay clean and true to the CLI.

- They carry no references to this project's own issues or commits: readers get the product,
  not its development history. Upstream citations such as NVIDIA/nccl#1478 are fine.
- Every `trainctl ...` command they show in code exists in the Click tree, so a renamed or
  removed command cannot leave the README pointing at nothing; every command line in a code block
  parses against the real CLI, options and their values included, and every option named in
  inline code exists on its command.
- Every default they quote for a site key (`key = value` ... default, `[table] key`, default
  `value`) is the site model's default (trainctl/site.py).
- Every sample output they show (a ```text block) is produced by a real run: each block is
  preceded by a `<!-- sample: ... -->` comment that says where it comes from, and the test
  reproduces it (see SAMPLES below). Diagrams say so: `<!-- sample: none, a diagram -->`.
- No development diary: "this project", "was lent", history of runs.

The strict MkDocs build (scripts/docs) checks links, anchors and the nav; this test needs no
docs tooling and no network.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import shlex
import typing
from pathlib import Path

import click
import pytest

from trainctl.cli import cli
from trainctl.job import jobdir

REPO = Path(__file__).resolve().parent.parent
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

# "issue 13", "issues 13 and 14", "Issue #13"; and a bare "#13" that is not part of an upstream
# reference (owner/repo#13) and not trainctl's own output ("since sweep #41").
ISSUE_REFERENCE = re.compile(r"\bissues?\s+#?\d+|(?<![\w/#&])(?<!sweep )#\d+\b", re.IGNORECASE)
# A git commit id: 7-40 lowercase hex digits with at least one letter and one digit.
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
# `trainctl` as a command word (also .venv/bin/trainctl; not $trainctl, trainctl-gate-1, trainctl.cli)
# followed by a space and what may be subcommand names.
INVOCATION = re.compile(r"(?<![\w$.-])trainctl((?:[ \t]+[a-z][a-z0-9-]*)+)")


def _code_text(text: str) -> list[str]:
    blocks = FENCED.findall(text)
    outside = FENCED.sub("", text)
    return blocks + INLINE.findall(outside)


def _commands_named(text: str) -> set[tuple[str, ...]]:
    found = set()
    for code in _code_text(text):
        for match in INVOCATION.finditer(code):
            found.add(tuple(match.group(1).split()))
    return found


def _unknown_prefix(words: tuple[str, ...]) -> str | None:
    """The first word that is not a subcommand where one is expected, or None if all are fine."""
    command: click.Command = cli
    ctx = click.Context(cli, info_name="trainctl")
    path = ["trainctl"]
    for word in words:
        if not isinstance(command, click.Group):
            return None          # a plain command: the rest are its arguments
        sub = command.get_command(ctx, word)
        if sub is None:
            return f"{' '.join(path)} has no subcommand {word!r}"
        command, ctx = sub, click.Context(sub, parent=ctx, info_name=word)
        path.append(word)
    return None


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_user_docs_carry_no_issue_numbers_or_commit_ids(path):
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        found += [f"line {number}: {m.group(0)!r}" for m in ISSUE_REFERENCE.finditer(line)]
        found += [f"line {number}: {m.group(0)!r} (a commit id?)" for m in COMMIT_ID.finditer(line)]
    assert not found, f"{path.name}: development history in user docs: " + "; ".join(found)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_trainctl_command_the_docs_show_exists(path):
    named = _commands_named(path.read_text(encoding="utf-8"))
    problems = sorted({problem for words in named if (problem := _unknown_prefix(words))})
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_the_readme_shows_commands_and_its_two_scripts():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert {("submit",), ("health", "check"), ("job", "show")} <= {w[:2] if w[0] != "submit" else w[:1]
                                                                  for w in _commands_named(readme)}
    for script in ("bash scripts/demo", "bash scripts/test"):
        assert f"```bash\n{script}\n```" in readme, f"README: {script} on a line of its own"


def test_the_checks_catch_what_they_are_for():
    assert ISSUE_REFERENCE.search("as issue 13 showed") and ISSUE_REFERENCE.search("fixed in #13")
    assert not ISSUE_REFERENCE.search("NVIDIA/nccl#1478") and not ISSUE_REFERENCE.search("since sweep #41")
    assert COMMIT_ID.search("git show 2f580fc:runner.py") and not COMMIT_ID.search("4096 nodes, deadbeef")
    text = "run `trainctl admin contrib` or\n```bash\n.venv/bin/trainctl health check\n```"
    assert _commands_named(text) == {("admin", "contrib"), ("health", "check")}
    assert _unknown_prefix(("admin", "contrib")) == "trainctl has no subcommand 'admin'"
    assert _unknown_prefix(("health", "chek")) == "trainctl health has no subcommand 'chek'"
    assert _unknown_prefix(("submit", "train")) is None


# ---------------------------------------------------------------- every command line parses

SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PLACEHOLDER = re.compile(r"<[A-Za-z][\w.-]*>")       # <jobid>, <node>: a word in the reader's hands
OPERATORS = set(";&|()<>")
LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _command_lines(text: str) -> list[str]:
    """The shell lines of the code blocks (continuations joined), and the `$ ` lines of text blocks."""
    lines = []
    for lang, body in FENCE.findall(text):
        for line in body.replace("\\\n", " ").splitlines():
            if lang.strip() in SHELL_BLOCKS:
                lines.append(line)
            elif line.startswith("$ "):
                lines.append(line[2:])
    return lines


def _is_trainctl(word: str) -> bool:
    return "$" not in word and word.rsplit("/", 1)[-1] == "trainctl"


def _invocations(line: str) -> list[list[str]]:
    """The arguments of each trainctl command on a shell line, up to the next shell operator."""
    lexer = shlex.shlex(PLACEHOLDER.sub("X", line), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    found: list[list[str]] = []
    argv: list[str] | None = None
    for token in lexer:
        if argv is not None and set(token) <= OPERATORS:
            found.append(argv)
            argv = None
        elif argv is not None:
            argv.append(token)
        elif _is_trainctl(token):
            argv = []
        elif "$(" in token:          # "$(trainctl dev-cluster env)"
            found += _invocations(token.split("$(", 1)[1].rsplit(")", 1)[0])
    return found + ([argv] if argv is not None else [])


def _parse_error(argv: list[str]) -> str | None:
    """Parse `trainctl ARGV` with the real Click tree, as `trainctl` would, without running it."""
    try:
        ctx = cli.make_context("trainctl", list(argv))
        command: click.Command = cli
        while isinstance(command, click.Group):
            rest = [*ctx._protected_args, *ctx.args]
            if not rest:
                return None
            name, command, rest = command.resolve_command(ctx, rest)
            ctx = command.make_context(name, rest, parent=ctx)
    except click.exceptions.Exit:   # --help, --version
        return None
    except click.BadParameter as exc:
        if isinstance(exc.param.type if exc.param else None, click.Path):
            return None             # a path of the reader's, not on this machine: parsed all the same
        return exc.format_message()
    except click.ClickException as exc:
        return exc.format_message()
    return None


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_line_in_the_docs_parses_against_the_cli(path):
    problems = []
    for line in _command_lines(path.read_text(encoding="utf-8")):
        for argv in _invocations(line):
            if (error := _parse_error(argv)) is not None:
                problems.append(f"trainctl {shlex.join(argv)}: {error}")
    assert not problems, f"{path.name}: " + "; ".join(problems)


def _inline_option_problems(text: str) -> list[str]:
    problems = []
    for code in INLINE.findall(FENCED.sub("", text)):
        for match in INVOCATION.finditer(code):
            words = tuple(match.group(1).split())
            command: click.Command = cli
            ctx = click.Context(cli, info_name="trainctl")
            for word in words:
                if not isinstance(command, click.Group) or (sub := command.get_command(ctx, word)) is None:
                    break
                command, ctx = sub, click.Context(sub, parent=ctx, info_name=word)
            if isinstance(command, click.Group):
                continue
            known = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
            known.add("--help")
            own = code[match.start():].split(" -- ", 1)[0]     # after `--`: the program's own arguments
            problems += [f"`{code}`: {command.name} has no option {option}"
                         for option in LONG_OPTION.findall(own) if option not in known]
    return problems


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_option_named_in_inline_code_exists(path):
    problems = _inline_option_problems(path.read_text(encoding="utf-8"))
    assert not problems, f"{path.name}: " + "; ".join(problems)


# ---------------------------------------------------------------- every default quoted is the model's

KEY_THEN_DEFAULT = re.compile(
    r"`\[(?P<table>[\w.]+)\] (?P<key>\w+)`(?:\)?,| \(|:)\s*(?:the )?default:?\s+(?P<value>`[^`]+`|[\w.\"-]+)")
KEY_VALUE_THEN_DEFAULT = re.compile(
    r"`(?:\[(?P<table>[\w.]+)\] )?(?P<key>[\w.]+) = (?P<value>[^`]+)`\s*\((?:the )?default\b")
KEY_COLON_VALUE_DEFAULT = re.compile(r"`\[(?P<table>[\w.]+)\] (?P<key>\w+)`:\s*(?P<value>`[^`]+`)\s*\((?:the )?default\)")
BARE_KEY_DEFAULT = re.compile(r"`(?P<key>[a-z][a-z0-9_]+)`,? \((?:the )?default:? (?P<value>`[^`]+`|[\w.\"-]+)")


def _site_defaults() -> dict[str, str]:
    """Every site key with a default, as `table.key` (partitions: `partitions.key`), in TOML."""
    from trainctl.site import PartitionConfig, SiteConfig

    def toml(value) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return f'"{value}"'
        if isinstance(value, (tuple, list)):
            return "[" + ", ".join(toml(v) for v in value) + "]"
        return repr(value)

    def fields(cls, prefix: str, out: dict[str, str]) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                fields(hint, f"{f.name}.", out)
            elif typing.get_origin(hint) is dict and typing.get_args(hint)[1] is PartitionConfig:
                fields(PartitionConfig, "partitions.", out)
            elif f.default is not dataclasses.MISSING:
                out[prefix + f.name] = toml(f.default)
            elif f.default_factory is not dataclasses.MISSING:   # type: ignore[misc]
                out[prefix + f.name] = toml(f.default_factory())  # type: ignore[misc]
    out: dict[str, str] = {}
    fields(SiteConfig, "", out)
    return out


def _same_value(quoted: str, model: str) -> bool:
    quoted = quoted.strip("`").strip()
    quoted = {"on": "true", "off": "false"}.get(quoted, quoted)
    if quoted.strip('"') == model.strip('"'):
        return True
    try:
        return float(quoted) == float(model)
    except ValueError:
        return False


def _quoted_defaults(text: str) -> list[tuple[str | None, str, str]]:
    text = re.sub(r"\s+", " ", FENCED.sub("", text))
    return [(m.groupdict().get("table"), m["key"], m["value"])
            for pattern in (KEY_THEN_DEFAULT, KEY_VALUE_THEN_DEFAULT, KEY_COLON_VALUE_DEFAULT, BARE_KEY_DEFAULT)
            for m in pattern.finditer(text)]


def _default_problems(text: str, defaults: dict[str, str]) -> list[str]:
    problems = []
    for table, key, value in _quoted_defaults(text):
        if table:
            path = f"{table}.{key}"
            if path not in defaults:
                problems.append(f"`[{table}] {key}` is not a site key with a default")
                continue
        else:   # a bare key: the one site key of that name, if it is one
            paths = [p for p in defaults if p.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]
                     and p.endswith(key)]
            if len(paths) != 1:
                continue
            path = paths[0]
        if not _same_value(value, defaults[path]):
            problems.append(f"{path}: the docs say the default is {value}, the model says {defaults[path]}")
    return problems


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_default_the_docs_quote_is_the_site_models(path):
    problems = _default_problems(path.read_text(encoding="utf-8"), _site_defaults())
    assert not problems, f"{path.name}: " + "; ".join(problems)


# ---------------------------------------------------------------- no development diary

DIARY = re.compile(r"\bthis project\b|\bwas lent\b|\bno GPU machine\b|\bstopped after \d+ runs\b"
                   r"|\bwe (?:tried|found|had)\b", re.IGNORECASE)


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_user_docs_tell_no_project_history(path):
    found = [f"line {number}: {m.group(0)!r}" for number, line in
             enumerate(path.read_text(encoding="utf-8").splitlines(), 1) for m in DIARY.finditer(line)]
    assert not found, f"{path.name}: development history in user docs: " + "; ".join(found)


def test_the_drift_checks_catch_what_they_are_for():
    assert _invocations('eval "$(.venv/bin/trainctl dev-cluster env)"') == [["dev-cluster", "env"]]
    assert _invocations("srun -N 1 trainctl health check --site x | head  # note") == [
        ["health", "check", "--site", "x"]]
    assert _invocations("trainctl job show <jobid> && trainctl report") == [["job", "show", "X"], ["report"]]
    assert _parse_error(["submit", "--site", "s", "--nodes", "N", "--", "t.py"])   # N is not a number
    assert _parse_error(["sweep", "--site", "s", "--zork"])
    assert _parse_error(["submit", "--site", "s", "--nodes", "2", "--", "t.py", "--zork"]) is None
    assert _inline_option_problems("run `trainctl sweep --site S --zork`") == [
        "`trainctl sweep --site S --zork`: sweep has no option --zork"]
    defaults = _site_defaults()
    assert defaults["launch.release_unused"] == "true" and defaults["watch.hold_spares"] == "0"
    assert _default_problems("`[launch] release_unused`, default `false`", defaults)
    assert _default_problems("`[watch] hold_spares = 2` (the default)", defaults)
    assert not _default_problems("`[gate] drain_on`, default `[]` (off); `[launch] release_unused` (default on)",
                                 defaults)
    assert DIARY.search("No GPU machine was lent to this project")
    assert _matches("$ trainctl x\na ... c\n", "a b\nb c") and not _matches("a x", "a y")


# ---------------------------------------------------------------- every sample output comes from a run

SAMPLE_BLOCK = re.compile(r"(?:<!-- sample: (?P<id>[^>]*?) -->\n)?^```text\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def _run(tmp_path: Path, *argv: str, env: dict | None = None) -> str:
    import subprocess
    import sys

    out = subprocess.run([str(Path(sys.executable).with_name("trainctl")), *argv], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, env=env)
    return out.stdout + out.stderr


def _bad_site(tmp_path: Path) -> str:
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site-configs" / "local-demo.toml").read_text().replace(
        "probe_timeout_s = 10.0", "probe_timeout_s = -5.0"))
    return _run(tmp_path, "site", "show", "site.toml")


def _another_trainctl(tmp_path: Path) -> str:
    # the real header of the unrelated `trainctl` 0.1.0 on the public index (its METADATA)
    import os

    other = tmp_path / "site-packages" / "trainctl-0.1.0.dist-info"
    other.mkdir(parents=True)
    (other / "METADATA").write_text("Metadata-Version: 2.5\nName: trainctl\nVersion: 0.1.0\nSummary: A lightweight, "
                                    "framework-agnostic deep-learning experiment supervisor\n\nlong description\n")
    return _run(tmp_path, "health", "list", env=dict(os.environ, PYTHONPATH=str(tmp_path / "site-packages")))


def _rank_exec_binding(tmp_path: Path) -> str:
    # rank-exec as srun starts it on a recorded H200 node (its real `topo -m`), dgx-h100's site
    from test_rank_exec import H200_TOPO, gate_dir_with_topo, rank_exec, slurm_task

    gate = gate_dir_with_topo(tmp_path, "gpu07", H200_TOPO)
    task = dict(slurm_task(rank=0, local=0, node=0, world=8, layout="8"), SLURMD_NODENAME="gpu07")
    return rank_exec(tmp_path, task, "--gate-dir", str(gate), program=("true",)).stderr


def _sweep_report(tmp_path: Path) -> str:
    # a night's sweep as `trainctl sweep` records it (node2 and node3 failing ib.ports with the
    # reason the check gives for the recorded ibstat with two ports Down, node4 busy), the drains
    # `trainctl drain --apply` records for them, then the real `trainctl report`
    import os
    import time

    from support.sweeps import night
    from trainctl.sweep.db import History

    reason = "mlx5_11 port 1 is Down/Disabled; mlx5_5 port 1 is Down/Disabled"
    db = tmp_path / "sweeps.db"
    now = time.time() - 3600
    with History.open(db, write=True) as history:
        sweep = night(history, now, {"node1": "ok", "node2": {"ib.ports": ("fail", reason)},
                                     "node3": {"ib.ports": ("fail", reason)}, "node4": "allocated"})
        for host in ("node2", "node3"):
            history.record_drain(host=host, reason=f"trainctl: ib.ports: {reason}", reason_time="2026-11-22T20:52:00",
                                 sweep_id=sweep, check="ib.ports", drained_at=now + 120)
    return _run(tmp_path, "report", "--db", str(db), env=dict(os.environ, TZ="UTC"))


def _retry_chain(tmp_path: Path) -> str:
    # attempt files as the job's supervisor writes them (jobdir's writers) when node3 is lost during
    # training and job 1 submits job 2 (tests/test_retry_cluster.py makes real ones), read as
    # `job show 2` reads them
    from trainctl.job import jobdir
    from trainctl.job.show import LocalFiles, chain_lines, collect_chain

    first, second = jobdir.JobPaths.of(tmp_path, "1"), jobdir.JobPaths.of(tmp_path, "2")
    first.root.mkdir()
    second.root.mkdir()
    jobdir.write_json(first.retry, jobdir.RetryRecord(
        "1", 1, 1, "step", 1, True, "a node was lost during training",
        {"node3": "Slurm removed it from the job (node failure)"}, ("node3",), "2", None, None, ()).to_json())
    jobdir.write_json(second.attempt, jobdir.AttemptRecord("2", 2, 1, "1", ("node3",)).to_json())
    return "\n".join(chain_lines(collect_chain(LocalFiles(), str(second.root), "2"), "2"))


def _cannot_go_on(tmp_path: Path) -> str:
    # the job's machine and its driver's last line, on the events of a job of --nodes 2 on a site
    # that allows no successor: the gate chose node1 and node2, then node2's agent reported an Xid
    import contextlib
    import io

    from trainctl.job import machine
    from trainctl.job.driver import JobDriver
    from trainctl.job.jobdir import Journal, NodeReading, RankProgress
    from trainctl.job.policy import load_gate_policy

    policy = load_gate_policy("local-demo", None)
    watch = machine.WatchFacts(policy.watch_limits, None, 1.0, 1.0, 1.0, policy.watch.pay_factor,
                               policy.watch.restart_cost_s)
    facts = machine.JobFacts(("node1", "node2"), "node1", True, 0, max_restarts=3, min_nodes=2, successors=0,
                             watch=watch)
    state = machine.JobState()
    readings = {"node1": NodeReading("node1", 1001.0, (RankProgress(0, 5, 2.5, 1001.0),), ()),
                "node2": NodeReading("node2", 1001.0, (RankProgress(1, 5, 2.5, 1001.0),),
                                     (("gpu.xid", "Xid 79 on GPU 0 (fell off the bus)"),))}
    for event in (machine.Started(), machine.GateDecided("node[1-2]", ("node1", "node2"), "10.0.0.1"),
                  machine.TrainingStarted(1000.0), machine.Polled(1001.0, readings),
                  machine.CheckpointAsked(posted=True, listening=False), machine.StepStopped(137)):
        state, effects = machine.advance(facts, state, event)
    driver = JobDriver.__new__(JobDriver)
    driver.job_id = "1"
    driver.journal = Journal(tmp_path / "journal.jsonl")
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        driver.carry_out(effects[-1])
    return said.getvalue()


def _slowdown_weighed(tmp_path: Path) -> str:
    # the job's machine on the local-demo site's settings, its journal written by the job's own
    # Journal, and `job show`'s timeline of it: a job of --nodes 2 stepping at 0.5 s, whose program
    # slows to 1 s a step after 80 s of training with no node named; its last save at 1060 s
    from trainctl.job import machine
    from trainctl.job.driver import JobDriver
    from trainctl.job.jobdir import Journal, NodeReading, RankProgress, Save, read_journal
    from trainctl.job.journal import timeline_lines
    from trainctl.job.policy import load_gate_policy

    policy = load_gate_policy("local-demo", None)
    watch = machine.WatchFacts(policy.watch_limits, 10, 1.0, 1.0, 1.0, policy.watch.pay_factor,
                               policy.watch.restart_cost_s)
    facts = machine.JobFacts(("node1", "node2"), "node1", False, 0, max_restarts=3, min_nodes=2, watch=watch)
    clock = [1000.0]
    driver = JobDriver.__new__(JobDriver)
    driver.journal = Journal(tmp_path / "journal.jsonl", clock=lambda: clock[0])
    state, _ = machine.advance(facts, machine.JobState(), machine.Started())
    state, _ = machine.advance(facts, state, machine.GateDecided("node[1-2]", ("node1", "node2"), "10.0.0.1"))
    state, _ = machine.advance(facts, state, machine.TrainingStarted(1000.0))
    state, _ = machine.advance(facts, state, machine.Polled(1000.0, {}, Save(1060.0, "torch.save", "ckpt.pt")))
    for second in range(1, 121):
        t = 1000.0 + second
        steps = int(min(second, 80) * 2 + max(second - 80, 0))
        readings = {node: NodeReading(node, t, (RankProgress(rank, steps, float(second), t),), ())
                    for rank, node in enumerate(("node1", "node2"))}
        clock[0] = t
        state, effects = machine.advance(facts, state, machine.Polled(t, readings))
        for effect in effects:
            if isinstance(effect, machine.Journal) and effect.kind == "weighed":
                driver.carry_out(effect)
    return "\n".join(timeline_lines([("1", read_journal(tmp_path / "journal.jsonl"))], 1000.0)) + "\n"


def _flight_recorder_section(tmp_path: Path) -> str:
    # the node agent's account in its stacks file, for a node whose two ranks both dumped
    from trainctl.job.agent import flight_recorder_text

    return flight_recorder_text("node2", {0: "", 1: ""}, {0, 1})


def _another_users_directory(tmp_path: Path) -> Path:
    # the node directory of uid 1000 (this job's user here), made first by uid 1001 (as root: chown)
    import os

    taken = tmp_path / "trainctl-1000"
    taken.mkdir(mode=0o700)
    os.chown(taken, 1001, 1001)
    return taken


def _agent_refusing(tmp_path: Path) -> str:
    # the node agent's bind, as uid 1000, where uid 1001 made its directory first
    import contextlib
    import io
    from unittest import mock

    from trainctl.agent_socket import agent_socket_path
    from trainctl.job.agent import Agent

    _another_users_directory(tmp_path)
    agent = Agent.__new__(Agent)
    agent.node = "node1"
    agent.socket_path = agent_socket_path("7", "node1", {"TMPDIR": str(tmp_path)}, uid=1000)
    agent.request_path = agent.socket_path + ".checkpoint-request"
    said = io.StringIO()
    with mock.patch("os.geteuid", return_value=1000), contextlib.redirect_stderr(said):
        assert agent._bind() is None
    return said.getvalue()


def _rank_exec_refusing(tmp_path: Path) -> str:
    # rank-exec as srun starts it in a watched step, as uid 1000, where uid 1001 made its directory first
    import os
    import subprocess
    import sys

    from test_rank_exec import slurm_task

    _another_users_directory(tmp_path)
    as_uid_1000 = ("import os, sys; os.geteuid = lambda: 1000; from trainctl.cli import main; "
                   "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, **slurm_task(rank=0, local=0, node=0, world=1, layout="1"), "SLURMD_NODENAME": "node1",
           "TMPDIR": str(tmp_path), "TRAINCTL_WATCH_DIR": str(tmp_path / "watch")}
    out = subprocess.run([sys.executable, "-P", "-c", as_uid_1000, "rank-exec", "--site", "local-demo",
                          "--master-addr", "h", "--no-bind", "--", "true"], capture_output=True, text=True,
                         timeout=120, env=env, cwd=tmp_path)
    return out.stdout + out.stderr


def _submit_torchrun(tmp_path: Path) -> str:
    # a dry run of a torchrun command line, with the script it names
    (tmp_path / "multinode.py").write_text("")
    return _run(tmp_path, "submit", "--site", "local-demo", "--dry-run", "--", "torchrun", "--nnodes", "2",
                "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node1:29500", "multinode.py",
                "20", "5")


def _submit_job_script(tmp_path: Path) -> str:
    # a dry run of pytorch/examples' DDP tutorial job script, as edited for the dev cluster
    shutil.copy(REPO / "tests" / "fixtures" / "job-scripts" / "dev-cluster" / "pytorch-examples-sbatch_run.sh",
                tmp_path / "sbatch_run.sh")
    (tmp_path / "multinode_torchrun.py").write_text("")
    return _run(tmp_path, "submit", "--site", "local-demo", "--dry-run", "sbatch_run.sh")


def _followed_job(tmp_path: Path, ended: bool):
    # a job of 3 nodes as its supervisor and agents write it (test_job_follow's JobFiles: the job's own
    # Journal, the agents' writer, the gate round's archive), on a clock that starts at 10:00:00 UTC:
    # node2 slows to 1 s a step, the watch names it, the gate runs again, training goes on without it
    from test_job_follow import Clock, JobFiles

    clock = Clock(1764583200.0)
    job = JobFiles(tmp_path, "7", clock=clock)
    job.add(jobdir.Kind.SUBMITTED, submitted_t=clock.t - 95)
    job.start("local-demo")
    clock.t += 3
    job.add(jobdir.Kind.FIRST_STEP, steps=1)
    clock.t += 1400
    job.add(jobdir.Kind.CHECKPOINT, checkpoint_t=clock.t - 200, note="step 2000")
    job.agents(2800, {"node1": 0.5, "node2": 0.5, "node3": 0.5}, written=clock.t)
    job.add(jobdir.Kind.DETECTION, kind="slow", suspects=["node2"], evidence="step time 1 s over the last 60 s, "
            "2.00x the job's own 0.5 s; rank 2 on node2 0.93 s a step of its own", details={"step_s": 1.0, "baseline_s": 0.5})
    clock.t += 40
    job.add(jobdir.Kind.CHECKPOINT, checkpoint_t=clock.t, note="step 2840", source="progress.checkpoint()")
    job.add(jobdir.Kind.STEP_END, status=143, cause="stopped after a detection", training_start_t=clock.t - 1445,
            last_checkpoint_t=clock.t)
    clock.t += 90
    job.add(jobdir.Kind.CONFIRMATION, kind="slow", named={"node2": "slow: rank 2's own time"}, checked=["node1", "node2", "node3"])
    job.start("local-demo", chosen=("node1", "node3"), again=1)
    clock.t += 60
    job.add(jobdir.Kind.FIRST_STEP, steps=1)
    clock.t += 600
    job.agents(1196, {"node1": 0.5, "node3": 0.5}, written=clock.t - 2)
    before = jobdir.read_node_files(job.paths, ("node1", "node3"))
    job.agents(1200, {"node1": 0.5}, written=clock.t)
    job.agents(1198, {"node3": (1196 * 0.5 + 2 * 1.0) / 1198}, written=clock.t)   # its last 2 steps: 1 s each
    if ended:
        job.add(jobdir.Kind.STEP_END, status=0, cause="the program ended", training_start_t=clock.t - 660)
        job.add(jobdir.Kind.JOB_END, status=0)
    return job, before


def _follow_piped(tmp_path: Path) -> str:
    import os

    job, _ = _followed_job(tmp_path, ended=True)
    return _run(tmp_path, "job", "show", "--follow", "7", "--dir", str(job.paths.root), env=dict(os.environ, TZ="UTC"))


def _follow_terminal(tmp_path: Path) -> str:
    # the view a terminal shows of the job above while it trains again, the agents' files of its
    # last two polls read as `job show --follow` reads them
    from trainctl.job.follow import Follower, follow_view, site_watch, view_lines

    job, before = _followed_job(tmp_path, ended=False)
    follower = Follower(str(job.paths.root), "7", site_watch)
    follower.read(job.clock.t)
    readings = jobdir.read_node_files(job.paths, ("node1", "node3"))
    view = follow_view(("7",), follower.so_far, readings, before, job.clock.t + 1, site_watch("local-demo"))
    return "\n".join(view_lines(view)) + "\n"


def _job_last_line(tmp_path: Path) -> str:
    # the job's supervisor at the job's end, as the machine ends it
    import contextlib
    import io

    from trainctl.job import machine
    from trainctl.job.driver import JobDriver

    driver = JobDriver.__new__(JobDriver)
    driver.job_id = "7"
    driver.journal = jobdir.Journal(tmp_path / "journal.jsonl")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        driver.carry_out(machine.Finish(0))
    return said.getvalue()


# Where each sample comes from: a command or function run here on real or recorded input; or
# `recorded PATH`, the recorded output of a real run under tests/fixtures/ (each recording's
# README or header names the command that made it).
def _hung_job_journal(path: Path):
    # a job's journal as its supervisor writes it: the gate left node3 out, training from 1040 with
    # a save at 1100, node2 hung at 1200, the restart trained again at 1300
    from trainctl.job.jobdir import Journal, Kind

    clock = [1000.0]
    journal = Journal(path, clock=lambda: clock[0], keep=True)
    for t, kind, fields in ((1000, Kind.JOB_START, {"job": "1234"}), (1001, Kind.SUBMITTED, {"submitted_t": 900.0}),
                            (1001, Kind.GATE_START, {}),
                            (1029, Kind.NODE_VERDICT, {"node": "node3", "verdict": "excluded", "reasons": ["Xid 79"]}),
                            (1031, Kind.GATE_END, {"status": 0}), (1040, Kind.TRAINING_START, {"nodes": "node[1-2]"}),
                            (1101, Kind.CHECKPOINT, {"checkpoint_t": 1100.0}),
                            (1200, Kind.DETECTION, {"kind": "hung", "suspects": ["node2"],
                                                    "evidence": "no rank finished a step for 600 s"}),
                            (1210, Kind.STEP_END, {"status": 143, "training_start_t": 1040.0,
                                                   "last_checkpoint_t": 1100.0}),
                            (1211, Kind.GATE_START, {"nodes": ["node1", "node4"]}), (1240, Kind.GATE_END, {"status": 0}),
                            (1300, Kind.TRAINING_START, {"nodes": "node[1,4]", "restart": 1})):
        clock[0] = t
        journal.add(kind, **fields)
    return journal


def _job_metrics(tmp_path: Path) -> str:
    # what the supervisor writes into node_exporter's textfile directory for that job at 1400
    from trainctl.job import metrics

    journal = _hung_job_journal(tmp_path / "journal.jsonl")
    identity = metrics.JobIdentity("1234", "1234", "alice", "llama")
    samples = metrics.job_samples([journal.events], metrics.Live("training", 2, 0.5, 200), 1400.0)
    metrics.publish(str(tmp_path), "1234", metrics.render(identity, samples))
    return (tmp_path / "trainctl-job-1234.prom").read_text()


def _alert_on_stdin(tmp_path: Path) -> str:
    # the event the alert command reads on stdin, for that job's detection
    import os

    from trainctl.job.alerts import AlertSender, alert_event
    from trainctl.job.metrics import JobIdentity

    journal = _hung_job_journal(tmp_path / "journal.jsonl")
    detection = next(event for event in journal.events if event["event"] == "detection")
    sender = AlertSender(["sh", "-c", 'cat > "$0"', str(tmp_path / "stdin")], 10.0, str(tmp_path / "alerts.log"),
                         dict(os.environ), print)
    sender.send(alert_event(detection, JobIdentity("1234", "1234", "alice", "llama"), "/home/alice/trainctl-gate-1234"))
    sender.close()
    return (tmp_path / "stdin").read_text()


SAMPLES = {
    "a job's metrics file": _job_metrics,
    "an alert's stdin": _alert_on_stdin,
    "site show of a bad site file": _bad_site,
    "submit --zork": lambda tmp_path: _run(tmp_path, "submit", "--zork"),
    "another trainctl installed": _another_trainctl,
    "rank-exec on a recorded H200": _rank_exec_binding,
    "a night's sweep, then report": _sweep_report,
    "job show of a retried job": _retry_chain,
    "the job cannot go on": _cannot_go_on,
    "a slowdown weighed": _slowdown_weighed,
    "the agent's flight recorder section": _flight_recorder_section,
    "the agent refusing another user's directory": _agent_refusing,
    "rank-exec refusing another user's directory": _rank_exec_refusing,
    "submit --dry-run of torchrun": _submit_torchrun,
    "submit --dry-run of a job script": _submit_job_script,
    "job show --follow, piped": _follow_piped,
    "job show --follow on a terminal": _follow_terminal,
    "the job's last line": _job_last_line,
}
# A diagram is no output: `<!-- sample: none, a diagram -->`.
NOT_OUTPUT = "none, a diagram"


def _matches(shown: str, real: str) -> bool:
    """The block is the real output, where each `...` in it stands for any text."""
    shown = "\n".join(line for line in shown.strip("\n").splitlines() if not line.startswith("$ "))  # the command
    pattern = ".*?".join(re.escape(part) for part in shown.split("..."))
    return re.search(pattern, real, re.DOTALL) is not None


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_sample_output_comes_from_a_real_run(path, tmp_path):
    problems = []
    for number, match in enumerate(SAMPLE_BLOCK.finditer(path.read_text(encoding="utf-8")), 1):
        sample, body = match["id"], match["body"]
        if sample == NOT_OUTPUT:
            continue
        if sample is not None and sample.startswith("recorded ") and sample not in SAMPLES:
            SAMPLES[sample] = lambda _, name=sample.removeprefix("recorded "): (
                REPO / "tests" / "fixtures" / name).read_text(encoding="utf-8")
        if sample not in SAMPLES:
            problems.append(f"text block {number} ({body.splitlines()[0][:60]!r}...): no `<!-- sample: ID -->` "
                            f"naming where it comes from" if sample is None else f"unknown sample {sample!r}")
            continue
        workdir = tmp_path / str(number)
        workdir.mkdir()
        real = SAMPLES[sample](workdir)
        if not _matches(body, real):
            problems.append(f"text block {number} is not what {sample!r} prints:\n{body}\n--- it prints:\n{real}")
    assert not problems, f"{path.name}: " + "\n".join(problems)


# ---------------------------------------------------------------- the README's links work everywhere

README_LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_URL = "https://github.com/trainctl/trainctl/blob/main/"


def test_the_readmes_links_work_on_the_package_index_and_name_files_that_exist():
    # pip users read the README on the package index, where a relative link leads nowhere; the
    # generated reference pages exist only in a docs build
    problems = []
    for target in README_LINK.findall((REPO / "README.md").read_text(encoding="utf-8")):
        if not target.startswith(("https://", "http://")):
            problems.append(f"{target}: relative")
        elif target.startswith(REPO_URL) and not (REPO / target.removeprefix(REPO_URL).split("#")[0]).is_file():
            problems.append(f"{target}: no such file in the repository")
    assert not problems, "; ".join(problems)
    import tomllib

    urls = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    assert urls["Documentation"].startswith(REPO_URL) and (REPO / urls["Documentation"].removeprefix(REPO_URL)).is_file()


# ---------------------------------------------------------------- the development page's room map is the tree

# what a checkout holds beside the tree (.gitignore): never in the map
NOT_THE_TREE = {".venv", "build", "dist", "site", "test-artifacts", "__pycache__"}


def layout_rows() -> list[tuple[list[str], list[str]]]:
    """The development page's Layout table: each row's paths (its first cell's code) and what it names."""
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    table = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        if line.startswith("| `"):
            paths, what = line.strip().strip("|").split("|", 1)
            rows.append((INLINE.findall(paths), INLINE.findall(what)))
    return rows


def named_files(folder: str, names: list[str]) -> tuple[set[str], list[str]]:
    """The modules and folders a row names (`cli.py`, `devcluster/`, `tests/fixtures/recorded/`),
    and those of them that are nowhere: in the row's folder, or from the repository's top."""
    found, missing = set(), []
    for name in names:
        if not re.fullmatch(r"[\w./-]+(\.py|/)", name):
            continue    # a command, a name in the code: not a path
        places = [REPO / folder / name, REPO / name]
        if any(place.exists() for place in places):
            found.add(name)
        else:
            missing.append(f"{folder}: {name}")
    return found, missing


def test_the_development_pages_room_map_is_the_tree():
    """Every top-level folder of the tree is in the map and every folder and module the map names
    exists; the top floor's row (trainctl/) names each of its modules."""
    rows = layout_rows()
    listed = {path.rstrip("/") for paths, _ in rows for path in paths if path.endswith("/")}
    tree = {entry.name for entry in REPO.iterdir()
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in NOT_THE_TREE
            and not entry.name.endswith(".egg-info")}
    assert listed == tree, f"in the map, not the tree: {sorted(listed - tree)}; in the tree, not the map: {sorted(tree - listed)}"
    problems = []
    for paths, names in rows:
        folder = next((path.rstrip("/") for path in paths if path.endswith("/")), "")
        found, missing = named_files(folder, names)
        problems += missing
        if folder == "trainctl":
            modules = {entry.name + ("/" if entry.is_dir() else "") for entry in (REPO / "trainctl").iterdir()
                       if (entry.suffix == ".py" and entry.name not in ("__init__.py", "__main__.py"))
                       or (entry.is_dir() and (entry / "__init__.py").is_file())}
            problems += [f"trainctl: {name} not in the map" for name in sorted(modules - found)]
    assert not problems, "; ".join(problems)
