"""What trainctl reads from a Slurm version: the version line itself and what a version allows (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.errors import ParseError
from trainctl.slurm import node_for_hostname, parse_scontrol_oneliner, parse_slurm_version

RECORDED = Path(__file__).parent / "fixtures" / "recorded"


@pytest.mark.parametrize("recorded, version", [
    ("devcluster-slurm-22.05.8/scontrol-version.txt", (22, 5, 8)),
    ("devcluster-slurm-24.11.5/scontrol-version.txt", (24, 11, 5)),
    ("devcluster-slurm-26.05.5/scontrol-version.txt", (26, 5, 5)),
])
def test_debian_version_lines_recorded_on_the_dev_cluster(recorded, version):
    assert parse_slurm_version((RECORDED / recorded).read_text()) == version


@pytest.mark.parametrize("line, version", [
    # SchedMD's own build: PACKAGE_NAME "slurm" (configure.ac's AC_INIT) and SLURM_VERSION_STRING,
    # which auxdir/slurm.m4 builds from META: "-<Release>" unless Release is 1, and "MAJOR.MINOR
    # (unstable svn build DATE)" on an unreleased branch. Not recorded: no such build runs here.
    ("slurm 25.11.0", (25, 11, 0)),
    ("slurm 25.11.0-0rc1", (25, 11, 0)),
    ("slurm 26.05 (unstable svn build 202611270000)", (26, 5, 0)),
])
def test_version_lines_of_schedmds_builds(line, version):
    assert parse_slurm_version(line) == version


@pytest.mark.parametrize("text", [
    "",
    "slurm",
    "slurm 25",
    "scontrol: fatal: Could not establish a configuration source",  # 22.05 with no slurm.conf to read
    "slurm-wlm 24.11.5\nslurm-wlm 24.11.5",
])
def test_anything_else_is_a_parse_error_not_a_guess(text):
    with pytest.raises(ParseError, match="not a Slurm version line"):
        parse_slurm_version(text)


def test_what_trainctl_reads_from_scontrol_is_unchanged_on_26_05():
    """26.05 adds SLUIDs beside job ids (RELEASE_NOTES.md, API Changes); `scontrol show job -o` prints
    `SLUID=` only with --details, and the fields trainctl reads keep their names and forms."""
    job, = parse_scontrol_oneliner((RECORDED / "devcluster-slurm-26.05.5/scontrol-show-job.txt").read_text())
    assert (job["JobId"], job["JobState"], job["NodeList"], job["BatchHost"], job["Restarts"]) == (
        "1", "RUNNING", "node[1-2]", "node1", "0")
    assert job["WorkDir"] == "/tmp/s26rec" and "SLUID" not in job
    drained = RECORDED / "devcluster-slurm-26.05.5/scontrol-show-node-drained.txt"
    records = parse_scontrol_oneliner(drained.read_text())
    assert node_for_hostname(records, ("node3",)) == "node3"
    assert records[0]["State"] == "IDLE+DRAIN" and records[0]["NodeAddr"] == "10.77.6.3"
