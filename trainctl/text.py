"""Text from files and machines, made safe to print: control characters never reach the terminal.

A site file, a snapshot's meta.json or a job name can carry ESC, BEL, CR or a C1 control;
printed raw they can rewrite the terminal (move the cursor, hide a line, set the title).
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (ECMA-48), and lone surrogates (undecodable bytes).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_UNSAFE_KEEP_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape of an undecodable byte: show the byte
        return f"\\x{code - 0xDC00:02x}"
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (
        f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def printable(text: str, *, keep_lines: bool = False) -> str:
    """`text` with control characters written as escapes (`\\x1b`); with `keep_lines`,
    newlines and tabs are kept."""
    return (_UNSAFE_KEEP_LINES if keep_lines else _UNSAFE).sub(_escape, text)
