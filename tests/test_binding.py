"""Per-rank binding computed from real `nvidia-smi topo -m` recordings."""

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainctl.health.affinity import GpuAffinity, gpu_affinity
from trainctl.health.parse.cpu_siblings import parse_thread_siblings
from trainctl.health.parse.cpulist import parse_cpu_list
from trainctl.health.parse.lscpu import parse_lscpu
from trainctl.health.parse.topo import parse_topo
from trainctl.launcher.binding import cpu_share, format_cpu_list, rank_bindings
from trainctl.launcher.plan import nccl_ib_hca
from trainctl.site import load_site

sys.path.insert(0, str(Path(__file__).resolve().parent / "health"))
from health_fixtures import cpu_topology_files  # noqa: E402  (the tarball reader the parser tests use)

TOPO_DIR = Path(__file__).resolve().parent / "fixtures" / "library" / "nvidia-smi" / "topo"
RECORDED_TOPO = (Path(__file__).resolve().parent / "fixtures" / "recorded" / "h100-vm-2026-11-22"
                 / "nvidia-smi-topo-m.txt")
TOPO_FILES = sorted(TOPO_DIR.glob("*.txt")) + [RECORDED_TOPO]
CPU_FIXTURES = TOPO_DIR.parents[1] / "cpu"


def gpus_of(path: Path):
    return gpu_affinity(parse_topo(path.read_text()))


def test_every_recording_is_covered():
    assert len(TOPO_FILES) >= 6, TOPO_FILES


def smt_cores(threads_apart: int) -> tuple[frozenset[int], ...]:
    """Cores of a machine where CPU n and n + threads_apart are one core's two threads (no real
    sibling dump of an H200 node exists; its affinity 0-55,112-167 has this shape)."""
    return tuple(frozenset({n, n + threads_apart}) for n in range(threads_apart))


def one_thread_per_core(cpus) -> tuple[frozenset[int], ...]:
    return tuple(frozenset({cpu}) for cpu in sorted(cpus))


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_ranks_split_each_numa_affinity_in_whole_cores(path):
    gpus = gpus_of(path)
    every_cpu = frozenset().union(*(parse_cpu_list(g.cpu_affinity or "") for g in gpus))
    bindings = rank_bindings(gpus, len(gpus), cores=one_thread_per_core(every_cpu))
    assert [b.gpu for b in bindings] == [b.local_rank for b in bindings] == list(range(len(gpus)))
    for gpu in gpus:
        sharers = [b for b in bindings if gpus[b.gpu].cpu_affinity == gpu.cpu_affinity]
        slices = [parse_cpu_list(b.cpus) for b in sharers]
        # the sharers' slices are disjoint, non-empty, and together make up the whole affinity
        assert all(slices)
        assert sum(len(s) for s in slices) == len(frozenset().union(*slices))
        assert frozenset().union(*slices) == parse_cpu_list(gpu.cpu_affinity)
    for binding, gpu in zip(bindings, gpus):
        assert binding.numa_node == gpu.numa_node
        assert binding.nearest_nic is None if not gpu.nearest_nics else binding.nearest_nic in gpu.nearest_nics


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_without_measured_cores_ranks_share_their_numa_affinity(path):
    gpus = gpus_of(path)
    bindings = rank_bindings(gpus, len(gpus))
    assert [parse_cpu_list(b.cpus) for b in bindings] == [parse_cpu_list(g.cpu_affinity or "") for g in gpus]


def test_h200_dgx_layout_numa_split_and_nearest_hca():
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 8,
                             cores=smt_cores(112))
    assert [b.numa_node for b in bindings] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [b.nearest_nic for b in bindings] == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5",
                                                 "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    # GPU0-3 share 0-55,112-167: each gets 14 cores with both their threads
    assert bindings[0].cpus == "0-13,112-125"
    assert bindings[3].cpus == "42-55,154-167"
    assert bindings[4].cpus == "56-69,168-181"


def test_h200_nearest_nics_shown_are_the_sample_sites_compute_hcas():
    # the dgx-h100 sample lists the compute HCAs; storage ports mlx5_1/2/7/8 are never named
    hca_devices = tuple(p.split(":")[0] for p in load_site("dgx-h100").config.partitions["h100"].hca_ports)
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 8, hca_devices)
    assert [b.nearest_nic for b in bindings] == list(hca_devices)


def test_gpus_behind_one_switch_show_both_tied_nics():
    # DGX A100: two GPUs per PCIe switch, two NICs on it
    bindings = rank_bindings(gpus_of(TOPO_DIR / "dgx-a100-8gpu-12nic-nv12.txt"), 8)
    assert {bindings[0].nearest_nic, bindings[1].nearest_nic} == {"mlx5_0", "mlx5_1"}


def test_fewer_ranks_than_gpus_split_the_affinity_among_the_ranks_only():
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 2,
                             cores=smt_cores(112))
    assert [b.cpus for b in bindings] == ["0-27,112-139", "28-55,140-167"]


def test_more_ranks_than_gpus_is_refused():
    with pytest.raises(ValueError, match="2 ranks"):
        rank_bindings(gpus_of(TOPO_DIR / "l40s-1gpu-pcie-ansi-underline.txt"), 2)


# --- whole cores on the real CPU layouts of tests/fixtures/library/cpu/ -------------------------
# None of these machines has a recorded `topo -m`: each GPU's affinity below is the NUMA node's
# CPU list from the machine's own lscpu, which is what `topo -m` prints for a GPU on that node.

def numa_gpus(cpu_info, node: int, count: int) -> list[GpuAffinity]:
    cpus = format_cpu_list(sorted(cpu_info.numa_nodes[node]))
    return [GpuAffinity(index=i, cpu_affinity=cpus, numa_node=node, nearest_nics=(), nic_path=None)
            for i in range(count)]


def assert_whole_cores(bindings, cores, affinity):
    shares = [parse_cpu_list(b.cpus) for b in bindings]
    assert all(shares) and sum(map(len, shares)) == len(frozenset().union(*shares)) == len(affinity)
    for core in cores:
        owners = {i for i, share in enumerate(shares) if share & core}
        assert len(owners) <= 1, f"core {sorted(core)} split between ranks {owners}"


@pytest.mark.parametrize("lscpu, dump, node, ranks, first", [
    # adjacent siblings (0-1): NUMA node 0 is CPUs 0-3, two cores
    ("utillinux-lscpu-opteron6328-2socket-4numa-smt-adjacent-siblings-with-parsable.txt",
     "utillinux-dump-opteron6328-2socket-thread-siblings-adjacent-0-1.tar.gz", 0, 2, "0-1"),
    # split siblings (0,32) and a stride NUMA list (0-62:2): 16 cores, 4 ranks
    ("utillinux-lscpu-xeon-x7550-4socket-stride-ranges-with-parsable.txt",
     "utillinux-dump-xeon-x7550-4socket-thread-siblings-split-0-32.tar.gz", 0, 4, "0,2,4,6,32,34,36,38"),
], ids=["adjacent-0-1", "split-0-32"])
def test_sysfs_siblings_keep_each_core_with_one_rank(lscpu, dump, node, ranks, first):
    cores = parse_thread_siblings(cpu_topology_files(CPU_FIXTURES / "sysfs-dumps" / dump))
    cpu_info = parse_lscpu((CPU_FIXTURES / lscpu).read_text())
    bindings = rank_bindings(numa_gpus(cpu_info, node, ranks), ranks, cores=cores)
    assert_whole_cores(bindings, cores, cpu_info.numa_nodes[node])
    assert bindings[0].cpus == first


def test_epyc_siblings_half_the_machine_apart_from_lscpu_p():
    # siblings n and n+48 (the issue's "n+64" shape): a range-shape split of 0-5,48-53 happened to
    # be right; the measured cores make it so by construction
    epyc = parse_lscpu((CPU_FIXTURES / "utillinux-lscpu-epyc7451-2socket-8numa-with-parsable.txt").read_text())
    bindings = rank_bindings(numa_gpus(epyc, 0, 2), 2, cores=epyc.measured_cores())
    assert [b.cpus for b in bindings] == ["0-2,48-50", "3-5,51-53"]


def test_even_odd_numa_interleaving_gives_every_rank_its_share():
    # Princeton della H100 node: NUMA 0 is the even CPUs 0-94, SMT off; 4 GPUs per NUMA node.
    # Slicing each contiguous range (the old rule) gave rank 0 all 48 CPUs and ranks 1-3 none.
    della = parse_lscpu((CPU_FIXTURES / "princeton-della-h100-node-xeon8468-2socket-nosmt-"
                                        "numa-even-odd-interleaved-lscpu.txt").read_text())
    bindings = rank_bindings(numa_gpus(della, 0, 4), 4, cores=della.measured_cores())
    assert_whole_cores(bindings, della.measured_cores(), della.numa_nodes[0])
    assert [len(parse_cpu_list(b.cpus)) for b in bindings] == [12, 12, 12, 12]
    assert bindings[1].cpus == "24,26,28,30,32,34,36,38,40,42,44,46"


@given(cores=st.integers(1, 64), threads=st.integers(1, 4), parts=st.integers(1, 16))
def test_shares_are_whole_cores_that_cover_the_affinity_once(cores, threads, parts):
    machine = tuple(frozenset(core + t * cores for t in range(threads)) for core in range(cores))
    affinity = frozenset().union(*machine)
    shares = [cpu_share(affinity, part, parts, machine) for part in range(parts)]
    if cores >= parts:
        assert sorted(cpu for share in shares for cpu in share) == sorted(affinity)
        assert max(map(len, shares)) - min(map(len, shares)) <= threads
    assert all(share and all(core <= share or not core & share for core in machine) for share in shares)


def test_a_job_given_the_second_half_of_a_node_binds_to_those_gpus():
    from trainctl.launcher.rank_exec import job_gpus

    gpus = job_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert gpus == [4, 5, 6, 7]
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 4, job_gpus=gpus,
                             cores=smt_cores(112))
    assert [(b.local_rank, b.gpu, b.numa_node, b.nearest_nic) for b in bindings] == [
        (0, 4, 1, "mlx5_6"), (1, 5, 1, "mlx5_9"), (2, 6, 1, "mlx5_10"), (3, 7, 1, "mlx5_11")]
    assert [b.cpus for b in bindings] == ["56-69,168-181", "70-83,182-195", "84-97,196-209", "98-111,210-223"]


def test_visible_devices_that_are_not_plain_indices_mean_the_whole_node():
    from trainctl.launcher.rank_exec import job_gpus

    assert job_gpus({}) is None
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "GPU-99deca37-188a-60d0-2971-8cae46b3c544"}) is None
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "0"}) == [0]


def test_hca_list_matches_names_exactly():
    # '=': mlx5_1 must not also select mlx5_10 and mlx5_11 (NCCL env.rst, NCCL_IB_HCA)
    assert nccl_ib_hca(("mlx5_1:1", "mlx5_10:1")) == "=mlx5_1:1,mlx5_10:1"


def test_the_issues_case_siblings_half_the_machine_apart():
    # issue 11: on 0-127 with CPU n's sibling n+64, range slicing gave rank 0 CPUs 0-31 and
    # rank 2 CPUs 64-95, rank 0's own siblings. By measured cores each rank owns both threads.
    cores = smt_cores(64)
    shares = [format_cpu_list(sorted(cpu_share(frozenset(range(128)), part, 4, cores))) for part in range(4)]
    assert shares == ["0-15,64-79", "16-31,80-95", "32-47,96-111", "48-63,112-127"]
