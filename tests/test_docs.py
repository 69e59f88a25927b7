"""The user docs (README.md and docs/) stay clean and true to the CLI.

- They carry no references to this project's own issues or commits: readers get the product,
  not its development history. Upstream citations such as NVIDIA/nccl#1478 are fine.
- Every `trainctl ...` command they show in code exists in the Click tree, so a renamed or
  removed command cannot leave the README pointing at nothing.

The strict MkDocs build (scripts/docs) checks links, anchors and the nav; this test needs no
docs tooling and no network.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from trainctl.cli import cli

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
