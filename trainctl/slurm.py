"""Small, typed wrappers over Slurm's client commands (always with a timeout)."""

from __future__ import annotations

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

from trainctl.errors import UsageError
from trainctl.proc import run_checked

SCONTROL_TIMEOUT_S = 15.0


def expand_hostlist(hostlist: str) -> list[str]:
    """`node[1-3,5]` -> ['node1', 'node2', 'node3', 'node5'] (Slurm order: sorted)."""
    try:
        return list(NodeSet(hostlist, resolver=RESOLVER_NOGROUP))
    except NodeSetParseError as exc:
        raise UsageError(f"bad hostlist {hostlist!r}: {exc}") from exc


def fold_hostlist(hosts: list[str]) -> str:
    """['node1', 'node2', 'node4'] -> 'node[1-2,4]'."""
    return str(NodeSet.fromlist(hosts, resolver=RESOLVER_NOGROUP))


def parse_scontrol_oneliner(text: str) -> list[dict[str, str]]:
    """`scontrol show node -o` records: one line each, space-separated Key=Value pairs."""
    records = []
    for line in text.splitlines():
        record = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                record[key] = value
        if record:
            records.append(record)
    return records


def node_address(node: str, env: dict[str, str] | None = None) -> str:
    """The address Slurm reaches `node` at (NodeAddr), which need not resolve through DNS."""
    result = run_checked(["scontrol", "show", "node", "-o", node], timeout=SCONTROL_TIMEOUT_S, env=env)
    for record in parse_scontrol_oneliner(result.stdout):
        if record.get("NodeName") == node:
            return record.get("NodeAddr") or node
    return node

