"""Small, typed wrappers over Slurm's client commands (always with a timeout)."""

from __future__ import annotations

import os
import pwd
import re
import socket
from dataclasses import dataclass
from typing import Mapping

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetBase, NodeSetParseError
from ClusterShell.RangeSet import RangeSet

from trainctl.errors import ExternalCommandError, ParseError, PrivilegeError, UsageError
from trainctl.proc import run, run_checked
from trainctl.text import printable
from trainctl.validate import MAX_NODES, check_job_id, check_node_name

SCONTROL_TIMEOUT_S = 15.0


# Counted before anything is expanded: ClusterShell builds every number of a range in memory
# (n[1-100000000] took 3.6 GB). The limit and its source: trainctl.validate.MAX_NODES.
HOSTLIST_MAX_NODES = MAX_NODES
HOSTLIST_SHOWN_CHARS = 80     # of a refused hostlist, in the error line


def expand_hostlist(hostlist: str, *, source: str | None = None) -> list[str]:
    """`node[1-3,5]` -> ['node1', 'node2', 'node3', 'node5'] (Slurm order: sorted).

    `source` names where the hostlist came from (an option, an environment variable) in errors.
    """
    where = f" in {source}" if source else ""
    count = count_hostlist(hostlist)
    if count > HOSTLIST_MAX_NODES:
        raise UsageError(f"hostlist{where} {_shown(hostlist)} names {_count_text(count)} nodes, more than the "
                         f"{HOSTLIST_MAX_NODES} a hostlist may hold (Slurm's host range limit)")
    try:
        return list(NodeSet(hostlist, resolver=RESOLVER_NOGROUP))
    except (NodeSetParseError, ValueError, AssertionError, OverflowError) as exc:  # ClusterShell asserts on some
        raise UsageError(f"bad hostlist{where} {_shown(hostlist)}: {exc or type(exc).__name__}") from exc


def count_hostlist(hostlist: str) -> int:
    """How many names `hostlist` can expand to at most, read from its brackets alone.

    Each operand (split at the top-level `,` and ClusterShell's `!&^` operators) counts the
    product of its bracket groups' sizes; a group counts the sum of its ranges (`1-8/2` as 8).
    An upper bound: names repeated across ranges are counted each time. Text that is not a
    well-formed range counts as one name and is left to the parser to refuse.
    """
    total, depth, start = 0, 0, 0
    for index, char in enumerate(hostlist + ","):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif depth == 0 and char in ",!&^":
            total += _count_operand(hostlist[start:index])
            start = index + 1
    return total


def _count_operand(pattern: str) -> int:
    count = 1
    for group in _BRACKETS.findall(pattern):
        size = 0
        for item in group.split(","):
            bounds = _RANGE.fullmatch(item.strip())
            size += abs(int(bounds[2]) - int(bounds[1])) + 1 if bounds and bounds[2] else 1
        count *= max(size, 1)
    return count


_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?(?:/\d+)?")


def _count_text(count: int) -> str:
    return f"{count:,}" if count < 10**15 else f"about 10^{len(str(count)) - 1}"


def _shown(hostlist: str) -> str:
    return repr(hostlist if len(hostlist) <= HOSTLIST_SHOWN_CHARS else hostlist[:HOSTLIST_SHOWN_CHARS] + "...")


def fold_hostlist(hosts: list[str]) -> str:
    """['node1', 'node2', 'node4'] -> 'node[1-2,4]'."""
    by_prefix: dict[str, list[str]] = {}
    for host in hosts:
        match = _PREFIX_NUMBER.fullmatch(host)
        if match is None:  # several numbers, brackets, no number: ClusterShell parses each name
            return str(NodeSet.fromlist(hosts, resolver=RESOLVER_NOGROUP))
        by_prefix.setdefault(match.group(1), []).append(match.group(2))
    # Names of the common shape (letters, one trailing number): one RangeSet of the numbers per
    # prefix, the same hostlist as NodeSet.fromlist (padding kept) in a fraction of its time,
    # which parses every name as a pattern (seconds for 40,000 scattered nodes).
    nodes = NodeSet(resolver=RESOLVER_NOGROUP)
    for prefix, numbers in by_prefix.items():
        rangeset = RangeSet()
        rangeset.updaten(numbers)
        nodes.update(NodeSetBase(f"{prefix}%s", rangeset))
    return str(nodes)


_PREFIX_NUMBER = re.compile(r"([A-Za-z_.-]*)(\d+)")


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
    name = "SLURM_STEP_NODELIST" if environ.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = environ.get(name)
    return expand_hostlist(nodelist, source=name) if nodelist else []


def this_node_name(environ: Mapping[str, str] = os.environ, hostname: str | None = None) -> str:
    """This node's name as Slurm knows it (its NodeName), which need not be its host name.

    slurm.conf(5): NodeName is "typically" `hostname -s`, but may be the FQDN or "an arbitrary
    string if NodeHostname is specified"; NodeHostname defaults to NodeName and NodeAddr to
    NodeHostname. Job node lists (SLURM_JOB_NODELIST) and every scontrol/sinfo command use
    NodeName, so that is the name trainctl files a node under. In order:

    1. SLURMD_NODENAME, which Slurm sets in every task: "Name of the node running the task"
       (srun(1); sbatch(1) for the batch script).
    2. Inside a job whose environment lost it (a wrapper or container that filters the
       environment): the job's node list, expanded as `scontrol show hostnames` does, that
       holds the host name or its short form; else the node of that list whose NodeHostname
       (`scontrol show node`) is the host name or its short form.
    3. Otherwise (no Slurm job, or nothing matched): the host name.

    The name becomes a file name (the gate's DIR/nodes/NAME.json, the slurm-hook's state), so a
    name that cannot be a node name (`../../x`) is a UsageError, whatever it came from.

    Quotes from the Slurm 22.05.8 man pages (https://slurm.schedmd.com/slurm.conf.html#OPT_NodeName,
    https://slurm.schedmd.com/srun.html#OPT_SLURMD_NODENAME). The node list is expanded with
    ClusterShell (expand_hostlist), which reads Slurm hostlists as `scontrol show hostnames` does,
    without a process per call.
    """
    name = environ.get("SLURMD_NODENAME")
    if name:
        return check_node_name(name, "SLURMD_NODENAME")
    hostname = hostname or socket.gethostname()
    name = "SLURM_JOB_NODELIST" if environ.get("SLURM_JOB_NODELIST") else "SLURM_STEP_NODELIST"
    nodelist = environ.get(name)
    if not nodelist:
        return check_node_name(hostname, "the host name")
    nodes = expand_hostlist(nodelist, source=name)
    names = (hostname, hostname.split(".")[0])
    for candidate in names:
        if candidate in nodes:
            return check_node_name(candidate, "the job's node list entry")
    result = run(["scontrol", "show", "node", "-o", nodelist], timeout=SCONTROL_TIMEOUT_S)
    records = parse_scontrol_oneliner(result.stdout) if result.ok else []
    found = node_for_hostname(records, names)
    return check_node_name(found, "scontrol's NodeName") if found else check_node_name(hostname, "the host name")


def node_for_hostname(records: list[dict[str, str]], hostnames: tuple[str, ...]) -> str | None:
    """The NodeName of the `scontrol show node -o` record whose NodeHostName is one of `hostnames`."""
    for record in records:
        if record.get("NodeHostName") in hostnames and record.get("NodeName"):
            return record["NodeName"]
    return None


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
    text = check_job_id(environ.get("SLURM_JOB_ID", "0").strip(), "SLURM_JOB_ID")
    # Inside a job SLURM_JOB_ID is the job's own number (an array task and a het component have their
    # own); the `_` and `+` forms are for people.
    return 20000 + (int(re.split(r"[_+]", text)[0]) * 2 + offset) % 10000


# ---------------------------------------------------------------- node states, drain and resume

SINFO_FORMAT = "%N|%o|%T|%u|%H|%E"   # the reason last: it may contain anything, even '|'
NO_REASON = "none"                   # what sinfo prints for a node without a reason
# sinfo appends one of these to a state: not responding, powered off, maintenance ...
STATE_SUFFIXES = "*~#!%$@^-"
# Slurm stores node reasons in slurmdbd's event table as TINYTEXT: 255 bytes.
REASON_MAX_BYTES = 255
DRAIN_TAG = "trainctl:"    # every reason trainctl sets starts with this
# Node states in which a node is in service again. Slurm clears a node's reason when it returns to
# service in clusteracct_storage_g_node_up() (src/interfaces/accounting_storage.c), but from 23.11
# ("Remove 'none' plugins", RELEASE_NOTES) to at least 25.11 that function returns before clearing
# it when no accounting storage plugin is configured (no slurmdbd): a resumed node keeps its old
# reason while idle (seen on the dev cluster, Slurm 24.11.5; fixed upstream after 25.11 by SchedMD
# commit ac3305964d "Resuming nodes clears reason without database"). trainctl only ever sets its
# reason together with a drain, so its reason on a node in service is such a leftover, not a claim.
IN_SERVICE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})


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
        leftover = base in IN_SERVICE_STATES and reason.startswith(DRAIN_TAG)
        has_reason = reason != NO_REASON and not leftover
        states.setdefault(name, NodeState(
            name=name, address=address, state=base, flags=state[len(base):],
            reason=reason if has_reason else "", reason_user=user if has_reason else "",
            reason_time=when if has_reason else ""))
    return states


def node_states(*, partition: str | None = None, nodes: list[str] | None = None,
                env: dict[str, str] | None = None,
                timeout: float = SCONTROL_TIMEOUT_S) -> dict[str, NodeState]:
    """State, address and reason of the nodes of `partition` and/or `nodes` (all nodes if neither)."""
    argv = ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]
    if partition:
        argv += ["-p", partition]
    if nodes:
        argv += ["-n", fold_hostlist(nodes)]
    return parse_sinfo_states(run_checked(argv, timeout=timeout, env=env).stdout)


PARTITION_FORMAT = "%N|%R"   # node, partition name (sinfo's %P marks the default partition with '*')


def parse_sinfo_partitions(text: str) -> dict[str, frozenset[str]]:
    """`sinfo -h -N -o PARTITION_FORMAT` -> {partition: its nodes}; a node in two partitions is in both."""
    partitions: dict[str, set[str]] = {}
    for line in text.splitlines():
        node, sep, partition = line.strip().partition("|")
        if sep and node and partition:
            partitions.setdefault(partition, set()).add(node)
    return {name: frozenset(nodes) for name, nodes in partitions.items()}


def partition_nodes(env: dict[str, str] | None = None, timeout: float = SCONTROL_TIMEOUT_S) -> dict[str, frozenset[str]]:
    """Every partition and its nodes, as Slurm has them now."""
    return parse_sinfo_partitions(run_checked(["sinfo", "-h", "-N", "-o", PARTITION_FORMAT], timeout=timeout,
                                              env=env).stdout)


def fit_reason(text: str, limit: int = REASON_MAX_BYTES) -> str:
    """`text` on one line, control characters escaped (a check's output or a job id may carry ESC or
    BEL, and sinfo prints the reason raw), cut to `limit` UTF-8 bytes (with an ellipsis when cut)."""
    line = printable(" ".join(text.split()))
    if len(line.encode()) <= limit:
        return line
    cut = line.encode()[:limit - len("...")].decode(errors="ignore")
    return cut.rstrip() + "..."


def tagged_reason(failures: list[tuple[str, str]], context: str = "") -> tuple[str, str]:
    """[(check, reason), ...] -> (first check, `trainctl: <check>: <reason> [+other checks] (context)`).

    The one reason format every trainctl drain uses (sweeps, the gate, the Slurm hook), cut
    to Slurm's 255 bytes: the reason is shortened, never the tag, the list of other checks or
    the context (the gate names its job there).
    """
    failures = sorted(failures)
    (check, reason), others = failures[0], [name for name, _ in failures[1:]]
    head = f"{DRAIN_TAG} {check}: "
    tail = (f" [+{', '.join(others)}]" if others else "") + (f" ({context})" if context else "")
    budget = max(16, REASON_MAX_BYTES - len(head.encode()) - len(tail.encode()))
    return check, fit_reason(head + fit_reason(reason, budget) + tail)


def not_drainable(state: NodeState | None) -> str:
    """Why trainctl leaves a node alone ("" if it may drain it): unknown to Slurm, or someone's reason on it."""
    if state is None:
        return "not known to Slurm"
    if state.reason:
        return f"has a reason trainctl did not set ({state.reason_user or 'someone'}: {state.reason!r})"
    return ""


def drain_unclaimed(node: str, reason: str, env: dict[str, str] | None = None,
                    timeout: float = SCONTROL_TIMEOUT_S) -> tuple[NodeState | None, str]:
    """Drain `node` with `reason` only if it has no reason from anyone; look right before.

    Returns (the node's state read back after draining, "") or (None, why it was left alone).
    The state read back carries Slurm's timestamp for the reason, which tells this drain
    from a later one with the same text (`not_ours_any_more`).
    """
    state = node_states(nodes=[node], env=env, timeout=timeout).get(node)
    why = not_drainable(state)
    if why:
        return None, why
    drain_nodes([node], reason, env, timeout=timeout)
    after = node_states(nodes=[node], env=env, timeout=timeout).get(node)
    return after or state, ""


def not_ours_any_more(state: NodeState | None, reason: str, reason_time: str) -> str:
    """Why a drain trainctl set (`reason` at Slurm time `reason_time`) is no longer its own; "" if it is."""
    if state is None:
        return "no longer known to Slurm"
    if not state.drained:
        return f"no longer drained (now {state.label}): resumed outside trainctl"
    if state.reason != reason:
        return f"reason changed by {state.reason_user or 'someone'} to {state.reason!r}: no longer trainctl's"
    if reason_time and state.reason_time != reason_time:
        return (f"drained again by {state.reason_user or 'someone'} at {state.reason_time} "
                "(same text, new drain): no longer trainctl's")
    return ""


def drain_nodes(nodes: list[str], reason: str, env: dict[str, str] | None = None,
                timeout: float = SCONTROL_TIMEOUT_S) -> None:
    # An argv element needs no quotes: quotes would become part of the stored reason.
    _update_nodes(nodes, ["State=DRAIN", f"Reason={reason}"], env, timeout)


def resume_nodes(nodes: list[str], env: dict[str, str] | None = None,
                 timeout: float = SCONTROL_TIMEOUT_S) -> None:
    _update_nodes(nodes, ["State=RESUME"], env, timeout)


def _update_nodes(nodes: list[str], settings: list[str], env: dict[str, str] | None, timeout: float) -> None:
    result = run(["scontrol", "update", f"NodeName={fold_hostlist(nodes)}", *settings],
                 timeout=timeout, env=env)
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


def config_binds_tasks(config: dict[str, str]) -> bool:
    """Whether srun can bind tasks to CPUs here, from `scontrol show config`: only a task plugin
    does (slurm.conf(5) TaskPlugin: task/affinity and task/cgroup enable --cpu-bind). Without one,
    TaskPlugin reads `task/none` (Slurm 22.05) or `(null)` (23.11 on: read_config.c drops a "none"),
    and 22.05's srun answers any --cpu-bind with "cluster configuration lacks support for cpu
    binding" (_have_task_affinity, src/common/slurm_resource_info.c). True when it cannot tell."""
    plugins = config.get("TaskPlugin")
    if plugins is None:
        return True
    names = (name.strip().removeprefix("task/") for name in plugins.split(","))
    return any(name not in ("", "none", "(null)") for name in names)


# `scontrol --version` (and every client's, and `slurmd -V`) prints PACKAGE_NAME and SLURM_VERSION_STRING
# (print_slurm_version, src/common/proc_args.c): "slurm 25.11.0" from SchedMD's build, "slurm-wlm 24.11.5"
# from Debian's, "-0rc1" appended to a release candidate and "26.05 (unstable svn build ...)" on
# an unreleased branch (auxdir/slurm.m4).
SLURM_VERSION_RE = re.compile(r"(slurm[\w-]*) (\d+)\.(\d+)(?:\.(\d+))?(?:-\w+| \(.+\))?")

def parse_slurm_version(text: str) -> tuple[int, int, int]:
    """(major, minor, micro) from `scontrol --version`; micro is 0 where the build names none."""
    match = SLURM_VERSION_RE.fullmatch(text.strip())
    if not match:
        raise ParseError(f"not a Slurm version line: {text.strip()[:80]!r}", source="scontrol --version")
    major, minor, micro = match.group(2, 3, 4)
    return int(major), int(minor), int(micro or 0)


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


# ---------------------------------------------------------------- accounting (sacct)

# Slurm's record of a job, from its accounting database (slurmdbd), as `sacct` prints it:
# --allocations (one line per allocation, no steps), --duplicates (a job resized by `scontrol update
# NodeList=` keeps its earlier allocation as a RESIZING line: without it, the nodes it let go are
# gone), --parsable2 ('|' between fields, a header line naming them), times as seconds since 1970
# (SLURM_TIME_FORMAT=%s, a strftime format; "Unknown" while the job has not started or ended).
SACCT_FIELDS = ("JobID", "JobIDRaw", "UID", "NodeList", "Start", "End", "State")
SACCT_JOBS_PER_CALL = 500       # job ids on one command line (a few KB)
SACCT_TIMEOUT_S = 60.0
SACCT_OUTPUT_CAP = 16 << 20     # a few lines per job: far below for 500 jobs


@dataclass(frozen=True)
class AccountedJob:
    """What Slurm's accounting holds of one job: every allocation it had, together."""

    job_id: str
    uid: int
    nodes: frozenset[str]        # every node of every allocation (a resized job's earlier ones too)
    start: float | None          # None: it never started
    end: float | None            # None: still running (or its end has not reached the database yet)


def sacct_argv(job_ids: list[str]) -> list[str]:
    return ["sacct", "--allocations", "--duplicates", "--parsable2", f"--format={','.join(SACCT_FIELDS)}",
            f"--jobs={','.join(job_ids)}"]


def parse_sacct_jobs(text: str, job_ids: list[str], *, source: str = "sacct") -> dict[str, AccountedJob]:
    """`sacct_argv(job_ids)`'s output -> {asked id: its record}; an id Slurm never ran has none.

    A line answers the asked id X when its JobIDRaw is X (an array task asked by its own id), its
    JobID is X (`123_4`, `123+1`), or it is a component of het job X (`X+1`). ParseError for
    output of another shape (a header that is not SACCT_FIELDS', a field of the wrong form)."""
    lines = text.splitlines()
    if not lines or lines[0].split("|") != list(SACCT_FIELDS):
        raise ParseError(f"expected a header line {'|'.join(SACCT_FIELDS)}", source=source, line=1)
    asked = set(job_ids)
    found: dict[str, list[tuple[int, list[str], float | None, float | None]]] = {}
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("|")
        if len(fields) != len(SACCT_FIELDS) or not fields[2].isdigit():
            raise ParseError(f"not a {len(SACCT_FIELDS)}-field allocation line with a UID", source=source,
                             line=number)
        job, raw, uid, nodelist, start, end = fields[:6]
        het_leader = job.split("+", 1)[0] if "+" in job else None
        for key in {raw, job, het_leader} & asked:
            nodes = [] if nodelist in ("", "None assigned") else expand_hostlist(nodelist, source=source)
            found.setdefault(key, []).append((int(uid), nodes, _sacct_time(start, source, number),
                                              _sacct_time(end, source, number)))
    records = {}
    for key, rows in found.items():
        starts = [start for _, _, start, _ in rows if start is not None]
        ends = [end for _, _, _, end in rows]
        records[key] = AccountedJob(key, rows[0][0], frozenset(node for _, nodes, _, _ in rows for node in nodes),
                                    min(starts) if starts else None,
                                    None if None in ends else max(ends))
    return records


def _sacct_time(text: str, source: str, line: int) -> float | None:
    if text in ("Unknown", "None", ""):
        return None
    if not text.isdigit():
        raise ParseError(f"time {text[:40]!r} is not seconds since 1970 (SLURM_TIME_FORMAT=%s)", source=source,
                         line=line)
    return float(text)


def accounted_jobs(job_ids: list[str], env: dict[str, str] | None = None,
                   timeout: float = SACCT_TIMEOUT_S) -> dict[str, AccountedJob]:
    """Slurm's accounting records of `job_ids` (Slurm job ids, checked), SACCT_JOBS_PER_CALL to a
    sacct call. ExternalCommandError (one line) where sacct cannot answer: no accounting at this site
    ("Slurm accounting storage is disabled"), slurmdbd down, a timeout."""
    records: dict[str, AccountedJob] = {}
    wanted = sorted({check_job_id(job_id, "job id") for job_id in job_ids})
    environment = {**(env if env is not None else os.environ), "SLURM_TIME_FORMAT": "%s"}
    for first in range(0, len(wanted), SACCT_JOBS_PER_CALL):
        chunk = wanted[first:first + SACCT_JOBS_PER_CALL]
        result = run(sacct_argv(chunk), timeout=timeout, env=environment, output_cap=SACCT_OUTPUT_CAP)
        if not result.ok:
            raise ExternalCommandError(result.describe_failure())
        if result.truncated:
            raise ExternalCommandError(f"sacct wrote more than {SACCT_OUTPUT_CAP} bytes for {len(chunk)} jobs")
        records.update(parse_sacct_jobs(result.stdout, chunk))
    return records
