"""How hard the probe bounds hold, with real processes (no GPU, no cluster needed).

Three measurements, each against the figure it must stay under:
- Ctrl-C / SIGTERM / SIGHUP sent to `trainctl health check` while five probes hang (each
  behind a `setsid` grandchild): seconds from the signal to exit, vs the 1 s target and
  the 60 s probe timeout it must not wait for;
- `health snapshot --timeout T` with a probe whose grandchild keeps stdout open: the
  collection's own duration (meta.json) vs T + 1 s;
- four `exec yes` floods for T seconds: trainctl's peak RSS vs what the floods wrote.

    .venv/bin/python bench/probe_bounds.py [--rounds 5] [--timeout 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
TAG = "27182"   # in the hung probes' command lines, to find what is left


def script(directory: str, name: str, body: str) -> str:
    path = os.path.join(directory, name)
    Path(path).write_text(body)
    os.chmod(path, 0o755)
    return path


def leftovers() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if TAG in " ".join(p.info["cmdline"] or ())]


def signal_to_exit(hung: str, signum: int) -> float:
    proc = subprocess.Popen([TRAINCTL, "health", "check", "--timeout", "60"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            env={**os.environ, "TRAINCTL_BIN_NVIDIA_SMI": hung, "TRAINCTL_BIN_IBSTAT": hung})
    while not leftovers():
        time.sleep(0.02)
    time.sleep(0.3)     # every probe under way
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait()
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signum and not leftovers(), (proc.returncode, leftovers())
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="trainctl-bench-")
    hung = script(work, "hung", f"#!/bin/sh\nsetsid sleep {TAG} &\nsleep {TAG}\n")
    flood = script(work, "flood", "#!/bin/sh\nexec yes\n")

    # interleaved: one round of each signal after the other
    took: dict[str, list[float]] = {s.name: [] for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for _ in range(args.rounds):
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            took[signum.name].append(signal_to_exit(hung, signum))
    for name, times in took.items():
        print(f"{name:<8} -> exit: median {statistics.median(times):.2f} s, max {max(times):.2f} s "
              f"(target 1 s; probe timeout 60 s: {statistics.median(times) / 60:.3f}x of it)")

    probe_s, snapshot_s = [], []
    for i in range(args.rounds):
        out = os.path.join(work, f"snap{i}")
        subprocess.run([TRAINCTL, "health", "snapshot", "--out", out, "--timeout", str(args.timeout)],
                       stdout=subprocess.DEVNULL, env={**os.environ, "TRAINCTL_BIN_IBSTAT": hung}, check=True)
        meta = json.loads(Path(out, "meta.json").read_text())
        probe_s.append(meta["probes"]["ibstat.txt"]["duration_s"])
        snapshot_s.append(meta["duration_s"])
    print(f"--timeout {args.timeout:g}, a setsid grandchild on stdout: the probe returned after median "
          f"{statistics.median(probe_s):.2f} s, max {max(probe_s):.2f} s (target {args.timeout + 1:g} s: "
          f"{max(probe_s) / (args.timeout + 1):.2f}x); whole snapshot median {statistics.median(snapshot_s):.2f} s; "
          f"left: {len(leftovers())}")

    out = os.path.join(work, "flood-snapshot")
    proc = subprocess.Popen([TRAINCTL, "health", "snapshot", "--out", out, "--timeout", str(args.timeout)],
                            stdout=subprocess.DEVNULL, env={**os.environ, "TRAINCTL_BIN_NVIDIA_SMI": flood})
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    written = sum(r["stdout_bytes"] for r in json.loads(Path(out, "meta.json").read_text())["probes"].values())
    print(f"4 x `exec yes` for {args.timeout:g} s: peak RSS {peak >> 20} MiB while the floods wrote "
          f"{written >> 20} MiB ({peak / written:.3f}x)")


if __name__ == "__main__":
    main()
