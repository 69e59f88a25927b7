"""The gate's policy: the site, loaded once per process, and everything the gate reads from it.

`load_gate_policy` is the one place `gate node`, `gate decide` and the job's supervisor read
the site; the policy then travels to the node checks, the compute test, the fabric test, the
decision, the drains and the deadlines. Without a site every value is the site model's default
(`GateConfig()`), never typed again elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainctl.health.fabric.options import FabricPolicy
from trainctl.job.gate import gate_deadline_s
from trainctl.job.gate_compute import ComputePolicy, compute_deadline_s
from trainctl.job.watch import WatchLimits
from trainctl.site import AlertsConfig, GateConfig, MetricsConfig, PartitionConfig, SiteConfig, WatchConfig

FINAL_MARGIN_S = 5.0


@dataclass(frozen=True)
class GatePolicy:
    site: str | None                 # as the job names it (--site): the report's first line, the drains' history
    partition_name: str | None       # as given (None: the site's default partition)
    config: SiteConfig | None        # None: no site
    partition: PartitionConfig | None
    gate: GateConfig
    compute: ComputePolicy
    watch: WatchConfig
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)

    @property
    def watch_limits(self) -> WatchLimits:
        w = self.watch
        return WatchLimits(w.slow_factor, w.slow_window_s, w.baseline_window_s, w.warmup_s, w.hang_floor_s,
                           w.hang_steps, w.agent_silence_s)

    def startup_s(self, nodes: int) -> float:
        """The start-up bound of a training step on `nodes` nodes (0: none)."""
        w = self.watch
        return w.startup_s + w.startup_per_node_s * nodes if w.startup_s > 0 else 0.0

    @property
    def fabric(self) -> FabricPolicy:
        return FabricPolicy(self.gate, self.partition)

    def deadline_s(self, nodes: int) -> float:
        """How long the whole gate may take on `nodes` nodes."""
        return gate_deadline_s(self.gate.probe_timeout_s, self.gate.fabric_timeout_s,
                               compute_deadline_s(self.compute, nodes))

    @property
    def final_grace_s(self) -> float:
        """How long after the fabric report a live node may take to re-read its error counters."""
        return self.gate.probe_timeout_s + FINAL_MARGIN_S


def load_gate_policy(site: str | None, partition: str | None) -> GatePolicy:
    if site is None:
        gate = GateConfig()
        return GatePolicy(None, partition, None, None, gate, ComputePolicy.from_gate(gate), WatchConfig())
    from trainctl.site import load_site, partition as pick_partition

    config = load_site(site).config
    _, part = pick_partition(config, partition)
    return GatePolicy(site, partition, config, part, config.gate, ComputePolicy.from_gate(config.gate), config.watch,
                      config.metrics, config.alerts)
