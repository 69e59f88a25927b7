"""The fabric test's options from the site's gate policy, overridden where the caller says:
`trainctl health fabric` (its command-line options) and `trainctl gate node` (the site alone).
Without a site the defaults are the site model's own (`GateConfig()`), never typed again here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainctl.errors import UsageError
from trainctl.site import GateConfig, PartitionConfig

if TYPE_CHECKING:
    from trainctl.health.fabric.report import FabricReport

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class FabricPolicy:
    gate: GateConfig
    partition: PartitionConfig | None = None     # None: no site (no interface, no rails)


@dataclass(frozen=True)
class FabricOverrides:
    """What a command line sets; None (or the default) leaves the site's value."""

    sizes: str | None = None
    iters: int | None = None
    passes: int | None = None
    warmup: int = 2
    timeout_s: float | None = None
    join_timeout_s: float | None = None
    factor: float | None = None
    floor_gbps: float | None = None
    no_intra: bool = False
    local_procs: int = 0
    rails: tuple[str, ...] | None = None


def fabric_policy(site: str | None, partition: str | None) -> FabricPolicy:
    if site is None:
        return FabricPolicy(GateConfig())
    from trainctl.site import load_site, partition as pick_partition

    config = load_site(site).config
    _, part = pick_partition(config, partition)
    return FabricPolicy(config.gate, part)


def fabric_options(policy: FabricPolicy, given: FabricOverrides = FabricOverrides()):
    """(FabricOptions, straggler factor, busbw floor in GB/s or None)."""
    from trainctl.health.fabric.runner import FabricOptions

    gate, part = policy.gate, policy.partition
    timeout = given.timeout_s or gate.fabric_timeout_s
    options = FabricOptions(
        sizes=tuple(parse_size(s) for s in (given.sizes.split(",") if given.sizes else gate.fabric_sizes)),
        iters=given.iters or gate.fabric_iters,
        passes=given.passes or gate.fabric_passes,
        warmup=given.warmup,
        timeout_s=timeout,
        join_timeout_s=given.join_timeout_s or timeout / 4,
        op_timeout_s=timeout / 4,
        local_procs=given.local_procs,
        socket_ifname=part.socket_ifname if part else None,
        intra=not given.no_intra,
        rails=given.rails if given.rails is not None else (part.fabric_rails if part else ()),
    )
    floor = given.floor_gbps if given.floor_gbps is not None else gate.busbw_floor_gbps
    return options, given.factor or gate.straggler_factor, floor or None


def run_fabric(policy: FabricPolicy, given: FabricOverrides = FabricOverrides(), *,
               master_addr: str | None = None, port: int | None = None) -> FabricReport | None:
    """This rank's part of the fabric test; rank 0 returns the report."""
    import os
    import signal

    # The CLI turns SIGTERM/SIGHUP into a clean stop, but a Python handler waits while torch
    # blocks in native code: here they kill at once, as Slurm expects (no probe runs now).
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    options, factor, floor_gbps = fabric_options(policy, given)
    from trainctl.health.fabric.runner import identity_from_env, run_node

    identity = identity_from_env(os.environ, master_addr, port)
    return run_node(identity, options, straggler_factor=factor, floor_gbps=floor_gbps)


def parse_size(text: str) -> int:
    """nccl-tests style sizes: 1M = 1048576 bytes, 64K, 1G, or a plain byte count."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in SIZE_UNITS else ""
    number = text[: len(text) - len(unit)]
    if not number.isdigit() or int(number) == 0:
        raise UsageError(f"--sizes: {text!r} is not a size like 1M, 64M or 1048576")
    size = int(number) * SIZE_UNITS[unit]
    if size % 4:
        raise UsageError(f"--sizes: {text!r}: sizes are float32 buffers, so a multiple of 4 bytes")
    return size
