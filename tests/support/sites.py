"""A variant of a shipped site file for one test: the same file with some keys set otherwise.

TOML has no writer in the standard library, so the variant is the file's own text with the
named `key = value` lines replaced (values written as JSON, which TOML reads alike for strings,
numbers, booleans and lists of them). A key that is not in the file is an error, so a renamed
key cannot leave a test running on defaults it did not mean."""

from __future__ import annotations

import json
import re
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parents[2] / "site-configs"


def site_variant(directory: Path, base: str, changes: dict[str, object]) -> Path:
    """`directory/<base>-variant.toml`: `site-configs/<base>.toml` with `changes` ({"table.key": value})."""
    wanted = dict(changes)
    table = ""
    lines = []
    for line in (SITE_DIR / f"{base}.toml").read_text().splitlines():
        header = re.fullmatch(r"\[([^\]]+)\]\s*(#.*)?", line.strip())
        if header:
            table = header.group(1)
        key = re.match(r"([A-Za-z0-9_]+)\s*=", line)
        dotted = f"{table}.{key.group(1)}" if key and table else key.group(1) if key else None
        if dotted in wanted:
            line = f"{key.group(1)} = {json.dumps(wanted.pop(dotted))}   # changed for this test"
        lines.append(line)
    if wanted:
        raise KeyError(f"not in {base}.toml: {', '.join(sorted(wanted))}")
    path = directory / f"{base}-variant.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
