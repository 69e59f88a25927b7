"""Small, typed wrappers over Slurm's client commands (always with a timeout)."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Mapping

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

from trainctl.errors import ExternalCommandError, PrivilegeError, UsageError
from trainctl.proc import run, run_checked

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


def step_hosts(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The hosts of this Slurm step (else of the job) in Slurm's order; [] outside Slurm."""
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    return expand_hostlist(nodelist) if nodelist else []


def node_address(node: str, env: dict[str, str] | None = None) -> str:
    """The address Slurm reaches `node` at (NodeAddr), which need not resolve through DNS."""
    result = run_checked(["scontrol", "show", "node", "-o", node], timeout=SCONTROL_TIMEOUT_S, env=env)
    for record in parse_scontrol_oneliner(result.stdout):
        if record.get("NodeName") == node:
            return record.get("NodeAddr") or node
    return node


def job_port(environ: Mapping[str, str] = os.environ, offset: int = 0) -> int:
    """A TCP port in 20000-29999 derived from SLURM_JOB_ID, so concurrent jobs on a node differ.

    Each job id owns two ports: offset 0 is the training job's MASTER_PORT (`rank-exec`),
    offset 1 the health gate's fabric test, so the two never collide within one job.
    """
    job = int(environ.get("SLURM_JOB_ID", "0"))
    return 20000 + (job * 2 + offset) % 10000


# ---------------------------------------------------------------- node states, drain and resume

SINFO_FORMAT = "%N|%o|%T|%u|%H|%E"   # the reason last: it may contain anything, even '|'
NO_REASON = "none"                   # what sinfo prints for a node without a reason
# sinfo appends one of these to a state: not responding, powered off, maintenance ...
STATE_SUFFIXES = "*~#!%$@^-"
# Slurm stores node reasons in slurmdbd's event table as TINYTEXT: 255 bytes.
REASON_MAX_BYTES = 255


@dataclass(frozen=True)
class NodeState:
    """One node as sinfo shows it: its long state and the reason someone gave for it."""

    name: str
    address: str
    state: str                # "idle", "mixed", "allocated", "drained", "down" ... (suffix removed)
    flags: str                # sinfo's suffix characters, e.g. "*" (not responding)
    reason: str               # "" when none
    reason_user: str          # "" when none
    reason_time: str          # Slurm's timestamp of the reason, "" when none

    @property
    def idle(self) -> bool:
        """Free to run a sweep job now: idle and responding."""
        return self.state == "idle" and not self.flags

    @property
    def drained(self) -> bool:
        return self.state in ("drained", "draining")

    @property
    def label(self) -> str:
        return self.state + self.flags


def parse_sinfo_states(text: str) -> dict[str, NodeState]:
    """`sinfo -h -N -o SINFO_FORMAT` -> {node: NodeState}; a node in two partitions is listed once."""
    states: dict[str, NodeState] = {}
    for line in text.splitlines():
        fields = line.split("|", 5)
        if len(fields) != 6:
            continue
        name, address, state, user, when, reason = fields
        base = state.rstrip(STATE_SUFFIXES)
        has_reason = reason != NO_REASON
        states.setdefault(name, NodeState(
            name=name, address=address, state=base, flags=state[len(base):],
            reason=reason if has_reason else "", reason_user=user if has_reason else "",
            reason_time=when if has_reason else ""))
    return states


def node_states(*, partition: str | None = None, nodes: list[str] | None = None,
                env: dict[str, str] | None = None) -> dict[str, NodeState]:
    """State, address and reason of the nodes of `partition` and/or `nodes` (all nodes if neither)."""
    argv = ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]
    if partition:
        argv += ["-p", partition]
    if nodes:
        argv += ["-n", fold_hostlist(nodes)]
    return parse_sinfo_states(run_checked(argv, timeout=SCONTROL_TIMEOUT_S, env=env).stdout)


def fit_reason(text: str, limit: int = REASON_MAX_BYTES) -> str:
    """`text` on one line, cut to `limit` UTF-8 bytes (with an ellipsis when cut)."""
    line = " ".join(text.split())
    if len(line.encode()) <= limit:
        return line
    cut = line.encode()[:limit - len("...")].decode(errors="ignore")
    return cut.rstrip() + "..."


def drain_nodes(nodes: list[str], reason: str, env: dict[str, str] | None = None) -> None:
    # An argv element needs no quotes: quotes would become part of the stored reason.
    _update_nodes(nodes, ["State=DRAIN", f"Reason={reason}"], env)


def resume_nodes(nodes: list[str], env: dict[str, str] | None = None) -> None:
    _update_nodes(nodes, ["State=RESUME"], env)


def _update_nodes(nodes: list[str], settings: list[str], env: dict[str, str] | None) -> None:
    result = run(["scontrol", "update", f"NodeName={fold_hostlist(nodes)}", *settings],
                 timeout=SCONTROL_TIMEOUT_S, env=env)
    if result.ok:
        return
    if any(marker in result.stderr for marker in PERMISSION_MARKERS):
        raise PrivilegeError(f"scontrol update refused: {result.stderr.strip()}",
                             hint="needs Slurm operator rights")
    raise ExternalCommandError(result.describe_failure())


# What scontrol prints when the caller lacks the rights for an update.
PERMISSION_MARKERS = ("Invalid user id", "Access/permission denied", "Permission denied")


def parse_scontrol_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {key: value} (lines `Key = value`)."""
    config = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


def require_operator(env: dict[str, str] | None = None) -> None:
    """Raise PrivilegeError unless this user may drain and resume nodes.

    Root and SlurmUser always may; anyone else needs AdminLevel Operator or Administrator,
    which only exists where Slurm keeps accounting (slurmdbd).
    """
    if os.geteuid() == 0:
        return
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        user = str(os.geteuid())
    config = parse_scontrol_config(run_checked(["scontrol", "show", "config"],
                                               timeout=SCONTROL_TIMEOUT_S, env=env).stdout)
    slurm_user = config.get("SlurmUser", "").split("(")[0]
    if user == slurm_user:
        return
    level = "None"
    if config.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none":
        result = run(["sacctmgr", "-nP", "show", "user", user, "format=adminlevel"],
                     timeout=SCONTROL_TIMEOUT_S, env=env)
        level = (result.stdout.strip() or "None") if result.ok else "unknown (sacctmgr failed)"
    if level not in ("Operator", "Administrator"):
        raise PrivilegeError(f"user {user} may not drain or resume nodes: not root, not SlurmUser "
                             f"({slurm_user or '?'}), Slurm AdminLevel {level}",
                             hint="run as root or ask for Slurm operator rights")
