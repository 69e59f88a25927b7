"""Software and firmware versions a snapshot's sysfs copies show (pure).

- `class/infiniband/<hca>/fw_ver` ("28.39.1002") and `hca_type` ("MT4129"): HCA firmware,
  compared between adapters of the same model only;
- `module/mlx5_core/version`: the mlx5 driver's version, which MLNX_OFED / DOCA-OFED sets to
  its own release (the kernel's inbox driver has no such file);
- `module/nvidia/version`: the loaded NVIDIA kernel module.

Values are compared as printed: trainctl never orders versions, it only sees that they differ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_FW = re.compile(r".*?/?infiniband/(?P<hca>[^/]+)/(?P<attr>fw_ver|hca_type)")
_MODULE = re.compile(r".*?/?module/(?P<module>mlx5_core|nvidia)/version")
_MODULE_KEYS = {"mlx5_core": "ofed", "nvidia": "nvidia_module"}


def parse_software_sysfs(files: Mapping[str, str]) -> dict[str, str] | None:
    """{"hca_firmware MT4129": "28.39.1002", "ofed": "24.10-1.1.4", ...}; None when none is there."""
    hcas: dict[str, dict[str, str]] = {}
    found: dict[str, set[str]] = {}
    for path, contents in files.items():
        fw = _FW.fullmatch(path)
        if fw:
            hcas.setdefault(fw["hca"], {})[fw["attr"]] = contents.strip()
            continue
        module = _MODULE.fullmatch(path)
        if module and contents.strip():
            found.setdefault(_MODULE_KEYS[module["module"]], set()).add(contents.strip())
    for attrs in hcas.values():
        if attrs.get("fw_ver"):
            found.setdefault(f"hca_firmware {attrs.get('hca_type') or 'HCA'}", set()).add(attrs["fw_ver"])
    return {key: ", ".join(sorted(values)) for key, values in sorted(found.items())} or None
