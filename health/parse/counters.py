"""Link error counters: InfiniBand port counters and NVLink error counters, one reading each.

A reading maps a component ("mlx5_0:1", "GPU 3 link 7") to its counters (name -> count).
Counts since boot or since the last reset mean little on their own; `health/counters.py`
judges how they grow between two readings.

Sources:
- sysfs `infiniband/<hca>/ports/<n>/counters/<name>`: one number per file, or
  `N/A (no PMA)` where the adapter has no performance management agent (Intel i40iw in
  node_exporter's fixture): such a port has no counters, and is listed as such.
- `perfquery -x` (extended PortCounters, `Name:......value` lines under a
  `# Port extended counters: Lid L port P` header), for snapshots written by hand.
- `nvidia-smi nvlink -e`: no complete real output is public. The format below follows
  NVIDIA's documented example as quoted in stas00/ml-engineering (compute/accelerator/
  nvidia/debug.md: `GPU 0: NVIDIA H100 80GB HBM3 (UUID: ...)` then `Link 0: Replay
  Errors: 0`, `Link 0: Recovery Errors: 0`, `Link 0: CRC Errors: 0`, a blank line between
  links); GB300 hosts print the GPU line without the UUID. A GPU without usable NVLink gets
  one of the sentences `nvlink -s` prints in its place (recorded for `-s`: no NVLink, MIG
  mode, all links inactive; assumed alike for `-e`, as they describe the device): it has no
  counters. The parser is strict otherwise: any other line is an error, so a changed format
  is noticed instead of read as "no errors".
- `dcgmi nvlink -e -g N -j`: `{"header": [..., "GPU N"], "body": {"Link L": {"children":
  {"CRC Data Error": {"value": "12"}, ...}}}}` (gcm's test fixtures; values are strings).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import json_field, load_json, to_int
from trainctl.health.parse.nvlink import NO_LINKS

# sysfs names of the port error counters (the data and packet counters are not errors).
IB_ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped")
NO_PMA = "N/A (no PMA)"
# perfquery's names for the same counters.
_PERFQUERY_NAMES = {
    "SymbolErrorCounter": "symbol_error", "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed", "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards", "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors", "VL15Dropped": "VL15_dropped"}

_IB_COUNTER_FILE = re.compile(r".*?/?infiniband/(?P<hca>[^/]+)/ports/(?P<port>[0-9]+)/counters/(?P<name>\w+)")
# "# Port extended counters: Lid 2052 port 1 (CapMask: ...)", "# PortRcvErrorDetails counters: ..."
_PERFQUERY_HEADER = re.compile(r"# [A-Za-z ]+ counters: Lid (\d+) port (\d+)(?: \(.*\))?")
_PERFQUERY_LINE = re.compile(r"(\w+):\.*(\S+)")
_SMI_GPU = re.compile(r"GPU (\d+): (.+?)(?: \(UUID: (.+)\))?")
_SMI_LINK = re.compile(r"Link (\d+): ([A-Za-z][A-Za-z ]*[A-Za-z]): (\S+)")
_DCGM_LINK = re.compile(r"Link (\d+)")
_DCGM_GPU = re.compile(r"GPU (\d+)")


@dataclass(frozen=True)
class CounterReading:
    kind: str                                   # "ib" or "nvlink"
    counters: dict[str, dict[str, int]]         # component -> counter name -> count
    without_counters: tuple[str, ...] = ()      # components that have none (no PMA)

    def to_json(self) -> dict:
        """Every component, with its non-zero counters only: a sweep history keeps one per node and
        night, and a healthy DGX's 12 ports x 12 counters are almost all zero."""
        return {"counters": {component: {name: value for name, value in counts.items() if value}
                             for component, counts in self.counters.items()},
                "without_counters": list(self.without_counters)}


def parse_ib_counters(files: Mapping[str, str]) -> CounterReading | None:
    """sysfs port counters (paths as in a snapshot or a ttar); None when there are none."""
    counters: dict[str, dict[str, int]] = {}
    no_pma: set[str] = set()
    for path, contents in files.items():
        match = _IB_COUNTER_FILE.fullmatch(path)
        if not match or match["name"] not in IB_ERROR_COUNTERS:
            continue
        port = f"{match['hca']}:{match['port']}"
        value = contents.strip()
        if value == NO_PMA:
            no_pma.add(port)
            continue
        counters.setdefault(port, {})[match["name"]] = to_int(value, what=match["name"], source=path, line=1)
    if not counters and not no_pma:
        return None
    return CounterReading("ib", dict(sorted(counters.items())), tuple(sorted(no_pma - set(counters))))


def parse_perfquery(text: str, *, source: str = "perfquery -x") -> CounterReading:
    counters: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        header = _PERFQUERY_HEADER.fullmatch(line.strip())
        if header:
            current = counters.setdefault(f"lid {header[1]} port {header[2]}", {})
            continue
        match = _PERFQUERY_LINE.fullmatch(line.strip())
        if current is None or not match:
            raise ParseError(f"expected a perfquery header or 'Name:....value', got {line.strip()!r}",
                             source=source, line=lineno)
        # the error counters by their sysfs names; -E's error details by their own
        name = _PERFQUERY_NAMES.get(match[1]) or (match[1] if match[1].endswith("Errors") else None)
        if name:
            current[name] = to_int(match[2], what=match[1], source=source, line=lineno)
    if not counters:
        raise ParseError("no port counters", source=source, line=1)
    return CounterReading("ib", counters)


def parse_nvlink_errors(text: str, *, source: str = "nvidia-smi nvlink -e") -> CounterReading:
    counters: dict[str, dict[str, int]] = {}
    gpu: str | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        header = _SMI_GPU.fullmatch(stripped)
        link = _SMI_LINK.fullmatch(stripped)
        if header and not link:
            gpu = f"GPU {header[1]}"
        elif stripped in NO_LINKS and gpu is not None:
            continue
        elif link and gpu is not None:
            counters.setdefault(f"{gpu} link {link[1]}", {})[link[2]] = to_int(
                link[3], what=f"{gpu} link {link[1]} {link[2]}", source=source, line=lineno)
        else:
            raise ParseError(f"unexpected line: {stripped!r}", source=source, line=lineno)
    return CounterReading("nvlink", counters)


def parse_dcgm_nvlink_errors(text: str, *, source: str = "dcgmi nvlink -e -j") -> CounterReading:
    doc = load_json(text, source=source)
    header = json_field(doc, "header", list, where="dcgmi nvlink", source=source)
    gpus = [_DCGM_GPU.fullmatch(item) for item in header if isinstance(item, str)]
    gpu = next((m[1] for m in gpus if m), None)
    if gpu is None:
        raise ParseError("header names no GPU", source=source)
    body = json_field(doc, "body", dict, where="dcgmi nvlink", source=source)
    counters: dict[str, dict[str, int]] = {}
    for link_name, link in body.items():
        number = _DCGM_LINK.fullmatch(link_name)
        if not number:
            raise ParseError(f"unexpected entry {link_name!r}", source=source)
        children = json_field(link, "children", dict, where=link_name, source=source)
        counters[f"GPU {gpu} link {number[1]}"] = {
            name: to_int(json_field(value, "value", str, where=f"{link_name} {name}", source=source),
                         what=f"{link_name} {name}", source=source)
            for name, value in children.items()}
    return CounterReading("nvlink", counters)


def parse_dcgm_nvlink_tree(files: Mapping[str, str]) -> CounterReading | None:
    """`dcgmi-nvlink-e/<gpu>.json` files (one `dcgmi nvlink -e -g N -j` each) as one reading."""
    counters: dict[str, dict[str, int]] = {}
    for path, text in sorted(files.items()):
        if path.endswith(".json"):
            counters.update(parse_dcgm_nvlink_errors(text, source=path).counters)
    return CounterReading("nvlink", counters) if counters else None
