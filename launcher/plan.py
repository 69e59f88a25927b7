"""The job plan: what `trainctl submit` will ask Slurm for and run, decided without any I/O.

`plan_job(site, request, ...)` checks the request against the site and turns it into a
frozen `JobPlan`: the sbatch options, the NCCL/gloo environment, the gate policy numbers and
the program's argv. Rendering (`render.py`) and submission (`submit.py`) only read it, so a
dry run shows exactly what a real submission would do.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import PurePosixPath
from typing import NamedTuple

from trainctl.errors import UsageError
from trainctl.launcher.launchers import PYTHON_MODULE, Refusal, Translation, is_python, translate
from trainctl.records import record
from trainctl.site import PartitionConfig, SiteConfig, partition
from trainctl.validate import MAX_NODES, InvalidValue, check_checkpoint_pattern, check_slurm_signal, check_text

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
# Set by the job script from site keys and options, by rank-exec for each rank, or by Slurm:
# a site's launch.env may not set them (each has its own key, option or owner).
OWNED_ENV = {
    "NCCL_SOCKET_IFNAME": "socket_ifname", "GLOO_SOCKET_IFNAME": "socket_ifname", "NCCL_IB_HCA": "hca_ports",
    "NCCL_IB_DISABLE": "link_layer/hca_ports", "NCCL_IB_GID_INDEX": "roce_gid_index",
    "NCCL_DEBUG": "submit --nccl-debug", "CUDA_VISIBLE_DEVICES": "Slurm's GPU allocation",
    **{name: "rank-exec, per rank" for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")},
}

# srun's filename pattern for per-rank output: %N is the node's short name, %t the task id (the rank).
RANK_OUTPUT = "rank-%N-%t.out"
# PyTorch appends the rank to this prefix for each rank's flight recorder dump.
FLIGHT_RECORDER_PREFIX = "nccl-trace-rank-"
# Each rank's named pipe that asks its flight recorder for a dump now (flight_recorder_pipe).
FLIGHT_RECORDER_PIPE_PREFIX = "nccl-trace-pipe-rank-"
# sbatch --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME_LIMIT_RE = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}(:\d{1,2})?)?)$")


@record(kw_only=False)
class SubmitRequest:
    """What the user asked for on the command line (already typed, not yet checked)."""

    site_ref: str                        # --site as the nodes should see it: a name or a file path
    program: tuple[str, ...]             # SCRIPT ARGS..., or -m MODULE ARGS...
    nodes: int | None                    # None: the launcher's node count (torchrun --nnodes), or missing
    partition: str | None = None
    spare: int = 0
    min_nodes: int | None = None         # None: all --nodes must be healthy
    gpus_per_node: int | None = None     # None: the partition's GPUs per node
    time_limit: str | None = None
    job_name: str | None = None          # None: the script's file name without suffix
    nccl_debug: str | None = None
    retries: int | None = None           # None: the site's launch.retries
    signal: str | None = None            # None: the site's launch.signal; "": none
    sbatch: tuple[str, ...] = ()         # submit --sbatch: more sbatch options for this job, e.g. --qos=high
    checkpoints: str | None = None       # None: the site's launch.checkpoints; "": none
    watch: bool | None = None            # submit --watch/--no-watch; None: the site's watch.enabled
    alert_command: tuple[str, ...] | None = None   # submit --alert-command; None: the site's [alerts] command
    launcher: Translation | None = None  # the launcher the program was given with, translated (`with_launcher`)


class SbatchOption(NamedTuple):  # NamedTuple, not dataclass: a third of the import time
    """One sbatch option, `--name` or `--name=value` (value kept apart so it can be checked)."""

    name: str
    value: str | None = None

    @property
    def argv(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value}"


class EnvSetting(NamedTuple):
    """A variable the batch script exports, and why (rendered as a comment above it)."""

    name: str
    value: str
    why: str
    in_gate_dir: bool = False            # `value` is a path inside the job's gate directory

    @property
    def shown(self) -> str:
        return f"${{gate_dir}}/{self.value}" if self.in_gate_dir else self.value


@record(kw_only=False)
class JobPlan:
    site_name: str
    site_ref: str                        # passed to `--site` on the nodes
    partition: str
    nodes: int                           # nodes the program runs on
    spare: int                           # extra nodes allocated to absorb gate failures
    min_nodes: int                       # fewer healthy nodes than this: the job fails
    gpus_per_node: int
    tasks_per_node: int                  # one rank per GPU; one per node without GPUs
    bind: bool                           # rank-exec binds ranks to GPU/CPU/NUMA/NIC
    rank_output: bool                    # srun writes each rank's output to <gate dir>/RANK_OUTPUT
    release_unused: bool                 # after the gate, shrink the allocation to the chosen nodes
    retries: int                         # successors the job may submit around bad nodes (0: none)
    signal: str                          # sbatch --signal value ("" : none)
    checkpoints: str                     # the program's checkpoint files, a path or glob ("": none)
    watch: bool | None                   # the watch runs beside the training (submit --watch/--no-watch;
                                         # None: the site's watch.enabled where the job runs)
    job_name: str
    alert_command: tuple[str, ...]       # run on the job's detections, restarts, successor and end (empty: none)
    sbatch_options: tuple[SbatchOption, ...]
    environment: tuple[EnvSetting, ...]  # exported by the batch script, in this order
    trainctl: str                        # trainctl on the compute nodes
    program: tuple[str, ...]             # what each rank execs (after rank-exec's binding)
    launcher: str                        # what became of a launcher on the command line, one line ("": none)
    command: tuple[str, ...]             # the trainctl command line that produced this plan
    version: str

    @property
    def allocated_nodes(self) -> int:
        return self.nodes + self.spare

    def to_json(self) -> dict:
        return {"site": self.site_name, "partition": self.partition, "nodes": self.nodes,
                "spare": self.spare, "min_nodes": self.min_nodes, "gpus_per_node": self.gpus_per_node,
                "tasks_per_node": self.tasks_per_node, "job_name": self.job_name,
                "program": list(self.program), "launcher": self.launcher or None,
                "rank_output": f"${{gate_dir}}/{RANK_OUTPUT}" if self.rank_output else None,
                "release_unused": self.release_unused, "retries": self.retries,
                "signal": self.signal or None, "checkpoints": self.checkpoints or None, "watch": self.watch,
                "alert_command": list(self.alert_command) or None,
                "environment": {setting.name: setting.shown for setting in self.environment}}

    def to_document(self) -> dict:
        """Every field, for `trainctl job run --plan` (the job script carries it)."""
        document = {name: getattr(self, name) for name in JOB_PLAN_FIELDS}
        document["sbatch_options"] = [list(option) for option in self.sbatch_options]
        document["environment"] = [list(setting) for setting in self.environment]
        return {"format": PLAN_FORMAT} | document

    @classmethod
    def from_document(cls, document: dict) -> JobPlan:
        """The plan `to_document` wrote; UsageError naming what is wrong with any other."""
        if not isinstance(document, dict) or document.get("format") != PLAN_FORMAT:
            raise UsageError(f"not a trainctl job plan of format {PLAN_FORMAT}")
        document = {**LATER_FIELDS, **document}
        missing = [name for name in JOB_PLAN_FIELDS if name not in document]
        if missing:
            raise UsageError(f"job plan: missing field {missing[0]!r}")
        for name in JOB_PLAN_FIELDS:
            if not _plan_value_fits(JobPlan.__dataclass_fields__[name].type, document[name]):
                raise UsageError(f"job plan: {name}: expected {JobPlan.__dataclass_fields__[name].type}, "
                                 f"got {type(document[name]).__name__}")
        fields = {name: document[name] for name in JOB_PLAN_FIELDS}
        fields["sbatch_options"] = tuple(SbatchOption(*option) for option in document["sbatch_options"])
        fields["environment"] = tuple(EnvSetting(*setting) for setting in document["environment"])
        fields["program"], fields["command"] = tuple(fields["program"]), tuple(fields["command"])
        fields["alert_command"] = tuple(fields["alert_command"])
        return cls(**fields)


PLAN_FORMAT = 1
# Fields added to format 1 after its first release, with what a plan written before them meant:
# a job queued before an upgrade runs after it as it was submitted.
LATER_FIELDS = {"checkpoints": "", "watch": None, "launcher": "", "alert_command": []}
JOB_PLAN_FIELDS = tuple(JobPlan.__dataclass_fields__)
# the plan's JSON for each field's type (the annotations are strings: `from __future__ import annotations`)
_PLAIN = {"str": (str,), "bool": (bool,), "bool | None": (bool, type(None)), "int": (int,), "tuple[str, ...]": None}
_ROWS = {"tuple[SbatchOption, ...]": ((str,), (str, type(None))),
         "tuple[EnvSetting, ...]": ((str,), (str,), (str,), (bool,))}


def _plan_value_fits(hint: str, value: object) -> bool:
    """Whether `value` is what `to_document` writes for a field of type `hint` (exact types: a
    bool is not an int)."""
    if hint == "tuple[str, ...]":
        return isinstance(value, (list, tuple)) and all(type(item) is str for item in value)
    if hint in _PLAIN:
        return type(value) in _PLAIN[hint] and (hint != "int" or 0 <= value <= 1 << 31)   # type: ignore[operator]
    row = _ROWS[hint]
    return isinstance(value, (list, tuple)) and all(
        isinstance(item, (list, tuple)) and len(item) == len(row) and all(type(part) in kinds for part, kinds in zip(item, row))
        for item in value)


def plan_job(site: SiteConfig, request: SubmitRequest, *, node_trainctl: str, node_python: str,
             command: tuple[str, ...], version: str) -> JobPlan:
    """Check `request` against `site` and build the plan. Raises UsageError naming the bad value.

    `node_trainctl`/`node_python` are used where the site leaves `launch.trainctl`/`launch.python`
    empty (the caller passes its own paths: a shared filesystem puts them on the nodes too).
    """
    partition_name, part = partition(site, request.partition)
    request = with_launcher(request)
    request, kept = _launcher_counts(request, part, partition_name)
    _check_counts(request, part, partition_name)
    if not request.program or not request.program[0] or request.program == (PYTHON_MODULE,):
        raise UsageError("no SCRIPT given: put the program and its arguments after `--`")
    gpus = part.gpus_per_node if request.gpus_per_node is None else request.gpus_per_node
    time_limit = request.time_limit
    if time_limit is not None and not TIME_LIMIT_RE.match(time_limit):
        raise UsageError(f"--time {time_limit!r} is not a Slurm time limit "
                         "(minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    nccl_debug = request.nccl_debug.upper() if request.nccl_debug else None
    if nccl_debug is not None and nccl_debug not in NCCL_DEBUG_LEVELS:
        raise UsageError(f"--nccl-debug {request.nccl_debug!r}: "
                         f"expected one of {', '.join(NCCL_DEBUG_LEVELS)}")
    job_name = request.job_name if request.job_name is not None else _default_job_name(request)
    if not job_name:
        raise UsageError("--job-name is empty")

    retries = site.launch.retries if request.retries is None else request.retries
    if retries < 0:
        raise UsageError(f"--retries must be 0 or more, got {retries}")
    # The site's launch.signal was checked when the site loaded, and is blamed on that key there.
    signal = site.launch.signal if request.signal is None else check_signal(request.signal)
    checkpoints = site.launch.checkpoints if request.checkpoints is None else check_checkpoints(request.checkpoints)

    program = runnable(request.program, site.launch.python or node_python)
    return JobPlan(
        site_name=site.name, site_ref=request.site_ref, partition=partition_name,
        nodes=request.nodes, spare=request.spare,
        min_nodes=request.nodes if request.min_nodes is None else request.min_nodes,
        gpus_per_node=gpus, tasks_per_node=max(gpus, 1), bind=gpus > 0, rank_output=site.launch.rank_output,
        release_unused=site.launch.release_unused, retries=retries, signal=signal, checkpoints=checkpoints,
        watch=site.watch.enabled if request.watch is None else request.watch, job_name=job_name,
        alert_command=site.alerts.command if request.alert_command is None else request.alert_command,
        sbatch_options=sbatch_options(site, partition_name, request.nodes + request.spare, gpus,
                                      max(gpus, 1), job_name, time_limit)
        + job_sbatch_options(request.sbatch)
        + ((SbatchOption("--signal", signal),) if signal else ()),
        environment=(nccl_environment(part, nccl_debug)
                     + flight_recorder_environment(site.launch.flight_recorder_entries)
                     + site_environment(site)),
        trainctl=site.launch.trainctl or node_trainctl,
        program=program, launcher=launcher_note(request.launcher, program, kept) if request.launcher else "",
        command=command, version=version)


def runnable(program: tuple[str, ...], python: str) -> tuple[str, ...]:
    """A .py script or `-m MODULE` runs under `python`; any other program as it is."""
    script = program[0]
    return (python, *program) if script.endswith(".py") or script == PYTHON_MODULE else program


def with_launcher(request: SubmitRequest) -> SubmitRequest:
    """`request` with a launcher on its command line (torchrun, accelerate launch, deepspeed ...)
    translated into what trainctl runs itself (`trainctl.launcher.launchers`); UsageError, one
    line, for a launcher option trainctl cannot honour. Unchanged without a launcher, or when
    translated already."""
    if request.launcher is not None:
        return request
    translated = translate(request.program)
    if translated is None:
        return request
    if isinstance(translated, Refusal):
        raise UsageError(translated.reason)
    return dataclasses.replace(request, program=translated.program, launcher=translated)


def _launcher_counts(request: SubmitRequest, part: PartitionConfig,
                     partition_name: str) -> tuple[SubmitRequest, tuple[str, ...]]:
    """The launcher's node and rank counts as trainctl's own options, where the command line gave
    none; UsageError where it gave others. Also says, for each, which option it became."""
    launched = request.launcher
    if launched is None:
        return request, ()
    written, name = dict(launched.mapped), launched.launcher
    nodes, min_nodes, gpus = request.nodes, request.min_nodes, request.gpus_per_node
    kept = []

    def disagree(count: str, theirs: int, ours: str) -> UsageError:
        return UsageError(f"{name} {written[count]} and {ours} disagree ({theirs} against {ours.split()[-1]}): "
                          f"give one of them")

    if launched.nodes is not None:
        if nodes is not None and nodes != launched.nodes:
            raise disagree("nodes", launched.nodes, f"--nodes {nodes}")
        nodes = launched.nodes
        kept.append(f"{written['nodes']} as --nodes {nodes}")
    if launched.min_nodes is not None:
        if min_nodes is not None and min_nodes != launched.min_nodes:
            raise disagree("nodes", launched.min_nodes, f"--min-nodes {min_nodes}")
        min_nodes = launched.min_nodes
        kept[-1] += f" --min-nodes {min_nodes}"
    per_node, count = launched.ranks_per_node, "ranks_per_node"
    if launched.total_ranks is not None:
        count = "total_ranks"
        if nodes is None:
            raise UsageError(f"{name} {written[count]} counts the ranks of all nodes: give --nodes (or "
                             f"{name}'s own node count) to split them into ranks per node")
        if launched.total_ranks % nodes:
            raise UsageError(f"{name} {written[count]} does not split evenly over {nodes} nodes: trainctl runs "
                             "as many ranks on every node")
        per_node = launched.total_ranks // nodes
    if per_node is not None:
        asks = f"{name} {written[count]} asks for {per_node} ranks per node"
        if gpus is not None and max(gpus, 1) != per_node:
            raise disagree(count, per_node, f"--gpus-per-node {gpus}")
        if not part.gpus_per_node and per_node != 1:
            raise UsageError(f"{asks}; partition {partition_name} has no GPUs, and trainctl runs one rank per node "
                             "without GPUs: drop it")
        if per_node > part.gpus_per_node > 0:
            raise UsageError(f"{asks}; trainctl runs one per GPU and partition {partition_name} has "
                             f"{part.gpus_per_node} per node: drop it, or choose a partition with {per_node}")
        if gpus is None and part.gpus_per_node:
            gpus = per_node
        kept.append(f"{written[count]} as {per_node} rank{'s' if per_node > 1 else ''} per node")
    return dataclasses.replace(request, nodes=nodes, min_nodes=min_nodes, gpus_per_node=gpus), tuple(kept)


def launcher_note(launched: Translation, program: tuple[str, ...], kept: tuple[str, ...]) -> str:
    """The one line that says what trainctl does with the launcher: what each rank runs, which of
    its options were kept as trainctl's own, which were dropped and why."""
    import shlex

    from trainctl.text import printable   # here: a plan without a launcher does without its patterns

    line = f"{launched.launcher} translated, one rank per GPU started by trainctl: each runs {shlex.join(program)}"
    if kept:
        line += "; kept " + ", ".join(kept)
    reasons: dict[str, list[str]] = {}
    for dropped in launched.dropped:
        reasons.setdefault(dropped.reason, []).append(dropped.option)
    if reasons:
        line += "; dropped " + "; ".join(f"{', '.join(options)} ({reason})" for reason, options in reasons.items())
    return printable(line)


def _check_counts(request: SubmitRequest, part: PartitionConfig, partition_name: str) -> None:
    if request.nodes is None:
        raise UsageError("--nodes is missing: how many nodes the program runs on")
    if request.nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {request.nodes}")
    if request.spare < 0:
        raise UsageError(f"--spare must be 0 or more, got {request.spare}")
    if request.nodes + request.spare > MAX_NODES:
        raise UsageError(f"--nodes {request.nodes} + --spare {request.spare} is more than the {MAX_NODES} nodes "
                         "a Slurm hostlist holds")
    if request.min_nodes is not None and not 1 <= request.min_nodes <= request.nodes:
        raise UsageError(f"--min-nodes must be between 1 and --nodes ({request.nodes}), "
                         f"got {request.min_nodes}")
    gpus = request.gpus_per_node
    if gpus is not None and not 0 <= gpus <= part.gpus_per_node:
        raise UsageError(f"--gpus-per-node must be between 0 and {part.gpus_per_node} "
                         f"(partition {partition_name}), got {gpus}")


def check_checkpoints(value: str) -> str:
    """--checkpoints: a path or glob relative to the submit directory (`check_checkpoint_pattern`)."""
    try:
        return check_checkpoint_pattern(value)
    except InvalidValue as exc:
        raise UsageError(f"--checkpoints: {exc}") from None


def parse_alert_command(value: str) -> tuple[str, ...]:
    """--alert-command: the command's words, split as a shell would (never run by one); '' for none."""
    try:
        return tuple(shlex.split(check_text(value)))
    except (InvalidValue, ValueError) as exc:
        raise UsageError(f"--alert-command: {exc}") from None


def check_signal(value: str) -> str:
    """--signal as sbatch(1) takes it, or "" for none (see `trainctl.validate.check_slurm_signal`)."""
    try:
        return check_slurm_signal(value)
    except InvalidValue as exc:
        raise UsageError(f"--signal {value!r}: {exc}") from None


def _default_job_name(request: SubmitRequest) -> str:
    """The script's file name without suffix, or the module's last name (-m MODULE); the script's,
    not its Python's, where a translated launcher named the Python that runs it."""
    words = request.program[1:] if request.launcher and is_python(request.program[0]) else request.program
    if words[0] == PYTHON_MODULE and len(words) > 1:
        return words[1].rsplit(".", 1)[-1]
    name = PurePosixPath(words[0]).name
    return name.rsplit(".", 1)[0] if "." in name[1:] else name


def sbatch_options(site: SiteConfig, partition_name: str, allocated_nodes: int, gpus: int,
                   tasks_per_node: int, job_name: str, time_limit: str | None) -> tuple[SbatchOption, ...]:
    """The allocation: job name, partition, nodes (with spares), GPUs, time, account, extras."""
    # --ntasks-per-node makes Slurm allocate a CPU for every rank on every node.
    options = [SbatchOption("--job-name", job_name), SbatchOption("--partition", partition_name),
               SbatchOption("--nodes", str(allocated_nodes)),
               SbatchOption("--ntasks-per-node", str(tasks_per_node))]
    if gpus and site.slurm.gpu_request == "gpus-per-node":
        options.append(SbatchOption("--gpus-per-node", str(gpus)))
    elif gpus and site.slurm.gpu_request == "gres":
        options.append(SbatchOption("--gres", f"gpu:{gpus}"))
    if time_limit:
        options.append(SbatchOption("--time", time_limit))
    if site.slurm.account:
        options.append(SbatchOption("--account", site.slurm.account))
    if site.slurm.qos:
        options.append(SbatchOption("--qos", site.slurm.qos))
    for extra in site.slurm.extra_sbatch:
        if not extra.startswith("-"):
            raise UsageError(f"site {site.name!r}: slurm.extra_sbatch item {extra!r} is not an option "
                             "(expected e.g. '--exclusive' or '--constraint=ib')")
        name, sep, value = extra.partition("=")
        options.append(SbatchOption(name, value if sep else None))
    return tuple(options)


SBATCH_LONG_OPTION = re.compile(r"--[a-z][a-z0-9-]*")   # as sbatch(1) names its long options
# sbatch options trainctl sets itself, each with the submit option that sets it: `--sbatch` refuses them.
OWN_SBATCH_OPTIONS = {
    "--job-name": "--job-name", "--partition": "--partition", "--nodes": "--nodes and --spare",
    "--ntasks": "--gpus-per-node", "--ntasks-per-node": "--gpus-per-node", "--gpus-per-node": "--gpus-per-node",
    "--gpus": "--gpus-per-node", "--gres": "--gpus-per-node", "--time": "--time", "--signal": "--signal",
    "--chdir": "--chdir", "--no-kill": "nothing (every job keeps its allocation when a node fails)",
    "--exclude": "--retries (a successor excludes the bad nodes)", "--dependency": "--retries",
    "--output": "nothing (trainctl job show reads slurm-<jobid>.out)", "--error": "nothing",
}


def job_sbatch_options(options: tuple[str, ...]) -> tuple[SbatchOption, ...]:
    """`submit --sbatch` options: long sbatch options (`--qos=high`, `--exclusive`), after the site's
    own; one that trainctl sets itself is refused, naming the submit option for it."""
    parsed = []
    for option in options:
        name, sep, value = option.partition("=")
        if not SBATCH_LONG_OPTION.fullmatch(name):
            raise UsageError(f"--sbatch {option!r}: expected a long sbatch option, e.g. --qos=high or --exclusive")
        if name in OWN_SBATCH_OPTIONS:
            raise UsageError(f"--sbatch {option!r}: trainctl sets {name} itself; use {OWN_SBATCH_OPTIONS[name]}")
        parsed.append(SbatchOption(name, value if sep else None))
    return tuple(parsed)


def nccl_ib_hca(entries: tuple[str, ...]) -> str:
    """NCCL_IB_HCA for a list of `dev[:port]` entries: `=` makes NCCL match names exactly, so
    `mlx5_1` does not also select `mlx5_10` to `mlx5_19` (NCCL env.rst, NCCL_IB_HCA)."""
    return "=" + ",".join(entries)


def nccl_environment(part: PartitionConfig, nccl_debug: str | None) -> tuple[EnvSetting, ...]:
    """NCCL and gloo settings for the partition's fabric, each with the reason it is set."""
    env: list[EnvSetting] = []

    def export(name: str, value: str, why: str) -> None:
        env.append(EnvSetting(name, value, why))

    export("NCCL_SOCKET_IFNAME", part.socket_ifname, "bootstrap traffic on the site's socket interface")
    export("GLOO_SOCKET_IFNAME", part.socket_ifname, "gloo (CPU collectives) on the same interface")
    if part.hca_ports and part.link_layer != "none":
        # One list for every rank of a node (NVIDIA/nccl#1478); '=' matches names exactly, so
        # mlx5_1 does not also select mlx5_10 and mlx5_11 (NCCL env.rst, NCCL_IB_HCA).
        export("NCCL_IB_HCA", nccl_ib_hca(part.hca_ports),
               "the partition's compute HCA ports, the same list for every rank of a node "
               "(NVIDIA/nccl#1478): NCCL picks each GPU's nearest port itself"
               + ("; a node with one down runs without it (hca_port_down = drop-port)"
                  if part.hca_port_down == "drop-port" else ""))
    else:
        export("NCCL_IB_DISABLE", "1", "no HCA ports in this partition: NCCL uses sockets")
    if part.link_layer == "Ethernet" and part.roce_gid_index >= 0:
        export("NCCL_IB_GID_INDEX", str(part.roce_gid_index), "RoCE v2 GID of the site's GID table")
    if nccl_debug:
        export("NCCL_DEBUG", nccl_debug, "asked for with --nccl-debug")
    return tuple(env)


def site_environment(site: SiteConfig) -> tuple[EnvSetting, ...]:
    """The site's `[launch.env]` table (RoCE traffic class, UCX, container settings), in file order."""
    for name in site.launch.env:
        if name in OWNED_ENV or name.startswith("SLURM_"):
            owner = OWNED_ENV.get(name, "Slurm")
            raise UsageError(f"site {site.name!r}: launch.env.{name}: trainctl sets {name} itself "
                             f"(from {owner}); remove it from launch.env")
    return tuple(EnvSetting(name, value, f"site {site.name}: launch.env.{name}")
                 for name, value in site.launch.env.items())

def flight_recorder_environment(entries: int) -> tuple[EnvSetting, ...]:
    """PyTorch's flight recorder, dumped per rank into the gate directory on a collective timeout.

    Only the names the installed torch (2.13) reads first, because setting any other name it
    accepts prints a deprecation warning in every rank's log. PyTorch's rule
    (torch/csrc/distributed/c10d/Utils.hpp, getCvarString/getCvarInt/getCvarBool): each setting
    is a list of names, the current one first; any later name that is set is read but warns
    "Environment variable X is deprecated; use Y instead". The lists, in torch's own sources
    (https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/):
      - the ring buffer: {TORCH_FR_BUFFER_SIZE, TORCH_NCCL_TRACE_BUFFER_SIZE}, 2000 entries when
        neither is set (FlightRecorder.hpp, FlightRecorder(); the NCCL group's DumpPipe and
        dump-on-timeout read the same, ProcessGroupNCCL.hpp/.cpp). So 0 must be said to turn
        the recorder off: an unset variable leaves it on.
      - the dump file prefix: {TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE}
        (FlightRecorder.cpp, DebugInfoWriter::getWriter); PyTorch appends the rank.
      - dump on a collective timeout: {TORCH_NCCL_DUMP_ON_TIMEOUT} (ProcessGroupNCCL.hpp), and
        the dump-on-demand pipe: {TORCH_NCCL_DEBUG_INFO_PIPE_FILE} (ProcessGroupNCCL.cpp): these
        have no newer name in torch 2.13.
    The pipe (`flight_recorder_pipe`) is what the watch writes to on a hang, before it ends the step.
    """
    if entries <= 0:
        return (EnvSetting("TORCH_FR_BUFFER_SIZE", "0",
                           "flight recorder off (PyTorch keeps 2000 collectives when it is not set)"),)
    return (
        EnvSetting("TORCH_FR_BUFFER_SIZE", str(entries),
                   "flight recorder: the last collectives of each rank, kept in memory"),
        EnvSetting("TORCH_NCCL_DUMP_ON_TIMEOUT", "1",
                   "a collective that times out dumps them (`trainctl job show`)"),
        EnvSetting("TORCH_FR_DUMP_TEMP_FILE", FLIGHT_RECORDER_PREFIX,
                   "one dump per rank in the gate directory (PyTorch appends the rank)", in_gate_dir=True),
        EnvSetting("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", FLIGHT_RECORDER_PIPE_PREFIX,
                   "each rank's pipe (PyTorch appends <rank>.pipe): a line written into it dumps now "
                   "(the watch does, on a hang)", in_gate_dir=True),
    )


def flight_recorder_pipe(rank: int) -> str:
    """The name of global rank `rank`'s dump-on-demand pipe in the gate directory.

    PyTorch's rule (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, struct DumpPipe;
    https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp):
    when TORCH_NCCL_DEBUG_INFO_PIPE_FILE is set and the ring buffer is above 0 (TORCH_FR_BUFFER_SIZE),
    the rank itself unlinks and mkfifo()s `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe` and holds it open
    O_RDONLY|O_NONBLOCK. Only the default process group makes one, named by the global rank
    (ProcessGroupNCCL.cpp, HeartbeatMonitor::runLoop: `dumpPipe.emplace(pg_->globalRank(), ...)`).
    That thread polls it (every TORCH_NCCL_COORD_CHECK_MILSEC, 1 s by default, while
    TORCH_NCCL_DUMP_ON_TIMEOUT is on) and any bytes read start `dumpDebuggingInfo()` in the
    background, which writes the dump to the TEMP_FILE prefix + rank: FLIGHT_RECORDER_PREFIX + rank.
    PyTorch's own test writes "1\n" to it (test/distributed/test_c10d_nccl.py, test_dump_pipe).
    """
    return f"{FLIGHT_RECORDER_PIPE_PREFIX}{rank}.pipe"
