"""`dcgmi diag -r LEVEL -j`: DCGM's diagnostic, one result per test.

    {"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [
            {"name": "Persistence Mode", "results": [{"status": "Fail", ...}, ...]}, ...]}, ...]}}

A test has one result per GPU it ran on (or one for the whole node); each status is
"Pass", "Fail", "Warn", "Skip" or "Not Run" (the samples here are gcm's test fixtures,
trimmed to name and status). Statuses are kept as printed; the check decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import json_field, load_json

SOURCE = "dcgmi diag -j"


@dataclass(frozen=True)
class DcgmTest:
    category: str
    name: str
    statuses: tuple[str, ...]     # one per result, as printed
    messages: tuple[str, ...] = ()


def parse_dcgm_diag(text: str, *, source: str = SOURCE) -> tuple[DcgmTest, ...]:
    doc = load_json(text, source=source)
    diag = json_field(doc, "DCGM GPU Diagnostic", dict, where="top level", source=source)
    categories = json_field(diag, "test_categories", list, where="DCGM GPU Diagnostic", source=source)
    tests = []
    for i, category in enumerate(categories):
        name = json_field(category, "category", str, where=f"category #{i}", source=source)
        for j, test in enumerate(json_field(category, "tests", list, where=name, source=source)):
            where = f"{name} test #{j}"
            results = json_field(test, "results", list, where=where, source=source)
            statuses = tuple(json_field(r, "status", str, where=where, source=source) for r in results)
            messages = []
            for result in results:
                warnings = json_field(result, "warnings", list, where=where, source=source,
                                      required=False) or []
                messages += [w["warning"] for w in warnings
                             if isinstance(w, dict) and isinstance(w.get("warning"), str)]
            tests.append(DcgmTest(name, json_field(test, "name", str, where=where, source=source),
                                  statuses, tuple(messages)))
    if not tests:
        raise ParseError("no tests in the diagnostic", source=source)
    return tuple(tests)
