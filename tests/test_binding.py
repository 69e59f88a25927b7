"""Per-rank binding computed from real `nvidia-smi topo -m` recordings."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainctl.health.affinity import gpu_affinity
from trainctl.health.parse.cpulist import parse_cpu_list
from trainctl.health.parse.topo import parse_topo
from trainctl.launcher.binding import cpu_slice, rank_bindings
from trainctl.launcher.site import load_site

TOPO_DIR = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "nvidia-smi" / "topo"
RECORDED_TOPO = (Path(__file__).resolve().parent / "fixtures" / "recorded" / "h100-vm-2026-11-22"
                 / "nvidia-smi-topo-m.txt")
TOPO_FILES = sorted(TOPO_DIR.glob("*.txt")) + [RECORDED_TOPO]


def gpus_of(path: Path):
    return gpu_affinity(parse_topo(path.read_text()))


def test_every_recording_is_covered():
    assert len(TOPO_FILES) >= 6, TOPO_FILES


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.name)
def test_ranks_partition_each_numa_affinity_and_stay_on_their_gpu(path):
    gpus = gpus_of(path)
    bindings = rank_bindings(gpus, len(gpus))
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
        assert binding.nic is None if not gpu.nearest_nics else binding.nic in gpu.nearest_nics


def test_h200_dgx_layout_numa_split_and_nearest_hca():
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 8)
    assert [b.numa_node for b in bindings] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [b.nic for b in bindings] == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5",
                                         "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    # GPU0-3 share 0-55,112-167: each gets 14 cores with their hyperthread siblings
    assert bindings[0].cpus == "0-13,112-125"
    assert bindings[3].cpus == "42-55,154-167"
    assert bindings[4].cpus == "56-69,168-181"


def test_h200_bindings_use_only_the_sample_sites_compute_hcas():
    # the dgx-h100 sample lists the compute HCAs; storage ports mlx5_1/2/7/8 are never chosen
    hca_devices = tuple(p.split(":")[0] for p in load_site("dgx-h100").config.partitions["h100"].hca_ports)
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 8, hca_devices)
    assert [b.nic for b in bindings] == list(hca_devices)


def test_gpus_behind_one_switch_take_turns_on_tied_nics():
    # DGX A100: two GPUs per PCIe switch, two NICs on it: each GPU gets its own port
    bindings = rank_bindings(gpus_of(TOPO_DIR / "dgx-a100-8gpu-12nic-nv12.txt"), 8)
    assert bindings[0].nic != bindings[1].nic
    assert {bindings[0].nic, bindings[1].nic} == {"mlx5_0", "mlx5_1"}


def test_fewer_ranks_than_gpus_split_the_affinity_among_the_ranks_only():
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 2)
    assert [b.cpus for b in bindings] == ["0-27,112-139", "28-55,140-167"]


def test_more_ranks_than_gpus_is_refused():
    with pytest.raises(ValueError, match="2 ranks"):
        rank_bindings(gpus_of(TOPO_DIR / "l40s-1gpu-pcie-ansi-underline.txt"), 2)


@given(first=st.integers(0, 64), length=st.integers(1, 200), parts=st.integers(1, 16))
def test_cpu_slices_cover_a_range_exactly_once(first, length, parts):
    cpus = f"{first}-{first + length - 1}"
    slices = [parse_cpu_list(cpu_slice(cpus, part, parts)) for part in range(parts)]
    assert sorted(cpu for s in slices for cpu in s) == list(range(first, first + length))
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


def test_a_job_given_the_second_half_of_a_node_binds_to_those_gpus():
    from trainctl.launcher.rank_exec import job_gpus

    gpus = job_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert gpus == [4, 5, 6, 7]
    bindings = rank_bindings(gpus_of(TOPO_DIR / "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"), 4, job_gpus=gpus)
    assert [(b.local_rank, b.gpu, b.numa_node, b.nic) for b in bindings] == [
        (0, 4, 1, "mlx5_6"), (1, 5, 1, "mlx5_9"), (2, 6, 1, "mlx5_10"), (3, 7, 1, "mlx5_11")]
    assert [b.cpus for b in bindings] == ["56-69,168-181", "70-83,182-195", "84-97,196-209", "98-111,210-223"]


def test_visible_devices_that_are_not_plain_indices_mean_the_whole_node():
    from trainctl.launcher.rank_exec import job_gpus

    assert job_gpus({}) is None
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "GPU-99deca37-188a-60d0-2971-8cae46b3c544"}) is None
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "0"}) == [0]
