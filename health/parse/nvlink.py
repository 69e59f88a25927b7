"""`nvidia-smi nvlink -s`: per GPU, each NVLink's speed, or why there is none.

Link lines read `Link 0: 26.562 GB/s`, or `Link 3: <inactive>` for a dead link (the
form in Azure/azhpc-diagnostics#73). A GPU whose links are all down, that is in MIG
mode, or that has no NVLink prints one sentence instead of links. Some systems without
NVLink print nothing at all (a single H100 in a VM, driver 580): no GPUs listed.

`nvidia-smi nvlink -e` (error counters) is read by parse/counters.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainctl.errors import ParseError
from trainctl.health.parse.common import to_float

SOURCE = "nvidia-smi nvlink -s"
_GPU = re.compile(r"GPU (\d+): (.+) \(UUID: (.+)\)")
_LINK = re.compile(r"Link (\d+): (?:([0-9.]+) GB/s|(<inactive>))")
# The sentence nvidia-smi prints in place of links -> the state it means.
NO_LINKS = {
    "NVML: Unable to retrieve NVLink information as all links are inactive": "all_inactive",
    "Nvlink queries are not supported for Devices in MIG mode": "mig",
    "Device does not have or support Nvlink": "absent",
}


@dataclass(frozen=True)
class NvlinkLink:
    number: int
    speed_gbps: float | None    # GB/s as printed; None for an inactive link


@dataclass(frozen=True)
class NvlinkGpu:
    index: int
    name: str
    uuid: str
    state: str                  # "links" (listed below), "all_inactive", "mig" or "absent"
    links: tuple[NvlinkLink, ...]


def parse_nvlink_status(text: str, *, source: str = SOURCE) -> tuple[NvlinkGpu, ...]:
    gpus: list[NvlinkGpu] = []
    current: dict | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        gpu = _GPU.fullmatch(stripped)
        link = _LINK.fullmatch(stripped)
        if gpu:
            if current is not None:
                gpus.append(_finish(current, source))
            current = {"index": int(gpu[1]), "name": gpu[2], "uuid": gpu[3], "state": None,
                       "links": [], "line": lineno}
        elif current is None:
            raise ParseError(f"expected a 'GPU N: ...' line, got {stripped!r}", source=source,
                             line=lineno)
        elif link and current["state"] in (None, "links"):
            speed = None if link[3] else to_float(link[2], what="link speed", source=source,
                                                  line=lineno)
            current["state"] = "links"
            current["links"].append(NvlinkLink(int(link[1]), speed))
        elif stripped in NO_LINKS and current["state"] is None:
            current["state"] = NO_LINKS[stripped]
        else:
            raise ParseError(f"unexpected line for GPU {current['index']}: {stripped!r}",
                             source=source, line=lineno)
    if current is not None:
        gpus.append(_finish(current, source))
    return tuple(gpus)


def _finish(gpu: dict, source: str) -> NvlinkGpu:
    if gpu["state"] is None:
        raise ParseError(f"GPU {gpu['index']} has neither links nor a status line (truncated?)",
                         source=source, line=gpu["line"])
    return NvlinkGpu(index=gpu["index"], name=gpu["name"], uuid=gpu["uuid"], state=gpu["state"],
                     links=tuple(gpu["links"]))
