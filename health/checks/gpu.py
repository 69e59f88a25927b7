"""GPU checks over `nvidia-smi -q -x` (or `-q`)."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.smi_query import GpuQuery, SmiQuery
from trainctl.health.parse.snapshot_files import SnapshotMeta
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize

# Clock event reasons that mean the hardware is holding the clocks down, not the workload.
HARDWARE_SLOWDOWNS = {
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "power brake (external power supply signal)",
}
SOFTWARE_SLOWDOWNS = {"sw_thermal_slowdown": "software thermal slowdown"}


SMI_QUERY_FILE = "nvidia-smi-q.xml"
# nvidia-smi(1), RETURN VALUE: the codes that mean the hardware or driver, not the caller.
SMI_EXIT_MEANINGS = {
    9: "the NVIDIA driver is not loaded",
    14: "an infoROM is corrupted",
    15: "a GPU has fallen off the bus or otherwise become inaccessible",
}


def gpu_name(gpu: GpuQuery) -> str:
    return f"GPU {gpu.index} ({gpu.pci_bus_id})"


@check("gpu.smi", "nvidia-smi -q -x answers: a non-zero exit or no output fails (a GPU off the "
       "bus, a driver that does not answer)", uses=("meta",), hardware="gpu")
def gpu_smi(meta: SnapshotMeta | None, expected: NodeExpectations) -> Finding:
    probe = meta.probes.get(SMI_QUERY_FILE) if meta else None
    if probe is None:
        return Finding(Status.OK, f"no record of how {SMI_QUERY_FILE} was collected (no meta.json "
                       "entry): the other GPU checks judge the file", {"recorded": False})
    details = {"command": list(probe.command), "exit_code": probe.exit_code,
               "stdout_bytes": probe.stdout_bytes, "stderr_tail": probe.stderr_tail}
    if probe.missing:               # `health check` names the PATH it searched, once
        return Finding(Status.UNKNOWN, f"nvidia-smi -q -x did not run: {probe.command[0]} not found", details)
    if probe.exit_code is None:     # timed out, could not be executed
        return Finding(Status.UNKNOWN, f"nvidia-smi -q -x did not run to the end: {probe.error}", details)
    if probe.exit_code != 0:
        meaning = SMI_EXIT_MEANINGS.get(probe.exit_code)
        why = probe.error or f"exited with status {probe.exit_code}"
        return Finding(Status.FAIL, f"nvidia-smi -q -x failed: {why}"
                       + (f" (status {probe.exit_code}: {meaning})" if meaning else ""), details)
    if probe.stdout_bytes == 0:
        stderr = probe.stderr_tail.strip().splitlines()[-1:]
        return Finding(Status.FAIL, "nvidia-smi -q -x exited 0 but printed nothing"
                       + (f": {stderr[0]}" if stderr else ""), details)
    return Finding(Status.OK, "nvidia-smi -q -x answered", details)


def unread(smi: SmiQuery, *sections: str) -> list[tuple[Status, str]]:
    """The fields of `sections` (-q -x tags or -q headings) a check needed but could not read."""
    return [(Status.UNKNOWN, f"{gpu_name(g)}: {f.path} not reported ({f.value!r}): not judged")
            for g in smi.gpus for f in g.unreadable if f.section in sections]


@check("gpu.count", "The node shows the number of GPUs the site expects", needs=("smi",),
       hardware="gpu")
def gpu_count(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    found = len(smi.gpus)
    details = {"gpus": found, "attached_gpus": smi.attached_gpus, "expected": expected.gpus}
    if expected.gpus is None:
        return Finding(Status.OK, f"{found} GPU(s) visible (no count expected)", details)
    if found < expected.gpus:
        return Finding(Status.FAIL, f"{found} of {expected.gpus} expected GPUs visible "
                       "(lost or fallen off the bus?)", details)
    if found > expected.gpus:
        return Finding(Status.WARN, f"{found} GPUs visible, the site expects {expected.gpus}",
                       details)
    return Finding(Status.OK, f"{found} GPUs, as expected", details)


@check("gpu.model", "Every GPU is the model the site expects (and all are alike)",
       needs=("smi",), hardware="gpu")
def gpu_model(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    names = sorted({str(gpu.product_name) for gpu in smi.gpus})
    issues = []
    if expected.gpu_model is not None:
        issues = [(Status.FAIL, f"{gpu_name(g)} is {g.product_name or 'an unnamed GPU'}, "
                                f"the site expects {expected.gpu_model}")
                  for g in smi.gpus if expected.gpu_model not in (g.product_name or "")]
    elif len(names) > 1:
        issues = [(Status.WARN, "mixed GPU models: " + ", ".join(names))]
    return summarize(issues, f"GPU model: {', '.join(names) or 'none'}",
                     {"gpus": [{"index": g.index, "model": g.product_name} for g in smi.gpus]})


@check("gpu.ecc", "No GPU has uncorrectable ECC errors", needs=("smi",), hardware="gpu")
def gpu_ecc(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    issues = []
    for gpu in smi.gpus:
        if gpu.ecc_uncorrectable_volatile:
            issues.append((Status.FAIL, f"{gpu_name(gpu)}: {gpu.ecc_uncorrectable_volatile} "
                                        "uncorrectable ECC errors since the last reset"))
        elif gpu.ecc_uncorrectable_aggregate:
            issues.append((Status.WARN, f"{gpu_name(gpu)}: {gpu.ecc_uncorrectable_aggregate} "
                                        "uncorrectable ECC errors over its lifetime"))
    issues += unread(smi, "ecc_errors", "ECC Errors")
    details = {"gpus": [{"index": g.index, "ecc_mode": g.ecc_mode,
                         "uncorrectable_volatile": g.ecc_uncorrectable_volatile,
                         "uncorrectable_aggregate": g.ecc_uncorrectable_aggregate}
                        for g in smi.gpus]}
    return summarize(issues, "no uncorrectable ECC errors", details)


@check("gpu.row_remap", "No row remapping or page retirement is pending or has failed",
       needs=("smi",), hardware="gpu")
def gpu_row_remap(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    issues = []
    for gpu in smi.gpus:
        name = gpu_name(gpu)
        if gpu.remapped_rows_pending:
            issues.append((Status.FAIL, f"{name}: row remapping pending (reset the GPU to apply it)"))
        if gpu.remapped_rows_failure:
            issues.append((Status.FAIL, f"{name}: row remapping failed (no spare rows left)"))
        if gpu.retired_pages_pending:
            issues.append((Status.FAIL, f"{name}: retired pages pending (reset the GPU to retire them)"))
        retired = (gpu.retired_pages_sbe or 0) + (gpu.retired_pages_dbe or 0)
        if expected.max_retired_pages is not None and retired > expected.max_retired_pages:
            issues.append((Status.FAIL, f"{name}: {retired} retired pages, the site allows "
                                        f"{expected.max_retired_pages}"))
    issues += unread(smi, "retired_pages", "remapped_rows", "Retired Pages", "Remapped Rows")
    details = {"gpus": [{"index": g.index, "remapped_rows_pending": g.remapped_rows_pending,
                         "remapped_rows_failure": g.remapped_rows_failure,
                         "remapped_rows_uncorrectable": g.remapped_rows_uncorrectable,
                         "retired_pages_sbe": g.retired_pages_sbe,
                         "retired_pages_dbe": g.retired_pages_dbe,
                         "retired_pages_pending": g.retired_pages_pending} for g in smi.gpus]}
    return summarize(issues, "no memory repair pending or failed", details)


@check("gpu.reset", "No GPU asks for a reset, a drain or another recovery action",
       needs=("smi",), hardware="gpu")
def gpu_reset(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    issues = []
    for gpu in smi.gpus:
        if gpu.reset_required:
            issues.append((Status.FAIL, f"{gpu_name(gpu)} requires a reset"))
        if gpu.drain_and_reset_recommended:
            issues.append((Status.FAIL, f"{gpu_name(gpu)}: drain and reset recommended"))
        if gpu.recovery_action not in (None, "None"):
            issues.append((Status.FAIL, f"{gpu_name(gpu)}: recovery action {gpu.recovery_action}"))
    issues += unread(smi, "gpu_reset_status", "GPU Reset Status")
    details = {"gpus": [{"index": g.index, "reset_required": g.reset_required,
                         "drain_and_reset_recommended": g.drain_and_reset_recommended,
                         "recovery_action": g.recovery_action} for g in smi.gpus]}
    return summarize(issues, "no GPU needs a reset", details)


@check("gpu.fabric", "NVSwitch systems: every GPU completed fabric registration",
       needs=("smi",), hardware="nvlink")
def gpu_fabric(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    issues = []
    for gpu in smi.gpus:
        # Fabric state is N/A on GPUs without NVSwitch; "Completed"/"Success" when ready.
        if gpu.fabric_state not in (None, "Completed"):
            issues.append((Status.FAIL, f"{gpu_name(gpu)}: fabric state {gpu.fabric_state} "
                                        "(fabric manager not ready?)"))
        elif gpu.fabric_status not in (None, "Success"):
            issues.append((Status.FAIL, f"{gpu_name(gpu)}: fabric status {gpu.fabric_status}"))
    states = sorted({f"{g.fabric_state}/{g.fabric_status}" for g in smi.gpus if g.fabric_state})
    ok = ("fabric: " + ", ".join(states)) if states else "no GPU reports an NVSwitch fabric state"
    return summarize(issues, ok,
                     {"gpus": [{"index": g.index, "state": g.fabric_state,
                                "status": g.fabric_status} for g in smi.gpus]})


@check("gpu.clock_events", "No GPU clocks are held down by hardware slowdown, thermal or "
       "power brake", needs=("smi",), hardware="gpu")
def gpu_clock_events(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    issues = []
    for gpu in smi.gpus:
        for reason in gpu.clock_events_active:
            if reason in HARDWARE_SLOWDOWNS:
                issues.append((Status.FAIL, f"{gpu_name(gpu)}: {HARDWARE_SLOWDOWNS[reason]} active"))
            elif reason in SOFTWARE_SLOWDOWNS:
                issues.append((Status.WARN, f"{gpu_name(gpu)}: {SOFTWARE_SLOWDOWNS[reason]} active"))
    issues += unread(smi, "clocks_event_reasons", "clocks_throttle_reasons", "Clocks Event Reasons",
                     "Clocks Throttle Reasons")
    return summarize(issues, "no hardware or thermal clock slowdown",
                     {"gpus": [{"index": g.index, "active": list(g.clock_events_active)}
                               for g in smi.gpus]})


@check("gpu.persistence", "Persistence mode is on where the site wants it", needs=("smi",),
       hardware="gpu")
def gpu_persistence(smi: SmiQuery, expected: NodeExpectations) -> Finding:
    modes = [{"index": g.index, "persistence_mode": g.persistence_mode} for g in smi.gpus]
    if not expected.persistence_mode:
        return Finding(Status.OK, "persistence mode not required", {"gpus": modes})
    off = [gpu_name(g) for g in smi.gpus if g.persistence_mode != "Enabled"]
    issues = [(Status.WARN, "persistence mode off on " + ", ".join(off))] if off else []
    return summarize(issues, "persistence mode on, on every GPU", {"gpus": modes})
