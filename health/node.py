"""One node's health, end to end: site policy -> collect -> load -> evaluate.

Shared by `trainctl health check`, the job gate and sweeps, so a node is judged the same
way wherever it is judged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trainctl.health.collect import collect_counters, collect_snapshot
from trainctl.health.counters import COUNTER_CHECKS, judge_growth
from trainctl.health.evaluate import evaluate
from trainctl.health.expectations import NodeExpectations, from_site
from trainctl.health.snapshot import load_snapshot
from trainctl.health.status import NodeReport, Status


@dataclass(frozen=True)
class NodePolicy:
    expectations: NodeExpectations
    only: tuple[str, ...] | None     # check names or families; None: every registered check
    probe_binaries: dict[str, str]
    probe_timeout_s: float


def policy_for(site: str | None, partition: str | None, only: tuple[str, ...] | None,
               in_gate: bool = False) -> NodePolicy:
    """The site's expectations and checks; --only overrides the site's list.

    `in_gate`: the node is about to run a job, so a process already on a GPU fails it.
    """
    if site is None:
        return node_policy(None, None, only, in_gate)
    from trainctl.site import load_site, partition as pick_partition

    config = load_site(site).config
    _, part = pick_partition(config, partition)
    return node_policy(config, part, only, in_gate)


def node_policy(config, part, only: tuple[str, ...] | None, in_gate: bool = False) -> NodePolicy:
    """The policy from a site already loaded (`config` None: no site), for callers that load it once.

    Without a site the gate's values are the site model's defaults (`GateConfig()`)."""
    from trainctl.site import GateConfig

    gate = config.gate if config is not None else GateConfig()
    site_checks = None if "all" in gate.checks else tuple(gate.checks)
    expectations = dataclasses.replace(from_site(part if config is not None else None, gate),
                                       gpu_processes_fail=in_gate)
    probes = dict(config.probes) if config is not None else {}
    return NodePolicy(expectations, only or site_checks, probes, gate.probe_timeout_s)


def check_node(snapshot_dir: str | Path, policy: NodePolicy, collect: bool) -> NodeReport:
    if collect:
        # the site's free-space paths are measured too, so host.disk can judge them
        disks = tuple(dict.fromkeys(("/", "/tmp", *policy.expectations.min_free_disk_gib)))
        collect_snapshot(snapshot_dir, binaries=policy.probe_binaries, timeout_s=policy.probe_timeout_s,
                         disk_paths=disks, dcgm_diag_level=policy.expectations.dcgm_diag_level)
    return evaluate(load_snapshot(snapshot_dir), policy.expectations, policy.only)


def counter_growth(report: NodeReport, after_dir: str | Path, policy: NodePolicy,
                   window: str = "during the fabric test", sysfs_root: str | Path = "/") -> NodeReport:
    """`report` with its counter checks judged by growth: the counters are read again now
    (into `after_dir`) and compared with the reading the report holds (the gate's hook,
    called after its fabric test). Checks that did not read counters the first time stay."""
    wanted = [c for c in report.checks if c.name in COUNTER_CHECKS and c.status == Status.OK
              and "counters" in c.details]
    if not wanted:
        return report
    collect_counters(after_dir, binaries=policy.probe_binaries, timeout_s=policy.probe_timeout_s,
                     sysfs_root=sysfs_root)
    after = {c.name: c for c in evaluate(load_snapshot(after_dir), policy.expectations,
                                         tuple(c.name for c in wanted)).checks}
    judged = {}
    for before in wanted:
        second = after[before.name]
        judged[before.name] = (judge_growth(before.name, before.details, second.details, window)
                               if second.status == Status.OK and "counters" in second.details else
                               dataclasses.replace(second, reason=f"second reading: {second.reason}"))
    return NodeReport(report.host, tuple(judged.get(c.name, c) for c in report.checks))
