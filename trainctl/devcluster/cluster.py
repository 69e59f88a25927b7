"""A real multi-node Slurm cluster on one machine, built from Linux namespaces (needs root).

Layout of one instance (every kernel object name starts with `ClusterSpec.prefix`, "tc"):

- bridge `tcbr0` in the root namespace carries the controller address <subnet>.254;
- node N is a network namespace `tcnN` whose `eth0` (<subnet>.N, its own MTU) pairs with
  `tcvethN` on the bridge, plus persistent UTS and mount namespaces: `hostname` says nodeN
  and a sysfs of its own makes /sys/class/net show the node's interfaces, not the host's;
- a private munged and slurmctld run in the root namespace, one `slurmd -N nodeN` per node
  inside that node's namespaces; fake GPUs are char devices /dev/tcgpuK (/dev/null's numbers);
- everything else (configs, keys, logs, pid files, Slurm state) lives in `base_dir`, with a
  state file listing what was created, so `down()` (or the next `up()` after a crash)
  removes exactly that: it kills only the PIDs of its own pid files and processes inside
  its own namespaces.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from trainctl.errors import ExternalCommandError, PrivilegeError, TrainctlError, UsageError
from trainctl.proc import ProcResult, resolve, run, run_checked

DEFAULT_BASE_DIR = "/tmp/trainctl-devcluster"
STATE_FILE = "state.json"
CONTROLLER_OCTET = 254
ROOT_SIDE_MTU = 9000        # bridge and root-side veths carry the largest node MTU
MAX_NODE_MTU = ROOT_SIDE_MTU
MIN_NODE_MTU = 576
TBF_BURST = "256kb"         # must exceed the device MTU, or tbf silently drops jumbo frames
TBF_LATENCY = "400ms"
CMD_TIMEOUT_S = 15.0
DAEMON_START_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0
SSHD_PORT = 22
LOG_TAIL_LINES = 8
# Daemons live in sbin, which a non-login root shell may not have on PATH.
SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin"
REQUIRED_BINARIES = ("slurmctld", "slurmd", "munged", "sinfo", "scontrol", "ip", "tc",
                     "nsenter", "unshare", "mount", "umount", "hostname")
SSHD_BINARIES = ("sshd", "ssh-keygen")
INSTALL_HINT = "Debian: apt-get install slurm-wlm munge iproute2 util-linux openssh-server"

NODE_NAME_RE = re.compile(r"^node([1-9][0-9]*)$")
RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$",
                     re.IGNORECASE)
SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]+$")  # goes verbatim into slurm.conf and scripts
PREFIX_RE = re.compile(r"^[a-z]{1,6}$")             # keeps "<prefix>veth<N>" within 15 chars
PARTITION_RE = re.compile(r"^[A-Za-z0-9_]+$")


# ---------------------------------------------------------------- prerequisites

def _which(binary: str) -> str | None:
    return resolve(binary, f"{os.environ.get('PATH', '')}:{SBIN_DIRS}")


def missing_prerequisites(*, need_sshd: bool = False) -> list[str]:
    """What keeps a dev cluster from starting here, one sentence each; empty when nothing."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"not root (euid {os.geteuid()}): namespaces, bridges and Slurm "
                        "daemons need root")
    wanted = REQUIRED_BINARIES + (SSHD_BINARIES if need_sshd else ())
    missing = [binary for binary in wanted if _which(binary) is None]
    if missing:
        problems.append(f"not found on PATH or in {SBIN_DIRS}: {', '.join(missing)} ({INSTALL_HINT})")
    return problems


def check_prerequisites(*, need_sshd: bool = False) -> None:
    if os.geteuid() != 0:
        raise PrivilegeError(f"the dev cluster needs root (euid is {os.geteuid()})",
                             hint="it creates network namespaces, a bridge and Slurm daemons")
    problems = missing_prerequisites(need_sshd=need_sshd)
    if problems:
        raise ExternalCommandError("; ".join(problems))


def _binary(name: str) -> str:
    """Absolute path (sshd refuses to start from a relative one)."""
    path = _which(name)
    if path is None:
        raise ExternalCommandError(f"{name}: not found on PATH or in {SBIN_DIRS}", hint=INSTALL_HINT)
    return path


# ---------------------------------------------------------------- spec

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

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    def index(self, node: str) -> int:
        match = NODE_NAME_RE.match(node)
        if not match or int(match.group(1)) > self.nodes:
            raise UsageError(f"unknown node {node!r}: this dev cluster has "
                             f"{', '.join(self.node_names)}")
        return int(match.group(1))

    def address(self, node: str) -> str:
        return f"{self.subnet}.{self.index(node)}"

    @property
    def controller_address(self) -> str:
        return f"{self.subnet}.{CONTROLLER_OCTET}"

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

    def veth(self, node: str) -> str:
        return f"{self.prefix}veth{self.index(node)}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

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
        if not PREFIX_RE.match(self.prefix):
            raise UsageError(f"prefix {self.prefix!r} must be 1-6 lowercase letters")
        if not 1024 <= self.slurmctld_port <= 65535:
            raise UsageError(f"slurmctld port must be 1024..65535, got {self.slurmctld_port}")
        for node, mtu in self.mtus.items():
            self._check_known(node, "MTU")
            if not MIN_NODE_MTU <= mtu <= MAX_NODE_MTU:
                raise UsageError(f"MTU for {node} must be {MIN_NODE_MTU}..{MAX_NODE_MTU}, got {mtu}")
        for node, rate in self.rates.items():
            self._check_known(node, "rate")
            _check_rate(node, rate)
        if not 0 <= self.gpus_per_node <= 64:
            raise UsageError(f"gpus per node must be 0..64, got {self.gpus_per_node}")
        if not PARTITION_RE.match(self.partition):
            raise UsageError(f"partition name {self.partition!r} must be letters, digits or _")

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
        return cls(**data)


def _check_rate(node: str, rate: str) -> None:
    if not RATE_RE.match(rate):
        raise UsageError(f"rate for {node} must be a tc rate such as 100mbit or 1gbit, got {rate!r}")


@dataclass(frozen=True)
class SshEndpoint:
    """How to reach a node's sshd: key auth as `user`, host key pinned in `known_hosts_path`."""

    host: str
    port: int
    user: str
    key_path: str
    known_hosts_path: str

    def ssh_argv(self, *command: str) -> list[str]:
        """An OpenSSH command line that verifies the host key and never prompts."""
        return ["ssh", "-i", self.key_path, "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.known_hosts_path}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                f"{self.user}@{self.host}", *command]


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


# ---------------------------------------------------------------- pure generation

def node_range(spec: ClusterSpec) -> str:
    """Slurm hostlist of all nodes: node1 or node[1-N]."""
    return "node1" if spec.nodes == 1 else f"node[1-{spec.nodes}]"


def _gpu_file_range(spec: ClusterSpec) -> str:
    first = spec.gpu_devices[0]
    return first if spec.gpus_per_node == 1 else f"/dev/{spec.prefix}gpu[0-{spec.gpus_per_node - 1}]"


def slurm_conf_text(spec: ClusterSpec, controller_hostname: str) -> str:
    """slurm.conf for `spec`. SlurmctldHost's name must be the machine's `hostname -s`."""
    base = spec.base_dir
    gres = f" Gres=gpu:{spec.gpus_per_node}" if spec.gpus_per_node else ""
    lines = [
        "# Generated by trainctl dev-cluster; removed by `trainctl dev-cluster down`.",
        f"ClusterName={spec.prefix}devcluster",
        f"SlurmctldHost={controller_hostname}({spec.controller_address})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base}/run/munge.sock",
        f"SlurmctldPort={spec.slurmctld_port}",
        "SlurmdPort=6818",  # one slurmd per network namespace: no clash
        f"StateSaveLocation={base}/state",
        f"SlurmdSpoolDir={base}/spool/%n",
        f"SlurmctldPidFile={base}/run/slurmctld.pid",
        f"SlurmdPidFile={base}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={base}/log/slurmctld.log",
        f"SlurmdLogFile={base}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"TaskProlog={base}/task_prolog.sh",
        # linuxproc/none: the node's private sysfs hides /sys/fs/cgroup from slurmd.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",  # nodes claim more CPUs than the host has
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "MinJobAge=300",  # keeps finished jobs visible to `scontrol show job` (no slurmdbd)
        "KillWait=5",
        "Waittime=0",
    ]
    for node in spec.node_names:
        lines.append(
            f"NodeName={node} NodeAddr={spec.address(node)} NodeHostname={node} "
            f"CPUs={spec.cpus_per_node} Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket={spec.cpus_per_node} ThreadsPerCore=1 "
            f"RealMemory={spec.memory_mb}{gres} State=UNKNOWN")
    lines.append(f"PartitionName={spec.partition} Nodes={node_range(spec)} Default=YES "
                 "MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def gres_conf_text(spec: ClusterSpec) -> str:
    """gres.conf: fake GPUs need real device files; a Count-only entry leaves nodes INVAL."""
    lines = ["AutoDetect=off"]
    if spec.gpus_per_node:
        lines.append(f"NodeName={node_range(spec)} Name=gpu File={_gpu_file_range(spec)}")
    return "\n".join(lines) + "\n"


def task_prolog_text(spec: ClusterSpec) -> str:
    """Slurm TaskProlog: each `export NAME=value` line it prints sets that variable for the task."""
    return ("#!/bin/sh\n"
            "# Generated by trainctl dev-cluster. Puts this node's bin dir first on the task's\n"
            "# PATH, so a test can shadow a command (nvidia-smi, say) on one node only.\n"
            f'echo "export PATH={spec.base_dir}/nodes/$SLURMD_NODENAME/bin:$PATH"\n')


def sshd_config_text(ssh_dir: str, slurm_conf: str) -> str:
    return (f"# Generated by trainctl dev-cluster.\n"
            f"HostKey {ssh_dir}/host_ed25519\n"
            f"AuthorizedKeysFile {ssh_dir}/authorized_keys\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"  # the keys live under /tmp, which StrictModes rejects
            "Subsystem sftp internal-sftp\n"  # `submit --remote` checks the script over SFTP
            f"SetEnv SLURM_CONF={slurm_conf}\n")


def known_hosts_text(addresses: Iterable[str], host_public_key: str) -> str:
    """One known_hosts line: every node shares the generated host key."""
    key_type, key_b64 = host_public_key.split()[:2]
    return f"{','.join(addresses)} {key_type} {key_b64}\n"


# ---------------------------------------------------------------- pure parsing

def parse_sinfo_node_states(text: str) -> dict[str, str]:
    """`sinfo -h -N -o %N|%T` -> {node: state}."""
    states = {}
    for line in text.splitlines():
        if "|" in line:
            node, state = line.strip().split("|", 1)
            states[node] = state
    return states


def parse_link_mtu(ip_json: str) -> int | None:
    """`ip -j link show dev X` -> its MTU."""
    links = json.loads(ip_json or "[]")
    return int(links[0]["mtu"]) if links else None


def parse_tbf_rate_bits(tc_json: str) -> int | None:
    """`tc -j qdisc show dev X` -> rate of its root tbf in bit/s (tc reports bytes/s), else None."""
    for qdisc in json.loads(tc_json or "[]"):
        if qdisc.get("root") and qdisc.get("kind") == "tbf":
            return int(qdisc["options"]["rate"]) * 8
    return None


def mounts_under(mountinfo_text: str, base: str) -> list[str]:
    """Mount points at or below `base` in /proc/self/mountinfo text, deepest first."""
    def unescape(field_text: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)

    base = base.rstrip("/")
    points = []
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = unescape(fields[4])
            if point == base or point.startswith(base + "/"):
                points.append(point)
    return sorted(points, key=lambda p: p.count("/"), reverse=True)


# ---------------------------------------------------------------- processes

def pid_alive(pid: int) -> bool:
    """Zombies count as dead: PID 1 here may reap late, and kill -0 still succeeds on them."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = re.search(r"^State:\s*(\S)", status, re.MULTILINE)
    return bool(state) and state.group(1) != "Z"


def _pid_runs_from(pid: int, base: Path) -> bool:
    """The PID's command line names a file in `base`: guards against a reused PID."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return f"{base}/" in cmdline


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_pids(pids: Iterable[int], sig: int = signal.SIGTERM) -> list[int]:
    """Signal `pids`, wait up to STOP_GRACE_S, SIGKILL the rest; returns PIDs still alive."""
    pids = [pid for pid in pids if pid_alive(pid)]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.05)
    survivors = [pid for pid in pids if pid_alive(pid)]
    if survivors and sig != signal.SIGKILL:
        return _stop_pids(survivors, signal.SIGKILL)
    return survivors


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc.strerror})"


# ---------------------------------------------------------------- the cluster

class DevCluster:
    """Build, inspect, change and remove one dev cluster (everything that touches the system needs root)."""

    def __init__(self, spec: ClusterSpec | None = None):
        self.spec = spec or ClusterSpec()
        self.spec.validate()
        self.base = Path(self.spec.base_dir)
        self._lock_fd: int | None = None
        self._state: dict = {}

    @classmethod
    def attach(cls, base_dir: str = DEFAULT_BASE_DIR) -> DevCluster:
        """The cluster whose state file is in `base_dir` (started by another process, say)."""
        state_file = Path(base_dir) / STATE_FILE
        try:
            data = json.loads(state_file.read_text())
            return cls(ClusterSpec.from_dict(data["spec"]))
        except FileNotFoundError:
            raise UsageError(f"no dev cluster in {base_dir}",
                             hint="start one with `trainctl dev-cluster up`") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{state_file}: unreadable dev cluster state: {exc}") from exc

    # -- paths
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

    def node_bin_dir(self, node: str) -> Path:
        """Directory first on PATH for Slurm tasks on `node` (via TaskProlog): drop fakes here."""
        self.spec.index(node)
        return self.base / "nodes" / node / "bin"

    def env(self) -> dict[str, str]:
        """Environment additions for Slurm clients (sinfo, srun, sbatch ...) of this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    def exec_argv(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run inside `node`'s network, UTS and mount namespaces, in the caller's cwd."""
        return ["nsenter", f"--net=/run/netns/{self.spec.netns(node)}",
                f"--uts={self._uts_file(node)}", f"--mount={self._mnt_file(node)}",
                "--wd=.", *argv]  # entering a mount namespace would otherwise cd to /

    def _uts_file(self, node: str) -> Path:
        return self.ns_dir / f"{node}.uts"

    def _mnt_file(self, node: str) -> Path:
        return self.ns_dir / f"{node}.mnt"

    def _pid_file(self, daemon: str) -> Path:
        return self.run_dir / f"{daemon}.pid"

    # -- up
    def up(self, progress: Callable[[str], None] | None = None, *, lock_wait_s: float = 0.0) -> float:
        """Start the cluster from scratch and wait until every node is idle; returns seconds taken.

        Leftovers of an earlier run in the same base dir are removed first. On any failure
        everything created so far is removed again and the error carries the daemons' log tails.
        """
        say = progress or (lambda _message: None)
        check_prerequisites()
        start = time.monotonic()
        self._lock(lock_wait_s)
        try:
            self._refuse_foreign_base_dir()
            removed = self._teardown()
        except BaseException:
            self._unlock()
            raise
        if removed:
            say(f"removed {len(removed)} leftovers of an earlier run ({', '.join(removed[:3])}, ...)")
        try:
            self._build(say, start)
        except BaseException:
            # The error already carries the log tails; do not leave half a cluster behind.
            try:
                self._teardown()
                say("start failed; removed what had been created")
            except TrainctlError as teardown_error:
                say(f"start failed, and so did the cleanup: {teardown_error}")
            finally:
                self._unlock()
            raise
        elapsed = time.monotonic() - start
        say(f"{self.spec.nodes} nodes idle after {elapsed:.2f} s")
        return elapsed

    def _build(self, say: Callable[[str], None], start: float) -> None:
        for sub in ("state", "log", "run", "ns", "ssh", *(f"spool/{n}" for n in self.spec.node_names)):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        for node in self.spec.node_names:
            self.node_bin_dir(node).mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)  # non-root Slurm clients must reach the munge socket
        self._state = {"spec": self.spec.to_dict(), "bridge": None, "netns": [], "veths": [],
                       "devices": [], "created_run_sshd": False}
        self._save_state()

        self._create_network()
        self._create_node_namespaces()
        say(f"network: {self.spec.nodes} namespaces on {self.spec.bridge} "
            f"({self.spec.subnet}.0/24) after {time.monotonic() - start:.2f} s")
        self._create_fake_gpus()
        self._write_configs()
        self._start_munged()
        self._start_daemon("slurmctld", [_binary("slurmctld"), "-f", str(self.slurm_conf)])
        for node in self.spec.node_names:
            self._start_daemon(f"slurmd-{node}", self.exec_argv(
                node, [_binary("slurmd"), "-N", node, "-f", str(self.slurm_conf)]))
        say(f"daemons started after {time.monotonic() - start:.2f} s; waiting for nodes to be idle")
        self.wait_idle(max(1.0, self.spec.up_timeout_s - (time.monotonic() - start)))

    def _refuse_foreign_base_dir(self) -> None:
        """`down` deletes base_dir: never adopt a directory we did not make."""
        if self.base.is_dir() and any(self.base.iterdir()) and not (self.base / STATE_FILE).exists():
            raise UsageError(f"{self.base} exists, is not empty and holds no dev cluster state",
                             hint="pick another --base-dir; it would be deleted by `down`")

    def _save_state(self) -> None:
        tmp = self.base / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self._state, indent=2) + "\n")
        tmp.replace(self.base / STATE_FILE)

    def _read_state(self) -> dict:
        try:
            return json.loads((self.base / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def _ip(self, *args: object) -> ProcResult:
        return run_checked(["ip", *map(str, args)], timeout=CMD_TIMEOUT_S)

    def _create_network(self) -> None:
        spec = self.spec
        self._state["bridge"] = spec.bridge  # recorded before creating, so a crash leaves no orphan
        self._save_state()
        self._ip("link", "add", spec.bridge, "type", "bridge")
        self._ip("addr", "add", f"{spec.controller_address}/24", "dev", spec.bridge)
        for node in spec.node_names:
            netns, veth = spec.netns(node), spec.veth(node)
            self._state["netns"].append(netns)
            self._state["veths"].append(veth)
            self._save_state()
            self._ip("netns", "add", netns)
            self._ip("link", "add", veth, "mtu", ROOT_SIDE_MTU, "type", "veth",
                     "peer", "name", "eth0", "mtu", spec.mtu(node), "netns", netns)
            self._ip("link", "set", veth, "master", spec.bridge, "up")
            self._ip("-n", netns, "link", "set", "lo", "up")
            self._ip("-n", netns, "addr", "add", f"{spec.address(node)}/24", "dev", "eth0")
            self._ip("-n", netns, "link", "set", "eth0", "up")
        # A bridge takes the smallest port MTU until told otherwise.
        self._ip("link", "set", spec.bridge, "mtu", ROOT_SIDE_MTU, "up")
        for node, rate in spec.rates.items():
            self.set_rate(node, rate)

    def _create_node_namespaces(self) -> None:
        ns_dir = str(self.ns_dir)
        # `unshare --mount=FILE` refuses a FILE on a shared mount (systemd makes / shared):
        # give the namespace files a private mount of their own.
        run_checked(["mount", "--bind", ns_dir, ns_dir], timeout=CMD_TIMEOUT_S)
        run_checked(["mount", "--make-private", ns_dir], timeout=CMD_TIMEOUT_S)
        for node in self.spec.node_names:
            self._uts_file(node).touch()
            self._mnt_file(node).touch()
            run_checked(["nsenter", f"--net=/run/netns/{self.spec.netns(node)}",
                         "unshare", f"--uts={self._uts_file(node)}", f"--mount={self._mnt_file(node)}",
                         "--propagation=slave", "hostname", node], timeout=CMD_TIMEOUT_S)
            # sysfs shows the interfaces of the namespace that mounted it, so the node needs
            # its own, mounted from inside its netns, for /sys/class/net to be the node's.
            # slurmd refuses to start without /sys/fs/cgroup: carry the host's tree over.
            cgroup_aside = self.ns_dir / f"{node}.cgroup"
            cgroup_aside.mkdir()
            for argv in (["mount", "--rbind", "/sys/fs/cgroup", str(cgroup_aside)],
                         ["mount", "-t", "sysfs", f"sysfs-{node}", "/sys"],
                         ["mount", "--move", str(cgroup_aside), "/sys/fs/cgroup"]):
                run_checked(self.exec_argv(node, argv), timeout=CMD_TIMEOUT_S)

    def _create_fake_gpus(self) -> None:
        null_device = os.stat("/dev/null").st_rdev
        for device in self.spec.gpu_devices:
            if os.path.lexists(device):
                if not _is_fake_gpu(device, null_device):
                    raise UsageError(f"{device} exists and is not a fake GPU (a /dev/null clone)",
                                     hint="choose another --prefix")
                continue
            self._state["devices"].append(device)
            self._save_state()
            os.mknod(device, 0o666 | stat.S_IFCHR, null_device)
            os.chmod(device, 0o666)  # mknod's mode is cut by the umask

    def _write_configs(self) -> None:
        self.slurm_conf.write_text(slurm_conf_text(self.spec, socket.gethostname().split(".")[0]))
        (self.base / "gres.conf").write_text(gres_conf_text(self.spec))
        prolog = self.base / "task_prolog.sh"
        prolog.write_text(task_prolog_text(self.spec))
        prolog.chmod(0o755)

    def _start_munged(self) -> None:
        key = self.base / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(1024))
        self._start_daemon("munged", [
            _binary("munged"), "--force", f"--key-file={key}",
            f"--socket={self.run_dir}/munge.sock", f"--pid-file={self._pid_file('munged')}",
            f"--log-file={self.log_dir}/munged.log", f"--seed-file={self.run_dir}/munged.seed"])

    def _start_daemon(self, daemon: str, argv: list[str]) -> int:
        """Run a self-daemonizing `argv` and wait for its pid file to name a live process."""
        pid_file = self._pid_file(daemon)
        result = run(argv, timeout=DAEMON_START_TIMEOUT_S)
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while result.ok and time.monotonic() < deadline:
            pid = _read_pid(pid_file)
            if pid is not None and pid_alive(pid):
                return pid
            time.sleep(0.02)
        why = result.describe_failure() if not result.ok else f"no live pid in {pid_file}"
        raise ExternalCommandError(f"dev cluster: {daemon} did not start: {why}\n{self._log_tails()}")

    # -- waiting and inspection
    def _slurm_states(self) -> dict[str, str]:
        result = run(["sinfo", "-h", "-N", "-p", self.spec.partition, "-o", "%N|%T"],
                     timeout=CMD_TIMEOUT_S, env=self.client_env())
        return parse_sinfo_node_states(result.stdout) if result.ok else {}

    def daemon_pids(self) -> dict[str, int | None]:
        """{munged, slurmctld, slurmd-nodeN, sshd-nodeN: PID}, None where not running.

        PIDs come from our pid files and count only while that process is alive and ours.
        """
        pids = {}
        for pid_file in sorted(self.run_dir.glob("*.pid")):
            pid = _read_pid(pid_file)
            alive = pid is not None and pid_alive(pid) and _pid_runs_from(pid, self.base)
            pids[pid_file.stem] = pid if alive else None
        return pids

    def wait_idle(self, timeout_s: float = 30.0) -> float:
        """Wait until sinfo shows every node `idle` (not `idle*`); returns the seconds waited."""
        start = time.monotonic()
        expected = ["munged", "slurmctld", *(f"slurmd-{n}" for n in self.spec.node_names)]
        while True:
            states = self._slurm_states()
            if all(states.get(node) == "idle" for node in self.spec.node_names):
                return time.monotonic() - start
            pids = self.daemon_pids()
            dead = [daemon for daemon in expected if pids.get(daemon) is None]
            waited = time.monotonic() - start
            if dead or waited > timeout_s:
                reason = (f"{', '.join(dead)} not running" if dead
                          else f"nodes not all idle after {timeout_s:.0f} s")
                shown = " ".join(f"{n}={states.get(n, '?')}" for n in self.spec.node_names)
                raise ExternalCommandError(f"dev cluster: {reason} (sinfo: {shown})\n{self._log_tails()}")
            time.sleep(0.1)

    def _log_tails(self) -> str:
        logs = sorted(self.log_dir.glob("*.log")) if self.log_dir.is_dir() else []
        return "\n".join(f"--- {log} (last {LOG_TAIL_LINES} lines) ---\n{_tail(log)}" for log in logs)

    def status(self) -> ClusterStatus:
        """What is running now, read back from the system (not from the spec)."""
        states = self._slurm_states()
        pids = self.daemon_pids()
        nodes = []
        for node in self.spec.node_names:
            netns = self.spec.netns(node)
            link = run(["ip", "-j", "-n", netns, "link", "show", "dev", "eth0"], timeout=CMD_TIMEOUT_S)
            qdisc = run(["tc", "-n", netns, "-j", "qdisc", "show", "dev", "eth0"], timeout=CMD_TIMEOUT_S)
            nodes.append(NodeStatus(
                name=node, address=self.spec.address(node), netns=netns,
                mtu=parse_link_mtu(link.stdout) if link.ok else None,
                rate_bit_s=parse_tbf_rate_bits(qdisc.stdout) if qdisc.ok else None,
                slurm_state=states.get(node),
                slurmd_alive=pids.get(f"slurmd-{node}") is not None,
                sshd_alive=pids.get(f"sshd-{node}") is not None))
        return ClusterStatus(
            base_dir=str(self.base), slurm_conf=str(self.slurm_conf),
            controller_address=self.spec.controller_address, slurmctld_port=self.spec.slurmctld_port,
            slurmctld_alive=pids.get("slurmctld") is not None,
            munged_alive=pids.get("munged") is not None, nodes=nodes)

    # -- live changes
    def set_rate(self, node: str, rate: str | None) -> None:
        """Limit `node`'s traffic in both directions to `rate` (tc tbf), or remove the limit."""
        if rate is not None:
            _check_rate(node, rate)
        netns = self.spec.netns(node)
        self._shape(["tc", "-n", netns], "eth0", rate)           # node -> others
        self._shape(["tc"], self.spec.veth(node), rate)          # others -> node

    @staticmethod
    def _shape(tc: list[str], device: str, rate: str | None) -> None:
        current = parse_tbf_rate_bits(
            run_checked([*tc, "-j", "qdisc", "show", "dev", device], timeout=CMD_TIMEOUT_S).stdout)
        if rate is not None:
            run_checked([*tc, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
                         "burst", TBF_BURST, "latency", TBF_LATENCY], timeout=CMD_TIMEOUT_S)
        elif current is not None:
            run_checked([*tc, "qdisc", "del", "dev", device, "root"], timeout=CMD_TIMEOUT_S)

    def set_mtu(self, node: str, mtu: int) -> None:
        if not MIN_NODE_MTU <= mtu <= MAX_NODE_MTU:
            raise UsageError(f"MTU for {node} must be {MIN_NODE_MTU}..{MAX_NODE_MTU}, got {mtu}")
        self._ip("-n", self.spec.netns(node), "link", "set", "eth0", "mtu", mtu)

    # -- ssh
    def start_sshd(self, node: str) -> SshEndpoint:
        """Start sshd inside `node` (once) and say how to log in as root with the test key."""
        check_prerequisites(need_sshd=True)
        daemon = f"sshd-{node}"
        if self.daemon_pids().get(daemon) is None:
            self._write_ssh_material()
            if not os.path.isdir("/run/sshd"):  # sshd's privilege separation directory
                os.makedirs("/run/sshd", mode=0o755)
                self._record("created_run_sshd", True)
            self._start_daemon(daemon, self.exec_argv(node, [
                _binary("sshd"), "-f", str(self.ssh_dir / "sshd_config"),
                "-o", f"PidFile={self._pid_file(daemon)}", "-E", str(self.log_dir / f"{daemon}.log")]))
            self._wait_for_port(self.spec.address(node), SSHD_PORT, daemon)
        return SshEndpoint(host=self.spec.address(node), port=SSHD_PORT, user="root",
                           key_path=str(self.ssh_dir / "id_ed25519"),
                           known_hosts_path=str(self.ssh_dir / "known_hosts"))

    def _record(self, key: str, value: object) -> None:
        self._state = self._read_state()
        self._state[key] = value
        self._save_state()

    def _write_ssh_material(self) -> None:
        ssh = self.ssh_dir
        for name, comment in (("host_ed25519", "devcluster-host"), ("id_ed25519", "devcluster-user")):
            if not (ssh / name).exists():
                run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                             "-f", str(ssh / name)], timeout=CMD_TIMEOUT_S)
        (ssh / "authorized_keys").write_text((ssh / "id_ed25519.pub").read_text())
        (ssh / "known_hosts").write_text(known_hosts_text(
            [self.spec.address(n) for n in self.spec.node_names], (ssh / "host_ed25519.pub").read_text()))
        (ssh / "sshd_config").write_text(sshd_config_text(str(ssh), str(self.slurm_conf)))

    def _wait_for_port(self, host: str, port: int, daemon: str) -> None:
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while True:
            try:
                with socket.create_connection((host, port), timeout=1.0):
                    return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ExternalCommandError(
                        f"dev cluster: {daemon} does not accept connections on {host}:{port}: {exc}\n"
                        f"{self._log_tails()}") from exc
                time.sleep(0.05)

    # -- down
    def down(self) -> list[str]:
        """Remove everything this cluster created; safe to repeat. Returns what was removed."""
        check_prerequisites()
        self._lock(0.0)
        try:
            return self._teardown()
        finally:
            self._unlock()

    def _teardown(self) -> list[str]:
        state = self._read_state()
        removed = []
        daemons = {name: pid for name, pid in self.daemon_pids().items() if pid is not None}
        survivors = _stop_pids(daemons.values())
        removed += [f"{name} (pid {pid})" for name, pid in daemons.items() if pid not in survivors]

        our_netns = self._existing_netns(state)
        # Job steps and ssh sessions outlive their daemons; they are ours by namespace.
        strays = [pid for netns in our_netns for pid in self._netns_pids(netns)]
        survivors += _stop_pids(strays, signal.SIGKILL)
        removed += [f"{len(strays)} processes in our namespaces"] if strays else []

        for point in mounts_under(Path("/proc/self/mountinfo").read_text(), str(self.base)):
            run(["umount", point], timeout=CMD_TIMEOUT_S)
            removed.append(f"mount {point}")
        # Deleting the root-side veth removes the pair at once; `ip netns del` alone frees
        # the peer asynchronously, which would race a quick `up`.
        for veth in self._existing_links(state, "veths", rf"{self.spec.prefix}veth[0-9]+"):
            run(["ip", "link", "del", veth], timeout=CMD_TIMEOUT_S)
            removed.append(f"veth {veth}")
        for netns in our_netns:
            run(["ip", "netns", "del", netns], timeout=CMD_TIMEOUT_S)
            removed.append(f"netns {netns}")
        if os.path.exists(f"/sys/class/net/{self.spec.bridge}"):
            run(["ip", "link", "del", self.spec.bridge], timeout=CMD_TIMEOUT_S)
            removed.append(f"bridge {self.spec.bridge}")

        null_device = os.stat("/dev/null").st_rdev
        for device in state.get("devices", []):
            if _is_fake_gpu(device, null_device):
                os.unlink(device)
                removed.append(device)
        if state.get("created_run_sshd"):
            try:
                os.rmdir("/run/sshd")
            except OSError:
                pass  # in use or no longer empty: not ours alone any more

        leftovers = self._leftovers(state, survivors)
        if not leftovers and (self.base / STATE_FILE).exists():
            shutil.rmtree(self.base)
            removed.append(str(self.base))
        if leftovers:
            raise ExternalCommandError(f"dev cluster teardown incomplete: {'; '.join(leftovers)}",
                                       hint=f"inspect and remove by hand; logs in {self.log_dir}")
        return removed

    def _existing_netns(self, state: Mapping) -> list[str]:
        pattern = re.compile(rf"{self.spec.prefix}n[0-9]+")
        try:
            present = set(os.listdir("/run/netns"))
        except FileNotFoundError:
            return []
        names = set(state.get("netns", [])) | {n for n in present if pattern.fullmatch(n)}
        return sorted(names & present)

    def _existing_links(self, state: Mapping, key: str, name_pattern: str) -> list[str]:
        pattern = re.compile(name_pattern)
        present = set(os.listdir("/sys/class/net"))
        names = set(state.get(key, [])) | {n for n in present if pattern.fullmatch(n)}
        return sorted(names & present)

    @staticmethod
    def _netns_pids(netns: str) -> list[int]:
        result = run(["ip", "netns", "pids", netns], timeout=CMD_TIMEOUT_S)
        return [int(p) for p in result.stdout.split() if p.isdigit()] if result.ok else []

    def _leftovers(self, state: Mapping, survivors: list[int]) -> list[str]:
        left = [f"pid {pid} survived SIGKILL" for pid in survivors]
        left += [f"netns {n}" for n in self._existing_netns(state)]
        left += [f"link {n}" for n in self._existing_links(
            state, "veths", rf"{self.spec.prefix}veth[0-9]+|{self.spec.bridge}")]
        left += [f"mount {p}" for p in mounts_under(Path("/proc/self/mountinfo").read_text(),
                                                     str(self.base))]
        return left

    # -- lock: one owner per base dir, so two test sessions cannot rebuild it under each other
    def _lock(self, wait_s: float) -> None:
        if self._lock_fd is not None:
            return
        lock_path = f"{self.base}.lock"  # beside base_dir: it must outlive `down`
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    os.close(fd)
                    raise UsageError(f"dev cluster {self.base} is in use by pid {holder} "
                                     f"(lock {lock_path})",
                                     hint="wait for that test session or command to finish") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None


def _is_fake_gpu(path: str, null_device: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null_device
