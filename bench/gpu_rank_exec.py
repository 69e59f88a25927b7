"""rank-exec on a real GPU node: the binding it prints and the NICs NCCL then selects.

Run on a GPU machine (no Slurm needed), from the repository root:

    python3 bench/gpu_rank_exec.py [--site S] [--ranks N] [--no-gate-snapshot]

It starts N local ranks (default: every GPU) the way srun starts a step's tasks (SLURM_PROCID,
SLURM_LOCALID, ... for one node), each through `trainctl rank-exec`, with NCCL_DEBUG=INFO.
Each rank joins one NCCL process group and all_reduces a tensor. First, unless told not to, it
collects this node's health snapshot as the gate would (`gate_dir/snapshots/<host>/`), so
rank-exec reads topology and CPU siblings from there. Printed: rank-exec's binding line, each
rank's NCCL_IB_HCA and CPU affinity, and NCCL's INFO lines about network devices (NET/IB,
NET/Socket, NCCL_IB_HCA, the channels' transports).

Without --site it writes a site for this node: its Active/LinkUp HCA ports from
/sys/class/infiniband (none: NCCL_IB_DISABLE, sockets). trainctl need not be installed: the
repository is put on trainctl's package path, as the editable install does (ClusterShell must
be importable, e.g. PYTHONPATH pointing at a copy of it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# trainctl.launcher lives in launcher/, trainctl.health in health/ ...: the package path gets the repo
TRAINCTL = [sys.executable, "-c", "import sys, trainctl; trainctl.__path__.append(sys.argv.pop(1)); "
            "sys.argv[0] = 'trainctl'; from trainctl.cli import main; main()", str(REPO)]
NCCL_LINE = re.compile(r"NCCL INFO (NET/|NCCL_IB_HCA|NCCL_SOCKET_IFNAME|Channel \d+/\d+ : .*via|"
                       r"Using network|.*comm .* nRanks)")
PROGRAM = """
import json, os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
tensor = torch.ones(1 << 20, device="cuda")
dist.all_reduce(tensor)
torch.cuda.synchronize()
print(json.dumps({"rank": dist.get_rank(), "local_rank": local, "NCCL_IB_HCA": os.environ.get("NCCL_IB_HCA"),
                  "cpus": sorted(os.sched_getaffinity(0)), "sum": tensor[0].item()}), flush=True)
dist.destroy_process_group()
"""


def active_hca_ports() -> list[tuple[str, str]]:
    """(dev:port, link layer) of this node's Active/LinkUp HCA ports."""
    ports = []
    for port in sorted(Path("/sys/class/infiniband").glob("*/ports/*")):
        try:
            state, phys = (port / "state").read_text(), (port / "phys_state").read_text()
            layer = (port / "link_layer").read_text().strip()
        except OSError:
            continue
        if "ACTIVE" in state and "LinkUp" in phys:
            ports.append((f"{port.parent.parent.name}:{port.name}", layer))
    return ports


def node_site(directory: Path, gpus: int) -> Path:
    ports = active_hca_ports()
    layer = ports[0][1] if ports else "none"
    path = directory / "this-node.toml"
    path.write_text(f'name = "this-node"\ndefault_partition = "p"\n[partitions.p]\ngpus_per_node = {gpus}\n'
                    f'socket_ifname = ""\nlink_layer = {json.dumps(layer)}\n'
                    f'hca_ports = {json.dumps([p for p, _ in ports])}\n')
    return path


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", help="site name or .toml (default: one written for this node)")
    parser.add_argument("--ranks", type=int, help="local ranks (default: every GPU)")
    parser.add_argument("--no-gate-snapshot", action="store_true", help="let rank-exec read the live node")
    args = parser.parse_args()
    ranks = args.ranks or gpu_count()
    host = socket.gethostname()
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or str(node_site(Path(tmp), ranks))
        print(f"== site {site}" + ("" if args.site else ": " + Path(site).read_text().replace("\n", " | ")))
        gate = Path(tmp) / "gate"
        extra = []
        if not args.no_gate_snapshot:
            snapshot = gate / "snapshots" / host
            collect = subprocess.run([*TRAINCTL, "health", "snapshot", "--out", str(snapshot)],
                                     capture_output=True, text=True, timeout=300)
            print(f"== gate snapshot of {host}: exit {collect.returncode}; "
                  f"{len(list(snapshot.rglob('thread_siblings_list')))} thread_siblings_list files copied")
            extra = ["--gate-dir", str(gate)]
        env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,GRAPH", SLURM_JOB_ID="4242",
                   SLURM_NODEID="0", SLURM_STEP_NUM_TASKS=str(ranks), SLURM_STEP_TASKS_PER_NODE=str(ranks),
                   SLURMD_NODENAME=host)
        procs = [subprocess.Popen([*TRAINCTL, "rank-exec", "--site", site, "--master-addr", "127.0.0.1", *extra,
                                   "--", sys.executable, "-c", PROGRAM],
                                  env=dict(env, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(ranks)]
        failed = 0
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=300)
            failed += proc.returncode != 0
            print(f"== rank {rank}: exit {proc.returncode}")
            for line in err.splitlines():
                if line.startswith("trainctl") or NCCL_LINE.search(line):
                    print("  " + line)
            for line in out.splitlines():
                print("  result " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
