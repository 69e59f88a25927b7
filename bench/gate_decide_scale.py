"""`trainctl gate decide` over thousands of node reports: seconds and peak memory (issue 15 item 2).

Run: .venv/bin/python bench/gate_decide_scale.py [--nodes 4096] [--rounds 3]

The gate directory is built from real outputs: the recorded H100 snapshot
(tests/fixtures/recorded/h100-vm-2026-11-22-snapshot) judged once by `trainctl health check
--snapshot DIR --json` with site local-demo (every check ok) and once with dgx-h100 (gpu.count,
host.cpus and nvlink.links fail on that 1-GPU VM), each copied under every node's name
(gpu0001 ...): 2 % of the nodes get the failing report, 1 % none at all. fabric.json is what
health/fabric/report.py build_report makes of the real pairing schedule's rounds, every pair
at 20 GB/s and 2 % of the nodes slow at 0.5x (no recorded fabric report of that size exists);
compute/HOST.json is one real CPU measurement (`measure_node`, this machine) per node, copied.

`gate decide --site local-demo` runs twice per round in a fresh process: with --nodes N (fails:
the folded one-line message) and with --nodes equal to the healthy count (succeeds). Each prints
wall seconds and the child's own peak RSS (os.wait4). Targets (issue 15): <= 2 s, <= 500 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "fixtures" / "recorded" / "h100-vm-2026-11-22-snapshot"
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
SITE = "local-demo"
SIZE = 16 << 20          # local-demo's largest fabric size
PAIR_GBPS = 20.0


def host_name(index: int) -> str:
    return f"gpu{index + 1:04d}"


def judged_report(site: str) -> dict:
    """The recorded snapshot judged by the real CLI with `site`'s expectations."""
    done = subprocess.run([TRAINCTL, "health", "check", "--snapshot", str(SNAPSHOT), "--site", site, "--json"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode not in (0, 2, 3):
        raise SystemExit(f"health check --site {site} failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)


def fabric_report(hosts: list[str], slow: set[str]) -> dict:
    """health/fabric/report.py's report of the real schedule's rounds, every pair measured once."""
    from trainctl.health.fabric.report import build_report
    from trainctl.health.fabric.schedule import pairing_schedule

    rounds = pairing_schedule(len(hosts))
    inter: dict[int, list[dict]] = {rank: [] for rank in range(len(hosts))}
    for pairs in rounds:
        for a, b in pairs:
            busbw = PAIR_GBPS * (0.5 if hosts[a] in slow or hosts[b] in slow else 1.0)
            seconds = SIZE / (busbw * 1e9)  # two ranks: busbw = algbw
            row = {"peers": [hosts[a], hosts[b]], "size": SIZE, "ranks": 2, "median_s": seconds,
                   "algbw_gbps": busbw, "busbw_gbps": busbw, "error": None, "fast_s": seconds}
            inter[a].append(row)
            inter[b].append(row)
    results = {rank: {"rank": rank, "host": host, "backend": "gloo", "intra": [], "inter": inter[rank]}
               for rank, host in enumerate(hosts)}
    roster = {"joined": list(range(len(hosts))), "missing": [],
              "hosts": {str(rank): host for rank, host in enumerate(hosts)}, "expected": hosts}
    return build_report(results=results, roster=roster, world=len(hosts), sizes=(1 << 20, SIZE),
                        rounds=len(rounds), retests=0, straggler_factor=0.7, floor_gbps=None,
                        join_timeout_s=15.0, duration_s=1.0).to_json()


def compute_report() -> dict:
    """One real CPU measurement of this machine (the gate's compute file), to copy per node."""
    from trainctl.health.compute.measure import measure_node

    return {"host": "", "rank": 0, "budget_s": 0.2, "in_turns": False, "waited_s": 0.0, "seconds": 0.2,
            "devices": [device.to_json() for device in measure_node(0.2)]}


def make_gate_dir(root: Path, nodes: int, compute: bool = True) -> dict:
    """Write a gate directory for `nodes` nodes; returns what was planted."""
    hosts = [host_name(i) for i in range(nodes)]
    failing = {h for i, h in enumerate(hosts) if i % 50 == 7}
    silent = {h for i, h in enumerate(hosts) if i % 100 == 3}        # no report at all
    slow = {h for i, h in enumerate(hosts) if i % 50 == 21}          # fabric straggler at 0.5x
    healthy_report, failing_report = judged_report(SITE), judged_report("dgx-h100")
    (root / "nodes").mkdir(parents=True)
    for host in hosts:
        if host in silent:
            continue
        report = dict(failing_report if host in failing else healthy_report, host=host)
        (root / "nodes" / f"{host}.json").write_text(json.dumps(report, indent=1) + "\n")
    (root / "fabric.json").write_text(json.dumps(fabric_report(hosts, slow), indent=1) + "\n")
    if compute:
        (root / "compute").mkdir()
        measured = compute_report()
        for host in hosts:
            if host not in silent:
                (root / "compute" / f"{host}.json").write_text(json.dumps(dict(measured, host=host)) + "\n")
    healthy = [h for h in hosts if h not in failing | silent | slow]
    return {"hosts": hosts, "failing": failing, "silent": silent, "slow": slow, "healthy": healthy}


def run_decide(root: Path, hostlist: str, wanted: int, path_dir: Path) -> dict:
    """One `gate decide` in a fresh process: exit code, seconds, its own peak RSS, its output.

    `path_dir` holds a stand-in `scontrol` (no Slurm here) that answers `show node` with
    nothing, so decide prints the node's name as its address, as for a node without NodeAddr.
    """
    (root / "decision.json").unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{path_dir}{os.pathsep}{os.environ['PATH']}")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen([TRAINCTL, "gate", "decide", "--site", SITE, "--dir", str(root),
                                  "--nodes", str(wanted), "--allocated", hostlist], stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"rc": child.returncode, "seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024,
                "stdout": out.read().decode(), "stderr": err.read().decode()}


def stub_scontrol(path_dir: Path) -> None:
    path_dir.mkdir(parents=True, exist_ok=True)
    (path_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (path_dir / "scontrol").chmod(0o755)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-compute", action="store_true", help="leave the compute files out")
    parser.add_argument("--generate", metavar="DIR", type=Path,
                        help="only write the gate directory DIR and print what was planted (JSON)")
    args = parser.parse_args()
    if args.generate:
        planted = make_gate_dir(args.generate, args.nodes, compute=not args.no_compute)
        print(json.dumps({key: sorted(value) for key, value in planted.items()}))
        return
    root = Path(tempfile.mkdtemp(prefix="gate-decide-scale-"))
    try:
        started = time.perf_counter()
        # generated in a child: this process stays small (Linux's peak RSS of a child started with
        # vfork + exec counts the parent's pages too; this one's own peak is printed below)
        generate = [sys.executable, __file__, "--generate", str(root / "gate"), "--nodes", str(args.nodes)]
        planted = json.loads(subprocess.run(generate + (["--no-compute"] if args.no_compute else []),
                                            check=True, capture_output=True, text=True).stdout)
        print(f"generated {args.nodes} nodes in {time.perf_counter() - started:.1f} s: {len(planted['failing'])} "
              f"failing, {len(planted['silent'])} without a report, {len(planted['slow'])} slow; "
              f"this process's own peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB",
              flush=True)
        stub_scontrol(root / "bin")
        from trainctl.slurm import fold_hostlist

        hostlist = fold_hostlist(planted["hosts"])
        cases = {"fails": args.nodes, "succeeds": len(planted["healthy"])}
        for round_number in range(args.rounds):
            for case, wanted in cases.items():  # interleaved
                run = run_decide(root / "gate", hostlist, wanted, root / "bin")
                line = run["stderr"].strip().splitlines()[-1] if case == "fails" else run["stdout"].splitlines()[0]
                print(json.dumps({"round": round_number, "case": case, "nodes": args.nodes, "rc": run["rc"],
                                  "seconds": round(run["seconds"], 3), "peak_rss_mb": round(run["peak_rss_mb"], 1),
                                  "line_chars": len(line), "line": line if len(line) <= 300 else line[:120] + "..."}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
