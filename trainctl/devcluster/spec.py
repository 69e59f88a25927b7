"""What a dev cluster is: its spec (nodes, addresses, MTUs, rates), where it keeps its files,
and the state file that lists every kernel object it created (so `down` removes exactly those).

Pure apart from StateFile: nothing here touches the network, Slurm or processes.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

from trainctl.errors import UsageError

DEFAULT_BASE_DIR = "/tmp/trainctl-devcluster"
STATE_FILE = "state.json"
INSTANCE_ENV = "TRAINCTL_DEVCLUSTER_INSTANCE"
SLURM_ENV = "TRAINCTL_DEVCLUSTER_SLURM"
SYSTEM_SLURM = "system"
# Slurm releases the dev cluster can run besides the system's, each from a root filesystem of
# its own (slurm_root.py), cached under /var/cache/trainctl: Debian 13 ("trixie") ships slurm-wlm
# 24.11, Debian's development suite ("sid") 26.05.
ROOT_SLURMS = ("24.11", "26.05")
SLURM_ROOTS = {"24.11": "/var/cache/trainctl/debian13-slurm-root",
               "26.05": "/var/cache/trainctl/debian-sid-slurm-26.05-root"}
CONTROLLER_OCTET = 254
ROOT_SIDE_MTU = 9000        # bridge and root-side veths carry the largest node MTU
MAX_NODE_MTU = ROOT_SIDE_MTU
MIN_NODE_MTU = 576
MAX_RAILS = 4
RAIL_SUBNET_STRIDE = 10   # rail r of instance K: 10.77.(K + 10r); instances are 0-9, so none overlap

NODE_NAME_RE = re.compile(r"^node([1-9][0-9]*)$")
RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$",
                     re.IGNORECASE)
SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+$")  # goes verbatim into slurm.conf and scripts
PREFIX_RE = re.compile(r"^[a-z]{1,6}$")             # keeps "<prefix>veth<N>" within 15 chars
PARTITION_RE = re.compile(r"^[A-Za-z0-9_]+$")
EXTRA_CONF_RE = re.compile(r"[A-Za-z]+=[^\n]*")
DOMAIN_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
HOST_NAME_MAX = 64                                  # Linux's limit for a UTS hostname


def spec_for_instance(instance: int | None = None) -> ClusterSpec:
    """The spec of dev cluster number `instance` (0-9; default $TRAINCTL_DEVCLUSTER_INSTANCE or 0).

    Instance 0 is the default cluster; instance K > 0 gets its own prefix, subnet, port and base
    directory, so several checkouts on one machine can each run their cluster tests at once.
    Its Slurm is $TRAINCTL_DEVCLUSTER_SLURM (default: the system's).
    """
    if instance is None:
        raw = os.environ.get(INSTANCE_ENV, "0")
        if not raw.isdigit() or not 0 <= int(raw) <= 9:
            raise UsageError(f"{INSTANCE_ENV} must be 0-9, got {raw!r}")
        instance = int(raw)
    slurm = os.environ.get(SLURM_ENV) or SYSTEM_SLURM
    check_slurm(slurm, SLURM_ENV)
    if instance == 0:
        return ClusterSpec(slurm=slurm)
    return ClusterSpec(base_dir=f"{DEFAULT_BASE_DIR}-{instance}", subnet=f"10.77.{instance}",
                       # "tc" is instance 0's prefix, so the letters skip c
                       prefix="t" + "abdefghij"[instance - 1], slurmctld_port=6817 + 10 * instance,
                       slurm=slurm)


def check_slurm(slurm: str, source: str = "slurm") -> None:
    if slurm != SYSTEM_SLURM and slurm not in ROOT_SLURMS:
        raise UsageError(f"{source}: Slurm {slurm!r} is not one the dev cluster runs; choose "
                         f"{', '.join((SYSTEM_SLURM, *ROOT_SLURMS))}")


@dataclass(frozen=True)
class ClusterSpec:
    """What to build. Node names are node1..nodeN; node N gets address <subnet>.N."""

    nodes: int = 4
    base_dir: str = DEFAULT_BASE_DIR
    subnet: str = "10.77.0"              # first three octets of a /24 used only inside our namespaces
    prefix: str = "tc"                   # bridge <prefix>br0, netns <prefix>nN, veth <prefix>vethN
    slurmctld_port: int = 6817           # a second instance beside the first needs another port
    mtus: Mapping[str, int] = field(default_factory=dict)   # overrides of default_mtu()
    rates: Mapping[str, str] = field(default_factory=dict)  # tc tbf rate per node, e.g. "1gbit"
    gpus_per_node: int = 8
    partition: str = "gpu"
    cpus_per_node: int = 16              # more than the host has: slurm.conf config_overrides
    memory_mb: int = 4000
    up_timeout_s: float = 60.0
    # Lines appended to slurm.conf as they are (HealthCheckProgram=..., Prolog=...), so a test
    # can start a cluster that runs a Slurm hook; each must be one `Key=Value ...` line.
    extra_slurm_conf: tuple[str, ...] = ()
    # Where set, node N's hostname is nodeN.<domain> (its NodeHostname in slurm.conf) while its
    # Slurm NodeName stays nodeN, as on clusters whose hosts carry FQDNs.
    domain: str = ""
    # Data rails: rail 0 is eth0 on the bridge; rail r > 0 is eth<r> in every node, on a bridge of
    # its own with no address in the root namespace, subnet third octet + 10r.
    rails: int = 1
    # Which Slurm runs the cluster: the system's, or a release from a root filesystem of its own
    # (ROOT_SLURMS) at slurm_root; its daemons, clients and job tasks then all run in that root,
    # which sees the host's /tmp, /dev, /proc, /sys, trainctl's Python and root_binds.
    slurm: str = SYSTEM_SLURM
    slurm_root: str = ""                 # "": the release's own cache (SLURM_ROOTS); see root_fs
    root_binds: tuple[str, ...] = ()
    # Slurm's accounting: MariaDB (a private datadir, a Unix socket only) and slurmdbd, so sacct
    # answers as at a site (accounting.py). Debian's slurmdbd is the system's 22.05; slurmdbd must be
    # at least as new as slurmctld, so it runs with the system's Slurm only.
    accounting: bool = False

    @property
    def root_fs(self) -> str:
        """The built root filesystem this cluster's Slurm runs from."""
        return self.slurm_root or SLURM_ROOTS.get(self.slurm, "")

    @property
    def uses_root(self) -> bool:
        return self.slurm != SYSTEM_SLURM

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def hostname(self, node: str) -> str:
        """What `hostname` says inside `node`: its NodeName, or nodeN.<domain> with a domain."""
        self.index(node)
        return f"{node}.{self.domain}" if self.domain else node

    def index(self, node: str) -> int:
        match = NODE_NAME_RE.match(node)
        if not match or int(match.group(1)) > self.nodes:
            raise UsageError(f"unknown node {node!r}: this dev cluster has "
                             f"{', '.join(self.node_names)}")
        return int(match.group(1))

    def address(self, node: str, rail: int = 0) -> str:
        return f"{self.rail_subnet(rail)}.{self.index(node)}"

    def rail_subnet(self, rail: int) -> str:
        first, second, third = self.subnet.split(".")
        return f"{first}.{second}.{int(third) + RAIL_SUBNET_STRIDE * rail}"

    @staticmethod
    def rail_interface(rail: int) -> str:
        """The node's interface on `rail`: eth0, eth1, ..."""
        return f"eth{rail}"

    @property
    def controller_address(self) -> str:
        return f"{self.subnet}.{CONTROLLER_OCTET}"

    @property
    def slurmdbd_port(self) -> int:
        """Slurm's default DbdPort (6819) for instance 0; each instance's beside its slurmctld's."""
        return self.slurmctld_port + 2

    def default_mtu(self, node: str) -> int:
        # Distinct MTUs by default, so tests and health checks see a mismatch to find.
        return 1500 if self.index(node) == 1 else 9000

    def mtu(self, node: str) -> int:
        return self.mtus.get(node, self.default_mtu(node))

    def rate(self, node: str) -> str | None:
        self.index(node)
        return self.rates.get(node)

    def netns(self, node: str) -> str:
        return f"{self.prefix}n{self.index(node)}"

    def veth(self, node: str, rail: int = 0) -> str:
        """Root-side end of `node`'s veth on `rail` (at most 6 + 4 + 2 + 2 = 14 characters)."""
        return f"{self.prefix}veth{self.index(node)}" + (f"r{rail}" if rail else "")

    @property
    def bridge(self) -> str:
        return self.rail_bridge(0)

    def rail_bridge(self, rail: int) -> str:
        return f"{self.prefix}br{rail}"

    @property
    def gpu_devices(self) -> list[str]:
        return [f"/dev/{self.prefix}gpu{k}" for k in range(self.gpus_per_node)]

    def validate(self) -> None:
        if not 1 <= self.nodes <= 64:
            raise UsageError(f"nodes must be 1..64, got {self.nodes}")
        if not SAFE_PATH_RE.match(self.base_dir) or self.base_dir.rstrip("/").count("/") < 2:
            raise UsageError(f"base dir {self.base_dir!r} must be an absolute path at least two "
                             "levels deep made of letters, digits and . _ - /",
                             hint="it is removed by `down` and written into slurm.conf")
        octets = self.subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets):
            raise UsageError(f"subnet {self.subnet!r} must be three octets, e.g. 10.77.0")
        if not 1 <= self.rails <= MAX_RAILS:
            raise UsageError(f"rails must be 1..{MAX_RAILS}, got {self.rails}")
        if int(self.rail_subnet(self.rails - 1).rsplit(".", 1)[1]) > 255:
            raise UsageError(f"subnet {self.subnet!r} leaves no room for {self.rails} rails "
                             f"(rail r uses third octet + {RAIL_SUBNET_STRIDE}r)")
        if not PREFIX_RE.match(self.prefix):
            raise UsageError(f"prefix {self.prefix!r} must be 1-6 lowercase letters")
        if not 1024 <= self.slurmctld_port <= 65535:
            raise UsageError(f"slurmctld port must be 1024..65535, got {self.slurmctld_port}")
        for node, mtu in self.mtus.items():
            self._check_known(node, "MTU")
            check_mtu(node, mtu)
        for node, rate in self.rates.items():
            self._check_known(node, "rate")
            check_rate(node, rate)
        if not 0 <= self.gpus_per_node <= 64:
            raise UsageError(f"gpus per node must be 0..64, got {self.gpus_per_node}")
        if not PARTITION_RE.match(self.partition):
            raise UsageError(f"partition name {self.partition!r} must be letters, digits or _")
        for line in self.extra_slurm_conf:
            if not EXTRA_CONF_RE.fullmatch(line):
                raise UsageError(f"extra slurm.conf line {line!r} must be one Key=Value line")
        if self.domain and (not DOMAIN_RE.match(self.domain)
                            or len(self.hostname(self.node_names[-1])) > HOST_NAME_MAX):
            raise UsageError(f"domain {self.domain!r} must be DNS labels (lowercase letters, digits, "
                             f"- and .), e.g. cluster.test, and nodeN.<domain> at most {HOST_NAME_MAX} "
                             "characters")

        check_slurm(self.slurm)
        if self.accounting and self.uses_root:
            raise UsageError(f"accounting runs the system's slurmdbd (Slurm 22.05), which cannot serve Slurm "
                             f"{self.slurm}'s slurmctld (slurmdbd must be at least as new)",
                             hint="use --accounting with the system's Slurm")
        for path in ((self.root_fs,) if self.uses_root else ()) + self.root_binds:
            if not SAFE_PATH_RE.match(path) or path.rstrip("/") == "":
                raise UsageError(f"path {path!r} must be absolute, below /, made of letters, digits "
                                 "and . _ - /", hint="it goes into the Slurm root's bind mounts")

    def _check_known(self, node: str, setting: str) -> None:
        if node not in self.node_names:
            raise UsageError(f"{setting} given for unknown node {node!r}: this dev cluster has "
                             f"{', '.join(self.node_names)}")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mtus"], data["rates"] = dict(self.mtus), dict(self.rates)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> ClusterSpec:
        return cls(**{**data, "extra_slurm_conf": tuple(data.get("extra_slurm_conf", ())),
                      "root_binds": tuple(data.get("root_binds", ()))})


def check_rate(node: str, rate: str) -> None:
    if not RATE_RE.match(rate):
        raise UsageError(f"rate for {node} must be a tc rate such as 100mbit or 1gbit, got {rate!r}")


def check_mtu(node: str, mtu: int) -> None:
    if not MIN_NODE_MTU <= mtu <= MAX_NODE_MTU:
        raise UsageError(f"MTU for {node} must be {MIN_NODE_MTU}..{MAX_NODE_MTU}, got {mtu}")


def node_range(spec: ClusterSpec) -> str:
    """Slurm hostlist of all nodes: node1 or node[1-N]."""
    return "node1" if spec.nodes == 1 else f"node[1-{spec.nodes}]"


@dataclass(frozen=True)
class Layout:
    """Where a cluster keeps its files under base_dir, and how to run a command in a node."""

    spec: ClusterSpec

    @property
    def base(self) -> Path:
        return Path(self.spec.base_dir)

    @property
    def slurm_conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def run_dir(self) -> Path:
        return self.base / "run"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    @property
    def ns_dir(self) -> Path:
        return self.base / "ns"

    @property
    def ssh_dir(self) -> Path:
        return self.base / "ssh"

    @property
    def root_dir(self) -> Path:
        """Where the Slurm root filesystem is assembled (a bind of spec.slurm_root plus the host's
        paths the daemons and tasks need); unused with the system's Slurm."""
        return self.base / "root"

    @property
    def slurm_bin_dir(self) -> Path:
        """Slurm client commands (sbatch, srun, ...) that run the root's: first on clients' PATH."""
        return self.base / "slurm-bin"

    @property
    def db_dir(self) -> Path:
        """MariaDB's datadir, Slurm's accounting database (with spec.accounting)."""
        return self.base / "db"

    @property
    def db_socket(self) -> Path:
        """MariaDB's only way in: no TCP port (--skip-networking)."""
        return self.run_dir / "mariadbd.sock"

    @property
    def slurmdbd_conf(self) -> Path:
        """slurmdbd reads slurmdbd.conf from SLURM_CONF's directory: beside slurm.conf."""
        return self.base / "slurmdbd.conf"

    def pid_file(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    def uts_file(self, node: str) -> Path:
        return self.ns_dir / f"{node}.uts"

    def mnt_file(self, node: str) -> Path:
        return self.ns_dir / f"{node}.mnt"

    def node_bin_dir(self, node: str) -> Path:
        """Where a test drops `node`'s own commands; the node sees it at local_bin_dir."""
        self.spec.index(node)
        return self.base / "nodes" / node / "bin"

    @property
    def local_bin_dir(self) -> Path:
        """One path, each node's own bin dir inside that node (a bind mount in its mount namespace)."""
        return self.base / "local" / "bin"

    def exec_argv(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run inside `node`'s network, UTS and mount namespaces, in the caller's cwd."""
        return ["nsenter", f"--net=/run/netns/{self.spec.netns(node)}",
                f"--uts={self.uts_file(node)}", f"--mount={self.mnt_file(node)}",
                "--wd=.", *argv]  # entering a mount namespace would otherwise cd to /


class StateFile:
    """base_dir/state.json: the spec and every object created, written before creating it,
    so a crash at any point leaves a list that `down` can finish from."""

    def __init__(self, base: Path):
        self.path = base / STATE_FILE

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def exists(self) -> bool:
        return self.path.exists()

    def start(self, spec: ClusterSpec) -> None:
        self._write({"spec": spec.to_dict(), "bridge": None, "netns": [], "veths": [],
                     "devices": [], "created_run_sshd": False})

    def add(self, key: str, item: str) -> None:
        """Append `item` to the list under `key`."""
        state = self.read()
        state.setdefault(key, []).append(item)
        self._write(state)

    def set(self, key: str, value: object) -> None:
        state = self.read()
        state[key] = value
        self._write(state)

    def _write(self, state: dict) -> None:
        tmp = self.path.with_name(f"{STATE_FILE}.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.path)


def load_spec(base_dir: str) -> ClusterSpec:
    """The spec recorded in `base_dir`'s state file (a cluster another process started, say)."""
    state_file = Path(base_dir) / STATE_FILE
    try:
        return ClusterSpec.from_dict(json.loads(state_file.read_text())["spec"])
    except FileNotFoundError:
        raise UsageError(f"no dev cluster in {base_dir}",
                         hint="start one with `trainctl dev-cluster up`") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{state_file}: unreadable dev cluster state: {exc}") from exc


@dataclass(frozen=True)
class NodeStatus:
    name: str
    address: str
    netns: str
    mtu: int | None             # read back from the node's eth0; None when it is gone
    rate_bit_s: int | None      # tbf rate on the node's eth0; None when unshaped
    slurm_state: str | None     # as sinfo prints it ("idle", "drained", "idle*", ...)
    slurmd_alive: bool
    sshd_alive: bool


@dataclass(frozen=True)
class ClusterStatus:
    base_dir: str
    slurm_conf: str
    controller_address: str
    slurmctld_port: int
    slurmctld_alive: bool
    munged_alive: bool
    nodes: list[NodeStatus]

    def as_dict(self) -> dict:
        return asdict(self)
