"""GPU-side parsers on every recorded output: topo -m, nvlink -s, -q -x and -q."""

from __future__ import annotations

import pytest
from health_fixtures import parsed, read

from trainctl.errors import ParseError
from trainctl.health.affinity import gpu_affinity
from trainctl.health.parse.nvlink import parse_nvlink_status
from trainctl.health.parse.smi_query import parse_smi_text, parse_smi_xml
from trainctl.health.parse.topo import parse_topo

TOPO = "nvidia-smi/topo/"
NVLINK = "nvidia-smi/nvlink/"
QUERY = "nvidia-smi/query/"

# file -> (GPUs, NIC names, GPU0 CPU affinity, GPU0 NUMA, GPU0-GPU1 link, GPU7 NUMA)
TOPO_VALUES = {
    "dgx-a100-8gpu-12nic-nv12.txt":
        (8, [f"mlx5_{i}" for i in range(12)], "48-63,176-191", 3, "NV12", 5),
    "dgx1-v100-8gpu-4nic-topo-mp-pcie-only.txt":
        (8, [f"mlx5_{i}" for i in range(4)], "0-19,40-59", 0, "PIX", 1),
    "h100-80gb-hbm3-1gpu-vm-ansi-underline.txt": (1, [], "0-19", 0, None, None),
    "h100-8gpu-nv18-no-nic-spaces-no-legend.txt": (8, [], "0-51,104-155", 0, "NV18", 1),
    "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt":
        (8, [f"mlx5_{i}" for i in range(12)], "0-55,112-167", 0, "NV18", 1),
    "l40s-1gpu-pcie-ansi-underline.txt": (1, [], "0-7", 0, None, None),
    "recorded/h100-vm-2026-11-22-b/nvidia-smi-topo-m.txt": (1, [], "0-15", 0, None, None),
}


@pytest.mark.parametrize("name", sorted(TOPO_VALUES))
def test_topo_values(name):
    gpus, nic_names, cpu0, numa0, link01, numa7 = TOPO_VALUES[name]
    topo = parsed(name if name.startswith(("local/", "recorded/")) else TOPO + name)
    assert [g.index for g in topo.gpus] == list(range(gpus))
    assert [topo.nic_names[n] for n in topo.nics] == nic_names
    assert (topo.gpus[0].cpu_affinity, topo.gpus[0].numa_node) == (cpu0, numa0)
    assert all(g.gpu_numa_id is None for g in topo.gpus)     # printed N/A or absent
    if link01:
        assert topo.link("GPU0", "GPU1") == topo.link("GPU1", "GPU0") == link01
        assert topo.gpus[7].numa_node == numa7
    assert all(topo.link(g.label, g.label) == "X" for g in topo.gpus)


def test_topo_h200_nic_legend_resolves_nic_columns():
    topo = parsed(TOPO + "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt")
    assert topo.nics[:2] == ("NIC0", "NIC1")
    assert topo.nic_names["NIC11"] == "mlx5_11"
    assert topo.link("GPU0", "NIC0") == "PXB" and topo.link("NIC1", "NIC2") == "PIX"
    assert [g.cpu_affinity for g in topo.gpus[3:5]] == ["0-55,112-167", "56-111,168-223"]


# file -> per GPU: (nearest NIC names, path type)
AFFINITY = {
    "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt":
        [(["mlx5_0"], "PXB"), (["mlx5_3"], "PXB"), (["mlx5_4"], "PXB"), (["mlx5_5"], "PXB"),
         (["mlx5_6"], "PXB"), (["mlx5_9"], "PXB"), (["mlx5_10"], "PXB"), (["mlx5_11"], "PXB")],
    "dgx-a100-8gpu-12nic-nv12.txt":
        [(["mlx5_0", "mlx5_1"], "PXB")] * 2 + [(["mlx5_2", "mlx5_3"], "PXB")] * 2
        + [(["mlx5_6", "mlx5_7"], "PXB")] * 2 + [(["mlx5_8", "mlx5_9"], "PXB")] * 2,
    "dgx1-v100-8gpu-4nic-topo-mp-pcie-only.txt":
        [(["mlx5_0"], "PIX")] * 2 + [(["mlx5_1"], "PIX")] * 2 + [(["mlx5_2"], "PIX")] * 2
        + [(["mlx5_3"], "PIX")] * 2,
    "h100-8gpu-nv18-no-nic-spaces-no-legend.txt": [([], None)] * 8,
    "h100-80gb-hbm3-1gpu-vm-ansi-underline.txt": [([], None)],
    "l40s-1gpu-pcie-ansi-underline.txt": [([], None)],
}


@pytest.mark.parametrize("name", sorted(AFFINITY))
def test_gpu_affinity_nearest_nics(name):
    affinity = gpu_affinity(parsed(TOPO + name))
    assert [(list(a.nearest_nics), a.nic_path) for a in affinity] == AFFINITY[name]


def test_gpu_affinity_json_is_what_topo_json_prints():
    affinity = gpu_affinity(parsed(TOPO + "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"))
    assert affinity[4].to_json() == {"index": 4, "cpu_affinity": "56-111,168-223", "numa_node": 1,
                                     "nearest_nics": ["mlx5_6"], "nic_path": "PXB"}
    assert [a.numa_node for a in affinity] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("mangle, message", [
    (lambda t: t.replace("NV18", "NV?", 1), "unknown link"),
    (lambda t: t.replace("PXB", "NV4", 1), "unknown link"),        # NVLink to a NIC
    (lambda t: "\n".join(t.splitlines()[:5]), "rows"),             # cut inside the matrix
    (lambda t: t.replace("\t0\t\tN/A", "\t0", 1), "affinity values"),
    (lambda t: t.replace("  NIC0: mlx5_0", "  NIC0 mlx5_0"), "unexpected line"),
    (lambda t: "", "empty"),
])
def test_topo_rejects_damaged_input_with_its_line(mangle, message):
    text = mangle(read(TOPO + "h200-8gpu-nv18-12nic-mlx5-dgx-layout.txt"))
    with pytest.raises(ParseError, match=message) as error:
        parse_topo(text, source="nvidia-smi-topo-m.txt")
    assert error.value.source == "nvidia-smi-topo-m.txt" and error.value.line is not None


# file -> [(GPU index, name, state, link speeds)]
NVLINK_VALUES = {
    "azure-a100-sxm4-80gb-1gpu-12links-25GBps-healthy.txt":
        [(7, "NVIDIA A100-SXM4-80GB", "links", [25.0] * 12)],
    "azure-a100-sxm4-80gb-all-links-inactive.txt": [(6, "NVIDIA A100-SXM4-80GB", "all_inactive", [])],
    "h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt":
        [(0, "NVIDIA H100 80GB HBM3", "links", [26.562] * 18)],
    "h200-1gpu-18links-nvlink-s.txt": [(0, "NVIDIA H200", "links", [26.562] * 18)],
    "h100-mig-mode-nvlink-s-not-supported.txt": [(0, "NVIDIA H100 80GB HBM3", "mig", [])],
    "l40s-nvlink-s-no-nvlink.txt": [(0, "NVIDIA L40S", "absent", [])],
}


@pytest.mark.parametrize("name", sorted(NVLINK_VALUES))
def test_nvlink_status_values(name):
    gpus = parsed(NVLINK + name)
    assert [(g.index, g.name, g.state, [link.speed_gbps for link in g.links]) for g in gpus] \
        == NVLINK_VALUES[name]
    assert all([link.number for link in g.links] == list(range(len(g.links))) for g in gpus)


def test_nvlink_status_empty_on_a_single_h100_vm():
    assert read("recorded/h100-vm-2026-11-22-b/nvidia-smi-nvlink-s.txt") == ""
    assert parsed("recorded/h100-vm-2026-11-22-b/nvidia-smi-nvlink-s.txt") == ()


def test_nvlink_status_per_link_inactive():
    (gpu,) = parsed("local/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt")
    assert (gpu.index, gpu.name, gpu.uuid) == (3, "Tesla V100-SXM2-32GB", "...")
    assert [link.speed_gbps for link in gpu.links] == [25.781, 25.781, 25.781, None, 25.781, None]


@pytest.mark.parametrize("text, message", [
    ("GPU 0: NVIDIA H200 (UUID: GPU-0)\n", "truncated"),
    ("\t Link 0: 26.562 GB/s\n", "expected a 'GPU N"),
    ("GPU 0: NVIDIA H200 (UUID: GPU-0)\n\t Link 0: 26.562 Gb/s\n", "unexpected line"),
    ("GPU 0: NVIDIA H200 (UUID: GPU-0)\n\t Link 0: 1.2.3 GB/s\n", "unexpected line|not a number"),
])
def test_nvlink_status_rejects_unknown_lines(text, message):
    with pytest.raises(ParseError, match=message):
        parse_nvlink_status(text)


def test_smi_xml_a100_v12():
    smi = parsed(QUERY + "a100-sxm4-80gb-1gpu-q-x-v12.xml")
    assert (smi.driver_version, smi.attached_gpus, len(smi.gpus)) == ("535.54.03", 4, 1)
    gpu = smi.gpus[0]
    assert (gpu.index, gpu.pci_bus_id, gpu.product_name) == (0, "00000000:01:00.0", "NVIDIA A100-SXM4-80GB")
    assert (gpu.persistence_mode, gpu.mig_mode, gpu.ecc_mode) == ("Disabled", "Enabled", "Enabled")
    assert (gpu.ecc_uncorrectable_volatile, gpu.ecc_uncorrectable_aggregate) == (0, 0)
    assert (gpu.reset_required, gpu.drain_and_reset_recommended) == (False, False)
    # remapped_rows is the single text "N/A" in this capture; retired pages are N/A too
    assert (gpu.remapped_rows_pending, gpu.retired_pages_pending, gpu.retired_pages_sbe) == (None,) * 3
    assert gpu.clock_events_active == ()


def test_smi_xml_h100_v13_recorded_on_the_test_machine():
    smi = parsed("recorded/h100-vm-2026-11-22-b/nvidia-smi-q.xml")
    assert (smi.driver_version, smi.attached_gpus) == ("580.159.04", 1)
    (gpu,) = smi.gpus
    assert (gpu.pci_bus_id, gpu.product_name, gpu.uuid) == (
        "00000000:00:06.0", "NVIDIA H100 80GB HBM3", "GPU-0afcf76d-b9a0-2234-515f-a3aa0fdddc16")
    assert (gpu.persistence_mode, gpu.mig_mode, gpu.ecc_mode) == ("Enabled", "Disabled", "Enabled")
    assert (gpu.recovery_action, gpu.reset_required) == ("None", None)   # v13: no gpu_reset_status
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (False, False)
    assert (gpu.fabric_state, gpu.clock_events_active) == (None, ("gpu_idle",))
    # the text form of the same moment says the same
    assert parsed("recorded/h100-vm-2026-11-22-b/nvidia-smi-q.txt").gpus[0] == gpu


def test_smi_xml_a10g_v11_throttle_reasons_and_remapped_rows():
    (gpu,) = parsed(QUERY + "a10g-1gpu-q-x-v11.xml").gpus
    assert (gpu.pci_bus_id, gpu.product_name, gpu.uuid) == (
        "00000000:00:1E.0", "NVIDIA A10G", "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94")
    assert gpu.clock_events_active == ("gpu_idle",)      # v11 names them throttle reasons
    assert (gpu.remapped_rows_uncorrectable, gpu.remapped_rows_pending,
            gpu.remapped_rows_failure) == (0, False, False)
    assert gpu.reset_required is None                    # v11 has no gpu_reset_status
    assert gpu.mig_mode is None                          # N/A


# file -> (driver, attached, listed GPUs, [product names], persistence of GPU 0)
SMI_TEXT_VALUES = {
    "a100-sxm4-4gpu-q.txt": ("555.42.02", 4, 4, ["NVIDIA A100-SXM4-80GB"] * 4, "Enabled"),
    "azure-nd96-8gpu-q-d-page-retirement-ecc-bad.txt": ("535.86.10", 8, 8, [None] * 8, None),
    "azure-nd96-8gpu-q-d-page-retirement-healthy.txt": ("535.86.10", 8, 8, [None] * 8, None),
    "h100-80gb-hbm3-q-idle.txt": ("590.48.01", 1, 1, ["NVIDIA H100 80GB HBM3"], "Enabled"),
    "h100-80gb-hbm3-q-load.txt": ("590.48.01", 1, 1, ["NVIDIA H100 80GB HBM3"], "Enabled"),
    "h100-mig-q-idle.txt": ("590.48.01", 1, 1, ["NVIDIA H100 80GB HBM3"], "Enabled"),
    "h100-nvl-2gpu-q.txt": ("550.54.14", 2, 2, ["NVIDIA H100 NVL"] * 2, "Enabled"),
    "h100-sxm5-80gb-8gpu-q.txt": ("565.57.01", 8, 8, ["NVIDIA H100 80GB HBM3"] * 8, "Enabled"),
    "h800-sxm-q-i0.txt": ("525.105.17", 8, 1, ["NVIDIA H800"], "Enabled"),
    "l40s-q-idle.txt": ("595.80", 1, 1, ["NVIDIA L40S"], "Disabled"),
}


@pytest.mark.parametrize("name", sorted(SMI_TEXT_VALUES))
def test_smi_text_values(name):
    driver, attached, listed, models, persistence = SMI_TEXT_VALUES[name]
    smi = parsed(QUERY + name)
    assert (smi.driver_version, smi.attached_gpus, len(smi.gpus)) == (driver, attached, listed)
    assert [g.product_name for g in smi.gpus] == models
    assert smi.gpus[0].persistence_mode == persistence
    assert [g.index for g in smi.gpus] == list(range(listed))


def test_smi_text_a100_gpu1_has_a_row_remap_pending():
    smi = parsed(QUERY + "a100-sxm4-4gpu-q.txt")
    assert [g.remapped_rows_pending for g in smi.gpus] == [False, True, False, False]
    assert smi.gpus[1].pci_bus_id == "00000000:9E:00.0"
    assert [g.clock_events_active for g in smi.gpus] == [("gpu_idle",)] * 4


def test_smi_text_page_retirement_fault():
    smi = parsed(QUERY + "azure-nd96-8gpu-q-d-page-retirement-ecc-bad.txt")
    assert [(g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending) for g in smi.gpus] == [
        (60, 5, False), (2, 61, True), (0, 0, False), (6, 0, True),
        (0, 0, False), (20, 45, True), (0, 0, False), (8, 56, True)]
    assert smi.gpus[7].pci_bus_id == "00000008:00:00.0"
    healthy = parsed(QUERY + "azure-nd96-8gpu-q-d-page-retirement-healthy.txt")
    assert {(g.retired_pages_sbe, g.retired_pages_dbe, g.retired_pages_pending)
            for g in healthy.gpus} == {(0, 0, False)}


def test_smi_text_new_layout_fields():
    idle = parsed(QUERY + "h100-80gb-hbm3-q-idle.txt").gpus[0]
    load = parsed(QUERY + "h100-80gb-hbm3-q-load.txt").gpus[0]
    assert (idle.recovery_action, idle.fabric_state, idle.fabric_status) == ("None", "Completed", "Success")
    assert (idle.ecc_uncorrectable_volatile, idle.ecc_uncorrectable_aggregate) == (0, 0)
    assert idle.clock_events_active == ("gpu_idle",) and load.clock_events_active == ()
    assert parsed(QUERY + "h100-mig-q-idle.txt").gpus[0].mig_mode == "Enabled"
    h800 = parsed(QUERY + "h800-sxm-q-i0.txt").gpus[0]
    assert (h800.ecc_mode, h800.ecc_uncorrectable_volatile) == ("Disabled", None)   # Ecc Mode, N/A
    assert h800.clock_events_active == ("gpu_idle",)     # "Clocks Throttle Reasons" (525 driver)


@pytest.mark.parametrize("text, message", [
    ("<nvidia_smi_log><gpu id='00000000:01:00.0'>", "malformed XML"),
    ("<other/>", "not <nvidia_smi_log>"),
    ("<nvidia_smi_log><gpu id='x'/></nvidia_smi_log>", "PCI bus id"),
    ("<nvidia_smi_log><attached_gpus>ERR!</attached_gpus></nvidia_smi_log>", "attached_gpus"),
])
def test_smi_xml_rejects_damaged_input(text, message):
    with pytest.raises(ParseError, match=message) as error:
        parse_smi_xml(text, source="nvidia-smi-q.xml")
    assert error.value.line is not None


@pytest.mark.parametrize("text, message", [
    ("Timestamp : now\n", "banner"),
    ("==============NVSMI LOG==============\nGPU 00000000:01:00.0\n    Retired Pages\n", "empty"),
    ("==============NVSMI LOG==============\nGPU 00000000:01:00.0\n   Product Name : X\n",
     "indentation"),
])
def test_smi_text_rejects_damaged_input(text, message):
    with pytest.raises(ParseError, match=message):
        parse_smi_text(text)


def test_one_unexpected_value_is_that_field_not_reported_the_rest_is_read():
    """"ERR!" is what nvidia-smi prints for a value it could not read (the Fan column of
    nvidia-smi/default/gpud-525-geforce-fan-err-bang.txt); a new enum reads the same way."""
    xml = read(QUERY + "a100-sxm4-80gb-1gpu-q-x-v12.xml")
    xml = xml.replace("<dram_uncorrectable>0</dram_uncorrectable>",
                      "<dram_uncorrectable>ERR!</dram_uncorrectable>", 1)
    xml = xml.replace("<clocks_event_reason_gpu_idle>Not Active</clocks_event_reason_gpu_idle>",
                      "<clocks_event_reason_gpu_idle>Asleep</clocks_event_reason_gpu_idle>", 1)
    gpu = parse_smi_xml(xml).gpus[0]
    assert [(f.path, f.value) for f in gpu.unreadable] == [
        ("ecc_errors/volatile/dram_uncorrectable", "ERR!"),
        ("clocks_event_reasons/clocks_event_reason_gpu_idle", "Asleep")]
    assert gpu.ecc_uncorrectable_volatile == 0 and gpu.ecc_uncorrectable_aggregate == 0   # the other counters
    assert gpu.product_name == "NVIDIA A100-SXM4-80GB" and gpu.vbios_version == "92.00.36.00.02"
    text = read(QUERY + "a100-sxm4-4gpu-q.txt").replace("Pending                           : No",
                                                        "Pending                           : [Unknown Error]", 1)
    gpus = parse_smi_text(text).gpus
    assert [(f.path, f.value) for f in gpus[0].unreadable] == [("Remapped Rows/Pending", "[Unknown Error]")]
    assert all(not g.unreadable for g in gpus[1:])


def test_smi_versions():
    smi = parse_smi_xml(read(QUERY + "a100-sxm4-80gb-1gpu-q-x-v12.xml"))
    assert (smi.driver_version, smi.cuda_version) == ("535.54.03", "12.2")
    smi = parse_smi_text(read(QUERY + "h100-sxm5-80gb-8gpu-q.txt"))
    assert (smi.driver_version, smi.cuda_version) == ("565.57.01", "12.7")
    assert {g.vbios_version for g in smi.gpus} == {"96.00.74.00.01"}
