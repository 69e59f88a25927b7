"""Judge every GPU's compute figures against the job's other GPUs of the same model (pure).

The reference for a figure is the median of that figure over the job's GPUs of the same
model (the CPU counts as one "model"), so a minority of slow GPUs cannot drag it down. A GPU
below `factor` x the reference, or below the site's floor, is slow; one that could not be
measured failed. Fewer than `MIN_PEERS` GPUs of a model and no floor: not judged, since a
median of one or two says nothing about which is slow.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

DEFAULT_COMPUTE_FACTOR = 0.8
MIN_PEERS = 3

OK, SLOW, FAILED, NOT_JUDGED = "ok", "slow", "failed", "not judged"


def deadline_for(budget_s: float) -> float:
    """How long a node's measurement may take before a device counts as hung."""
    return 4 * budget_s + 10.0


@dataclass(frozen=True)
class GpuFigures:
    host: str
    index: int                   # -1: the node's CPU (no GPUs)
    name: str
    tflops: float
    copy_gbps: float
    error: str = ""

    @property
    def label(self) -> str:
        return "CPU" if self.index < 0 else f"GPU {self.index} ({self.name})"


@dataclass(frozen=True)
class GpuVerdict:
    figures: GpuFigures
    status: str
    reason: str
    tflops_ratio: float | None
    copy_ratio: float | None

    def to_json(self) -> dict:
        f = self.figures
        return {"host": f.host, "index": f.index, "name": f.name, "tflops": round(f.tflops, 4),
                "copy_gbps": round(f.copy_gbps, 3), "status": self.status, "reason": self.reason,
                "tflops_ratio": _round(self.tflops_ratio), "copy_ratio": _round(self.copy_ratio)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def figures_from_report(host: str, report: dict) -> list[GpuFigures]:
    """The `devices` list a node's compute file holds -> figures (malformed entries: failed)."""
    out = []
    for item in report.get("devices", []):
        try:
            out.append(GpuFigures(host, int(item["index"]), str(item["name"]), float(item["tflops"]),
                                  float(item["copy_gbps"]), str(item.get("error", ""))))
        except (KeyError, TypeError, ValueError) as exc:
            out.append(GpuFigures(host, -1, "?", 0.0, 0.0, f"unreadable compute figures ({exc})"))
    return out


def judge(figures: Iterable[GpuFigures], factor: float = DEFAULT_COMPUTE_FACTOR,
          floor_tflops: float = 0.0, floor_copy_gbps: float = 0.0) -> list[GpuVerdict]:
    figures = list(figures)
    by_model: dict[str, list[GpuFigures]] = defaultdict(list)
    for item in figures:
        if not item.error:
            by_model[item.name].append(item)
    references = {}
    for name, group in by_model.items():
        if len(group) >= MIN_PEERS:
            references[name] = (statistics.median(g.tflops for g in group),
                                statistics.median(g.copy_gbps for g in group))
    verdicts = []
    for item in figures:
        if item.error:
            verdicts.append(GpuVerdict(item, FAILED, f"{item.label}: could not be measured: {item.error}",
                                       None, None))
            continue
        verdicts.append(_verdict(item, references.get(item.name), factor, floor_tflops, floor_copy_gbps,
                                 len(by_model[item.name])))
    return verdicts


def _verdict(item: GpuFigures, reference: tuple[float, float] | None, factor: float,
             floor_tflops: float, floor_copy_gbps: float, peers: int) -> GpuVerdict:
    problems = []
    ratios: list[float | None] = [None, None]
    if reference is not None:
        for slot, (value, ref, unit, what) in enumerate((
                (item.tflops, reference[0], "TFLOPS", "matmul"),
                (item.copy_gbps, reference[1], "GB/s", "copy"))):
            ratio = value / ref if ref > 0 else None
            ratios[slot] = ratio
            if ratio is not None and ratio < factor:
                problems.append(f"{what} {_fmt(value)} {unit}, {ratio:.2f}x the job's median {_fmt(ref)}")
    for value, floor, unit, what in ((item.tflops, floor_tflops, "TFLOPS", "matmul"),
                                     (item.copy_gbps, floor_copy_gbps, "GB/s", "copy")):
        if floor > 0 and value < floor:
            problems.append(f"{what} {_fmt(value)} {unit}, under the site's floor {_fmt(floor)}")
    if problems:
        return GpuVerdict(item, SLOW, f"{item.label}: " + "; ".join(problems), *ratios)
    if reference is None and floor_tflops <= 0 and floor_copy_gbps <= 0:
        return GpuVerdict(item, NOT_JUDGED, f"{item.label}: not judged: {peers} of this model in the job "
                          f"(need {MIN_PEERS}) and no site floor", None, None)
    return GpuVerdict(item, OK, f"{item.label}: {_fmt(item.tflops)} TFLOPS, {_fmt(item.copy_gbps)} GB/s",
                      *ratios)


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def node_reasons(verdicts: Iterable[GpuVerdict]) -> dict[str, list[str]]:
    """host -> why the node is excluded (a slow or failed GPU), for the gate's decision."""
    reasons: dict[str, list[str]] = defaultdict(list)
    for verdict in verdicts:
        if verdict.status in (SLOW, FAILED):
            reasons[verdict.figures.host].append(f"compute fail-slow: {verdict.reason}"
                                                 if verdict.status == SLOW else f"compute: {verdict.reason}")
    return dict(reasons)
