"""Health snapshot cost: collect wall time vs the slowest probe, and judge time per snapshot.

Run: .venv/bin/python bench/health_collect.py [--rounds 10] [--replay-delay S]
1. Collect: a full `collect_snapshot` against each of its probes run alone, in interleaved
   rounds; probes run concurrently, so the snapshot should cost about its slowest probe
   (target, issue 4: <= 1.3x). Real binaries are used; on a machine without nvidia-smi,
   `--replay-delay S` stages the recorded H100 outputs behind an S-second delay instead.
2. Judge: load + evaluate (every registered check) over one snapshot per real fixture
   file, the recorded H100 snapshots and a full composite node (target <= 20 ms each).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainctl.health.collect import PROBES, binary_paths, collect_snapshot
from trainctl.health.evaluate import evaluate
from trainctl.health.parse.sysfs import parse_ttar
from trainctl.health.snapshot import load_snapshot
from trainctl.proc import run

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / "tests" / "fixtures" / "library"
RECORDED = REPO / "tests" / "fixtures" / "recorded"
COLLECT_TARGET = 1.3
JUDGE_TARGET_MS = 20.0

# shared fixture folder -> the snapshot file its outputs stand for
SNAPSHOT_NAME = {
    "nvidia-smi/topo": "nvidia-smi-topo-m.txt",
    "nvidia-smi/nvlink": "nvidia-smi-nvlink-s.txt",
    "infiniband/ibstat": "ibstat.txt",
    "infiniband/ibv_devinfo": "ibv_devinfo.txt",
    "kernel/xid": "dmesg.txt",
    "kernel/syslog": "dmesg.txt",
    "infiniband/perfquery": "perfquery.txt",
}
COMPOSITE = {
    "nvidia-smi-topo-m.txt": "nvidia-smi/topo/h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt",
    "nvidia-smi-nvlink-s.txt": "nvidia-smi/nvlink/h200-1gpu-18links-nvlink-s.txt",
    "nvidia-smi-q.txt": "nvidia-smi/query/h100-sxm5-80gb-8gpu-q.txt",
    "ibstat.txt": "infiniband/ibstat/gpud-a100-9hca-cx6-hdr200-all-active.txt",
    "ibv_devinfo.txt": "infiniband/ibv_devinfo/fdr-mlx4-2hca-port2-down.txt",
    "lscpu.txt": "cpu/utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt",
    "dmesg.txt": "kernel/xid/gpud-xe9680-h100-dmesg-T-xid119-gsp-rpc-timeout-stacktrace.log",
    "lspci.txt": "pcie/gpud-h100-xe-lspci-vvv-gpu-cx7-cx6dx-switch-gen4-downgraded-excerpt.txt",
    "dcgmi-diag.json": "dcgm/gcm-dcgmi-diag-j-fail-persistence-mode.json",
}
ISSUE_13_FILES = ("lspci.txt", "dcgmi-diag.json")
# sysfs trees (ttar) the composite node also holds: IB port counters of 4 ports
COMPOSITE_TREES = ("infiniband/sysfs/procfs-hfi1-mlx4-mlx5-class-infiniband.ttar",)


def collect_ratio(rounds: int, binaries: dict[str, str]) -> None:
    paths = binary_paths(binaries)
    probes = {p.output: [paths[p.binary], *p.args] for p in PROBES}
    samples: dict[str, list[float]] = {name: [] for name in ["snapshot", *probes]}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(rounds + 1):  # round 0 warms caches and is dropped
            order = list(samples)
            rng.shuffle(order)
            for name in order:
                start = time.perf_counter()
                if name == "snapshot":
                    collect_snapshot(Path(tmp) / f"s{number}", binaries=binaries)
                else:
                    run(probes[name], timeout=60)
                if number:
                    samples[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    slowest = max((n for n in probes), key=medians.get)
    ratio = medians["snapshot"] / medians[slowest]
    print(f"collect: {rounds} interleaved rounds, medians")
    for name, value in sorted(medians.items(), key=lambda item: -item[1]):
        print(f"  {name:<26} {value * 1e3:8.1f} ms")
    print(f"snapshot / slowest probe ({slowest}) = {ratio:.2f} "
          f"({'meets' if ratio <= COLLECT_TARGET else 'MISSES'} target <= {COLLECT_TARGET})")


def judge_times(repeats: int) -> None:
    snapshots: dict[str, dict[str, bytes]] = {}
    for folder, target in SNAPSHOT_NAME.items():
        for path in sorted((SHARED / folder).iterdir()):
            snapshots[f"{folder}/{path.name}"] = {target: path.read_bytes()}
    for path in sorted((SHARED / "nvidia-smi/query").iterdir()):
        if path.suffix == ".xml":
            snapshots[f"nvidia-smi/query/{path.name}"] = {"nvidia-smi-q.xml": path.read_bytes()}
        elif path.name.endswith("q.txt") or "-q-" in path.name:
            snapshots[f"nvidia-smi/query/{path.name}"] = {"nvidia-smi-q.txt": path.read_bytes()}
    for recorded in sorted(RECORDED.iterdir()):
        if recorded.is_dir():
            snapshots[f"recorded/{recorded.name}"] = {p.relative_to(recorded).as_posix(): p.read_bytes()
                                                      for p in recorded.rglob("*") if p.is_file()}
    snapshots["composite 8-GPU node"] = {name: (SHARED / source).read_bytes() for name, source in COMPOSITE.items()}
    # the same node without the inputs issue 13 added (PCIe, counters, DCGM): what they cost
    snapshots["composite, without issue-13 inputs"] = {
        name: data for name, data in snapshots["composite 8-GPU node"].items() if name not in ISSUE_13_FILES}
    for tree in COMPOSITE_TREES:
        snapshots["composite 8-GPU node"] |= {path: text.encode() for path, text in
                                             parse_ttar((SHARED / tree).read_text()).items()}
    timings, judged = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        loaded = {}
        for number, (label, files) in enumerate(snapshots.items()):
            root = Path(tmp) / str(number)
            root.mkdir()
            for name, data in files.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(data)
            loaded[label] = root
        runs = {label: [] for label in snapshots}
        parse_check = {label: [] for label in snapshots}
        for _ in range(repeats):        # rounds interleave the snapshots: the machine is shared
            for label, root in loaded.items():
                start = time.perf_counter()
                snapshot = load_snapshot(root)
                middle = time.perf_counter()
                evaluate(snapshot)
                end = time.perf_counter()
                runs[label].append(end - start)
                parse_check[label].append(end - middle)
        timings = {label: statistics.median(r) * 1e3 for label, r in runs.items()}
        judged = {label: statistics.median(r) * 1e3 for label, r in parse_check.items()}
    worst = max(timings, key=timings.get)
    composite, without = "composite 8-GPU node", "composite, without issue-13 inputs"
    print(f"\njudge (load + evaluate, all checks): {len(timings)} snapshots, median of {repeats} each")
    print(f"  median over snapshots {statistics.median(timings.values()):.2f} ms; "
          f"composite 8-GPU node {timings[composite]:.2f} ms ({len(snapshots[composite])} files; "
          f"parse + check alone {judged[composite]:.2f} ms); worst {timings[worst]:.2f} ms ({worst})")
    print(f"  composite vs the same without issue-13 inputs: parse + check {judged[composite]:.2f} vs "
          f"{judged[without]:.2f} ms ({judged[composite] / judged[without]:.2f}x); "
          f"load {timings[composite] - judged[composite]:.2f} vs {timings[without] - judged[without]:.2f} ms")
    print(f"  {'meets' if timings[worst] <= JUDGE_TARGET_MS else 'MISSES'} target <= {JUDGE_TARGET_MS:g} ms per node; "
          f"1,000 nodes judge in about {statistics.median(timings.values()):.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--replay-delay", type=float, default=None,
                        help="stage recorded H100 nvidia-smi outputs behind this delay (no real GPU here)")
    args = parser.parse_args()
    binaries = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.replay_delay is not None:
            from trainctl.devcluster.replay import write_replay

            h100 = RECORDED / "h100-vm-2026-11-22"
            smi = write_replay(Path(tmp), "nvidia-smi", {
                "topo -m": h100 / "nvidia-smi-topo-m.txt", "nvlink -s": h100 / "nvidia-smi-nvlink-s.txt",
                "nvlink -e": h100 / "nvidia-smi-nvlink-e.txt", "-q -x": h100 / "nvidia-smi-q.xml"},
                sleep_s=args.replay_delay)
            binaries["nvidia-smi"] = str(smi)
            print(f"nvidia-smi: recorded H100 outputs replayed behind {args.replay_delay:g} s")
        collect_ratio(args.rounds, binaries)
    judge_times(repeats=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
