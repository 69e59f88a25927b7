"""Turn a JobPlan into the sbatch script (Jinja) and the sbatch command line that submits it.

Every value that reaches the script passes through a filter that makes it safe where it
lands, and the environment refuses to print anything that did not: `{{ plan.job_name }}`
without a filter is a render error, not an injection. Values go to three places:

- shell lines: `q` quotes a word for bash, on one line (`$'...'` when it holds control
  characters, so a newline in an argument cannot end a line or a comment early);
- `#SBATCH` lines: Slurm parses those itself (quotes and backslashes, up to the line's end),
  so only plain option values go there; any other value travels on sbatch's argv instead;
- comments: `comment` refuses line breaks.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import NamedTuple

import jinja2

import trainctl.templates
from trainctl.jobdir_names import DIR_PREFIX
from trainctl.launcher.plan import RANK_OUTPUT, JobPlan, SbatchOption

TEMPLATE = "sbatch.sh.j2"
TEMPLATE_DIR = Path(trainctl.templates.__file__).parent  # package data (not importlib.resources: 3 ms)
# Values Slurm's #SBATCH parser takes literally: no whitespace, quotes, backslash or '#'.
_DIRECTIVE_VALUE = re.compile(r"[A-Za-z0-9_.,:@%+/=\[\]&|!*-]*")
_OPTION_NAME = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # shlex.quote leaves these unquoted
_ANSI_C_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


class ShellText(str):
    """Text a filter has made safe for where the template puts it."""


class WrittenText(str):
    """Lines of the user's own job script, which the rendered script runs as written."""


class JobScriptParts(NamedTuple):
    """What the rendered script keeps of a job script (`trainctl.launcher.job_script`)."""

    name: str
    shebang: str                 # its bash line (`#!/bin/bash -l`), checked by the parser
    args: tuple[str, ...]        # the arguments after it on submit's command line: its "$@"
    prelude: WrittenText         # its lines from the first command to the training line
    prelude_lines: str           # "9-17", for the comment
    training_line: int
    exports: WrittenText         # the training line's own NAME=value words, exported
    training: WrittenText        # the training line's words, as written
    after: WrittenText           # its lines after the training line ("": none)


def job_script_parts(script, args: tuple[str, ...]) -> JobScriptParts:
    """The rendered script's view of a parsed JobScript."""
    training = script.training
    prelude_end = training.first - 1
    after = script.text(training.last + 1, len(script.lines)) if script.after else ""
    return JobScriptParts(
        script.name, script.shebang, args, WrittenText(script.text(script.body_start, prelude_end)),
        f"{script.body_start}-{prelude_end}", training.first,
        WrittenText(f"export {' '.join(training.assignments)}" if training.assignments else ""),
        WrittenText(" ".join(training.words)), WrittenText(after))


def shell_word(value: str) -> str:
    """`value` as one bash word on one line; bash reads it back unchanged."""
    if _SHELL_SAFE.fullmatch(value) and not value.startswith("="):  # `X==y` reads as a typo to shellcheck
        return value
    if not any(_is_control(char) for char in value):
        return "'" + value.replace("'", "'\"'\"'") + "'"  # as shlex.quote, which leaves `=x` bare
    # ANSI-C quoting: the one bash quoting that can carry a newline without a line break.
    return "$'" + "".join(_ANSI_C_ESCAPES.get(char) or (f"\\x{ord(char):02x}" if _is_control(char) else char)
                          for char in value) + "'"


def command_line(argv: list[str] | tuple[str, ...]) -> str:
    """A bash command line, on one line, that runs `argv` exactly."""
    return " ".join(shell_word(arg) for arg in argv)


def _is_control(char: str) -> bool:
    return char < " " or char == "\x7f"


def directive_safe(option: SbatchOption) -> bool:
    """Whether `option` can be an `#SBATCH` line that Slurm reads back unchanged."""
    return bool(_OPTION_NAME.fullmatch(option.name)) and (
        option.value is None or bool(_DIRECTIVE_VALUE.fullmatch(option.value)))


def split_sbatch_options(options: tuple[SbatchOption, ...]) -> tuple[list[SbatchOption], list[SbatchOption]]:
    """(options written as #SBATCH lines, options passed on sbatch's command line)."""
    directives = [option for option in options if directive_safe(option)]
    on_argv = [option for option in options if not directive_safe(option)]
    return directives, on_argv


def sbatch_argv(plan: JobPlan) -> list[str]:
    """The sbatch command; the script goes to its stdin."""
    _, on_argv = split_sbatch_options(plan.sbatch_options)
    return ["sbatch", "--parsable", *(option.argv for option in on_argv)]


def render_script(plan: JobPlan, job_script: JobScriptParts | None = None) -> str:
    directives, on_argv = split_sbatch_options(plan.sbatch_options)
    return template_environment().get_template(TEMPLATE).render(
        plan=plan, directives=directives, on_argv=on_argv, rank_output=RANK_OUTPUT,
        job_dir_prefix=DIR_PREFIX, job_script=job_script)


# ---------------------------------------------------------------- filters


def _defined(value: object) -> object:
    """StrictUndefined raises only when used; a filter's type check must not swallow that."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # raises jinja2.UndefinedError naming the missing variable
    return value


def _quote_filter(value: object) -> ShellText:
    value = _defined(value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"q: expected a string or an integer, got {type(value).__name__} {value!r}")
    return ShellText(shell_word(str(value)))


def _words_filter(values: object) -> ShellText:
    values = _defined(values)
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise TypeError(f"words: expected a list of strings, got {values!r}")
    return ShellText(command_line([str(value) for value in values]))


def _options_filter(options: list[SbatchOption]) -> ShellText:
    return ShellText(command_line([option.argv for option in options]))


def _directive_filter(option: SbatchOption) -> ShellText:
    if not directive_safe(option):
        raise ValueError(f"{option.argv!r} cannot be an #SBATCH line; it belongs on sbatch's argv")
    return ShellText(option.argv)


def _env_name_filter(name: str) -> ShellText:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    return ShellText(name)


def _comment_filter(text: str) -> ShellText:
    if any(_is_control(char) for char in text):
        raise ValueError(f"a comment cannot hold control characters: {text!r}")
    return ShellText(text)


def _as_written_filter(text: object) -> ShellText:
    """The user's own lines: only a job script's parts (`job_script_parts`) may be put in as they are."""
    text = _defined(text)
    if not isinstance(text, WrittenText):
        raise TypeError(f"as_written: expected a job script's own lines, got {text!r}")
    return ShellText(text.rstrip("\n"))


def _shebang_filter(line: object) -> ShellText:
    line = _defined(line)
    if not isinstance(line, str) or not line.startswith("#!") or any(_is_control(char) for char in line):
        raise ValueError(f"not an interpreter line: {line!r}")
    return ShellText(line)


PLAN_END = "TRAINCTL_PLAN"   # the job script's here-document of the plan ends at this line


def _plan_json_filter(plan: JobPlan) -> ShellText:
    """The plan for `trainctl job run`, as the body of a quoted here-document: bash reads it
    literally, and no line of JSON (every string in quotes, control characters escaped) can be
    the line that ends it."""
    text = json.dumps(plan.to_document(), indent=1, ensure_ascii=False)
    if PLAN_END in text.split("\n"):
        raise ValueError(f"a line of the plan is {PLAN_END}: it cannot be written as a here-document")
    return ShellText(text)


def _only_filtered(value: object) -> object:
    """Jinja `finalize`: every `{{ ... }}` must have gone through one of the filters above."""
    if isinstance(value, ShellText) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"unfiltered value {value!r} in {TEMPLATE}: pass it through q, words, "
                    "options, directive, env_name, comment, plan_json, as_written or shebang")


class _BestEffortBytecodeCache(jinja2.FileSystemBytecodeCache):
    """Compiled templates kept between runs (compiling costs more than the rest of a dry run);
    a cache that cannot be written only costs that time again, it never fails a render."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    try:  # Jinja's per-user directory in the temp dir, refused unless private to this user
        return _BestEffortBytecodeCache()
    except (OSError, RuntimeError):
        return None


@functools.cache
def template_environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined, finalize=_only_filtered, autoescape=False,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, bytecode_cache=_bytecode_cache())
    environment.filters.update(q=_quote_filter, words=_words_filter, options=_options_filter,
                               directive=_directive_filter, env_name=_env_name_filter,
                               comment=_comment_filter, plan_json=_plan_json_filter,
                               as_written=_as_written_filter, shebang=_shebang_filter)
    return environment
