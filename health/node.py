"""One node's health, end to end: site policy -> collect -> load -> evaluate.

Shared by `trainctl health check`, the job gate and sweeps, so a node is judged the same
way wherever it is judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainctl.health.collect import DEFAULT_PROBE_TIMEOUT_S, collect_snapshot
from trainctl.health.evaluate import evaluate
from trainctl.health.expectations import NodeExpectations, from_site
from trainctl.health.snapshot import load_snapshot
from trainctl.health.status import NodeReport


@dataclass(frozen=True)
class NodePolicy:
    expectations: NodeExpectations
    only: tuple[str, ...] | None     # check names or families; None: every registered check
    probe_binaries: dict[str, str]
    probe_timeout_s: float


def policy_for(site: str | None, partition: str | None, only: tuple[str, ...] | None) -> NodePolicy:
    """The site's expectations and checks; --only overrides the site's list."""
    if site is None:
        return NodePolicy(NodeExpectations(), only, {}, DEFAULT_PROBE_TIMEOUT_S)
    from trainctl.launcher.site import load_site, partition as pick_partition

    config = load_site(site).config
    _, part = pick_partition(config, partition)
    site_checks = None if "all" in config.gate.checks else tuple(config.gate.checks)
    return NodePolicy(from_site(part, config.gate), only or site_checks, dict(config.probes),
                      config.gate.probe_timeout_s)


def check_node(snapshot_dir: str | Path, policy: NodePolicy, collect: bool) -> NodeReport:
    if collect:
        collect_snapshot(snapshot_dir, binaries=policy.probe_binaries, timeout_s=policy.probe_timeout_s)
    return evaluate(load_snapshot(snapshot_dir), policy.expectations, policy.only)
