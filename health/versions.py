"""The odd node out: a node whose versions differ from its peers' majority (pure).

Mixed drivers, CUDA, VBIOS, HCA firmware, OFED, kernel, torch or NCCL versions cause hangs
and slowdowns no health counter shows. Google's cluster-health-scanner and Azure's checks
compare each node with a golden configuration; trainctl compares it with the job's own
nodes (gate) or the partition's (sweeps), and with the versions the site pins
(`[gate] pinned_versions`, judged on each node by `node.versions`).

Input: each node's versions, as the `node.versions` check records them in its details.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

VERSIONS_CHECK = "node.versions"


@dataclass(frozen=True)
class OddVersion:
    host: str
    name: str           # "driver", "hca_firmware MT4129", ...
    value: str
    majority: str       # the value most nodes have
    majority_count: int
    reporting: int      # nodes that report this version at all

    def describe(self) -> str:
        return (f"{self.name} {self.value}, while {self.majority_count} of {self.reporting} nodes have "
                f"{self.majority}")


def odd_nodes_out(versions: dict[str, dict[str, str]]) -> list[OddVersion]:
    """Every (node, version) that differs from a strict majority of the nodes reporting it.

    With no strict majority (two nodes that differ, a 2-2 split) nobody is named here: which
    side is odd is not known, and `node.versions` on each node still shows its values.
    """
    odd = []
    names = sorted({name for table in versions.values() for name in table})
    for name in names:
        values = {host: table[name] for host, table in versions.items() if table.get(name)}
        if len(values) < 3:
            continue
        (majority, count), = Counter(values.values()).most_common(1)
        if count * 2 <= len(values):
            continue
        odd += [OddVersion(host, name, value, majority, count, len(values))
                for host, value in sorted(values.items()) if value != majority]
    return odd


def versions_from_reports(reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """host -> versions, from `health check --json` reports (the gate's node files)."""
    found = {}
    for host, report in reports.items():
        for item in report.get("checks") or []:
            if isinstance(item, dict) and item.get("name") == VERSIONS_CHECK:
                table = (item.get("details") or {}).get("versions")
                if isinstance(table, dict):
                    found[host] = {k: v for k, v in table.items() if isinstance(v, str)}
    return found
