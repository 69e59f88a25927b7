"""Check families. Importing this package registers every check (see registry.py)."""

from trainctl.health.checks import (counters, dcgm, fabric, gpu, gpu_presence, host, kernel,  # noqa: F401
                                    nvlink, pcie, topo, versions)
