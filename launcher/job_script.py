"""A team's own Slurm job script, read into what `trainctl submit job.sbatch` runs (no I/O but
`read_job_script`).

A job script has four parts, and each becomes something trainctl does:

- its `#SBATCH` lines: read as sbatch reads them, only before the first line that is neither a
  comment nor blank ("sbatch will stop processing further #SBATCH directives once the first
  non-comment non-whitespace line has been reached in the script", sbatch(1),
  https://slurm.schedmd.com/sbatch.html); each is honoured, merged with the site's options, or
  taken over by trainctl with one line saying why (`merge_directives`);
- its environment lines (`module load`, `source`, `export`, `conda activate`, assignments) and
  helper `srun` calls (`srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address`): run as
  written, once, in the batch step before the gate;
- its one training line: `srun` (or none) with torchrun, `python -m torch.distributed.run|launch`,
  `accelerate launch`, `deepspeed`, or `srun python PROGRAM`: its words go to `trainctl job run`
  as bash expands them at run time, which translates them (`program_at_run_time`) and starts
  one rank per GPU on the gate's chosen nodes;
- the lines after it: run as written once the job's life has ended.

What cannot be placed (two training lines, one in a loop, an `if` or a function, none at all)
is one UsageError naming the script's line and what to change.

To say what the training line will run before the job does, the script's own top-level
assignments are followed (`export CMD="$LAUNCHER $SCRIPT"` ... `srun $CMD`); what only the job
knows (`$SLURM_NNODES`, `$(hostname)`) is shown as written.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from trainctl.errors import UsageError
from trainctl.launcher.plan import runnable
from trainctl.launcher.launchers import SRUN, Dropped, Refusal, Translation, is_python, translate

JOB_SCRIPT_MAX_BYTES = 1 << 20               # a job script is a page of shell; a megabyte is not one
JOB_SCRIPT_SUFFIXES = (".sbatch", ".slurm")
# The Python that runs a .py program (or -m MODULE) a launcher named, where the site names none
# (launch.python): the one the job's own environment lines put first on PATH, as torchrun's would be.
JOB_SCRIPT_PYTHON = "python3"
DIRECTIVE = "#SBATCH"
_SHEBANG = re.compile(r"#!\s*(?P<path>\S+)(?P<rest>.*)")
_BASH_OPTIONS = re.compile(r"(\s+-[a-zA-Z]+)*\s*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\+?=")
_UNKNOWN = "\x01"        # marks, in a value followed statically, an expansion only the job knows
_BLANK = "\x02"          # a blank inside such an expansion: it is one word until the job expands it

# sbatch(1)'s short options, by their long names.
SBATCH_SHORT = {
    "-A": "--account", "-a": "--array", "-b": "--begin", "-c": "--cpus-per-task", "-C": "--constraint",
    "-d": "--dependency", "-D": "--chdir", "-e": "--error", "-G": "--gpus", "-i": "--input", "-J": "--job-name",
    "-L": "--licenses", "-m": "--distribution", "-M": "--clusters", "-n": "--ntasks", "-N": "--nodes",
    "-o": "--output", "-p": "--partition", "-q": "--qos", "-S": "--core-spec", "-t": "--time", "-w": "--nodelist",
    "-x": "--exclude", "-F": "--nodefile",
    "-H": "--hold", "-k": "--no-kill", "-O": "--overcommit", "-Q": "--quiet", "-s": "--oversubscribe",
    "-v": "--verbose", "-W": "--wait", "-h": "--help", "-V": "--version",
}
# sbatch's options that take no value, or only one written with `=` (--exclusive[=user]).
SBATCH_FLAGS = frozenset((
    "--hold", "--no-kill", "--overcommit", "--quiet", "--oversubscribe", "--verbose", "--wait", "--help",
    "--version", "--exclusive", "--requeue", "--no-requeue", "--contiguous", "--use-min-nodes", "--spread-job",
    "--test-only", "--parsable", "--ignore-pbs", "--reboot", "--get-user-env", "--nice", "--propagate",
    "--usage", "--disable-stdout-job-summary"))
# srun's options that take a value as the next word when written without `=` (srun(1)): the
# training program starts at the first word that is not an option or such a value.
SRUN_SHORT_VALUED = frozenset("AbBcCdDeFGiJLmMnNopqrStTwWx")
SRUN_FLAGS = frozenset((
    "--overlap", "--exclusive", "--label", "--unbuffered", "--quiet", "--verbose", "--no-kill", "--kill-on-bad-exit",
    "--pty", "--multi-prog", "--overcommit", "--oversubscribe", "--spread-job", "--use-min-nodes", "--contiguous",
    "--disable-status", "--no-allocate", "--preserve-env", "--hold", "--immediate", "--test-only", "--reboot",
    "--help", "--usage", "--version", "--whole", "--exact", "--external-launcher", "--send-libs", "--requeue",
    "--no-requeue"))
ENVIRONMENT_COMMANDS = frozenset((
    "module", "ml", "source", ".", "export", "conda", "mamba", "micromamba", "spack", "set", "unset", "ulimit",
    "umask", "cd", "pushd", "popd", "declare", "typeset", "readonly", "shopt", "eval"))
_OPENERS = {"if": "fi", "for": "done", "while": "done", "until": "done", "select": "done", "case": "esac",
            "{": "}", "(": ")"}
_CLOSERS = frozenset(("fi", "done", "esac", "}", ")"))
_COMMAND_AFTER = frozenset(("then", "do", "else", "elif", "if", "while", "until", "!", "time", "{", "("))
_SEPARATORS = frozenset((";", "&", "&&", "||", "|", "|&", "\n", ";;", "(", ")"))
_REDIRECTIONS = ("&>>", "<<<", "<<-", "&>", ">>", ">&", "<&", "<>", ">|", "<<", "<", ">")
_OPERATORS = ("&&", "||", ";;", "|&", *_REDIRECTIONS, ";", "&", "|", "(", ")")


class Directive(NamedTuple):
    """One option of an #SBATCH line, in sbatch's long form."""

    line: int
    name: str                    # --nodes
    value: str | None            # "4"; None for a flag
    written: str                 # as the script wrote it: -N 4

    @property
    def argv(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value}"


class ScriptLine(NamedTuple):
    """A command of the script outside its training line, run as written."""

    first: int
    last: int
    kind: str                    # "environment", "helper" (an srun, or one inside $(...)), "command"
    text: str


class TrainingLine(NamedTuple):
    first: int
    last: int
    assignments: tuple[str, ...]    # `NAME=value` words before the command, as written
    words: tuple[str, ...]          # the command's words as written (bash expands them in the job)
    shown: tuple[str, ...]          # the words as far as the script's own assignments tell
    known: bool                     # no word depends on what only the job knows


class JobScript(NamedTuple):
    name: str                       # as the user named it
    shebang: str                    # the interpreter line the rendered script keeps
    directives: tuple[Directive, ...]
    lines: tuple[str, ...]          # the script's physical lines
    body_start: int                 # the first line after the #SBATCH header
    commands: tuple[ScriptLine, ...]   # before the training line
    training: TrainingLine
    after: tuple[ScriptLine, ...]
    changes_directory: bool         # a cd/pushd before the training line: its paths are relative to another folder

    def text(self, first: int, last: int) -> str:
        """Lines `first` to `last` (1-based, inclusive), as written."""
        return "".join(line + "\n" for line in self.lines[first - 1:last])


# ---------------------------------------------------------------- reading

def looks_like_job_script(name: str, head: bytes) -> bool:
    """A job script, not a program: named .sbatch/.slurm, or an interpreter line and #SBATCH lines
    in its header (a program's wrapper script has none)."""
    if name.endswith(JOB_SCRIPT_SUFFIXES):
        return True
    if not head.startswith(b"#!"):
        return False
    text = head.decode("utf-8", errors="replace")
    return any(line is not None and line.startswith(DIRECTIVE) for _, line in _header_lines(text.split("\n")))


def read_job_script(path: str, name: str) -> JobScript:
    """The job script at `path` (a regular file, at most JOB_SCRIPT_MAX_BYTES), parsed."""
    from trainctl.files import read_bytes

    data = read_bytes(path, JOB_SCRIPT_MAX_BYTES + 1)
    if data is None:
        raise UsageError(f"job script {name}: not a regular file")
    if len(data) > JOB_SCRIPT_MAX_BYTES:
        raise UsageError(f"job script {name}: larger than {JOB_SCRIPT_MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"job script {name}: not UTF-8 text (byte {exc.start})") from None
    return parse_job_script(text, name)


def parse_job_script(text: str, name: str) -> JobScript:
    lines = tuple(text.replace("\r\n", "\n").split("\n"))
    if lines and lines[-1] == "":
        lines = lines[:-1]
    shebang = _shebang(lines[0] if lines else "", name)
    directives: list[Directive] = []
    body_start = len(lines) + 1
    for number, line in _header_lines(lines):
        if line is None:
            body_start = number
            break
        if line.startswith(DIRECTIVE) and (len(line) == len(DIRECTIVE) or line[len(DIRECTIVE)] in " \t"):
            directives += _directive_options(line[len(DIRECTIVE):], number, name)
    commands = _commands(lines, body_start, name)
    training = _training_line(commands, name)
    before = tuple(c.line for c in commands if c.line.last < training.first)
    after = tuple(c.line for c in commands if c.line.first > training.last)
    changes = any(c.words[:1] and c.words[0] in ("cd", "pushd", "popd") for c in commands
                  if c.line.last < training.first)
    return JobScript(name, shebang, tuple(directives), lines, body_start, before, training, after, changes)


def _shebang(first: str, name: str) -> str:
    """The script's bash line, kept (`#!/bin/bash -l` makes a login shell, for `module`); a script
    for another shell is refused: trainctl's own lines are bash."""
    match = _SHEBANG.fullmatch(first.strip())
    if not match:
        return "#!/bin/bash"
    path, rest = match["path"], match["rest"]
    interpreter = path.rsplit("/", 1)[-1]
    if interpreter == "env":
        words = rest.split()
        interpreter, rest = (words[0] if words else ""), " ".join(words[1:])
    if interpreter in ("bash", "sh") and _BASH_OPTIONS.fullmatch(rest or ""):
        return f"#!/bin/bash{rest.rstrip()}" if interpreter == "sh" else first.strip()
    raise UsageError(f"{name}:1: {first.strip()}: trainctl runs job scripts with bash; start it with #!/bin/bash")


def _header_lines(lines):
    """(line number, line) of the comment and blank lines sbatch reads #SBATCH lines from, then
    (number, None) at the first other line."""
    for number, line in enumerate(lines, 1):
        if number == 1 and line.startswith("#!"):
            continue
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield number, None
            return
        yield number, stripped


def _directive_words(text: str) -> list[str]:
    """An #SBATCH line's words as sbatch splits them: quotes removed, `#` starts a comment."""
    words, word, quote, started = [], [], "", False
    for char in text:
        if quote:
            if char == quote:
                quote = ""
            else:
                word.append(char)
        elif char in "\"'":
            quote, started = char, True
        elif char in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        elif char == "#" and not started:
            break
        else:
            word.append(char)
            started = True
    if started:
        words.append("".join(word))
    return words


def _directive_options(text: str, number: int, name: str) -> list[Directive]:
    words, found, i = _directive_words(text), [], 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            option, sep, value = word.partition("=")
            if not sep and option not in SBATCH_FLAGS:
                if i + 1 >= len(words):
                    raise UsageError(f"{name}:{number}: #SBATCH {option}: expected a value")
                value, i = words[i + 1], i + 1
                word = f"{option} {value}"
            found.append(Directive(number, option, value if (sep or option not in SBATCH_FLAGS) else None, word))
        elif word.startswith("-") and len(word) >= 2 and word[:2] in SBATCH_SHORT:
            option = SBATCH_SHORT[word[:2]]
            if option in SBATCH_FLAGS:
                found.append(Directive(number, option, None, word))
            else:
                value = word[2:]
                if not value:
                    if i + 1 >= len(words):
                        raise UsageError(f"{name}:{number}: #SBATCH {word}: expected a value")
                    value, i = words[i + 1], i + 1
                    word = f"{word} {value}"
                found.append(Directive(number, option, value, word))
        else:
            raise UsageError(f"{name}:{number}: #SBATCH {word}: not an sbatch option trainctl knows: write it as "
                             "--long-name=value")
        i += 1
    return found


# ---------------------------------------------------------------- bash, as far as needed

class _Word(NamedTuple):
    raw: str
    parts: tuple[tuple[str, str, bool], ...]   # (kind, text, quoted): "lit", "param" (name or name\0default), "opaque"


class _Command(NamedTuple):
    line: ScriptLine
    words: tuple[str, ...]        # literal words (quotes removed; expansions as written)
    raw: tuple[_Word, ...]        # the command's words after its assignments
    assignments: tuple[_Word, ...]
    enclosing: tuple[tuple[str, int], ...]   # the compound commands around it: (kind, line)
    alone: bool                   # the only command of its line, with no redirection, pipe or background
    in_substitution: bool         # an srun inside $(...) or `...`


def _matching(text: str, i: int, opening: str, closing: str) -> int | None:
    """The index after the `closing` that matches the `opening` at text[i], quotes respected."""
    depth, j = 0, i
    while j < len(text):
        char = text[j]
        if char == "\\":
            j += 2
            continue
        if char == "'" and closing != "}":
            end = text.find("'", j + 1)
            if end < 0:
                return None
            j = end + 1
            continue
        if char == '"':
            end = _double_quote_end(text, j + 1)
            if end is None:
                return None
            j = end
            continue
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _double_quote_end(text: str, i: int) -> int | None:
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
        elif char == '"':
            return i + 1
        elif char == "$" and text[i + 1:i + 2] in ("(", "{"):
            end = _matching(text, i + 1, text[i + 1], ")" if text[i + 1] == "(" else "}")
            if end is None:
                return None
            i = end
        elif char == "`":
            end = text.find("`", i + 1)
            if end < 0:
                return None
            i = end + 1
        else:
            i += 1
    return None


def _dollar(text: str, i: int, quoted: bool) -> tuple[int, tuple[str, str, bool]] | None:
    nxt = text[i + 1:i + 2]
    if nxt == "(":
        end = _matching(text, i + 1, "(", ")")
        return None if end is None else (end, ("opaque", text[i:end], quoted))
    if nxt == "{":
        end = _matching(text, i + 1, "{", "}")
        if end is None:
            return None
        inner = text[i + 2:end - 1]
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?::?-(.*))?", inner, re.S)
        if match:
            default = match[2]
            return end, ("param", match[1] if default is None else f"{match[1]}\0{default}", quoted)
        return end, ("opaque", text[i:end], quoted)
    match = _NAME.match(text, i + 1)
    if match:
        return match.end(), ("param", match[0], quoted)
    if nxt and nxt in "@*#?$!-0123456789":
        return i + 2, ("opaque", text[i:i + 2], quoted)
    return i + 1, ("lit", "$", quoted)


def _lex(text: str) -> list | None:
    """Words (_Word) and operators (str) of `text`; None where a quote, `$(` or line continuation
    is still open at its end."""
    tokens: list = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char in " \t":
            i += 1
            continue
        if char == "\\" and text[i + 1:i + 2] == "\n":
            i += 2
            continue
        if char == "\\" and i + 1 == n:
            return None
        if char == "\n":
            tokens.append("\n")
            i += 1
            continue
        if char == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        operator = next((op for op in _OPERATORS if text.startswith(op, i)), None)
        if operator:
            tokens.append(operator)
            i += len(operator)
            continue
        start, parts = i, []
        while i < n and text[i] not in " \t\n" and not (
                any(text.startswith(op, i) for op in _OPERATORS) and not (text[i] == "(" and parts_end_assign(parts))):
            char = text[i]
            if char == "(":          # NAME=( ... ): an array, which the job alone fills
                end = _matching(text, i, "(", ")")
                if end is None:
                    return None
                parts.append(("opaque", text[i:end], False))
                i = end
            elif char == "\\":
                if i + 1 >= n:
                    return None
                if text[i + 1] != "\n":
                    parts.append(("lit", text[i + 1], True))
                i += 2
            elif char == "'":
                end = text.find("'", i + 1)
                if end < 0:
                    return None
                parts.append(("lit", text[i + 1:end], True))
                i = end + 1
            elif char == '"':
                end = _double_quote_end(text, i + 1)
                if end is None:
                    return None
                parts += _double_quoted_parts(text[i + 1:end - 1])
                i = end
            elif char == "$":
                found = _dollar(text, i, False)
                if found is None:
                    return None
                i, part = found
                parts.append(part)
            elif char == "`":
                end = text.find("`", i + 1)
                if end < 0:
                    return None
                parts.append(("opaque", text[i:end + 1], False))
                i = end + 1
            else:
                parts.append(("lit", char, False))
                i += 1
        tokens.append(_Word(text[start:i].replace("\\\n", ""), tuple(parts)))
    return tokens


def parts_end_assign(parts) -> bool:
    """Whether the word so far is `NAME=` (or `NAME+=`), which `(` continues as an array."""
    literal = "".join(text for kind, text, quoted in parts if kind == "lit" and not quoted)
    return len(literal) == len(parts) and bool(_ASSIGNMENT.fullmatch(literal))


def _double_quoted_parts(inner: str) -> list:
    parts, i = [], 0
    while i < len(inner):
        char = inner[i]
        if char == "\\" and inner[i + 1:i + 2] in ("$", "`", '"', "\\"):
            parts.append(("lit", inner[i + 1], True))
            i += 2
        elif char == "\\" and inner[i + 1:i + 2] == "\n":
            i += 2
        elif char == "$":
            i, part = _dollar(inner, i, True) or (len(inner), ("opaque", inner[i:], True))
            parts.append(part)
        elif char == "`":
            end = inner.find("`", i + 1)
            end = len(inner) - 1 if end < 0 else end
            parts.append(("opaque", inner[i:end + 1], True))
            i = end + 1
        else:
            parts.append(("lit", char, True))
            i += 1
    return parts


def _literal(word: _Word) -> str:
    """The word with its quotes removed and its expansions as written."""
    return "".join(text if kind == "lit" else _written(kind, text) for kind, text, _ in word.parts)


def _written(kind: str, text: str) -> str:
    if kind == "param":
        name, _, default = text.partition("\0")
        return f"${{{name}:-{default}}}" if "\0" in text else f"${name}"
    return text


def _logical_lines(lines: tuple[str, ...], start: int, name: str):
    """(first line, last line, tokens) of each logical line from `start`: continuations and
    quotes across lines joined, here-document bodies included."""
    number = start
    while number <= len(lines):
        first, text = number, lines[number - 1]
        tokens = _lex(text)
        while tokens is None:
            if number >= len(lines):
                raise UsageError(f"{name}:{first}: a quote, $( or line continuation opened here is never closed")
            number += 1
            text += "\n" + lines[number - 1]
            tokens = _lex(text)
        for index, token in enumerate(tokens):
            if token in ("<<", "<<-") and index + 1 < len(tokens) and isinstance(tokens[index + 1], _Word):
                delimiter = "".join(part[1] for part in tokens[index + 1].parts)
                while number < len(lines):
                    number += 1
                    body = lines[number - 1]
                    if (body.lstrip("\t") if token == "<<-" else body) == delimiter:
                        break
        yield first, number, tokens
        number += 1


def _commands(lines: tuple[str, ...], start: int, name: str) -> list[_Command]:
    """The script's simple commands, each with the compound commands around it."""
    found: list[_Command] = []
    stack: list[tuple[str, int]] = []        # the compound commands open here: (kind, line)
    function: str | None = None              # a function's name, until its body's `{`
    for first, last, tokens in _logical_lines(lines, start, name):
        text = "\n".join(lines[first - 1:last])
        simple: list[tuple[list[_Word], bool, tuple]] = []
        words: list[_Word] = []
        redirected = skip_target = named = skipping = False
        shared = False                       # a pipe or `&` on the line

        def end_command() -> None:
            nonlocal words, redirected, skipping
            if words:
                simple.append((words, redirected, tuple(stack)))
            words, redirected, skipping = [], False, False

        for index, token in enumerate(tokens):
            if isinstance(token, str):
                if token in _REDIRECTIONS:
                    redirected = skip_target = True
                elif token == "(" and words and tokens[index + 1:index + 2] == [")"]:
                    function = _literal(words.pop()).removeprefix("function ")   # NAME () { ... }
                elif token == "(" and not words:
                    stack.append(("(", first))
                elif token == ")":
                    end_command()
                    if stack and stack[-1][0] == "(":
                        stack.pop()
                else:
                    shared |= token in ("|", "|&", "&")
                    end_command()
                continue
            if skip_target or skipping:
                skip_target = False
                continue
            word = _literal(token)
            if not words:                    # a command's first word: a reserved word, or the command
                if named:
                    function, named = word.removesuffix("()"), False
                    continue
                if word in _CLOSERS and stack:
                    stack.pop()
                    continue
                if word == "{":
                    stack.append((f"function {function}" if function else "{", first))
                    function = None
                    continue
                if word in _OPENERS:
                    stack.append((word, first))
                    skipping = word in ("for", "select", "case")   # the words it runs over are no command
                    continue
                if word == "function":
                    named = True
                    continue
                if word in _COMMAND_AFTER:
                    continue
            words.append(token)
        end_command()
        for words, redirected, enclosing in simple:
            count = 0
            while count < len(words) and _ASSIGNMENT.match(_literal(words[count])):
                count += 1
            assignments, command = tuple(words[:count]), tuple(words[count:])
            literal = tuple(_literal(word) for word in command)
            substituted = any("srun" in part for word in words for kind, part, _ in word.parts if kind == "opaque")
            kind = ("helper" if (literal[:1] and literal[0].rsplit("/", 1)[-1] == "srun") or substituted
                    else "environment" if not literal or literal[0] in ENVIRONMENT_COMMANDS else "command")
            alone = len(simple) == 1 and not shared and not redirected
            found.append(_Command(ScriptLine(first, last, kind, text), literal, command, assignments, enclosing,
                                  alone, substituted))
    return found


# ---------------------------------------------------------------- the training line

def srun_command(words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(`srun` and its options, the command it runs); ((), words) without srun."""
    if not words or words[0].rsplit("/", 1)[-1] != "srun":
        return (), words
    i = 1
    while i < len(words) and words[i].startswith("-") and words[i] != "-":
        word = words[i]
        if word == "--":
            i += 1
            break
        if word.startswith("--"):
            i += 1 if "=" in word or word in SRUN_FLAGS else 2
        else:
            i += 2 if word[1] in SRUN_SHORT_VALUED and len(word) == 2 else 1
    return words[:i], words[i:]


def _is_training(words: tuple[str, ...]) -> bool:
    srun, command = srun_command(words)
    if not command:
        return False
    if translate(command, placed=True) is not None:
        return True
    return bool(srun) and (is_python(command[0]) or command[0].endswith(".py"))


def _training_line(commands: list[_Command], name: str) -> TrainingLine:
    env: dict[str, tuple[str, bool]] = {}
    candidates = []
    for command in commands:
        if command.enclosing:
            if _is_training(_shown_words(command.raw, env)[0]):
                candidates.append((command, None))
            continue
        shown, known = _shown_words(command.raw, env)
        if _is_training(shown) and not command.in_substitution:
            candidates.append((command, (shown, known)))
        elif not command.enclosing:
            _assign(command, env)
    if not candidates:
        bare = next((c for c in commands if c.words[:1] and (is_python(c.words[0]) or c.words[0].endswith(".py"))
                     and not c.enclosing), None)
        hint = (f"; line {bare.line.first} runs {bare.words[0]} once, on the batch host: write `srun "
                f"{' '.join(bare.words)}` to run it on every node" if bare else "")
        raise UsageError(f"{name}: no training line: trainctl looks for srun with torchrun, python -m "
                         f"torch.distributed.run, accelerate launch, deepspeed or python PROGRAM{hint}")
    if len(candidates) > 1:
        lines = ", ".join(str(c.line.first) for c, _ in candidates)
        raise UsageError(f"{name}:{candidates[1][0].line.first}: a second training line (lines {lines}): trainctl "
                         "runs one training per job: submit the other as a job of its own")
    command, static = candidates[0]
    where = f"{name}:{command.line.first}"
    if command.enclosing:
        kind, line = command.enclosing[-1]
        inside = (f"inside {kind} (line {line})" if kind.startswith("function")
                  else f"inside a loop ({kind}, line {line})" if kind in ("for", "while", "until", "select")
                  else f"inside `{kind}` (line {line})")
        raise UsageError(f"{where}: the training line is {inside}: trainctl runs the training line once, itself, "
                         "and cannot see where that runs it: put it on a line of its own at the top level")
    if not command.alone:
        raise UsageError(f"{where}: the training line shares its line with a pipe, a redirection, `&&`, `;` or `&`: "
                         "trainctl keeps the training's output itself: put the srun on a line of its own")
    shown, known = static
    return TrainingLine(command.line.first, command.line.last, tuple(w.raw for w in command.assignments),
                        tuple(w.raw for w in command.raw), shown, known)


def _assign(command: _Command, env: dict[str, tuple[str, bool]]) -> None:
    """Follow `NAME=value` and `export NAME=value` at the top level, as far as the script tells."""
    words = command.assignments if not command.words else (
        command.raw[1:] if command.words[0] in ("export", "declare", "typeset", "readonly") else ())
    for word in words:
        literal = _literal(word)
        match = _ASSIGNMENT.match(literal)
        if not match:
            continue
        value, known = _expand(word.parts, env, split=False)
        # the value is what follows NAME= in the word: drop the name's characters from the front
        text = value[0][len(match[0]):] if value else ""
        if not known and text.startswith(_UNKNOWN) and text.endswith(_UNKNOWN) and text.count(_UNKNOWN) == 2:
            env.pop(match["name"], None)     # only the job knows it: shown as $NAME
        else:
            env[match["name"]] = (text, known)


def _expand(parts, env, split: bool) -> tuple[list[str], bool]:
    """The word(s) `parts` make, with the script's assignments followed; an expansion only the
    job knows stays as written, marked (one word, whatever it holds)."""
    words, current, known, started = [], [], True, False
    for kind, text, quoted in parts:
        if kind == "lit":
            current.append(text)
            started = True
            continue
        value, value_known = None, False
        if kind == "param":
            param, _, default = text.partition("\0")
            if param in env:
                value, value_known = env[param]
            elif "\0" in text:
                value, value_known = default.strip('"'), '$' not in default
        if value is None:
            current.append(_UNKNOWN + re.sub(r"\s", _BLANK, _written(kind, text)) + _UNKNOWN)
            known, started = False, True
            continue
        known &= value_known
        if quoted or not split:
            current.append(value)
            started = True
            continue
        pieces = value.split()
        if pieces and value[:1].isspace() and started:
            words.append("".join(current))
            current, started = [], False
        for index, piece in enumerate(pieces):
            if index:
                words.append("".join(current))
                current = []
            current.append(piece)
            started = True
        if pieces and value[-1:].isspace():
            words.append("".join(current))
            current, started = [], False
    if started:
        words.append("".join(current))
    return words, known


def _shown_words(raw: tuple[_Word, ...], env) -> tuple[tuple[str, ...], bool]:
    words, known = [], True
    for word in raw:
        expanded, word_known = _expand(word.parts, env, split=True)
        words += expanded
        known &= word_known
    return tuple(word.replace(_UNKNOWN, "").replace(_BLANK, " ") for word in words), known


# ---------------------------------------------------------------- what each rank runs

def training_program(words: tuple[str, ...]) -> tuple[tuple[str, ...], Translation | None]:
    """The program each rank runs for a training line's words (srun and a launcher translated,
    the launcher's counts dropped: the job's placement is trainctl's), and the translation."""
    srun, command = srun_command(tuple(words))
    if not command:
        raise UsageError("the training line runs nothing after srun")
    translated = translate(command, placed=True)
    if isinstance(translated, Refusal):
        raise UsageError(translated.reason)
    if translated is None:
        if srun:
            return command, Translation("srun", command, dropped=(Dropped(" ".join(srun), SRUN),))
        return command, None
    if srun:
        translated = translated._replace(dropped=(Dropped(" ".join(srun), SRUN), *translated.dropped))
    return translated.program, translated


def program_at_run_time(words: tuple[str, ...], python: str) -> tuple[tuple[str, ...], str]:
    """In the job: the training line's words as bash expanded them, as each rank's program, and
    the line that says so."""
    import shlex

    program, _ = training_program(words)
    program = runnable(program, python)
    return program, f"the job script's training line, as bash expanded it: {shlex.join(words)}; each rank runs " \
                    f"{shlex.join(program)}"


# ---------------------------------------------------------------- the #SBATCH lines and trainctl's own

class Merged(NamedTuple):
    """The job script's #SBATCH lines as submit's own options."""

    nodes: int | None
    min_nodes: int | None
    gpus_per_node: int | None
    partition: str | None
    time_limit: str | None
    job_name: str | None
    signal: str | None
    chdir: str | None
    exclude: str | None
    sbatch: tuple[str, ...]         # the others, as `submit --sbatch` options, after the site's
    notes: tuple[str, ...]          # one line for each option trainctl took over


REFUSED = {
    "--array": "a job array runs the script once per task: submit one trainctl job for each",
    "--dependency": "trainctl makes successor jobs depend on this one itself: submit it once the job it waits for "
                    "has ended",
}
TAKEN_OVER = {
    "--output": "trainctl job show reads slurm-%j.out in the submit directory",
    "--error": "trainctl job show reads slurm-%j.out in the submit directory",
    "--no-kill": "trainctl sets it on every job: a node that fails leaves the allocation without ending the job",
    "--ntasks": "one rank per GPU", "--ntasks-per-node": "one rank per GPU", "--tasks-per-node": "one rank per GPU",
    "--gpus-per-task": "one rank per GPU", "--gpus-per-node": "one rank per GPU", "--gpus": "one rank per GPU",
    "--gres": "one rank per GPU",
}
# Honoured as the submit option of the same job, unless the command line gives that option.
AS_SUBMIT_OPTION = {"--partition": "partition", "--time": "time_limit", "--job-name": "job_name",
                    "--signal": "signal", "--chdir": "chdir"}


def merge_directives(directives: tuple[Directive, ...], given: dict[str, object], name: str) -> Merged:
    """The script's #SBATCH lines under the command line's options (`given`: those the command line
    set, by SubmitRequest field, as sbatch lets its command line win over the script)."""
    values: dict[str, object] = {}
    notes: list[str] = []
    extra: list[str] = []
    by_name = {d.name: d for d in directives}

    def where(d: Directive) -> str:
        return f"#SBATCH {d.written} (line {d.line})"

    for d in directives:
        if d.name in REFUSED:
            raise UsageError(f"{name}:{d.line}: #SBATCH {d.written}: {REFUSED[d.name]}")
        if d.name == "--nodes":
            low, _, high = (d.value or "").partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise UsageError(f"{name}:{d.line}: #SBATCH {d.written}: expected N or MIN-MAX nodes")
            values["nodes"], values["min_nodes"] = int(high or low), (int(low) if high else None)
            if given.get("nodes") is not None:
                notes.append(f"{where(d)}: submit --nodes {given['nodes']} wins")
            else:
                notes.append(f"{where(d)}: taken over: the program runs on {values['nodes']} nodes the gate chooses "
                             f"(submit --spare adds nodes for it to leave out){'' if not high else f', at least {low}'}")
        elif d.name in AS_SUBMIT_OPTION:
            field = AS_SUBMIT_OPTION[d.name]
            if given.get(field) is not None:
                notes.append(f"{where(d)}: submit's own option wins ({given[field]})")
            else:
                values[field] = d.value
                if d.name == "--signal":
                    notes.append(f"{where(d)}: taken over as trainctl's --signal: Slurm sends it before the time "
                                 "limit, and the watch asks for a checkpoint with it")
        elif d.name == "--exclude":
            values["exclude"] = d.value
        elif d.name in TAKEN_OVER:
            notes.append(f"{where(d)}: taken over: {TAKEN_OVER[d.name]}")
        else:
            extra.append(d.argv)
    gpus = _gpus_per_node(by_name, values.get("nodes"))
    if gpus is not None and given.get("gpus_per_node") is None:
        values["gpus_per_node"] = gpus
    return Merged(values.get("nodes"), values.get("min_nodes"), values.get("gpus_per_node"),   # type: ignore[arg-type]
                  values.get("partition"), values.get("time_limit"), values.get("job_name"),  # type: ignore[arg-type]
                  values.get("signal"), values.get("chdir"), values.get("exclude"),  # type: ignore[arg-type]
                  tuple(extra), tuple(notes))


def _count(value: str | None) -> int | None:
    """The count at the end of a GPU option's value (`4`, `a100:4`, `gpu:a100:4`)."""
    last = (value or "").split(",")[0].rsplit(":", 1)[-1]
    return int(last) if last.isdigit() else None


def _gpus_per_node(options: dict[str, Directive], nodes: object) -> int | None:
    """The GPUs per node the script asks for: --gpus-per-node, --gres=gpu:N, or GPUs per task times
    tasks per node, or --gpus over the nodes."""
    if "--gpus-per-node" in options:
        return _count(options["--gpus-per-node"].value)
    gres = options.get("--gres")
    if gres is not None and (gres.value or "").startswith("gpu"):
        return _count(gres.value) if ":" in (gres.value or "") else 1
    tasks = _count((options.get("--ntasks-per-node") or options.get("--tasks-per-node") or Directive(0, "", None, "")).value)
    total = _count((options.get("--ntasks") or Directive(0, "", None, "")).value)
    if tasks is None and total is not None and isinstance(nodes, int) and nodes and total % nodes == 0:
        tasks = total // nodes
    if "--gpus-per-task" in options and tasks is not None:
        per_task = _count(options["--gpus-per-task"].value)
        return None if per_task is None else per_task * tasks
    total_gpus = _count((options.get("--gpus") or Directive(0, "", None, "")).value)
    if total_gpus is not None and isinstance(nodes, int) and nodes and total_gpus % nodes == 0:
        return total_gpus // nodes
    return None


def summary(script: JobScript, merged: Merged, note: str, exported: tuple[str, ...]) -> list[str]:
    """What submit understood of the script, for the dry run: one line each. `exported`: the
    variables trainctl's own lines export after the script's (the site's fabric wins)."""
    import shlex

    lines = [f"job script {script.name}:"]
    kept = [d for d in script.directives if d.argv in merged.sbatch or AS_SUBMIT_OPTION.get(d.name)]
    if kept:
        lines.append("  #SBATCH honoured: " + ", ".join(f"{d.argv} (line {d.line})" for d in kept))
    lines += [f"  {line}" for line in merged.notes]
    for command in script.commands:
        names = [m["name"] for w in command.text.split() if (m := _ASSIGNMENT.match(w)) and m["name"] in exported]
        if command.kind == "environment" and names:
            lines.append(f"  line {command.first}: {', '.join(names)}: taken over: trainctl sets "
                         f"{'it' if len(names) == 1 else 'them'} after the script's lines, from the site's partition")
    for kind, title in (("environment", "environment, run once before the gate"),
                        ("helper", "helper srun, run as written before the gate"),
                        ("command", "other commands, run as written before the gate")):
        shown = list({c.first: c for c in script.commands if c.kind == kind}.values())
        if shown:
            lines.append(f"  {title}: " + "; ".join(f"line {c.first}: {_one_line(c.text)}" for c in shown))
    training = script.training
    lines.append(f"  training line {training.first}: {shlex.join(training.shown)}"
                 + ("" if training.known else " (its $ words are expanded in the job)"))
    lines.append(f"  runs as: {note}")
    if script.after:
        lines.append("  after the training, run as written: " + "; ".join(
            f"line {c.first}: {_one_line(c.text)}" for c in script.after))
    return lines


def _one_line(text: str) -> str:
    joined = " ".join(text.replace("\\\n", " ").split())
    return joined if len(joined) <= 100 else joined[:97] + "..."
