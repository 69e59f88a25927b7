"""Bus-bandwidth arithmetic against nccl-tests' formulas (src/*.cu GetBw, doc/PERFORMANCE.md)."""

import pytest

from trainctl.health.fabric.bandwidth import (Collective, algbw_gbps, bus_bandwidth_factor, busbw_gbps,
                                              figures_from_timings)


@pytest.mark.parametrize("collective, ranks, factor", [
    (Collective.ALL_REDUCE, 2, 1.0),
    (Collective.ALL_REDUCE, 8, 1.75),
    (Collective.ALL_REDUCE, 16, 1.875),
    (Collective.ALL_REDUCE, 1, 0.0),          # nccl-tests prints busbw 0 for one rank
    (Collective.ALL_GATHER, 8, 0.875),
    (Collective.REDUCE_SCATTER, 4, 0.75),
    (Collective.ALLTOALL, 2, 0.5),
    (Collective.BROADCAST, 16, 1.0),
    (Collective.REDUCE, 16, 1.0),
])
def test_bus_factor_per_collective(collective, ranks, factor):
    assert bus_bandwidth_factor(collective, ranks) == pytest.approx(factor)


def test_collective_can_be_named_by_string():
    assert bus_bandwidth_factor("all_reduce", 8) == 1.75
    assert busbw_gbps("all_gather", 8_000_000_000, 1.0, 8) == pytest.approx(7.0)
    with pytest.raises(ValueError):
        bus_bandwidth_factor("allreduce", 8)


def test_units_are_decimal_gigabytes_per_second():
    # 1 GB (1e9 bytes, not 2**30) in one second is 1 GB/s.
    assert algbw_gbps(1_000_000_000, 1.0) == pytest.approx(1.0)
    assert algbw_gbps(2**30, 1.0) == pytest.approx(1.073741824)


def test_all_reduce_busbw_matches_a_printed_row():
    # all_reduce_perf on 8 H100 (nccl-tests issue 290): 4294967296 B in 15870 us printed
    # algbw 270.63 and busbw 473.60.
    seconds = 15870e-6
    assert algbw_gbps(4294967296, seconds) == pytest.approx(270.63, abs=0.01)
    assert busbw_gbps(Collective.ALL_REDUCE, 4294967296, seconds, 8) == pytest.approx(473.60, abs=0.02)


def test_figures_use_the_median_iteration():
    stalled = [0.010, 0.011, 0.010, 0.500, 0.010]  # one iteration preempted
    figures = figures_from_timings(Collective.ALL_REDUCE, 1_000_000_000, 2, stalled)
    assert figures.median_seconds == 0.010
    assert figures.iterations == 5
    assert figures.algbw_gbps == pytest.approx(100.0)
    assert figures.busbw_gbps == pytest.approx(100.0)  # 2 ranks: factor 1


def test_even_iteration_count_takes_the_mean_of_the_middle_two():
    figures = figures_from_timings(Collective.ALL_REDUCE, 4_000_000_000, 4, [0.1, 0.3, 0.2, 0.4])
    assert figures.median_seconds == pytest.approx(0.25)
    assert figures.busbw_gbps == pytest.approx(16.0 * 1.5)


@pytest.mark.parametrize("call", [
    lambda: bus_bandwidth_factor(Collective.ALL_REDUCE, 0),
    lambda: algbw_gbps(-1, 1.0),
    lambda: algbw_gbps(8, 0.0),
    lambda: algbw_gbps(8, float("nan")),
    lambda: figures_from_timings(Collective.ALL_REDUCE, 8, 2, []),
    lambda: figures_from_timings(Collective.ALL_REDUCE, 8, 2, [0.1, -0.1]),
])
def test_impossible_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()


def test_a_lower_quantile_takes_the_nearest_rank_from_the_fast_end():
    times = [0.40, 0.10, 0.30, 0.20, 0.50, 0.60, 0.70, 0.80]  # 8 iterations
    figures = figures_from_timings(Collective.ALL_REDUCE, 1_000_000_000, 2, times, quantile=0.25)
    assert figures.seconds == 0.20  # 2nd fastest: ceil(0.25 x 8) = 2
    assert figures.median_seconds == pytest.approx(0.45)
    assert figures.busbw_gbps == pytest.approx(5.0)
    assert figures_from_timings(Collective.ALL_REDUCE, 8, 2, [0.3, 0.1], quantile=0.1).seconds == 0.1
    with pytest.raises(ValueError):
        figures_from_timings(Collective.ALL_REDUCE, 8, 2, [0.1], quantile=0.0)
