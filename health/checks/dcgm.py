"""NVIDIA DCGM's own diagnostic, where the site enables it and dcgmi is installed."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.dcgm import DcgmTest
from trainctl.health.parse.snapshot_files import SnapshotMeta
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize

DIAG_FILE = "dcgmi-diag.json"
_STATUS = {"pass": Status.OK, "fail": Status.FAIL, "warn": Status.WARN}


@check("dcgm.diag", "DCGM's diagnostic (dcgmi diag -r LEVEL) passes every test it ran; a skipped test is "
       "not a pass (site-enabled)", uses=("dcgm_diag", "meta"), hardware="gpu")
def dcgm_diag(tests: tuple[DcgmTest, ...] | None, meta: SnapshotMeta | None,
              expected: NodeExpectations) -> Finding:
    if expected.dcgm_diag_level is None:
        return Finding(Status.OK, "skipped: the site does not enable DCGM diagnostics", {"skipped": True})
    probe = meta.probes.get(DIAG_FILE) if meta else None
    if tests is None:
        if probe is not None and probe.missing:
            return Finding(Status.OK, "skipped: dcgmi is not installed on this node", {"skipped": True})
        why = probe.error if probe is not None and probe.error else "no output"
        return Finding(Status.UNKNOWN, f"dcgmi diag -r {expected.dcgm_diag_level}: not collected ({why})", {})
    issues, rows = [], []
    for test in tests:
        statuses = sorted(set(test.statuses))
        worst = max((_STATUS.get(s.lower(), Status.WARN) for s in statuses), default=Status.WARN)
        rows.append({"category": test.category, "test": test.name, "statuses": list(test.statuses)})
        if worst != Status.OK or not test.statuses:
            said = "/".join(statuses) or "no result"
            unjudged = [s for s in statuses if s.lower() not in _STATUS]
            note = " (did not run: not a pass)" if unjudged else ""
            extra = f": {test.messages[0]}" if test.messages else ""
            issues.append((worst, f"{test.category} / {test.name}: {said}{note}{extra}"))
    passed = sum(1 for r in rows if all(s.lower() == "pass" for s in r["statuses"]) and r["statuses"])
    if not passed:
        issues.append((Status.UNKNOWN, "no DCGM test passed"))
    return summarize(issues, f"DCGM diag -r {expected.dcgm_diag_level}: all {len(rows)} tests passed",
                     {"level": expected.dcgm_diag_level, "tests": rows})
