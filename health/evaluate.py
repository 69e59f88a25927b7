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
    if spec.hardware == "ib" and inputs.lacks_infiniband and not inputs.timed_out(spec.files):
        return _no_infiniband(spec, expectations)
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


def _no_infiniband(spec: CheckSpec, expectations: NodeExpectations) -> CheckResult:
    """The kernel shows no InfiniBand/RoCE device. That is a fact, not a failure to tell, so it is
    never UNKNOWN (the Nagios plugin guidelines keep UNKNOWN for a check that could not run;
    https://nagios-plugins.org/doc/guidelines.html). As in NHC, where `check_hw_ib` runs only on
    the nodes nhc.conf names, the site's declaration decides: HCA ports declared and no device
    means the driver did not load (fail); none declared means there is nothing to check."""
    if expectations.ib_ports:
        return CheckResult(spec.name, Status.FAIL,
                           "no InfiniBand device on this node (/sys/class/infiniband is missing or "
                           f"empty: the driver did not load), the site expects {', '.join(expectations.ib_ports)}")
    return CheckResult(spec.name, Status.OK, "skipped: no InfiniBand device on this node", {"skipped": True})
