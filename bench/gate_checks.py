"""`trainctl gate node` wall time on the real test cluster: the demo site's 3 checks vs every check.

Run (root): TRAINCTL_DEVCLUSTER_INSTANCE=N .venv/bin/python bench/gate_checks.py [--rounds 4]
Brings up its own 4-node dev cluster (instance $TRAINCTL_DEVCLUSTER_INSTANCE), runs
`srun -N4 trainctl gate node` (collect, checks, fabric test) with the local-demo site as it is
and with `[gate] checks = ["all"]` (the gray-failure checks of issue 13 included), and with every
check and the compute test on, in interleaved rounds, and prints medians and their ratio.
Target (issue 13): the gate, compute test included, stays within 15 s on the 4-node cluster.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainctl.devcluster.cluster import DevCluster, spec_for_instance
from trainctl.proc import run

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
DEMO_SITE = Path(__file__).resolve().parents[1] / "site-configs" / "local-demo.toml"
TARGET_S = 15.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    every = tmp / "all.toml"
    every.write_text(re.sub(r"(?m)^checks = \[.*\](.*)$", r'checks = ["all"]\1', DEMO_SITE.read_text(),
                            count=1))
    with_compute = tmp / "all-compute.toml"
    with_compute.write_text(every.read_text().replace("\ncompute = false", "\ncompute = true"))
    sites = {"demo (3 checks)": DEMO_SITE, "all checks": every, "all + compute": with_compute}
    cluster = DevCluster(spec_for_instance())
    cluster.up(lock_wait_s=120)
    times: dict[str, list[float]] = {label: [] for label in sites}
    try:
        for number in range(args.rounds):
            for label, site in sites.items():
                start = time.monotonic()
                out = run(["srun", "-N4", "--ntasks-per-node=1", TRAINCTL, "gate", "node",
                           "--site", str(site), "--dir", str(tmp / f"{number}-{len(times[label])}-{label[:3]}")],
                          timeout=300, env=cluster.client_env())
                times[label].append(time.monotonic() - start)
                if out.returncode != 0:
                    print(out.stderr[-2000:], file=sys.stderr)
                    return 1
    finally:
        cluster.down()
    medians = {label: statistics.median(values) for label, values in times.items()}
    for label, values in times.items():
        print(f"{label:<16} median {medians[label]:6.2f} s   ({', '.join(f'{v:.1f}' for v in values)})")
    demo, every_check, compute = medians.values()
    print(f"all / demo = {every_check / demo:.2f}; the compute test (in turns) adds {compute - every_check:.1f} s; "
          f"{'meets' if compute <= TARGET_S else 'MISSES'} target <= {TARGET_S:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
