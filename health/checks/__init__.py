"""Check families. Importing this package registers every check (see registry.py)."""

from trainctl.health.checks import fabric, gpu, host, kernel, nvlink, topo  # noqa: F401
