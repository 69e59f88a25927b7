"""A real multi-node Slurm cluster on one machine (network namespaces), for tests and the demo."""
