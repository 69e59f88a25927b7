"""Host checks: memory, /dev/shm, disk space, defunct processes, load and CPUs."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.lscpu import CpuInfo
from trainctl.health.parse.snapshot_files import HostInfo
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize

GIB = 1024 ** 3


@check("host.memory", "Available memory is above the site's minimum", needs=("host",))
def host_memory(host: HostInfo, expected: NodeExpectations) -> Finding:
    available = host.memory_available_bytes / GIB
    details = {"available_gib": round(available, 1), "total_gib": round(host.memory_total_bytes / GIB, 1)}
    minimum = expected.min_available_memory_gib
    issues = ([(Status.FAIL, f"{available:.1f} GiB memory available, the site wants {minimum:g} GiB")]
              if minimum is not None and available < minimum else [])
    return summarize(issues, f"{available:.1f} of {details['total_gib']:g} GiB memory available",
                     details)


@check("host.shm", "/dev/shm is as large as the site wants and not full", needs=("host",))
def host_shm(host: HostInfo, expected: NodeExpectations) -> Finding:
    shm = next((fs for fs in host.disks if fs.path == "/dev/shm"), None)
    if shm is None:
        return Finding(Status.UNKNOWN, "not collected: /dev/shm is not in host.json", {})
    size, free = shm.total_bytes / GIB, shm.free_bytes / GIB
    issues = []
    if expected.min_shm_gib is not None and size < expected.min_shm_gib:
        issues.append((Status.FAIL, f"/dev/shm is {size:.1f} GiB, the site wants "
                                    f"{expected.min_shm_gib:g} GiB"))
    if shm.free_bytes == 0:
        issues.append((Status.FAIL, "/dev/shm is full"))
    return summarize(issues, f"/dev/shm {size:.1f} GiB, {free:.1f} GiB free",
                     {"size_gib": round(size, 1), "free_gib": round(free, 1)})


@check("host.disk", "The site's paths have enough free space; no filesystem is full", needs=("host",))
def host_disk(host: HostInfo, expected: NodeExpectations) -> Finding:
    measured = {fs.path: fs for fs in host.disks}
    issues = []
    for path, minimum in sorted(expected.min_free_disk_gib.items()):
        fs = measured.get(path)
        if fs is None:
            issues.append((Status.UNKNOWN, f"{path}: not measured in host.json"))
        elif fs.free_bytes / GIB < minimum:
            issues.append((Status.FAIL, f"{path}: {fs.free_bytes / GIB:.1f} GiB free, the site "
                                        f"wants {minimum:g} GiB"))
    issues += [(Status.FAIL, f"{fs.path} is full") for fs in host.disks
               if fs.free_bytes == 0 and fs.path not in expected.min_free_disk_gib]
    details = {"filesystems": [{"path": fs.path, "free_gib": round(fs.free_bytes / GIB, 1),
                                "total_gib": round(fs.total_bytes / GIB, 1)} for fs in host.disks]}
    return summarize(issues, "free space as expected", details)


@check("host.defunct", "Defunct (zombie) processes stay under the site's limit", needs=("host",))
def host_defunct(host: HostInfo, expected: NodeExpectations) -> Finding:
    count = len(host.defunct_processes)
    details = {"processes": [{"pid": p.pid, "ppid": p.ppid, "name": p.name}
                             for p in host.defunct_processes]}
    limit = expected.max_defunct_processes
    issues = ([(Status.WARN, f"{count} defunct processes (limit {limit}): "
                             + ", ".join(f"{p.name}[{p.pid}]" for p in host.defunct_processes[:10]))]
              if limit is not None and count > limit else [])
    return summarize(issues, f"{count} defunct process(es)", details)


@check("host.load", "The 1-minute load per CPU stays under the site's limit", needs=("host",))
def host_load(host: HostInfo, expected: NodeExpectations) -> Finding:
    per_cpu = host.load_average[0] / max(host.cpu_count, 1)
    details = {"load_average": list(host.load_average), "cpu_count": host.cpu_count,
               "load_per_cpu": round(per_cpu, 2)}
    limit = expected.max_load_per_cpu
    issues = ([(Status.WARN, f"load {host.load_average[0]:g} on {host.cpu_count} CPUs "
                             f"({per_cpu:.2f} per CPU, limit {limit:g})")]
              if limit is not None and per_cpu > limit else [])
    return summarize(issues, f"load {host.load_average[0]:g} on {host.cpu_count} CPUs", details)


@check("host.cpus", "Every CPU is online; the NUMA node count is the site's", needs=("lscpu",))
def host_cpus(cpu: CpuInfo, expected: NodeExpectations) -> Finding:
    offline = sorted(set(range(cpu.cpus)) - cpu.online)
    issues = []
    if offline:
        issues.append((Status.WARN, f"{len(offline)} of {cpu.cpus} CPUs offline: "
                                    + ", ".join(map(str, offline[:16]))))
    if expected.numa_nodes is not None and len(cpu.numa_nodes) != expected.numa_nodes:
        issues.append((Status.FAIL, f"{len(cpu.numa_nodes)} NUMA nodes with CPUs, the site "
                                    f"expects {expected.numa_nodes}"))
    details = {"cpus": cpu.cpus, "online": len(cpu.online), "model": cpu.model_name,
               "numa_nodes": {str(n): len(cpus) for n, cpus in sorted(cpu.numa_nodes.items())}}
    return summarize(issues, f"{cpu.cpus} CPUs online, {len(cpu.numa_nodes)} NUMA node(s)", details)
