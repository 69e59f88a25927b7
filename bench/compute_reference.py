"""The gate's short compute test against a long run on the same device, and against the GPU's peak.

Run: python bench/compute_reference.py [--rounds 3] [--budget 1.5] [--long 10]
Interleaves, on every visible GPU (or the CPU): the gate's measurement with its time budget and the
same measurement given `--long` seconds, `--rounds` times, and prints one JSON line per round and a
summary: the short figure as a fraction of the long one (target: within 10%) and, on a GPU whose
published dense BF16 peak is known, the fraction of that peak (H100 SXM: 989 TFLOPS, NVIDIA's
H100 datasheet, dense, without sparsity).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from trainctl.health.compute.measure import measure_node

DENSE_BF16_PEAK_TFLOPS = {"H100 80GB HBM3": 989.0, "H100 SXM": 989.0, "H200": 989.0}


def peak_for(name: str) -> float | None:
    return next((peak for key, peak in DENSE_BF16_PEAK_TFLOPS.items() if key in name), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=1.5)
    parser.add_argument("--long", type=float, default=10.0)
    args = parser.parse_args()
    ratios: dict[int, list[float]] = {}
    copy_ratios: dict[int, list[float]] = {}
    last = []
    for round_ in range(args.rounds):
        started = time.perf_counter()
        short = measure_node(args.budget)
        short_wall = time.perf_counter() - started
        long = measure_node(args.long)
        for s, l in zip(short, long):
            ratios.setdefault(s.index, []).append(s.tflops / l.tflops)
            copy_ratios.setdefault(s.index, []).append(s.copy_gbps / l.copy_gbps)
            print(json.dumps({"round": round_, "device": s.index, "name": s.name, "dtype": s.dtype,
                              "short_s": round(short_wall, 2), "short_tflops": round(s.tflops, 2),
                              "long_tflops": round(l.tflops, 2), "short_copy_gbps": round(s.copy_gbps, 1),
                              "long_copy_gbps": round(l.copy_gbps, 1)}), flush=True)
        last = long
    for device in last:
        summary = {"device": device.index, "name": device.name,
                   "short_over_long_tflops_median": round(statistics.median(ratios[device.index]), 3),
                   "short_over_long_copy_median": round(statistics.median(copy_ratios[device.index]), 3)}
        peak = peak_for(device.name) if device.dtype == "bfloat16" else None
        if peak:
            summary["long_fraction_of_dense_bf16_peak"] = round(device.tflops / peak, 3)
        print(json.dumps({"summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
