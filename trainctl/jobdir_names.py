"""Where each file of a job's directory is: its names and `JobPaths`. Kept below the job room so
that code outside it that finds a job's files (the job script's renderer, `trainctl submit`, the
fleet history, which finds journals in job directories) spells them the one way the job's own
parts do. What each file holds, and its readers and writers, are `trainctl.job.jobdir`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DIR_PREFIX = "trainctl-gate-"            # + the job id, in the submit directory
JOURNAL = "journal.jsonl"
DECISION = "decision.json"
REPORT = "report.txt"
RETRY = "retry.json"
ATTEMPT = "attempt.json"
CHECKPOINT_MARKER = "checkpoint.seen"    # written by the program, named by TRAINCTL_CHECKPOINT_FILE
WATCH = "watch"
ROUNDS = "rounds"
NODE_REPORTS = "nodes"                   # the gate's per-node reports
FINAL_MARKER = ".final"                  # nodes/<node>.final: that node's report will not change any more
SNAPSHOTS = "snapshots"
COMPUTE = "compute"
FABRIC = "fabric.json"
GATE_STEP_STATUS = "gate-step.status"
ALERTS_LOG = "alerts.log"                # the alert command's runs: what it was given and what it said


def dir_name(job_id: str) -> str:
    return f"{DIR_PREFIX}{job_id}"


def node_file_name(node: str) -> str:
    return f"{node}.json"


def resize_script(job_id: str) -> str:
    """What `scontrol update NodeList=` writes in the current directory (scontrol(1), NodeList)."""
    return f"slurm_job_{job_id}_resize.sh"


@dataclass(frozen=True)
class JobPaths:
    """Where each file of one job's directory is (a path only: nothing here touches the filesystem)."""

    root: Path

    @classmethod
    def of(cls, submit_dir: str | os.PathLike, job_id: str) -> JobPaths:
        return cls(Path(submit_dir) / dir_name(job_id))

    @property
    def job_id(self) -> str | None:
        """The job whose directory this is, by its name; None for a directory of another name."""
        name = self.root.name
        return name[len(DIR_PREFIX):] or None if name.startswith(DIR_PREFIX) else None

    def sibling(self, job_id: str) -> JobPaths:
        """Another job's directory in the same submit directory (the attempts of one --retries job)."""
        return JobPaths(self.root.parent / dir_name(job_id))

    @property
    def decision(self) -> Path:
        return self.root / DECISION

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def journal(self) -> Path:
        return self.root / JOURNAL

    @property
    def retry(self) -> Path:
        return self.root / RETRY

    @property
    def attempt(self) -> Path:
        return self.root / ATTEMPT

    @property
    def checkpoint_marker(self) -> Path:
        return self.root / CHECKPOINT_MARKER

    @property
    def gate_step_status(self) -> Path:
        return self.root / GATE_STEP_STATUS

    @property
    def watch(self) -> Path:
        return self.root / WATCH

    @property
    def alerts_log(self) -> Path:
        return self.root / ALERTS_LOG

    def node_file(self, node: str) -> Path:
        return self.watch / node_file_name(node)

    def round(self, number: int) -> Path:
        return self.root / ROUNDS / str(number)

    # the gate's files

    @property
    def node_reports(self) -> Path:
        return self.root / NODE_REPORTS

    def node_report(self, node: str) -> Path:
        return self.node_reports / node_file_name(node)

    def node_report_final(self, node: str) -> Path:
        return self.node_reports / f"{node}{FINAL_MARKER}"

    def snapshot(self, node: str, *, after_fabric: bool = False) -> Path:
        return self.root / SNAPSHOTS / (f"{node}.after-fabric" if after_fabric else node)

    @property
    def fabric(self) -> Path:
        return self.root / FABRIC

    @property
    def compute(self) -> Path:
        return self.root / COMPUTE

    def compute_report(self, node: str) -> Path:
        return self.compute / node_file_name(node)

    @property
    def compute_order(self) -> Path:
        """Node 0's order of the compute test's turns."""
        return self.compute / ".order"

    def compute_ready(self, rank: int) -> Path:
        """Made by the node of `rank` once its checks are done, before the turns."""
        return self.compute / f".ready-{rank}"

    def compute_turn_done(self, rank: int) -> Path:
        """Made by the node of `rank` once it has measured, in turns."""
        return self.compute / f".turn-{rank}"

    def resize_script(self, job_id: str) -> Path:
        """Where `scontrol update NodeList=`, run in this directory, writes its script."""
        return self.root / resize_script(job_id)
