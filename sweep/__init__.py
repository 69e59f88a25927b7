"""Nightly health sweeps: run the node checks across a partition, keep the history in SQLite,
report what is broken and since when, and drain and resume nodes without touching anyone
else's drain. Modules: `model` (rows), `db` (the history), `collect` (Slurm and SSH
fan-out), `node_task` (runs on each node), `runner` (one sweep), `report` and `render`
(pure report building and formats), `drain` (drain/resume plans and their application).
"""
