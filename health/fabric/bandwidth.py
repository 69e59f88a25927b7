"""Bus-bandwidth arithmetic, exactly as nccl-tests computes it.

nccl-tests (src/<collective>.cu, `*GetBw`) divides the operation's size in bytes by 1e9
and by the time in seconds: algbw = S / 1e9 / t, in GB/s with decimal gigabytes. It then
multiplies by a per-collective factor (doc/PERFORMANCE.md) to get the bus bandwidth, a
figure comparable to the hardware's link speed whatever the rank count:

    all_reduce 2(n-1)/n     all_gather, reduce_scatter, alltoall (n-1)/n     broadcast, reduce 1

S is the size nccl-tests prints in its `size` column: the whole buffer (for all_gather and
reduce_scatter, the per-rank count times the rank count). nccl-tests prints time in
microseconds; here time is in seconds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence

BYTES_PER_GB = 1.0e9  # nccl-tests' GB/s are decimal, not GiB/s


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLTOALL = "alltoall"


def bus_bandwidth_factor(collective: Collective | str, rank_count: int) -> float:
    """busbw / algbw over `rank_count` ranks (0 for a 1-rank all_reduce, as in nccl-tests).

    `collective` may be given by name ("all_reduce"); an unknown name raises ValueError.
    """
    collective = Collective(collective)
    if rank_count < 1:
        raise ValueError(f"rank_count must be at least 1, got {rank_count}")
    n = float(rank_count)
    if collective is Collective.ALL_REDUCE:
        return 2.0 * (n - 1.0) / n
    if collective in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALLTOALL):
        return (n - 1.0) / n
    return 1.0  # broadcast, reduce: all data crosses the root's one link


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the operation's bytes over its time."""
    if size_bytes < 0:
        raise ValueError(f"size_bytes must not be negative, got {size_bytes}")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive finite number, got {seconds}")
    return size_bytes / BYTES_PER_GB / seconds


def busbw_gbps(collective: Collective | str, size_bytes: int, seconds: float, rank_count: int) -> float:
    """Bus bandwidth in GB/s, the figure nccl-tests prints in its `busbw` column."""
    return algbw_gbps(size_bytes, seconds) * bus_bandwidth_factor(collective, rank_count)


@dataclass(frozen=True)
class BandwidthFigures:
    collective: Collective
    size_bytes: int
    rank_count: int
    iterations: int          # timed iterations the figures were taken over
    median_seconds: float
    seconds: float           # the iteration time at `quantile`, which the bandwidths are computed from
    algbw_gbps: float
    busbw_gbps: float


def figures_from_timings(collective: Collective, size_bytes: int, rank_count: int,
                         iteration_seconds: Sequence[float], quantile: float = 0.5) -> BandwidthFigures:
    """Bandwidth from a quantile of timed iterations (warm-up iterations must not be passed).

    nccl-tests reports the mean (total time / iterations). The default here is the median, so
    that one iteration stalled by the OS or a neighbour does not make a good node slow; a lower
    quantile (nearest rank: 0.1 of 12 iterations is the 2nd fastest) measures what the link
    does when nothing interferes, which is what the fabric test judges (see its runner).
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    if not iteration_seconds:
        raise ValueError("no timed iterations")
    for seconds in iteration_seconds:
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"an iteration time must be a positive finite number, got {seconds}")
    median = statistics.median(iteration_seconds)
    ordered = sorted(iteration_seconds)
    seconds = median if quantile == 0.5 else ordered[max(math.ceil(quantile * len(ordered)) - 1, 0)]
    return BandwidthFigures(
        collective=collective,
        size_bytes=size_bytes,
        rank_count=rank_count,
        iterations=len(iteration_seconds),
        median_seconds=median,
        seconds=seconds,
        algbw_gbps=algbw_gbps(size_bytes, seconds),
        busbw_gbps=busbw_gbps(collective, size_bytes, seconds, rank_count),
    )
