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

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainctl.errors import ConfigError, UsageError

BUILTIN_SITE_DIR = Path(__file__).resolve().parent.parent / "site_configs"
# Editable installs and the source tree keep the samples beside the package folders.
if not BUILTIN_SITE_DIR.is_dir():
    BUILTIN_SITE_DIR = Path(__file__).resolve().parent.parent / "site-configs"

REQUIRED = dataclasses.MISSING


def doc(text: str, default: Any = REQUIRED, **kwargs) -> Any:
    """A config field with a one-line description (shown in errors and `site show`)."""
    if default is REQUIRED:
        return field(metadata={"doc": text}, **kwargs)
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for list defaults")
    return field(default=default, metadata={"doc": text}, **kwargs)


@dataclass(frozen=True, kw_only=True)
class SlurmConfig:
    gpu_request: Literal["gpus-per-node", "gres", "none"] = doc(
        "how this Slurm takes a GPU request: --gpus-per-node=N, --gres=gpu:N, or none", "gpus-per-node")
    account: str = doc("default --account (empty: none)", "")
    qos: str = doc("default --qos (empty: none)", "")
    extra_sbatch: tuple[str, ...] = doc("extra sbatch options, one per item, e.g. '--exclusive'", ())


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    checks: tuple[str, ...] = doc("health checks the gate runs ('all' or check names)", ("all",))
    straggler_factor: float = doc("a node slower than factor x its peers' median busbw is a straggler", 0.7)
    busbw_floor_gbps: float = doc("absolute floor for inter-node busbw in GB/s (0: none)", 0.0)
    fabric_sizes: tuple[str, ...] = doc("all_reduce message sizes of the fabric test", ("1M", "64M"))
    fabric_iters: int = doc("timed all_reduce iterations per size and pair", 5)
    fabric_timeout_s: float = doc("deadline for the whole fabric test", 120.0)
    probe_timeout_s: float = doc("deadline for each health probe (nvidia-smi, ibstat ...)", 20.0)
    xid_window_hours: float = doc("Xid events older than this are ignored (0: since boot)", 0.0)
    min_available_memory_gib: float = doc("a node with less memory available fails (0: no minimum)", 0.0)
    min_shm_gib: float = doc("/dev/shm smaller than this fails: NCCL and dataloaders use it (0: no minimum)", 0.0)
    max_defunct_processes: int = doc("more zombie processes than this warn (-1: no limit)", -1)
    max_load_per_cpu: float = doc("1-minute load per CPU above this warns: someone else is busy (0: no limit)", 0.0)


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    trainctl: str = doc("trainctl on the compute nodes, run by the job script for the gate and rank-exec "
                        "(empty: the path of the trainctl running submit, for a shared filesystem)", "")
    python: str = doc("interpreter that runs a SCRIPT ending in .py "
                      "(empty: the path of the Python running submit, for a shared filesystem)", "")


@dataclass(frozen=True, kw_only=True)
class PartitionConfig:
    gpus_per_node: int = doc("GPUs per node")
    gpu_model: str = doc("product name as nvidia-smi prints it (empty: do not check)", "")
    nvlink_type: str = doc("link type expected between every GPU pair in topo -m, e.g. NV18 (empty: any)", "")
    link_layer: Literal["InfiniBand", "Ethernet", "none"] = doc(
        "data-network link layer of the HCA ports: InfiniBand, Ethernet (RoCE), or none", "none")
    hca_ports: tuple[str, ...] = doc("HCA ports for NCCL, 'mlx5_0:1' style, in GPU order", ())
    port_rate_gbps: float = doc("expected rate of every HCA port in Gb/s (0: same as its peers)", 0.0)
    ib_mtu: int = doc("expected IB active MTU in bytes (0: do not check)", 0)
    netdev_mtu: int = doc("expected MTU of the data netdevs / RoCE interfaces (0: do not check)", 0)
    data_interfaces: tuple[str, ...] = doc(
        "netdevs that carry training traffic (RoCE ports' interfaces): netdev_mtu and link state "
        "are checked on these (empty: none)", ())
    socket_ifname: str = doc("interface for NCCL/gloo bootstrap traffic (NCCL_SOCKET_IFNAME)")
    roce_gid_index: int = doc("NCCL_IB_GID_INDEX for RoCE (-1: let NCCL choose)", -1)
    nic_per_gpu: bool = doc("each GPU should have a NIC closer than SYS (warn otherwise)", False)
    cpus_per_node: int = doc("CPU cores per node to hand out to ranks (0: what Slurm gives)", 0)
    gpu_persistence: bool = doc("persistence mode must be on", False)


@dataclass(frozen=True, kw_only=True)
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
    partitions: dict[str, PartitionConfig] = doc("partition name -> hardware")


@dataclass(frozen=True, kw_only=True)
class LoadedSite:
    config: SiteConfig
    path: Path
    explicit_keys: frozenset[str]  # dotted key paths set in the file; the rest are defaults

    def source_of(self, key_path: str) -> str:
        from_file = key_path in self.explicit_keys or any(
            key.startswith(key_path + ".") for key in self.explicit_keys)
        return str(self.path) if from_file else "default"


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
        for path in sorted(directory.glob("*.toml")) if directory.is_dir() else ():
            found[path.stem] = path
    return found


def resolve_site(name_or_file: str, dirs: list[Path] | None = None) -> Path:
    """A site name (searched in `dirs`) or a path to a .toml file."""
    if name_or_file.endswith(".toml") or os.sep in name_or_file:
        path = Path(name_or_file)
        if not path.is_file():
            raise UsageError(f"site file {path} does not exist")
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
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    explicit: set[str] = set()
    config = _build(SiteConfig, raw, path, "", explicit)
    if config.default_partition not in config.partitions:
        raise ConfigError(f"{path}: default_partition = {config.default_partition!r} is not among "
                          f"[partitions.*]: {', '.join(sorted(config.partitions))}")
    return LoadedSite(config=config, path=path, explicit_keys=frozenset(explicit))


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
        else:
            rows.append((key, value))
    return rows


def _build(cls: type, table: Any, path: Path, key_path: str, explicit: set[str]) -> Any:
    where = key_path.rstrip(".") or "top level"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
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


def _convert(hint: Any, value: Any, path: Path, key: str, explicit: set[str]) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, key + ".", explicit)
    if origin is dict:
        _, item_hint = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {key}: expected a table, got {_toml_type(value)}")
        return {k: _convert(item_hint, v, path, f"{key}.{k}", explicit) for k, v in value.items()}
    explicit.add(key)
    if origin is tuple:
        (item_hint, _) = typing.get_args(hint)
        if not isinstance(value, list) or not all(isinstance(v, item_hint) for v in value):
            raise ConfigError(f"{path}: {key}: expected an array of {item_hint.__name__}s, "
                              f"got {value!r}")
        return tuple(value)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{path}: {key}: expected one of {', '.join(map(repr, choices))}, "
                              f"got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{path}: {key}: expected {_type_name(hint)}, got {_toml_type(value)} {value!r}")
    return value


def _type_name(hint: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def _toml_type(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)
