"""Typed errors for the whole library, and the exit codes the CLI maps them to.

Library code raises these with the context a user needs (file, key, command, node);
`trainctl.cli.main` is the one place that turns them into a line on stderr and an
exit code. Exit codes, documented in docs/reference/exit-codes.md:

    0  ok                     1  warning (health)         2  failure (health) or bad input
    3  unknown (health)       4  an external command or service failed
    70 internal error         128+N ended by signal N: 129 SIGHUP, 130 Ctrl-C, 143 SIGTERM
    141 stdout closed (`| head`)
"""

import signal

EXIT_FAIL = 2
EXIT_USAGE = 2
EXIT_UNKNOWN = 3
EXIT_EXTERNAL = 4
EXIT_INTERNAL = 70
EXIT_SIGNAL_BASE = 128   # shells report a death by signal N as 128 + N; so does trainctl
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # each ends trainctl cleanly


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived (Ctrl-C is KeyboardInterrupt). A BaseException, like
    KeyboardInterrupt, so no `except Exception` on the way up swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
EXIT_CLOSED_PIPE = 141          # 128 + SIGPIPE: the reader of stdout went away


class TrainctlError(Exception):
    """Base of every error trainctl raises on purpose; `str()` is the one-line message."""

    exit_code = EXIT_EXTERNAL

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(TrainctlError):
    """The user asked for something that cannot be done as asked (bad option, bad file)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A site config is missing, malformed, or has unknown or mistyped keys."""


class ParseError(TrainctlError):
    """A recorded command output is not in a format the parser knows, or is truncated."""

    exit_code = EXIT_UNKNOWN

    def __init__(self, message: str, *, source: str = "<text>", line: int | None = None,
                 hint: str | None = None):
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}", hint=hint)
        self.source = source
        self.line = line


class ExternalCommandError(TrainctlError):
    """A command trainctl ran (sbatch, scontrol, ssh, ip ...) failed, timed out or is missing."""

    exit_code = EXIT_EXTERNAL


class PrivilegeError(TrainctlError):
    """The operation needs rights this user lacks (root, Slurm operator)."""

    exit_code = EXIT_USAGE


class CommandLoadError(TrainctlError):
    """A subcommand's module failed to import: a bug or a broken install, never 'no such command'."""

    exit_code = EXIT_INTERNAL


class GateFailed(TrainctlError):
    """Too few allocated nodes passed the health gate for the job to run."""

    exit_code = EXIT_FAIL
