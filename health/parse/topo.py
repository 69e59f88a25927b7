"""`nvidia-smi topo -m` (and `topo -mp`): the GPU/NIC link matrix and GPU affinities.

Handles every layout seen in real outputs: tab- or space-separated columns, NIC columns
named `mlx5_N` (old drivers) or `NICN` with a "NIC Legend", no legend at all, the
`GPU NUMA ID` column, and headers wrapped in ANSI underline escapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_int

SOURCE = "nvidia-smi topo -m"
AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# PCIe path types from the legend, nearest first; NV# (bonded NVLinks) is GPU-to-GPU only.
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")
_NVLINK = re.compile(r"NV(\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CELL_SPLIT = re.compile(r"\t| {2,}")
_GPU_LABEL = re.compile(r"GPU(\d+)")
_LEGEND_ENTRY = re.compile(r"\s+\S+\s+= \S.*")
_NIC_LEGEND_ENTRY = re.compile(r"\s+(NIC\d+): (\S+)")


@dataclass(frozen=True)
class TopoGpu:
    index: int
    label: str                  # the matrix label, "GPU0"
    cpu_affinity: str | None    # as printed ("0-55,112-167"); None when absent or N/A
    numa_node: int | None
    gpu_numa_id: int | None     # set on Grace systems where GPU memory is its own NUMA node


@dataclass(frozen=True)
class Topology:
    gpus: tuple[TopoGpu, ...]
    nics: tuple[str, ...]                 # NIC column labels in order ("NIC0" or "mlx5_0")
    nic_names: dict[str, str]             # label -> device name, through the NIC legend
    links: dict[tuple[str, str], str]     # (row label, column label) -> "NV18", "PIX", ...

    def link(self, a: str, b: str) -> str:
        return self.links[(a, b)]


def is_nvlink(link: str) -> bool:
    return _NVLINK.fullmatch(link) is not None


def parse_topo(text: str, *, source: str = SOURCE) -> Topology:
    lines = _ANSI.sub("", text).splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_at is None:
        raise ParseError("empty output", source=source, line=1)
    devices, affinity_columns = _parse_header(lines[header_at], source, header_at + 1)

    rows: dict[str, tuple[list[str], list[str]]] = {}
    at = header_at + 1
    while at < len(lines) and lines[at].strip():
        label, links, rest = _parse_row(lines[at], devices, source, at + 1)
        expected_label = devices[len(rows)] if len(rows) < len(devices) else None
        if label != expected_label:
            raise ParseError(f"row {label!r} where {expected_label!r} was expected", source=source,
                             line=at + 1)
        if _GPU_LABEL.fullmatch(label) and len(rest) != len(affinity_columns):
            raise ParseError(f"{label} has {len(rest)} affinity values for {len(affinity_columns)} "
                             "columns", source=source, line=at + 1)
        if not _GPU_LABEL.fullmatch(label) and rest:
            raise ParseError(f"unexpected values after the matrix row {label}", source=source,
                             line=at + 1)
        rows[label] = (links, rest)
        at += 1
    if len(rows) != len(devices):
        raise ParseError(f"matrix has {len(rows)} rows for {len(devices)} columns (truncated?)",
                         source=source, line=at + 1)
    nic_legend = _parse_legends(lines, at, source)

    links = {(row, col): value for row, (values, _) in rows.items()
             for col, value in zip(devices, values)}
    gpus = tuple(_gpu(label, dict(zip(affinity_columns, rows[label][1])), source, header_at + 2 + i)
                 for i, label in enumerate(devices) if _GPU_LABEL.fullmatch(label))
    if not gpus:
        raise ParseError("no GPU columns in the matrix", source=source, line=header_at + 1)
    nics = tuple(d for d in devices if not _GPU_LABEL.fullmatch(d))
    return Topology(gpus=gpus, nics=nics, nic_names={n: nic_legend.get(n, n) for n in nics},
                    links=links)


def _parse_header(line: str, source: str, lineno: int) -> tuple[list[str], list[str]]:
    cells = [c.strip() for c in _CELL_SPLIT.split(line) if c.strip()]
    devices = []
    for cell in cells:
        if cell in AFFINITY_COLUMNS:
            break
        if " " in cell or cell in devices:
            raise ParseError(f"unexpected header cell {cell!r}", source=source, line=lineno)
        devices.append(cell)
    affinity_columns = cells[len(devices):]
    if not devices or not _GPU_LABEL.fullmatch(devices[0]):
        raise ParseError("not a topology matrix header (no GPU0 column first)", source=source,
                         line=lineno)
    if any(c not in AFFINITY_COLUMNS for c in affinity_columns):
        raise ParseError(f"unknown header columns {affinity_columns}", source=source, line=lineno)
    return devices, affinity_columns


def _parse_row(line: str, devices: list[str], source: str,
               lineno: int) -> tuple[str, list[str], list[str]]:
    tokens = line.split()
    label, cells = tokens[0], tokens[1:]
    if len(cells) < len(devices):
        raise ParseError(f"row {label} has {len(cells)} cells for {len(devices)} columns",
                         source=source, line=lineno)
    links = cells[:len(devices)]
    for column, value in zip(devices, links):
        if column == label:
            valid = value == "X"
        elif is_nvlink(value):
            valid = bool(_GPU_LABEL.fullmatch(label) and _GPU_LABEL.fullmatch(column))
        else:
            valid = value in PCIE_PATHS
        if not valid:
            raise ParseError(f"unknown link {value!r} between {label} and {column}", source=source,
                             line=lineno)
    return label, links, cells[len(devices):]


def _parse_legends(lines: list[str], at: int, source: str) -> dict[str, str]:
    """The NIC legend (`NIC0: mlx5_0`) after the matrix; the link-type legend is fixed text."""
    nic_legend: dict[str, str] = {}
    for lineno, line in enumerate(lines[at:], start=at + 1):
        if not line.strip() or line.strip() in ("Legend:", "NIC Legend:") or _LEGEND_ENTRY.fullmatch(line):
            continue
        match = _NIC_LEGEND_ENTRY.fullmatch(line)
        if not match:
            raise ParseError(f"unexpected line after the matrix: {line.strip()!r}", source=source,
                             line=lineno)
        nic_legend[match[1]] = match[2]
    return nic_legend


def _gpu(label: str, affinity: dict[str, str], source: str, lineno: int) -> TopoGpu:
    cpu_affinity = affinity.get("CPU Affinity")
    return TopoGpu(index=int(_GPU_LABEL.fullmatch(label)[1]), label=label,
                   cpu_affinity=None if cpu_affinity in (None, "N/A") else cpu_affinity,
                   numa_node=_optional_int(affinity.get("NUMA Affinity"), source, lineno),
                   gpu_numa_id=_optional_int(affinity.get("GPU NUMA ID"), source, lineno))


def _optional_int(value: str | None, source: str, lineno: int) -> int | None:
    if value in (None, "N/A"):
        return None
    return to_int(value, what="NUMA node", source=source, line=lineno)
