"""Every check's name, known without importing the checks.

The commands that start work elsewhere (submit, site show, sweep) refuse a site that names a
check that does not exist: misspelt, it would fail inside the job, after the allocation. They
run on login nodes, where importing every check module and its parsers cost a third of
`submit --dry-run`'s time, so the names are listed here; `registry.check` refuses to register a
check that is not listed, and tests/test_import_graph.py checks that every name listed is
registered, so the list cannot drift from the checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from trainctl.errors import ConfigError

if TYPE_CHECKING:
    from trainctl.site import LoadedSite

CHECK_NAMES = frozenset({
    "dcgm.diag",
    "gpu.clock_events", "gpu.count", "gpu.ecc", "gpu.fabric", "gpu.model", "gpu.persistence", "gpu.processes",
    "gpu.reset", "gpu.row_remap", "gpu.smi", "gpu.visible", "gpu.xid",
    "host.cpus", "host.defunct", "host.disk", "host.load", "host.memory", "host.shm",
    "ib.counters", "ib.mtu", "ib.netdev", "ib.ports",
    "net.links", "net.mtu",
    "node.versions",
    "nvlink.counters", "nvlink.links", "nvlink.topology",
    "nvswitch.sxid",
    "pcie.links",
    "topo.affinity",
})
FAMILIES = frozenset(name.split(".")[0] for name in CHECK_NAMES)
SHOWN_NAME_CHARS = 60


def unknown_checks(names: Iterable[str]) -> list[str]:
    """The names that are neither a check, a family of checks, nor "all"."""
    return sorted(set(names) - CHECK_NAMES - FAMILIES - {"all"})


def check_site_check_names(loaded: LoadedSite) -> None:
    """gate.checks, sweep.checks and watch.checks name checks that exist. Checked by the commands
    that start work elsewhere (site show, submit, sweep), not at every load."""
    config = loaded.config
    for key, names in (("gate.checks", config.gate.checks), ("sweep.checks", config.sweep.checks),
                       ("watch.checks", config.watch.checks)):
        unknown = unknown_checks(names)
        if unknown:
            raise ConfigError(f"{loaded.path}: {key}: unknown check(s) "
                              f"{', '.join(repr(name[:SHOWN_NAME_CHARS]) for name in unknown[:5])}"
                              + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""),
                              hint="trainctl health list shows the checks and families")
