"""GPU <-> NIC <-> CPU affinity from the topology matrix."""

from __future__ import annotations

from trainctl.health.affinity import gpu_affinity
from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.topo import Topology
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("topo.affinity", "Each GPU's nearest NICs and CPU/NUMA affinity; a GPU with no NIC "
       "closer than SYS warns where the site wants a NIC per GPU", needs=("topo",), hardware="gpu")
def topo_affinity(topo: Topology, expected: NodeExpectations) -> Finding:
    affinities = gpu_affinity(topo)
    issues = []
    if expected.nic_per_gpu:
        for gpu in affinities:
            if gpu.nic_path in (None, "SYS"):
                where = f"nearest {', '.join(gpu.nearest_nics)} via SYS" if gpu.nearest_nics else "no NIC"
                issues.append((Status.WARN, f"GPU {gpu.index} has no NIC closer than SYS ({where})"))
    summary = ", ".join(f"GPU {g.index}: {'/'.join(g.nearest_nics) or 'no NIC'}"
                        + (f" ({g.nic_path})" if g.nic_path else "") for g in affinities)
    return summarize(issues, summary, {"gpus": [g.to_json() for g in affinities]})
