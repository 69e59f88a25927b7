"""trainctl: start multi-node GPU training on Slurm fast, and only on healthy hardware."""

# Kept as a literal (not importlib.metadata) so `trainctl --version` costs no extra imports.
__version__ = "0.1.0"
