"""One validation layer for numbers and node names, used by the site loader, the command-line
options and everything that files something under a node's name.

TOML and `float()` both accept `nan`, `inf` and 1e308, and neither knows that a timeout must
be positive or a port at most 65535. A number that passed its type check still goes through
`check_number` here: finite, inside the range of its key, or one of the key's sentinel
values (`-1`: no limit, `0`: off). The error names the key, the value and what is allowed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import click

from trainctl.errors import UsageError

DAY_S = 86400.0


@dataclass(frozen=True)
class Bounds:
    low: float | None = None
    high: float | None = None
    low_open: bool = False          # the low end itself is not allowed (a timeout of 0)
    sentinels: tuple[float, ...] = ()  # values outside the range that mean something
    choices: tuple[float, ...] = ()    # the only values allowed (besides the sentinels)

    def allows(self, value: float) -> bool:
        if value in self.sentinels:
            return True
        if self.choices:
            return value in self.choices
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        if self.choices:
            allowed = "one of " + ", ".join(f"{v:g}" for v in self.choices)
        elif self.low is not None and self.high is not None:
            allowed = (f"more than {self.low:g} and at most {self.high:g}" if self.low_open
                       else f"between {self.low:g} and {self.high:g}")
        elif self.low is not None:
            allowed = f"more than {self.low:g}" if self.low_open else f"{self.low:g} or more"
        elif self.high is not None:
            allowed = f"at most {self.high:g}"
        else:
            allowed = "a finite number"
        if self.sentinels:
            allowed += " (or " + ", ".join(f"{v:g}" for v in self.sentinels) + ")"
        return allowed


FINITE = Bounds()
TIMEOUT = Bounds(0, DAY_S, low_open=True)
FRACTION = Bounds(0, 1, low_open=True)
AMOUNT = Bounds(0, 1e6)

# Site keys, as dotted paths; `*` stands for any partition name. A numeric key not listed here
# (a key added later) must still be finite.
SITE_BOUNDS: dict[str, Bounds] = {
    "gate.straggler_factor": FRACTION,
    "gate.busbw_floor_gbps": AMOUNT,
    "gate.fabric_iters": Bounds(1, 10_000),
    "gate.fabric_timeout_s": TIMEOUT,
    "gate.probe_timeout_s": Bounds(0, 3600, low_open=True),
    "gate.xid_window_hours": Bounds(0, 24 * 365 * 10),
    "gate.min_available_memory_gib": AMOUNT,
    "gate.min_shm_gib": AMOUNT,
    "gate.max_defunct_processes": Bounds(0, 1e9, sentinels=(-1,)),
    "gate.max_load_per_cpu": AMOUNT,
    "gate.fabric_passes": Bounds(1, 1000),
    "gate.compute_budget_s": Bounds(0, 600, low_open=True),
    "gate.compute_factor": FRACTION,
    "gate.compute_floor_tflops": AMOUNT,
    "gate.compute_floor_copy_gbps": AMOUNT,
    # dcgmi diag -r: run levels 1-4 (DCGM user guide, "Run Levels"); 0: never
    "gate.dcgm_diag_level": Bounds(choices=(1, 2, 3, 4), sentinels=(0,)),
    "launch.flight_recorder_entries": Bounds(0, 1e7),
    "sweep.node_timeout_s": TIMEOUT,
    "sweep.fanout": Bounds(1, 4096),
    "sweep.ssh_port": Bounds(1, 65535),
    "sweep.keep_days": Bounds(0, 100 * 365),
    "partitions.*.gpus_per_node": Bounds(0, 1024),
    "partitions.*.port_rate_gbps": AMOUNT,
    # InfiniBand MTUs are 256-4096 bytes in powers of two (IBTA spec, `ibv_devinfo` active_mtu).
    "partitions.*.ib_mtu": Bounds(choices=(256, 512, 1024, 2048, 4096), sentinels=(0,)),
    # Linux: IPv4 needs at least 68; 65536 is the largest any driver takes (loopback).
    "partitions.*.netdev_mtu": Bounds(68, 65536, sentinels=(0,)),
    "partitions.*.roce_gid_index": Bounds(0, 1023, sentinels=(-1,)),
    "partitions.*.cpus_per_node": Bounds(0, 65536),
}


class InvalidValue(ValueError):
    """`str()` is the reason, without the key (the caller adds where the value came from)."""


def check_number(value: float, bounds: Bounds = FINITE) -> float:
    """`value` if it is finite and inside `bounds`; else InvalidValue saying what is allowed."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValue(f"got {value!r}; expected {bounds.describe()}")
    if not bounds.allows(value):
        raise InvalidValue(f"got {value!r}; expected {bounds.describe()}")
    return value


def check_text(value: str) -> str:
    """A string that can become a command-line argument: no NUL (argv is C strings). Other control
    characters are allowed and escaped wherever they are printed (`trainctl.text.printable`)."""
    if "\x00" in value:
        raise InvalidValue("contains a NUL character, which no command line can carry")
    return value


# slurm.conf(5), NodeName: "Typically this would be the string that "/bin/hostname -s" returns.
# It may also be the fully qualified domain name ... or any valid domain name associated with the
# host through the host database (/etc/hosts) or DNS" (https://slurm.schedmd.com/slurm.conf.html#OPT_NodeName).
# So: a host name (RFC 1123: letters, digits, '-', dots between labels), plus '_', which Slurm
# sites use and Slurm accepts; at most 253 characters, the longest DNS name (RFC 1035 2.3.4, 255
# octets on the wire). Never a separator, `..`, NUL, a leading '-' (an option to scontrol) or any
# hostlist character ([]^,): such a name cannot stand in SLURM_JOB_NODELIST either.
NODE_NAME_MAX = 253
_NODE_NAME = re.compile(r"[A-Za-z0-9_]+(?:[.-]+[A-Za-z0-9_]+)*")


def check_node_name(name: str, source: str) -> str:
    """`name` if it can be a Slurm node name, and so a file or directory name under a directory
    of trainctl's (`gate node --dir`, the slurm-hook's state directory, a snapshot); else a
    UsageError naming `source` (SLURMD_NODENAME, the host name, a hostlist)."""
    if len(name) <= NODE_NAME_MAX and ".." not in name and _NODE_NAME.fullmatch(name):
        return name
    from trainctl.text import printable

    shown = printable(name[:80]) + ("..." if len(name) > 80 else "")
    raise UsageError(f"{source} '{shown}' is not a node name: Slurm node names are host names (letters, digits, "
                     f"'-', '_', '.', at most {NODE_NAME_MAX} characters; slurm.conf(5) NodeName), never a path")


def site_bounds(key: str) -> Bounds:
    """The bounds of a dotted site key (`partitions.gpu.ib_mtu` -> `partitions.*.ib_mtu`)."""
    parts = key.split(".")
    if parts[0] == "partitions" and len(parts) == 3:
        key = f"partitions.*.{parts[2]}"
    return SITE_BOUNDS.get(key, FINITE)


class Number(click.ParamType):
    """A command-line number that is finite and inside `bounds` (Click's FloatRange lets nan through)."""

    def __init__(self, kind: type = float, bounds: Bounds = FINITE):
        self.kind = kind
        self.bounds = bounds
        self.name = "integer" if kind is int else "number"

    def convert(self, value, param, ctx):
        if isinstance(value, self.kind) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = self.kind(str(value).strip())
            except (ValueError, OverflowError):
                self.fail(f"{value!r} is not {'an integer' if self.kind is int else 'a number'}", param, ctx)
        try:
            return check_number(number, self.bounds)
        except InvalidValue as exc:
            self.fail(str(exc), param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        return "INTEGER" if self.kind is int else "SECONDS" if self.bounds is TIMEOUT else "NUMBER"
