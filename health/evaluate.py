"""The node verdict: run the selected checks over one snapshot."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from trainctl.health.expectations import NodeExpectations
from trainctl.health.registry import CheckSpec, select_checks
from trainctl.health.snapshot import Snapshot, SnapshotInputs, Unavailable
from trainctl.health.status import CheckResult, NodeReport, Status


def evaluate(snapshot: Snapshot, expectations: NodeExpectations = NodeExpectations(),
             only: Iterable[str] | None = None) -> NodeReport:
    inputs = SnapshotInputs(snapshot)
    meta = inputs.get("meta")
    host = meta.host if not isinstance(meta, Unavailable) and meta.host else Path(snapshot.path).name
    return NodeReport(host=host, checks=tuple(_run(spec, inputs, expectations)
                                              for spec in select_checks(only)))


def _run(spec: CheckSpec, inputs: SnapshotInputs, expectations: NodeExpectations) -> CheckResult:
    if spec.hardware and expectations.lacks(spec.hardware):
        return CheckResult(spec.name, Status.OK,
                           f"skipped: the site expects no {spec.hardware} on this node",
                           {"skipped": True})
    args, unreadable = [], {}
    for name in spec.needs + spec.uses:
        value = inputs.get(name)
        if isinstance(value, Unavailable):
            if name in spec.needs:
                return CheckResult(spec.name, Status.UNKNOWN, value.reason)
            if value.unreadable:
                # An optional input only adds detail (a GPU's index to an Xid's PCI address):
                # what the check's own inputs show is judged without it, and not hidden.
                unreadable[name] = value.reason
            value = None
        args.append(value)
    result = spec.func(*args, expectations)
    if unreadable:
        result = dataclasses.replace(result, details={**result.details, "unreadable_inputs": unreadable})
    return result
