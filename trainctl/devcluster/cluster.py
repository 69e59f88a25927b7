"""A real multi-node Slurm cluster on one machine, built from Linux namespaces (needs root).

Layout of one instance (every kernel object name starts with `ClusterSpec.prefix`, "tc"):

- bridge `tcbr0` in the root namespace carries the controller address <subnet>.254;
- node N is a network namespace `tcnN` whose `eth0` (<subnet>.N, its own MTU) pairs with
  `tcvethN` on the bridge, plus persistent UTS and mount namespaces: `hostname` says nodeN
  (nodeN.<domain> with `ClusterSpec.domain`: NodeHostname differs from NodeName)
  and a sysfs of its own makes /sys/class/net show the node's interfaces, not the host's;
- a private munged and slurmctld run in the root namespace, one `slurmd -N nodeN` per node
  inside that node's namespaces; fake GPUs are char devices /dev/tcgpuK (/dev/null's numbers);
- everything else (configs, keys, logs, pid files, Slurm state) lives in `base_dir`, with a
  state file listing what was created, so `down()` (or the next `up()` after a crash)
  removes exactly that: it kills only the PIDs of its own pid files and processes inside
  its own namespaces.

This module is the entry point (`DevCluster`); each concern has a module of its own:
spec.py (spec, file layout, state file), network.py (bridge, namespaces, shaping),
slurm_daemons.py (configs, munged, slurmctld, slurmd), sshd.py, replay.py (per-node
commands), processes.py (prerequisites, daemons, PIDs). The names below are re-exported
so callers import everything from here.
"""

from __future__ import annotations

import dataclasses

import fcntl
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Callable

from trainctl.devcluster import network, replay, slurm_daemons, slurm_root, sshd
from trainctl.devcluster.network import (mounts_under, netns_pids, parse_link_mtu,
                                         parse_tbf_rate_bits)
from trainctl.devcluster.processes import (check_prerequisites, daemon_pids,
                                           missing_prerequisites, pid_alive, stop_pids)
from trainctl.devcluster.replay import task_prolog_text
from trainctl.devcluster.slurm_daemons import (gres_conf_text, parse_sinfo_node_states,
                                               slurm_conf_text)
from trainctl.devcluster.spec import (DEFAULT_BASE_DIR, STATE_FILE, ClusterSpec,
                                      ClusterStatus, Layout, NodeStatus, StateFile, load_spec,
                                      node_range, spec_for_instance)
from trainctl.devcluster.sshd import (SshEndpoint, known_hosts_text,
                                      sshd_config_text)
from trainctl.errors import ExternalCommandError, TrainctlError, UsageError

__all__ = [
    "DEFAULT_BASE_DIR", "STATE_FILE", "ClusterSpec", "ClusterStatus", "DevCluster", "Layout",
    "NodeStatus", "SshEndpoint", "StateFile", "check_prerequisites", "daemon_pids",
    "gres_conf_text", "known_hosts_text", "load_spec", "missing_prerequisites", "mounts_under",
    "netns_pids", "node_range", "parse_link_mtu", "parse_sinfo_node_states",
    "parse_tbf_rate_bits", "pid_alive", "slurm_conf_text", "spec_for_instance",
    "sshd_config_text", "stop_pids", "task_prolog_text",
]


class DevCluster:
    """Build, inspect, change and remove one dev cluster (everything that touches the system needs root)."""

    def __init__(self, spec: ClusterSpec | None = None):
        self.spec = spec or ClusterSpec()
        self.spec.validate()
        self.base = Layout(self.spec).base
        self.state = StateFile(self.base)
        self._lock_fd: int | None = None

    @property
    def layout(self) -> Layout:
        # from the current spec: a test may restart the cluster with another (extra slurm.conf lines)
        return Layout(self.spec)

    @classmethod
    def attach(cls, base_dir: str = DEFAULT_BASE_DIR) -> DevCluster:
        """The cluster whose state file is in `base_dir` (started by another process, say)."""
        return cls(load_spec(base_dir))

    # -- paths and environment
    @property
    def slurm_conf(self) -> Path:
        return self.layout.slurm_conf

    @property
    def run_dir(self) -> Path:
        return self.layout.run_dir

    @property
    def log_dir(self) -> Path:
        return self.layout.log_dir

    @property
    def ssh_dir(self) -> Path:
        return self.layout.ssh_dir

    def node_bin_dir(self, node: str) -> Path:
        """Drop `node`'s own commands here: its Slurm tasks find them first on PATH, other nodes'
        tasks never (TaskProlog + a bind mount in the node's mount namespace; see replay.py)."""
        return self.layout.node_bin_dir(node)

    def exec_argv(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run inside `node`'s network, UTS and mount namespaces, in the caller's cwd."""
        return self.layout.exec_argv(node, argv)

    def slurmd_argv(self, node: str) -> list[str]:
        """The command that starts `node`'s slurmd (the cluster's Slurm, inside the node)."""
        return slurm_daemons.slurmd_argv(self.layout, node)

    def env(self) -> dict[str, str]:
        """Environment additions for Slurm clients (sinfo, srun, sbatch ...) of this cluster:
        with a Slurm root, PATH starts with the wrappers that run the root's clients."""
        env = {"SLURM_CONF": str(self.slurm_conf)}
        if self.spec.uses_root:
            env["PATH"] = f"{self.layout.slurm_bin_dir}:{os.environ.get('PATH', os.defpath)}"
        return env

    def client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env()}

    # -- up
    def up(self, progress: Callable[[str], None] | None = None, *, lock_wait_s: float = 0.0) -> float:
        """Start the cluster from scratch and wait until every node is idle; returns seconds taken.

        Leftovers of an earlier run in the same base dir are removed first. On any failure
        everything created so far is removed again and the error carries the daemons' log tails.
        """
        say = progress or (lambda _message: None)
        check_prerequisites(need_accounting=self.spec.accounting)
        if self.spec.uses_root:
            slurm_root.check_root(self.spec.slurm, self.spec.root_fs)
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
        spec = self.spec
        for sub in ("state", "log", "run", "ns", "ssh", *(f"spool/{n}" for n in spec.node_names)):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)  # non-root Slurm clients must reach the munge socket
        self.state.start(spec)

        network.create_network(spec, self.state)
        if spec.uses_root:  # before the node namespaces, which inherit it
            slurm_root.assemble_root(self.layout)
        network.create_node_namespaces(self.layout)
        replay.mount_node_bin_dirs(self.layout)
        if spec.uses_root:
            for node in spec.node_names:
                slurm_root.mount_node_root(self.layout, node)
            slurm_root.write_client_wrappers(self.layout)
            say(f"Slurm {spec.slurm} from {spec.root_fs}, assembled at {self.layout.root_dir}")
        say(f"network: {spec.nodes} namespaces on {spec.bridge} "
            f"({spec.subnet}.0/24) after {time.monotonic() - start:.2f} s")
        slurm_daemons.create_fake_gpus(spec, self.state)
        slurm_daemons.write_configs(self.layout)
        slurm_daemons.start_slurm(self.layout)
        say(f"daemons started{' (with accounting: MariaDB, slurmdbd)' if spec.accounting else ''} after "
            f"{time.monotonic() - start:.2f} s; waiting for nodes to be idle")
        self.wait_idle(max(1.0, spec.up_timeout_s - (time.monotonic() - start)))

    def _refuse_foreign_base_dir(self) -> None:
        """`down` deletes base_dir: never adopt a directory we did not make."""
        if self.base.is_dir() and any(self.base.iterdir()) and not self.state.exists():
            raise UsageError(f"{self.base} exists, is not empty and holds no dev cluster state",
                             hint="pick another --base-dir; it would be deleted by `down`")

    # -- waiting and inspection
    def daemon_pids(self) -> dict[str, int | None]:
        """{munged, slurmctld, slurmd-nodeN, sshd-nodeN: PID}, None where not running.

        PIDs come from our pid files and count only while that process is alive and ours.
        """
        return daemon_pids(self.run_dir, self.base)

    def wait_idle(self, timeout_s: float = 30.0) -> float:
        """Wait until sinfo shows every node `idle` (not `idle*`); returns the seconds waited."""
        return slurm_daemons.wait_idle(self.layout, self.client_env(), timeout_s)

    def status(self) -> ClusterStatus:
        """What is running now, read back from the system (not from the spec)."""
        states = slurm_daemons.slurm_states(self.layout, self.client_env())
        pids = self.daemon_pids()
        nodes = []
        for node in self.spec.node_names:
            mtu, rate = network.link_status(self.spec, node)
            nodes.append(NodeStatus(
                name=node, address=self.spec.address(node), netns=self.spec.netns(node),
                mtu=mtu, rate_bit_s=rate, slurm_state=states.get(node),
                slurmd_alive=pids.get(f"slurmd-{node}") is not None,
                sshd_alive=pids.get(f"sshd-{node}") is not None))
        return ClusterStatus(
            base_dir=str(self.base), slurm_conf=str(self.slurm_conf),
            controller_address=self.spec.controller_address, slurmctld_port=self.spec.slurmctld_port,
            slurmctld_alive=pids.get("slurmctld") is not None,
            munged_alive=pids.get("munged") is not None, nodes=nodes)

    # -- live changes
    def set_rate(self, node: str, rate: str | None, rail: int = 0) -> None:
        """Limit `node`'s traffic on `rail` in both directions to `rate` (tc tbf), or remove the limit."""
        network.set_rate(self.spec, node, rate, rail)

    def set_rails(self, rails: int) -> None:
        """Add or remove data rails on the running cluster: `rails` interfaces per node after it."""
        wanted = dataclasses.replace(self.spec, rails=rails)
        wanted.validate()
        if rails > self.spec.rails:
            network.add_rails(wanted, self.state, range(self.spec.rails, rails))
        else:
            network.remove_rails(self.spec, range(rails, self.spec.rails))
        self.spec = wanted
        self.state.set("spec", wanted.to_dict())

    def set_mtu(self, node: str, mtu: int) -> None:
        network.set_mtu(self.spec, node, mtu)

    def start_sshd(self, node: str) -> SshEndpoint:
        """Start sshd inside `node` (once) and say how to log in as root with the test key."""
        return sshd.start_sshd(self.layout, self.state, node)

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
        state = self.state.read()
        removed = []
        daemons = {name: pid for name, pid in self.daemon_pids().items() if pid is not None}
        survivors = stop_pids(daemons.values())
        removed += [f"{name} (pid {pid})" for name, pid in daemons.items() if pid not in survivors]

        # Job steps and ssh sessions outlive their daemons; they are ours by namespace.
        strays = [pid for netns in network.existing_netns(self.spec, state) for pid in netns_pids(netns)]
        survivors += stop_pids(strays, signal.SIGKILL)
        removed += [f"{len(strays)} processes in our namespaces"] if strays else []

        removed += network.remove_network(self.spec, state, self.base)
        removed += slurm_daemons.remove_fake_gpus(state)
        sshd.remove_run_sshd(state)

        leftovers = [f"pid {pid} survived SIGKILL" for pid in survivors]
        leftovers += network.network_leftovers(self.spec, state, self.base)
        if not leftovers and self.state.exists():
            shutil.rmtree(self.base)
            removed.append(str(self.base))
        if leftovers:
            raise ExternalCommandError(f"dev cluster teardown incomplete: {'; '.join(leftovers)}",
                                       hint=f"inspect and remove by hand; logs in {self.log_dir}")
        return removed

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
