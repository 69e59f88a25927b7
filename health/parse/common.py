"""Conversions shared by the parsers: a bad number or JSON value is a ParseError."""

from __future__ import annotations

import json
import math
import re

from trainctl.errors import ParseError

# ASCII digits only: str.isdigit() accepts characters such as "²" that int() rejects.
_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")


def to_int(value: str, *, what: str, source: str, line: int | None = None) -> int:
    value = value.strip()
    if not _INT.fullmatch(value):
        raise ParseError(f"{what}: not an integer: {value!r}", source=source, line=line)
    return int(value)


def to_float(value: str, *, what: str, source: str, line: int | None = None) -> float:
    value = value.strip()
    if not _FLOAT.fullmatch(value):
        raise ParseError(f"{what}: not a number: {value!r}", source=source, line=line)
    return float(value)


def load_json(text: str, *, source: str) -> object:
    """JSON as the standard says it: no NaN or Infinity, and no number too large for a float
    (Python would read 1e400 as inf and later print invalid JSON with it)."""
    try:
        return json.loads(text, parse_constant=_not_json, parse_float=_finite_float)
    except ValueError as exc:
        raise ParseError(f"not JSON: {getattr(exc, 'msg', exc)}", source=source,
                         line=getattr(exc, "lineno", None)) from None
    except RecursionError:
        raise ParseError("JSON nested too deeply", source=source) from None


def _not_json(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def json_field(obj: object, key: str, kind: type | tuple[type, ...], *, where: str, source: str,
               required: bool = True):
    """`obj[key]` checked to be of `kind` (bool is never accepted as a number)."""
    if not isinstance(obj, dict):
        raise ParseError(f"{where}: expected an object", source=source)
    if key not in obj or obj[key] is None:
        if required:
            raise ParseError(f"{where}: missing {key!r}", source=source)
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ParseError(f"{where}: {key!r} has the wrong type ({type(value).__name__})",
                         source=source)
    return value
