"""`nvidia-smi -q -x` (XML) and `nvidia-smi -q` (text): the per-GPU health fields.

Both forms become the same `SmiQuery`. Only the fields the checks judge are kept;
a field the driver does not report (older DTD, `-q -d SECTION`, "N/A", "[Not Supported]")
is None. A per-GPU field whose value is unexpected ("ERR!", a new enum, a deprecation
notice) is None too and is listed in `GpuQuery.unreadable`: the rest of the document is
still judged, and the checks that needed the field say which one they could not read.
XML tag names differ between DTD versions (v11 `clocks_throttle_reasons`, v12
`clocks_event_reasons`); both are read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar
from xml.parsers import expat

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_int

T = TypeVar("T")
XML_SOURCE = "nvidia-smi -q -x"
TEXT_SOURCE = "nvidia-smi -q"

# Clock event (throttle) reasons, by their text-form names -> one canonical name each.
_TEXT_CLOCK_REASONS = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clocks_setting",
}
_XML_CLOCK_SECTIONS = {"clocks_event_reasons": "clocks_event_reason_",
                       "clocks_throttle_reasons": "clocks_throttle_reason_"}
_TEXT_CLOCK_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")
# The children of <gpu> that _XmlReader.gpu reads.
_XML_GPU_SECTIONS = frozenset({
    "product_name", "uuid", "persistence_mode", "mig_mode", "ecc_mode", "ecc_errors",
    "retired_pages", "remapped_rows", "gpu_reset_status", "gpu_recovery_action", "fabric", "pci",
    "vbios_version", *_XML_CLOCK_SECTIONS})
_PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")
_TEXT_BANNER = "==============NVSMI LOG=============="
_TEXT_LINE = re.compile(r"(?P<key>\S.*?)\s+: ?(?P<value>.*)")
# Values that mean "this driver or GPU does not report the field".
_ABSENT = frozenset({"", "N/A", "[N/A]", "[Not Supported]", "Not Supported"})


@dataclass(frozen=True)
class UnreadField:
    """A per-GPU field whose value was not what the parser knows: not reported."""
    path: str       # XML path ("remapped_rows/remapped_row_pending") or -q keys ("Remapped Rows/Pending")
    value: str

    @property
    def section(self) -> str:
        return self.path.split("/")[0]


@dataclass(frozen=True)
class GpuQuery:
    index: int                      # position in the output: nvidia-smi's index order
    pci_bus_id: str                 # as printed, "00000000:9B:00.0"
    product_name: str | None = None
    uuid: str | None = None
    persistence_mode: str | None = None     # "Enabled" / "Disabled"
    mig_mode: str | None = None
    ecc_mode: str | None = None
    ecc_uncorrectable_volatile: int | None = None   # all SRAM + DRAM uncorrectable counters
    ecc_uncorrectable_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    recovery_action: str | None = None      # newer drivers (565 on): "None" when healthy
    clock_events_active: tuple[str, ...] = ()
    fabric_state: str | None = None         # NVSwitch systems: "Completed" when ready
    fabric_status: str | None = None
    vbios_version: str | None = None
    unreadable: tuple[UnreadField, ...] = ()


@dataclass(frozen=True)
class SmiQuery:
    driver_version: str | None
    attached_gpus: int | None
    gpus: tuple[GpuQuery, ...]
    cuda_version: str | None = None


# --- XML ---------------------------------------------------------------------------------

@dataclass
class _Node:
    tag: str
    attrs: dict[str, str]
    line: int
    parts: list[str] = field(default_factory=list)
    children: list["_Node"] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts).strip()

    def find(self, path: str) -> "_Node | None":
        node = self
        for tag in path.split("/"):
            node = next((c for c in node.children if c.tag == tag), None)
            if node is None:
                return None
        return node


def parse_smi_xml(text: str, *, source: str = XML_SOURCE) -> SmiQuery:
    root = _xml_tree(text, source)
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"root element is <{root.tag}>, not <nvidia_smi_log>", source=source,
                         line=root.line)
    reader = _XmlReader(source)
    gpus = tuple(reader.gpu(i, node) for i, node in
                 enumerate(c for c in root.children if c.tag == "gpu"))
    attached = root.find("attached_gpus")
    return SmiQuery(driver_version=reader.text(root, "driver_version"),
                    attached_gpus=None if attached is None else
                    to_int(attached.text, what="attached_gpus", source=source, line=attached.line),
                    gpus=gpus, cuda_version=reader.text(root, "cuda_version"))


def _xml_tree(text: str, source: str) -> _Node:
    """The element tree with line numbers (ElementTree keeps none), via expat.

    Only the `<gpu>` sections the checks read are built; the rest (supported clocks,
    processes, MIG devices: most of the document) is skipped, which keeps an 8-GPU
    document within the time budget of a node check.
    """
    parser = expat.ParserCreate()
    parser.buffer_text = True
    stack: list[_Node] = []
    roots: list[_Node] = []
    skipped_depth = 0

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal skipped_depth
        if skipped_depth or (stack and stack[-1].tag == "gpu" and tag not in _XML_GPU_SECTIONS):
            skipped_depth += 1
            return
        node = _Node(tag, attrs, parser.CurrentLineNumber)
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def end(tag: str) -> None:
        nonlocal skipped_depth
        if skipped_depth:
            skipped_depth -= 1
        else:
            stack.pop()

    def characters(data: str) -> None:
        if stack and not skipped_depth:
            stack[-1].parts.append(data)

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = characters
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise ParseError(f"malformed XML: {expat.ErrorString(exc.code)}", source=source,
                         line=exc.lineno) from None
    return roots[0]


class _Tolerant:
    """A bad per-GPU value is recorded in `unread` and read as None (see the module doc)."""

    def __init__(self, source: str):
        self.source = source
        self.unread: list[UnreadField] = []

    def tolerate(self, path: str, value: str, convert: Callable[[], T]) -> T | None:
        try:
            return convert()
        except ParseError:
            self.unread.append(UnreadField(path, value))
            return None

    def take_unread(self) -> tuple[UnreadField, ...]:
        unread, self.unread = tuple(self.unread), []
        return unread


class _XmlReader(_Tolerant):
    """Typed field reads off `<gpu>` elements."""

    def text(self, node: _Node, path: str) -> str | None:
        found = node.find(path)
        return None if found is None or found.text in _ABSENT else found.text

    def count(self, node: _Node, path: str) -> int | None:
        found = node.find(path)
        if found is None or found.text in _ABSENT:
            return None
        return self.tolerate(path, found.text, lambda: to_int(found.text, what=path, source=self.source,
                                                              line=found.line))

    def yes_no(self, node: _Node, path: str) -> bool | None:
        found = node.find(path)
        return None if found is None else self.tolerate(
            path, found.text, lambda: _yes_no(found.text, path, self.source, found.line))

    def uncorrectable(self, node: _Node, path: str) -> int | None:
        section = node.find(path)
        if section is None:
            return None
        counts = [self.count(node, f"{path}/{c.tag}") for c in section.children if "uncorrectable" in c.tag]
        return _sum_known(counts)

    def clock_events(self, gpu: _Node) -> tuple[str, ...]:
        active = []
        for section_tag, prefix in _XML_CLOCK_SECTIONS.items():
            section = gpu.find(section_tag)
            for reason in section.children if section is not None else ():
                if self.tolerate(f"{section_tag}/{reason.tag}", reason.text,
                                 lambda: _active(reason.text, reason.tag, self.source, reason.line)):
                    active.append(reason.tag.removeprefix(prefix))
        return tuple(active)

    def gpu(self, index: int, gpu: _Node) -> GpuQuery:
        bus_id = gpu.attrs.get("id") or self.text(gpu, "pci/pci_bus_id")
        if not bus_id or not _PCI_BUS_ID.fullmatch(bus_id):
            raise ParseError(f"<gpu> without a PCI bus id: {bus_id!r}", source=self.source,
                             line=gpu.line)
        return GpuQuery(
            index=index, pci_bus_id=bus_id,
            product_name=self.text(gpu, "product_name"), uuid=self.text(gpu, "uuid"),
            persistence_mode=self.text(gpu, "persistence_mode"),
            mig_mode=self.text(gpu, "mig_mode/current_mig"),
            ecc_mode=self.text(gpu, "ecc_mode/current_ecc"),
            ecc_uncorrectable_volatile=self.uncorrectable(gpu, "ecc_errors/volatile"),
            ecc_uncorrectable_aggregate=self.uncorrectable(gpu, "ecc_errors/aggregate"),
            retired_pages_sbe=self.count(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
            retired_pages_dbe=self.count(gpu, "retired_pages/double_bit_retirement/retired_count"),
            retired_pages_pending=_any_true(self.yes_no(gpu, "retired_pages/pending_blacklist"),
                                            self.yes_no(gpu, "retired_pages/pending_retirement")),
            remapped_rows_uncorrectable=self.count(gpu, "remapped_rows/remapped_row_unc"),
            remapped_rows_pending=self.yes_no(gpu, "remapped_rows/remapped_row_pending"),
            remapped_rows_failure=self.yes_no(gpu, "remapped_rows/remapped_row_failure"),
            reset_required=self.yes_no(gpu, "gpu_reset_status/reset_required"),
            drain_and_reset_recommended=self.yes_no(gpu, "gpu_reset_status/drain_and_reset_recommended"),
            recovery_action=self.text(gpu, "gpu_recovery_action"),
            clock_events_active=self.clock_events(gpu),
            fabric_state=self.text(gpu, "fabric/state"), fabric_status=self.text(gpu, "fabric/status"),
            vbios_version=self.text(gpu, "vbios_version"), unreadable=self.take_unread())


# --- text --------------------------------------------------------------------------------

@dataclass
class _Entry:
    key: str
    value: str | None
    line: int
    children: list["_Entry"] = field(default_factory=list)

    def find(self, path: str) -> "_Entry | None":
        entry = self
        for key in path.split("/"):
            entry = next((c for c in entry.children if c.key == key), None)
            if entry is None:
                return None
        return entry


def parse_smi_text(text: str, *, source: str = TEXT_SOURCE) -> SmiQuery:
    top = _text_tree(text, source)
    reader = _TextReader(source)
    gpu_entries = [e for e in top.children if e.key.startswith("GPU ") and e.value is None]
    gpus = []
    for index, entry in enumerate(gpu_entries):
        bus_id = entry.key.removeprefix("GPU ")
        if not _PCI_BUS_ID.fullmatch(bus_id):
            raise ParseError(f"not a GPU section: {entry.key!r}", source=source, line=entry.line)
        gpus.append(reader.gpu(index, bus_id, entry))
    attached = top.find("Attached GPUs")
    return SmiQuery(driver_version=reader.text(top, "Driver Version"),
                    attached_gpus=None if attached is None else
                    to_int(attached.value or "", what="Attached GPUs", source=source,
                           line=attached.line),
                    gpus=tuple(gpus), cuda_version=reader.text(top, "CUDA Version"))


def _text_tree(text: str, source: str) -> _Entry:
    """Indentation (4 spaces a level) -> a tree of `Key : value` entries and sections."""
    top = _Entry("", None, 0)
    stack = [top]
    banner_seen = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if not banner_seen:
            if line.strip() != _TEXT_BANNER:
                raise ParseError("not nvidia-smi -q output (no NVSMI LOG banner)", source=source,
                                 line=lineno)
            banner_seen = True
            continue
        content = line.lstrip(" ")
        indent = len(line) - len(content)
        depth, misaligned = divmod(indent, 4)
        if misaligned or depth > len(stack) - 1:
            raise ParseError("bad indentation", source=source, line=lineno)
        del stack[depth + 1:]
        match = _TEXT_LINE.fullmatch(content.rstrip())
        entry = (_Entry(match["key"], match["value"].strip(), lineno) if match
                 else _Entry(content.strip(), None, lineno))
        stack[-1].children.append(entry)
        stack.append(entry)
    if not banner_seen:
        raise ParseError("empty output", source=source, line=1)
    _reject_empty_sections(top, source)
    return top


def _reject_empty_sections(top: _Entry, source: str) -> None:
    """A section heading always heads fields; a bare one is a line cut off mid-way."""
    pending = list(top.children)
    while pending:
        entry = pending.pop()
        if entry.value is None and not entry.children:
            raise ParseError(f"section {entry.key!r} is empty (truncated?)", source=source,
                             line=entry.line)
        pending.extend(entry.children)


class _TextReader(_Tolerant):
    def text(self, entry: _Entry, path: str) -> str | None:
        found = entry.find(path)
        return None if found is None or found.value is None or found.value in _ABSENT else found.value

    def count(self, entry: _Entry, path: str) -> int | None:
        found = entry.find(path)
        if found is None or found.value is None or found.value in _ABSENT:
            return None
        return self.tolerate(path, found.value, lambda: to_int(found.value, what=path, source=self.source,
                                                               line=found.line))

    def yes_no(self, entry: _Entry, path: str) -> bool | None:
        found = entry.find(path)
        return None if found is None else self.tolerate(
            path, found.value or "", lambda: _yes_no(found.value or "", path, self.source, found.line))

    def uncorrectable(self, entry: _Entry, path: str) -> int | None:
        section = entry.find(path)
        if section is None:
            return None
        return _sum_known([self.count(entry, f"{path}/{c.key}") for c in section.children
                           if "Uncorrectable" in c.key])

    def clock_events(self, gpu: _Entry) -> tuple[str, ...]:
        active = []

        def visit(section: str, entries: list[_Entry]) -> None:
            for reason in entries:
                name = _TEXT_CLOCK_REASONS.get(reason.key, reason.key.lower().replace(" ", "_"))
                if self.tolerate(f"{section}/{reason.key}", reason.value or "",
                                 lambda: _active(reason.value or "", reason.key, self.source, reason.line)):
                    active.append(name)
                visit(section, reason.children)   # HW Slowdown holds its thermal and power-brake parts

        for section in _TEXT_CLOCK_SECTIONS:
            found = gpu.find(section)
            if found is not None:
                visit(section, found.children)
        return tuple(active)

    def gpu(self, index: int, bus_id: str, gpu: _Entry) -> GpuQuery:
        return GpuQuery(
            index=index, pci_bus_id=bus_id,
            product_name=self.text(gpu, "Product Name"), uuid=self.text(gpu, "GPU UUID"),
            persistence_mode=self.text(gpu, "Persistence Mode"),
            mig_mode=self.text(gpu, "MIG Mode/Current"),
            ecc_mode=self.text(gpu, "ECC Mode/Current") or self.text(gpu, "Ecc Mode/Current"),
            ecc_uncorrectable_volatile=self.uncorrectable(gpu, "ECC Errors/Volatile"),
            ecc_uncorrectable_aggregate=self.uncorrectable(gpu, "ECC Errors/Aggregate"),
            retired_pages_sbe=self.count(gpu, "Retired Pages/Single Bit ECC"),
            retired_pages_dbe=self.count(gpu, "Retired Pages/Double Bit ECC"),
            retired_pages_pending=self.yes_no(gpu, "Retired Pages/Pending Page Blacklist"),
            remapped_rows_uncorrectable=self.count(gpu, "Remapped Rows/Uncorrectable Error"),
            remapped_rows_pending=self.yes_no(gpu, "Remapped Rows/Pending"),
            remapped_rows_failure=self.yes_no(gpu, "Remapped Rows/Remapping Failure Occurred"),
            reset_required=self.yes_no(gpu, "GPU Reset Status/Reset Required"),
            drain_and_reset_recommended=self.yes_no(gpu, "GPU Reset Status/Drain and Reset Recommended"),
            recovery_action=self.text(gpu, "GPU Recovery Action"),
            clock_events_active=self.clock_events(gpu),
            fabric_state=self.text(gpu, "Fabric/State"), fabric_status=self.text(gpu, "Fabric/Status"),
            vbios_version=self.text(gpu, "VBIOS Version"), unreadable=self.take_unread())


# --- shared ------------------------------------------------------------------------------

def _yes_no(value: str, what: str, source: str, line: int) -> bool | None:
    if value in _ABSENT:
        return None
    if value not in ("Yes", "No"):
        raise ParseError(f"{what}: expected Yes or No, got {value!r}", source=source, line=line)
    return value == "Yes"


def _active(value: str, what: str, source: str, line: int) -> bool:
    if value not in ("Active", "Not Active") and value not in _ABSENT:
        raise ParseError(f"{what}: expected Active or Not Active, got {value!r}", source=source,
                         line=line)
    return value == "Active"


def _sum_known(counts: list[int | None]) -> int | None:
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _any_true(*flags: bool | None) -> bool | None:
    known = [f for f in flags if f is not None]
    return any(known) if known else None
