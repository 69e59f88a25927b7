"""Text from files and machines, made safe to print: control characters never reach the terminal.

A site file, a snapshot's meta.json or a job name can carry ESC, BEL, CR or a C1 control;
printed raw they can rewrite the terminal (move the cursor, hide a line, set the title). A
newline (or U+2028/U+2029) inside a value forges a line of the output, and Unicode's
bidirectional controls reorder what a reader sees against what the bytes say ("Trojan Source",
CVE-2021-42574: U+202A-U+202E embeddings and overrides, U+2066-U+2069 isolates, and the marks
U+200E, U+200F, U+061C; Unicode UAX #9). All of them are written as escapes.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (ECMA-48), lone surrogates (undecodable bytes), the line and
# paragraph separators, and the bidirectional formatting characters.
_FORMAT = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff{_FORMAT}]")
_UNSAFE_KEEP_LINES = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f\\ud800-\\udfff{_FORMAT}]")


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape of an undecodable byte: show the byte
        return f"\\x{code - 0xDC00:02x}"
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (
        f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def printable(text: str, *, keep_lines: bool = False) -> str:
    """`text` with control and bidirectional formatting characters written as escapes (`\\x1b`,
    `\\u202e`); with `keep_lines`, newlines and tabs are kept (only for text whose lines are ours:
    escape each value, or each line built from values, without it)."""
    return (_UNSAFE_KEEP_LINES if keep_lines else _UNSAFE).sub(_escape, text)


def prometheus_label(value: str) -> str:
    """A label value for Prometheus's text format: backslash, double quote and newline escaped
    (its three escapes), and a lone surrogate (an undecodable byte of a name) as U+FFFD, so the
    file is UTF-8, as the format requires."""
    from trainctl.journal_events import without_lone_surrogates   # here: printable's users need none of it

    return without_lone_surrogates(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
