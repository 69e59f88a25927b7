"""Every fixture is parsed, and damaged fixtures fail only with ParseError."""

from __future__ import annotations

import pytest
from health_fixtures import CASES, LOCAL, NOT_PARSED, RELEVANT_DIRS, SHARED, read
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainctl.errors import ParseError


def test_every_fixture_in_the_relevant_folders_has_a_parser_or_a_reason():
    on_disk = {path.relative_to(SHARED).as_posix() for folder in RELEVANT_DIRS
               for path in (SHARED / folder).iterdir() if path.is_file()}
    shared_cases = {name for name in CASES if not name.startswith(("local/", "recorded/"))}
    assert on_disk - shared_cases - set(NOT_PARSED) == set(), "new fixture files without a parser test"
    assert (shared_cases | set(NOT_PARSED)) - on_disk == set(), "listed fixtures that do not exist"
    local = {f"local/{path.name}" for path in LOCAL.iterdir() if path.name != "README.md"}
    assert local == {name for name in CASES if name.startswith("local/")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_fixture_parses(name):
    case = CASES[name]
    assert case.parse(case.extract(read(name))) is not None


# Fragments that real outputs are made of: separators, numbers, N/A, escapes, XML and JSON.
FRAGMENTS = ["\n", "\t", " ", ":", ": ", ",", "-", "0", "9", "99999999999999999999", "N/A", "X",
             "GPU0", "NV18", "<", ">", "</gpu>", "&", "\"", "{", "]", "\x1b[4m", "Xid", "²", "é",
             "Link 0: ", "Port 1:", "CA '", "Lines: 2", "GB/s", "<inactive>", "Yes", "Active"]


@st.composite
def damaged(draw, text: str) -> str:
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        operation = draw(st.sampled_from(["truncate", "replace", "insert", "drop_line"]))
        if operation == "truncate":
            text = text[:at]
        elif operation == "replace":
            end = draw(st.integers(at, min(len(text), at + 16)))
            text = text[:at] + draw(st.text(max_size=8)) + text[end:]
        elif operation == "insert":
            text = text[:at] + draw(st.sampled_from(FRAGMENTS)) + text[at:]
        else:
            lines = text.splitlines(keepends=True)
            if lines:
                del lines[draw(st.integers(0, len(lines) - 1))]
            text = "".join(lines)
    return text


@st.composite
def damaged_tree(draw, files: dict) -> dict:
    """A sysfs mapping with some of the files the parser reads damaged or missing."""
    read_by_parser = sorted(p for p in files if "/infiniband/" in p or "/net/" in p or "/devices/" in p
                            or "/topology/" in p)
    files = dict(files)
    for path in draw(st.lists(st.sampled_from(read_by_parser), min_size=1, max_size=4, unique=True)):
        if draw(st.booleans()):
            del files[path]
        else:
            files[path] = draw(damaged(files[path]))
    return files


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_fixture_raises_only_parse_error(name, data):
    case = CASES[name]
    original = case.extract(read(name))
    damaged_input = data.draw(damaged_tree(original) if isinstance(original, dict) else damaged(original))
    try:
        case.parse(damaged_input)
    except ParseError as error:
        assert error.source and str(error)
