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
import signal
import unicodedata

import click

from trainctl.errors import UsageError
from trainctl.records import record

DAY_S = 86400.0
# Slurm assumes a host range larger than 64K hosts is an error (src/common/hostlist.c: MAX_RANGE,
# "64K Hosts"); trainctl holds a whole hostlist, and any count of nodes, to that.
MAX_NODES = 64 * 1024


@record(kw_only=False)
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


PROBE_TIMEOUT_MIN_S = 0.1

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
    # Below a tenth of a second no probe (nvidia-smi, ibstat) can even start: every check would be unknown.
    "gate.probe_timeout_s": Bounds(PROBE_TIMEOUT_MIN_S, 3600),
    "gate.xid_window_hours": Bounds(0, 24 * 365 * 10),
    "gate.min_available_memory_gib": AMOUNT,
    "gate.min_shm_gib": AMOUNT,
    "gate.max_defunct_processes": Bounds(0, 1e9, sentinels=(-1,)),
    # NVIDIA retires at most a few hundred pages per GPU (DBE/SBE page retirement; row remapping on A100+).
    "gate.max_retired_pages": Bounds(0, 1e6, sentinels=(-1,)),
    "gate.min_free_disk_gib.*": AMOUNT,
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
    "fleet.lemon_strikes": Bounds(0, 1e6, low_open=True),
    "fleet.lemon_days": Bounds(0, 100 * 365, low_open=True),
    "fleet.exclusion_strike": Bounds(0, 1e6),
    "fleet.detection_strike": Bounds(0, 1e6),
    "fleet.sweep_strike": Bounds(0, 1e6),
    "fleet.forgive_after_jobs": Bounds(0, 1e6),
    "breaker.max_drains": Bounds(0, MAX_NODES),
    "breaker.window_s": Bounds(0, 30 * DAY_S, low_open=True),
    "breaker.max_share": FRACTION,
    "watch.poll_s": Bounds(0.1, 3600),
    "watch.agent_write_s": Bounds(0.1, 3600),
    "watch.check_interval_s": Bounds(1, DAY_S),
    "watch.slow_factor": Bounds(1, 1000, low_open=True),
    "watch.slow_window_s": TIMEOUT,
    "watch.baseline_window_s": TIMEOUT,
    "watch.warmup_s": Bounds(0, DAY_S),
    "watch.hang_floor_s": TIMEOUT,
    "watch.hang_steps": Bounds(0, 1e6),
    "watch.agent_silence_s": TIMEOUT,
    "watch.startup_s": Bounds(0, DAY_S),
    "watch.startup_per_node_s": Bounds(0, 3600),
    "watch.pay_factor": Bounds(0, 1e6),
    "watch.restart_cost_s": Bounds(0, DAY_S),
    "watch.checkpoint_wait_s": Bounds(0, DAY_S),
    "watch.dump_wait_s": Bounds(0, 3600),
    "watch.end_grace_s": Bounds(1, 3600),
    "alerts.timeout_s": Bounds(0.1, 600),
    "watch.max_restarts": Bounds(0, 1000),
    "watch.max_successors": Bounds(0, 1000),
    "watch.hold_spares": Bounds(0, MAX_NODES),
    "partitions.*.gpus_per_node": Bounds(0, 1024),
    "partitions.*.port_rate_gbps": AMOUNT,
    # InfiniBand MTUs are 256-4096 bytes in powers of two (IBTA spec, `ibv_devinfo` active_mtu).
    "partitions.*.ib_mtu": Bounds(choices=(256, 512, 1024, 2048, 4096), sentinels=(0,)),
    # Linux: IPv4 needs at least 68; 65536 is the largest any driver takes (loopback).
    "partitions.*.netdev_mtu": Bounds(68, 65536, sentinels=(0,)),
    "partitions.*.roce_gid_index": Bounds(0, 1023, sentinels=(-1,)),
    "partitions.*.cpus_per_node": Bounds(0, 65536),
    # Linux: MAX_NUMNODES is 1 << NODES_SHIFT, and NODES_SHIFT is at most 10 (mm/Kconfig, x86 Kconfig).
    "partitions.*.numa_nodes": Bounds(0, 1024),
    # nvml.h NVML_NVLINK_MAX_LINKS is 18 (H100, B200); room for parts to come, none with thousands.
    "partitions.*.nvlink_links_per_gpu": Bounds(0, 64),
    # `nvidia-smi nvlink -s` prints each link's GB/s: 25-50 on NVLink 3-5.
    "partitions.*.nvlink_speed_gbps": Bounds(0, 1000),
}


class InvalidValue(ValueError):
    """`str()` is the reason, without the key (the caller adds where the value came from)."""


SHOWN_VALUE_CHARS = 120   # of a bad value in an error line: one bad item of a huge array is not the array


def shown(value: object) -> str:
    """`repr(value)`, cut to SHOWN_VALUE_CHARS with the size of what was cut said."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    size = f"{len(value)} items" if isinstance(value, (list, tuple, dict)) else f"{len(text)} characters"
    return f"{text[:SHOWN_VALUE_CHARS]}... ({size})"


def not_a_regular_file(path: str) -> str | None:
    """None for a regular file (or a link to one); else what `path` is instead, for an error line:
    "does not exist", "is a directory", "is not a regular file (a character device)" ..."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
    return f"is not a regular file ({kind})"


def check_number(value: float, bounds: Bounds = FINITE) -> float:
    """`value` if it is finite and inside `bounds`; else InvalidValue saying what is allowed."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValue(f"got {shown(value)}; expected {bounds.describe()}")
    if not bounds.allows(value):
        raise InvalidValue(f"got {shown(value)}; expected {bounds.describe()}")
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


# Slurm job ids: a number below 2^32 (slurm.conf MaxJobId), an array task (`123_4`, sbatch --array) or
# a het job component (`123+1`, squeue's form). Anything else never reaches a history, a drain
# reason or a terminal: an id read from the environment or a file may carry ESC or BEL.
JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,5})?")   # ASCII digits: \d takes any script's


def check_job_id(job_id: str, source: str) -> str:
    """`job_id` if it is a Slurm job id; else a UsageError naming `source` (SLURM_JOB_ID, an argument)."""
    if JOB_ID.fullmatch(job_id) and int(job_id.split("_")[0].split("+")[0]) < 2**32:
        return job_id
    from trainctl.text import printable

    cut = job_id if len(job_id) <= 40 else job_id[:40] + "..."
    raise UsageError(f"{source}={printable(repr(cut))} is not a Slurm job id (digits below 2^32, an array task "
                     "123_4 or a het job component 123+1)")


def site_bounds(key: str) -> Bounds:
    """The bounds of a dotted site key (`partitions.gpu.ib_mtu` -> `partitions.*.ib_mtu`,
    `gate.min_free_disk_gib./scratch` -> `gate.min_free_disk_gib.*`)."""
    parts = key.split(".")
    if parts[0] == "partitions" and len(parts) == 3:
        key = f"partitions.*.{parts[2]}"
    elif parts[0] == "gate" and len(parts) > 2:   # a table of numbers keyed by anything (a path)
        key = f"gate.{parts[1]}.*"
    return SITE_BOUNDS.get(key, FINITE)


# sbatch(1) --signal=[{R|B}:]<sig_num>[@sig_time]: a signal name or number, seconds 0-65535.
SLURM_SIGNAL = re.compile(r"(?P<prefix>[RB]{1,2}:)?(?P<sig>(SIG)?[A-Za-z][A-Za-z0-9+-]*|\d{1,2})"
                          r"(@(?P<time>\d{1,5}))?")


def check_slurm_signal(value: str) -> str:
    """`[R:]SIG[@SECONDS]` as sbatch(1) --signal takes it, or "" for none; InvalidValue says why not.

    SIG goes to every job step (the ranks), not to the batch shell: `B:` is refused, because
    trainctl's batch script neither traps nor forwards signals, and bash ends on an untrapped
    USR1. SIG must be a signal this system has: a number 1 to SIGRTMAX, or a name signal(7) lists.
    """
    if not value:
        return ""
    match = SLURM_SIGNAL.fullmatch(value)
    if not match:
        raise InvalidValue("expected [R:]SIG[@SECONDS], e.g. USR1@120 (SIG a name such as USR1 or a number, "
                           "SECONDS 0-65535)")
    if match["prefix"] and "B" in match["prefix"]:
        raise InvalidValue("B: would signal only the batch shell, which runs trainctl's gate and srun, not "
                           "your program; leave B: out so the program's ranks get it")
    sig = match["sig"].upper().removeprefix("SIG")
    known = {member.name.removeprefix("SIG") for member in signal.Signals}
    if sig.isdigit() and not 1 <= int(sig) <= signal.SIGRTMAX:
        raise InvalidValue(f"signal number {sig} does not exist (1-{int(signal.SIGRTMAX)} here)")
    if not sig.isdigit() and sig not in known:
        raise InvalidValue(f"no signal named {match['sig']} (signal(7): USR1, USR2, TERM, INT ...)")
    if sig in ("KILL", "STOP") or (sig.isdigit() and int(sig) in (signal.SIGKILL, signal.SIGSTOP)):
        raise InvalidValue(f"the program cannot catch {sig}; use e.g. USR1")
    if match["time"] and int(match["time"]) > 65535:
        raise InvalidValue("SECONDS must be 0-65535 (sbatch(1))")
    return value


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


CHECKPOINT_PATTERN_MAX_CHARS = 4096     # PATH_MAX
CHECKPOINT_PATTERN_WILDCARD_LEVELS = 3  # levels of a pattern with a wildcard (*, ?, [...]) in them
CHECKPOINT_PATTERN_ROOT_DEPTH = 2       # directories an absolute pattern names before its first wildcard


def check_checkpoint_pattern(value: str) -> str:
    """submit --checkpoints or the site's launch.checkpoints: a path or glob the supervisor looks
    for the program's saves by, at every poll, on what is often a shared filesystem; "" for none.
    InvalidValue, saying why, for one that would search far more than the program's own files or
    print what a terminal takes for commands (docs: Submitting jobs, Checkpoints seen)."""
    if len(value) > CHECKPOINT_PATTERN_MAX_CHARS:
        raise InvalidValue(f"longer than {CHECKPOINT_PATTERN_MAX_CHARS} characters")
    if any(unicodedata.category(character) == "Cc" for character in value):
        raise InvalidValue("holds a control character (a newline, ESC, NUL...): it is printed in the journal "
                           "and by job show")
    levels = value.split("/")
    if ".." in levels:
        raise InvalidValue("climbs out of the submit directory with '..': give an absolute path instead")
    if "**" in value:
        raise InvalidValue("holds '**': a level here is never searched to any depth; name each level, e.g. "
                           "'out/*/*.pt'")
    wild = [number for number, level in enumerate(levels) if any(c in level for c in "*?[")]
    if value.startswith("/") and wild and wild[0] <= CHECKPOINT_PATTERN_ROOT_DEPTH:
        raise InvalidValue(f"an absolute pattern names {CHECKPOINT_PATTERN_ROOT_DEPTH} directories before its "
                           "first wildcard (e.g. /scratch/me/ckpt-*.pt): nearer / it would search everyone's files")
    if len(wild) > CHECKPOINT_PATTERN_WILDCARD_LEVELS:
        raise InvalidValue(f"has wildcards in {len(wild)} levels, more than {CHECKPOINT_PATTERN_WILDCARD_LEVELS}")
    return value
