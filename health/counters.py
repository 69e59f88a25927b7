"""Error counters judged by their growth between two readings (pure).

A count since boot says little: a port that took 20,000 discards during a fabric
outage last month is fine today. What matters is whether the counters grow now:
- in the gate, between the node checks (before) and the end of the fabric test (after);
- in sweeps, since the previous sweep of the same node (its `ib.counters` /
  `nvlink.counters` details in the history).

Both readings are the `details` of a counter check (`CounterReading.to_json()`: each
component with its non-zero counters), so the function below works on what the history
stores as well as on fresh snapshots. A counter a listed component does not show is zero.
A counter that went down was reset (reboot, driver reload, `perfquery -R`): it is not
judged. A `link_downed` that grew is a flap: the link went down and came back.
"""

from __future__ import annotations

from typing import Any

from trainctl.health.status import CheckResult, Status, summarize

# Check name -> the snapshot input its reading comes from.
COUNTER_CHECKS = {"ib.counters": "ib_counters", "nvlink.counters": "nvlink_errors"}

# Growth that fails the node; any other error counter that grows warns.
# IB: a downed link (flap) or a link-level recovery; NVLink: a link recovery (retraining).
_FAILING = {"link_downed": "link flapped (went down and came back)",
            "link_error_recovery": "link retrained",
            "Recovery Errors": "link recovered (retrained)",
            "Recovery Error": "link recovered (retrained)"}


def judge_growth(check: str, before: dict[str, Any], after: dict[str, Any], window: str) -> CheckResult:
    """The growth of every counter in `after` over `before` (both a reading's JSON form).

    `window` says what the two readings span ("during the fabric test", "since sweep #12"),
    for the reason text.
    """
    old = before.get("counters") or {}
    new = after.get("counters") or {}
    issues: list[tuple[Status, str]] = []
    growth: dict[str, dict[str, int]] = {}
    reset: list[str] = []
    for component, counts in sorted(new.items()):
        if not isinstance(old.get(component), dict) or not isinstance(counts, dict):
            continue        # a port or link the earlier reading did not have: nothing to compare
        grown = []
        for name in sorted(set(counts) | set(old[component])):
            value, previous = counts.get(name, 0), old[component].get(name, 0)
            if not isinstance(previous, int) or not isinstance(value, int):
                continue
            if value < previous:
                reset.append(f"{component} {name}")
                continue
            if value > previous:
                growth.setdefault(component, {})[name] = value - previous
                grown.append((name, value - previous))
        for name, delta in grown:
            if name in _FAILING:
                issues.append((Status.FAIL, f"{component} {name} +{delta} {window}: {_FAILING[name]}"))
        warned = [f"{name} +{delta}" for name, delta in grown if name not in _FAILING]
        if warned:
            issues.append((Status.WARN, f"{component} {', '.join(warned)} {window}"))
    details = {**after, "window": window, "growth": growth, "reset": reset}
    compared = sum(1 for component in new if component in old)
    ok = (f"no error counter grew {window} ({compared} link(s) compared)" if compared
          else f"no earlier reading to compare with {window}")
    return CheckResult(check, *summarize(issues, ok, details))
