"""Site configs: strict TOML files that say what a site's partitions are and how to gate them.

A site name resolves to one file, searched in these directories (later wins):

    1. the samples shipped with trainctl (package data `trainctl/site_configs`)
    2. /etc/trainctl/site-configs                      (system)
    3. ~/.config/trainctl/site-configs                 (user; $XDG_CONFIG_HOME respected)
    4. ./site-configs                                  (the current directory)
    5. $TRAINCTL_SITE_DIR                              (last, wins)

Loading is strict: an unknown key, a wrong type or a missing required key is a
`ConfigError` naming the file, the key path, and the valid keys with their defaults.
"""

import dataclasses
import functools
import os
import re
import stat
import tomllib
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from trainctl.errors import ConfigError, UsageError
from trainctl.records import record
from trainctl.validate import (InvalidValue, check_checkpoint_pattern, check_number, check_slurm_signal, check_text,
                               shown, site_bounds)

BUILTIN_SITE_DIR = Path(__file__).resolve().parent / "site_configs"
# Editable installs and the source tree keep the samples in the top-level site-configs/.
if not BUILTIN_SITE_DIR.is_dir():
    BUILTIN_SITE_DIR = Path(__file__).resolve().parent.parent / "site-configs"

REQUIRED = dataclasses.MISSING
# POSIX: portable environment variable names are letters, digits and underscores, not starting
# with a digit (the only names every shell can `export`).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def doc(text: str, default: Any = REQUIRED, **kwargs) -> Any:
    """A config field with a one-line description (shown in errors and `site show`)."""
    if default is REQUIRED:
        return field(metadata={"doc": text}, **kwargs)
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for list defaults")
    return field(default=default, metadata={"doc": text}, **kwargs)


@record
class SlurmConfig:
    gpu_request: Literal["gpus-per-node", "gres", "none"] = doc(
        "how this Slurm takes a GPU request: --gpus-per-node=N, --gres=gpu:N, or none", "gpus-per-node")
    account: str = doc("default --account (empty: none)", "")
    qos: str = doc("default --qos (empty: none)", "")
    extra_sbatch: tuple[str, ...] = doc("extra sbatch options, one per item, e.g. '--exclusive'", ())


@record
class GateConfig:
    checks: tuple[str, ...] = doc("health checks the gate runs ('all' or check names)", ("all",))
    straggler_factor: float = doc("best busbw below factor x the healthy pairs' makes a straggler", 0.7)
    busbw_floor_gbps: float = doc("absolute floor for inter-node busbw in GB/s (0: none)", 0.0)
    fabric_sizes: tuple[str, ...] = doc("all_reduce message sizes of the fabric test", ("1M", "64M"))
    fabric_iters: int = doc("timed all_reduce iterations per size and pair, per pass", 5)
    fabric_passes: int = doc("times the pairing rounds run over, interleaved (load hits all pairs)", 1)
    fabric_timeout_s: float = doc("deadline for the whole fabric test", 120.0)
    probe_timeout_s: float = doc("deadline for each health probe (nvidia-smi, ibstat ...)", 20.0)
    compute: bool = doc("run the per-GPU compute test (matmul TFLOPS, device-copy GB/s) in the gate", True)
    compute_budget_s: float = doc("time per GPU for the compute test, warm-up included (GPUs run at once)", 1.5)
    compute_factor: float = doc("a GPU below factor x the median of the job's GPUs of its model is slow", 0.8)
    compute_floor_tflops: float = doc("matmul TFLOPS below this fail whatever the peers do (0: none)", 0.0)
    compute_floor_copy_gbps: float = doc("device-copy GB/s below this fail whatever the peers do (0: none)", 0.0)
    compute_in_turns: bool = doc("nodes measure one after another: only where nodes share processors "
                                 "(the dev cluster, oversubscribed VMs)", False)
    unknown: Literal["exclude", "keep"] = doc(
        "a node whose checks could not decide (unknown): exclude it (reported apart from failures) "
        "or keep it (its unknown checks listed in the report)", "exclude")
    xid_window_hours: float = doc("Xid events older than this are ignored (0: since boot)", 0.0)
    min_available_memory_gib: float = doc("a node with less memory available fails (0: no minimum)", 0.0)
    min_shm_gib: float = doc("/dev/shm smaller than this fails: NCCL and dataloaders use it (0: no minimum)", 0.0)
    max_defunct_processes: int = doc("more zombie processes than this warn (-1: no limit)", -1)
    max_load_per_cpu: float = doc("1-minute load per CPU above this warns: someone else is busy (0: no limit)", 0.0)
    max_retired_pages: int = doc("a GPU with more retired pages (single + double bit) fails (-1: no limit)", -1)
    min_free_disk_gib: dict[str, float] = doc(
        "path -> GiB that must be free there, e.g. {\"/\" = 50, \"/scratch\" = 500}; each path is measured "
        "in the node's snapshot (empty: only a full filesystem fails)", default_factory=dict)
    pcie_below_max: Literal["fail", "warn"] = doc(
        "a GPU or HCA whose PCIe link runs below its maximum speed or width: fail or warn", "fail")
    odd_node_out: Literal["warn", "fail"] = doc(
        "a node whose driver, CUDA, VBIOS, HCA firmware, OFED, kernel, torch or NCCL version differs from "
        "the job's (or partition's) majority: warn or fail", "warn")
    pinned_versions: dict[str, str] = doc(
        "versions every node must have, e.g. driver = '565.57.01', nccl = '2.21.5' (keys as node.versions "
        "names them)", default_factory=dict)
    dcgm_diag_level: int = doc("run `dcgmi diag -r LEVEL -j` where dcgmi exists (0: never; 1 takes seconds, "
                               "2 minutes)", 0)
    drain_on: tuple[Literal["fail", "unknown", "fabric"], ...] = doc(
        "drain the nodes the gate excluded for these: fail (a node check failed), unknown (a check could "
        "not decide), fabric (the fabric test excluded it); needs Slurm operator rights in the job "
        "(empty: off)", ())


@record
class SweepConfig:
    db: str = doc("sweep history database (SQLite), used by sweep, report, drain and resume",
                  "/var/lib/trainctl/sweeps.db")
    checks: tuple[str, ...] = doc("node checks a sweep runs ('all' or check names/families)", ("all",))
    node_timeout_s: float = doc("a node whose checks take longer is recorded as timed out", 120.0)
    fanout: int = doc("SSH sweeps and resume re-checks: nodes checked at once", 32)
    ssh_user: str = doc("SSH sweeps and resume re-checks log in as this user", "root")
    ssh_port: int = doc("sshd port on the nodes", 22)
    ssh_key: str = doc("private key for SSH (empty: ssh-agent and ~/.ssh/id_*)", "")
    known_hosts: str = doc("host keys are verified against this file (empty: ~/.ssh/known_hosts)", "")
    node_python: str = doc("Python with trainctl on the nodes (empty: the one running the sweep)", "")
    keep_days: float = doc("history kept: at the end of each sweep, sweeps older than this are removed with "
                           "their rows (0: keep everything; a drain trainctl still holds keeps its sweep)", 0.0)


@record
class FleetConfig:
    journal_dir: str = doc(
        "directory every job's supervisor copies its finished journal into (<job id>.jsonl), and the sweep "
        "history folds in at each sweep or `trainctl history ingest`; on a shared filesystem, writable by "
        "every user, sticky (mode 1777) (empty: off, jobs' verdicts stay in their own directories)", "")
    lemon_strikes: float = doc("a node with at least this many strikes of one failure family within lemon_days "
                               "is a lemon", 3.0)
    lemon_days: float = doc("days the lemon rule looks back", 7.0)
    exclusion_strike: float = doc("strikes for each job whose gate left the node out", 1.0)
    detection_strike: float = doc("strikes for each job whose watch named the node (slow, sick, hung, lost)", 1.0)
    sweep_strike: float = doc("strikes for each nightly sweep the node failed", 1.0)
    forgive_after_jobs: int = doc(
        "a node's strikes of one failure family stop counting once it has served this many jobs since that "
        "family's last strike; a new strike of the family counts them all again (0: only lemon_days ages them)", 10)
    lemon_min_users: int = doc(
        "a family's job strikes make a node a lemon only when the jobs of at least this many distinct users struck "
        "it (or a failed sweep of the node agrees): one user's jobs, which that user may have failed or forged "
        "themselves, never make the fleet shun a node for everyone (1: one user's jobs are enough, for a "
        "single-team site)", 2)
    lemons_file: str = doc(
        "the lemons, as JSON, rewritten by every sweep and `trainctl history ingest`: what submit reads "
        "(on a shared filesystem; SQLite's history is not to be read over one) (empty: submit reads sweep.db)",
        "")
    submit_excludes_lemons: bool = doc(
        "submit adds the current lemons to the job's --exclude, from lemons_file (else sweep.db); per job: "
        "submit --keep-lemons", False)
    unverified_journals: bool = doc(
        "where Slurm's accounting cannot vouch for a journal's job (sacct fails: the site keeps no accounting, "
        "or slurmdbd does not answer), fold it in anyway, checked only by its file's owner and the nodes the "
        "history knows; false: refuse it with one line, and fold it in at a later ingest that sacct answers", False)


# The automatic drains the breaker bounds, by the rule that asks for them.
DRAIN_RULES = ("gate", "watch", "sweep", "lemons")


@record
class BreakerConfig:
    max_drains: int = doc("automatic drains trainctl makes per window, all rules and jobs of the site together; "
                          "past it the breaker trips and no rule drains until `trainctl breaker reset` (0: none)", 3)
    window_s: float = doc("the sliding window max_drains counts over, in seconds", 3600.0)
    max_share: float = doc("share of a partition's nodes trainctl may hold drained at once (at least one node)",
                           0.1)
    shadow: tuple[Literal["gate", "watch", "sweep", "lemons"], ...] = doc(
        "rules that only record in the history what they would drain, and drain nothing: gate and watch "
        "([gate] drain_on), sweep (`trainctl drain`), lemons (`trainctl drain --lemons`)", ())


@record
class LaunchConfig:
    trainctl: str = doc("trainctl on the compute nodes, run by the job script for the gate and rank-exec "
                        "(empty: the path of the trainctl running submit, for a shared filesystem)", "")
    python: str = doc("interpreter that runs a SCRIPT ending in .py "
                      "(empty: the path of the Python running submit, for a shared filesystem)", "")
    env: dict[str, str] = doc("variables the job script exports for every step, e.g. NCCL_IB_TC = \"106\" "
                              "(RoCE traffic class, UCX or container settings); names trainctl sets itself "
                              "are refused", default_factory=dict)
    rank_output: bool = doc("each rank's stdout and stderr in its own file, "
                            "<gate dir>/rank-<node>-<rank>.out (srun --output), for `trainctl job show`; "
                            "false: all in slurm-<id>.out", True)
    release_unused: bool = doc(
        "after the gate, shrink the job to the nodes it runs on (scontrol update NodeList=): excluded and "
        "surplus spare nodes go back to the pool while the job runs; needs Slurm to let the job's user "
        "shrink the job (docs: For Slurm admins, Release unused nodes)", True)
    flight_recorder_entries: int = doc(
        "PyTorch's flight recorder: collectives kept per rank (TORCH_FR_BUFFER_SIZE), dumped "
        "into the gate dir when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT), and on demand through "
        "each rank's pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) when the watch finds the job hung, before it "
        "ends the step; 0: off (TORCH_FR_BUFFER_SIZE=0: PyTorch keeps 2000 when it is not set)", 2000)
    retries: int = doc(
        "default for submit --retries: times a job submits its successor, excluding the bad nodes, when the "
        "gate finds too few healthy nodes or a node is lost during training (0: never; docs: Submitting "
        "jobs, Requeue around bad nodes)", 0)
    signal: str = doc(
        "default for submit --signal, [R:]SIG[@SECONDS]: Slurm sends SIG to the job's steps SECONDS before "
        "its time limit (#SBATCH --signal), so the program can checkpoint; empty: none", "")
    checkpoints: str = doc(
        "default for submit --checkpoints: the program's own checkpoint files or directories, a path or glob "
        "relative to the submit directory (e.g. 'snapshot.pt', 'checkpoints/*.ckpt', 'out/checkpoint-*'); a "
        "regular file written after the training step started is a checkpoint seen, for goodput and lost work "
        "(`trainctl job show`), and a directory once its newest time has held for a second; "
        "empty: only $TRAINCTL_CHECKPOINT_FILE and progress.checkpoint() count", "")


@record
class WatchConfig:
    enabled: bool = doc("watch the training: a node agent on each training node and the supervisor's "
                        "detectors (docs: Watching the training)", True)
    poll_s: float = doc("how often the supervisor reads the node agents' files; less often where one read of them all "
                        "would take more than 5 % of this (large jobs: about 0.1 ms a node)", 1.0)
    agent_write_s: float = doc("how often each node agent rewrites its file", 1.0)
    check_interval_s: float = doc("how often each node agent re-runs `checks` (the first run is the baseline)",
                                  30.0)
    checks: tuple[str, ...] = doc(
        "node checks the agents re-run during training; one that passed at the baseline and fails now "
        "condemns its node", ("gpu.xid", "gpu.ecc", "gpu.row_remap", "gpu.reset", "ib.ports", "ib.counters",
                              "nvlink.counters"))
    slow_factor: float = doc("the job's step time (median over slow_window_s) above factor x its own "
                             "baseline is a slowdown", 1.5)
    slow_window_s: float = doc("the recent window the slowdown is judged over: a spike shorter than half "
                               "of it is not one", 60.0)
    baseline_window_s: float = doc("how far back, before the recent window, the baseline step time reaches",
                                   600.0)
    warmup_s: float = doc("the first seconds of training are left out of the baseline (compilation, "
                          "caches)", 120.0)
    hang_floor_s: float = doc("no rank finishing a step for this long is a hang (longer when hang_steps "
                              "x the step time is); must exceed the program's longest checkpoint save", 600.0)
    hang_steps: float = doc("the hang timeout in steps of the job's own baseline step time, when longer "
                            "than hang_floor_s", 20.0)
    startup_s: float = doc(
        "no rank reporting its first step this long after the training step started is a hang (with "
        "startup_per_node_s x the nodes added), recorded with every rank's stack once a step and not acted "
        "on (it names no node); judged only where steps are counted without the program's help (auto_steps, "
        "not turned off by the job) or a rank has reported something; it covers the program's import, the "
        "rendezvous and loading a checkpoint from shared storage; 0: not judged", 600.0)
    startup_per_node_s: float = doc(
        "added to startup_s per training node: the rendezvous and the communicators' set-up grow with the "
        "job (0.5 s a node: about 17 minutes more at 2,048 nodes)", 0.5)
    pay_factor: float = doc(
        "a slowdown no evidence pins on a node stops the job for the gate only when the time it would save "
        "over the time left exceeds this many times the restart's price (its measured restart, else "
        "restart_cost_s, plus the work since the last checkpoint), and then once the slowdown has cost the "
        "training that price itself (a phase that passes first stops nothing); otherwise training goes on; "
        "0: stop for the gate at once on any such slowdown", 3.0)
    restart_cost_s: float = doc(
        "a restart's time, from the decision to stop to the first step again, for a job that has not "
        "restarted yet (set it high: a job's own restart replaces it once measured)", 600.0)
    agent_silence_s: float = doc("a node agent whose file is older than this is silent (its node hung, "
                                 "when the job stalls too); more than agent_write_s + poll_s", 60.0)
    checkpoint_wait_s: float = doc("after a slowdown or a sick node, how long the ranks get to checkpoint "
                                   "(launch.signal) before the step ends", 120.0)
    dump_wait_s: float = doc("after a hang, how long the agents get to record every rank's stack "
                             "(py-spy dump)", 30.0)
    end_grace_s: float = doc("after SIGTERM to the training step, before scancel; again before SIGKILL", 10.0)
    max_restarts: int = doc("restarts inside the allocation after a detection; then the job goes on in a "
                            "successor job excluding the named nodes (max_successors)", 3)
    max_successors: int = doc("after a detection the job cannot restart around inside its allocation (no "
                              "spare held, fewer than --min-nodes left, or max_restarts used up): successor "
                              "jobs the chain may submit, each excluding the named nodes, where submit "
                              "--retries allows fewer; 0: the job ends", 2)
    auto_steps: bool = doc("count each optimizer step of a Python rank as a training step, and see each "
                           "of its saves (torch.save to a path, torch.distributed.checkpoint, safetensors, "
                           "Lightning), with no change to the program (torch's global optimizer step hook, "
                           "and the save functions, hooked when the program imports them); steps the "
                           "program reports itself win; a job turns it off with "
                           "TRAINCTL_AUTO_STEPS=0 in the environment of `trainctl submit` "
                           "(docs: Watching the training)", True)
    hold_spares: int = doc("healthy nodes the gate did not choose that the job keeps through training, "
                           "to restart on after a detection (each costs node-hours while held; "
                           "launch.release_unused gives back the rest)", 0)


@record
class MetricsConfig:
    textfile_dir: str = doc(
        "node_exporter's textfile collector directory on the batch hosts (its --collector.textfile.directory), "
        "writable by the jobs' users: each job's supervisor keeps trainctl-job-<id>.prom there, rewritten at "
        "every event and watch poll, and removes it when the job ends (docs: Site administration, Job "
        "metrics) (empty: off)", "")


@record
class AlertsConfig:
    command: tuple[str, ...] = doc(
        "a command, as its argv, that each job runs on its detections, restarts, successor and end, with "
        "the event as one JSON object on stdin, e.g. ['/opt/site/trainctl-slack', 'https://hooks.slack.com/...']; "
        "per job: submit --alert-command (empty: none)", ())
    timeout_s: float = doc("the alert command is killed after this long; the job never waits for it", 10.0)


@record
class PartitionConfig:
    gpus_per_node: int = doc("GPUs per node")
    gpu_model: str = doc("product name as nvidia-smi prints it (empty: do not check)", "")
    nvlink_type: str = doc("link type expected between every GPU pair in topo -m, e.g. NV18 (empty: any)", "")
    nvlink: Literal["auto", "required", "none"] = doc(
        "required: a GPU without NVLink fails; none: PCIe cards, NVLink checks are skipped; "
        "auto: judge what nvidia-smi shows", "auto")
    nvlink_links_per_gpu: int = doc("NVLinks per GPU in `nvlink -s`, e.g. 18 on H100 SXM (0: do not check)", 0)
    nvlink_speed_gbps: float = doc("speed of every NVLink in GB/s as `nvlink -s` prints it, e.g. 26.562 "
                                   "(0: that of its peers)", 0.0)
    link_layer: Literal["InfiniBand", "Ethernet", "none"] = doc(
        "data-network link layer of the HCA ports: InfiniBand, Ethernet (RoCE), or none", "none")
    hca_ports: tuple[str, ...] = doc("the compute HCA ports, 'mlx5_0:1' style: every rank of a node gets "
                                     "this one list as NCCL_IB_HCA", ())
    hca_port_down: Literal["exclude-node", "drop-port"] = doc(
        "a node with one of hca_ports down: exclude-node (the gate leaves it out) or drop-port (it runs "
        "with that port left out of its NCCL_IB_HCA)", "exclude-node")
    port_rate_gbps: float = doc("expected rate of every HCA port in Gb/s (0: same as its peers)", 0.0)
    ib_mtu: int = doc("expected IB active MTU in bytes (0: do not check)", 0)
    netdev_mtu: int = doc("expected MTU of the data netdevs / RoCE interfaces (0: do not check)", 0)
    data_interfaces: tuple[str, ...] = doc(
        "netdevs that carry training traffic (RoCE ports' interfaces): netdev_mtu and link state "
        "are checked on these (empty: none)", ())
    socket_ifname: str = doc("interface for NCCL/gloo bootstrap traffic (NCCL_SOCKET_IFNAME)")
    roce_gid_index: int = doc("NCCL_IB_GID_INDEX for RoCE (-1: let NCCL choose)", -1)
    fabric_rails: tuple[str, ...] = doc(
        "the fabric test's rails, rail r = entry r: with GPUs the HCA port of GPU r ('mlx5_5:1', given "
        "to GPU r's rank as NCCL_IB_HCA), without GPUs a netdev gloo binds to ('eth1'); each rail is "
        "measured on its own, local rank r with rail r of the other nodes (fewer than 2: one rail, "
        "over socket_ifname)", ())
    nic_per_gpu: bool = doc("each GPU should have a NIC closer than SYS (warn otherwise)", False)
    cpus_per_node: int = doc("CPU cores per node to hand out to ranks (0: what Slurm gives)", 0)
    numa_nodes: int = doc("NUMA nodes with CPUs, as lscpu shows them (0: do not check)", 0)
    gpu_persistence: bool = doc("persistence mode must be on", False)


@record
class SiteConfig:
    name: str = doc("site name, as given to --site")
    description: str = doc("one line about the site", "")
    login_host: str = doc("[user@]host for `submit --remote` (empty: none)", "")
    default_partition: str = doc("partition used when --partition is not given")
    probes: dict[str, str] = doc("probe binary paths, e.g. nvidia-smi = '/usr/bin/nvidia-smi'",
                                 default_factory=dict)
    slurm: SlurmConfig = doc("Slurm specifics", default_factory=SlurmConfig)
    gate: GateConfig = doc("health gate policy", default_factory=GateConfig)
    launch: LaunchConfig = doc("what the job script runs on the compute nodes", default_factory=LaunchConfig)
    sweep: SweepConfig = doc("nightly sweeps: history database, checks, SSH access", default_factory=SweepConfig)
    watch: WatchConfig = doc("watching the training once it runs", default_factory=WatchConfig)
    fleet: FleetConfig = doc("fleet memory: jobs' verdicts in the sweep history, lemons", default_factory=FleetConfig)
    breaker: BreakerConfig = doc("the cap on trainctl's automatic drains", default_factory=BreakerConfig)
    metrics: MetricsConfig = doc("each running job's state for Prometheus", default_factory=MetricsConfig)
    alerts: AlertsConfig = doc("a command run on each job's detections, restarts, successors and ends",
                               default_factory=AlertsConfig)
    partitions: dict[str, PartitionConfig] = doc("partition name -> hardware")


@record
class LoadedSite:
    config: SiteConfig
    path: Path
    explicit_keys: frozenset[str]  # dotted key paths set in the file; the rest are defaults

    def source_of(self, key_path: str) -> str:
        return str(self.path) if key_path in self._set_in_file else "default"

    @functools.cached_property
    def _set_in_file(self) -> frozenset[str]:
        """Every key set in the file and every table above one: one lookup per key, so `site show`
        stays linear in the number of partitions."""
        paths = set()
        for key in self.explicit_keys:
            parts = key.split(".")
            paths.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        return frozenset(paths)


def site_dirs(environ: typing.Mapping[str, str] = os.environ, cwd: Path | None = None) -> list[Path]:
    """Directories searched for site files, lowest precedence first."""
    config_home = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    dirs = [BUILTIN_SITE_DIR, Path("/etc/trainctl/site-configs"), config_home / "trainctl" / "site-configs",
            (cwd or Path.cwd()) / "site-configs"]
    if environ.get("TRAINCTL_SITE_DIR"):
        dirs.append(Path(environ["TRAINCTL_SITE_DIR"]))
    return dirs


def available_sites(dirs: list[Path]) -> dict[str, Path]:
    """Site name -> the file that wins for it."""
    found: dict[str, Path] = {}
    for directory in dirs:
        try:  # a directory this user may not enter holds no site for them
            paths = sorted(directory.glob("*.toml")) if directory.is_dir() else []
        except OSError:
            paths = []
        for path in paths:
            found[path.stem] = path
    return found


def resolve_site(name_or_file: str, dirs: list[Path] | None = None) -> Path:
    """A site name (searched in `dirs`) or a path to a .toml file."""
    if name_or_file.endswith(".toml") or os.sep in name_or_file:
        path = Path(name_or_file)
        try:
            is_file = stat.S_ISREG(path.stat().st_mode)
        except FileNotFoundError:
            is_file = False
        except OSError as exc:  # a directory on the way that this user may not enter
            raise UsageError(f"site file {path}: cannot read: {exc.strerror}") from exc
        if not is_file:
            raise UsageError(f"site file {path} does not exist" if not path.exists() else
                             f"site file {path} is not a regular file")
        return path
    sites = available_sites(dirs if dirs is not None else site_dirs())
    if name_or_file not in sites:
        known = ", ".join(sorted(sites)) or "none"
        raise UsageError(f"unknown site {name_or_file!r} (known: {known}; "
                         f"searched {', '.join(str(d) for d in (dirs or site_dirs()))})")
    return sites[name_or_file]


def load_site(name_or_file: str, dirs: list[Path] | None = None) -> LoadedSite:
    path = resolve_site(name_or_file, dirs)
    try:
        # utf-8-sig: one BOM at the start is allowed; TOML files are "a valid UTF-8 encoded Unicode
        # document", which its maintainers read as allowing an optional BOM (toml-lang/toml#437).
        raw = tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML files are UTF-8 (toml.io spec)
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 (byte {exc.start})") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    explicit: set[str] = set()
    config = _build(SiteConfig, raw, path, "", explicit)
    for name in config.launch.env:
        if not ENV_NAME.fullmatch(name):
            raise ConfigError(f"{path}: launch.env.{name}: not an environment variable name "
                              "(letters, digits and _, not starting with a digit)")
    try:
        check_slurm_signal(config.launch.signal)
    except InvalidValue as exc:
        raise ConfigError(f"{path}: launch.signal = {config.launch.signal!r}: {exc}") from None
    try:
        check_checkpoint_pattern(config.launch.checkpoints)
    except InvalidValue as exc:
        raise ConfigError(f"{path}: launch.checkpoints: {exc}") from None
    contradiction = contradicting_keys(config)
    if contradiction:
        raise ConfigError(f"{path}: {contradiction}")
    if config.default_partition not in config.partitions:
        raise ConfigError(f"{path}: default_partition = {config.default_partition!r} is not among "
                          f"[partitions.*]: {', '.join(sorted(config.partitions))}")
    return LoadedSite(config=config, path=path, explicit_keys=frozenset(explicit))


def contradicting_keys(config: SiteConfig) -> str | None:
    """Keys whose values, each in range, cannot hold together; why, or None."""
    watch = config.watch
    if watch.agent_silence_s <= watch.agent_write_s + watch.poll_s:
        # a healthy agent's file is up to agent_write_s old, and read up to poll_s later
        return (f"watch.agent_silence_s = {watch.agent_silence_s:g} must be more than watch.agent_write_s "
                f"({watch.agent_write_s:g}) + watch.poll_s ({watch.poll_s:g}): a healthy node's agent would "
                "read as silent")
    return None


def partition(site: SiteConfig, name: str | None) -> tuple[str, PartitionConfig]:
    chosen = name or site.default_partition
    if chosen not in site.partitions:
        raise UsageError(f"site {site.name!r} has no partition {chosen!r} "
                         f"(known: {', '.join(sorted(site.partitions))})")
    return chosen, site.partitions[chosen]


def describe_fields(cls: type) -> list[tuple[str, str, str]]:
    """(key, default, description) for each field of a config table."""
    rows = []
    for f in dataclasses.fields(cls):
        if f.default is not REQUIRED:
            default = repr(f.default)
        elif f.default_factory is not REQUIRED:  # type: ignore[misc]
            default = "{...}" if dataclasses.is_dataclass(f.default_factory) else "{}"
        else:
            default = "required"
        rows.append((f.name, default, f.metadata.get("doc", "")))
    return rows


def flatten(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted key paths and leaf values of a loaded config, for `site show`."""
    rows: list[tuple[str, Any]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            rows += flatten(value, key + ".")
        elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
            for sub, item in value.items():
                rows += flatten(item, f"{key}.{sub}.")
        elif isinstance(value, dict) and value:   # a table of plain values: one row each, own source
            rows += [(f"{key}.{sub}", item) for sub, item in value.items()]
        else:
            rows.append((key, value))
    return rows


def _build(cls: type, table: Any, path: Path, key_path: str, explicit: set[str]) -> Any:
    where = key_path.rstrip(".") or "top level"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where}: expected a table, got {type(table).__name__}")
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        valid = "; ".join(f"{k} (default {d})" for k, d, _ in describe_fields(cls))
        raise ConfigError(f"{path}: {key_path}{unknown[0]}: unknown key; valid keys in {where}: {valid}")
    values = {}
    for name, f in fields.items():
        full = f"{key_path}{name}"
        if name not in table:
            if f.default is REQUIRED and f.default_factory is REQUIRED:  # type: ignore[misc]
                valid = "; ".join(f"{k} (default {d})" for k, d, _ in describe_fields(cls))
                raise ConfigError(f"{path}: {full}: required key is missing ({f.metadata['doc']}); "
                                  f"valid keys in {where}: {valid}")
            continue
        values[name] = _convert(hints[name], table[name], path, full, explicit)
    return cls(**values)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """Resolved once per table class, not once per partition (10,000 partitions load in seconds)."""
    return typing.get_type_hints(cls)


def _convert(hint: Any, value: Any, path: Path, key: str, explicit: set[str]) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, key + ".", explicit)
    if origin is dict:
        _, item_hint = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {key}: expected a table, got {_toml_type(value)}")
        return {_site_text(path, f"{key} name", k): _convert(item_hint, v, path, f"{key}.{k}", explicit)
                for k, v in value.items()}
    explicit.add(key)
    if origin is tuple:
        (item_hint, _) = typing.get_args(hint)
        choices = typing.get_args(item_hint) if typing.get_origin(item_hint) is Literal else None
        expected = (f"an array of {', '.join(map(repr, choices))}" if choices is not None
                    else f"an array of {item_hint.__name__}s")
        if not isinstance(value, list):
            raise ConfigError(f"{path}: {key}: expected {expected}, got {_toml_type(value)} {shown(value)}")
        bad = next((index for index, item in enumerate(value)
                    if (item not in choices if choices is not None else not isinstance(item, item_hint))), None)
        if bad is not None:   # the one bad item, not the whole array (which may hold 200,000)
            raise ConfigError(f"{path}: {key}: expected {expected}, got {shown(value[bad])} at index {bad}"
                              + (f" of {len(value)}" if len(value) > 1 else ""))
        return tuple(_site_text(path, key, v) if isinstance(v, str) else v for v in value)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{path}: {key}: expected one of {', '.join(map(repr, choices))}, "
                              f"got {shown(value)}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{path}: {key}: expected {_type_name(hint)}, got {_toml_type(value)} {shown(value)}")
    if hint in (int, float):
        try:
            return check_number(value, site_bounds(key))
        except InvalidValue as exc:
            raise ConfigError(f"{path}: {key}: {exc}") from exc
    return _site_text(path, key, value) if isinstance(value, str) else value


def _site_text(path: Path, key: str, value: str) -> str:
    try:
        return check_text(value)
    except InvalidValue as exc:
        raise ConfigError(f"{path}: {key}: {exc}") from exc  # the error funnel escapes control characters


def _type_name(hint: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def _toml_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)
