"""Shared fixtures. `devcluster`: the real 4-node Slurm test cluster (tests marked `cluster`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

from trainctl.devcluster.cluster import DevCluster, missing_prerequisites, spec_for_instance

# Hypothesis's 200 ms per-example deadline is an absolute time: on a shared 2-core machine
# it fails a correct example now and then. Tests here never assert on time.
settings.register_profile("shared-machine", deadline=None)
settings.load_profile("shared-machine")

# Another test session on this machine may hold the cluster: wait for it rather than
# rebuilding the cluster under its feet.
DEVCLUSTER_LOCK_WAIT_S = 300.0


@pytest.fixture(scope="session")
def devcluster() -> Iterator[DevCluster]:
    """A running 4-node cluster (node1 MTU 1500, node2-4 MTU 9000, 8 fake GPUs each).

    Shared by the whole session: a test that changes it (rate, MTU, drain, files in a
    node_bin_dir) restores it. Torn down at session end, also after failures and Ctrl-C.
    """
    problems = missing_prerequisites()
    if problems:
        reason = "dev cluster unavailable: " + "; ".join(problems)
        if os.environ.get("TRAINCTL_REQUIRE_CLUSTER") == "1":  # CI: a skipped cluster test is a failure
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = DevCluster(spec_for_instance())  # $TRAINCTL_DEVCLUSTER_INSTANCE: 0 unless set
    cluster.up(lock_wait_s=DEVCLUSTER_LOCK_WAIT_S)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def nobody_python() -> Iterator[str]:
    """An interpreter that user nobody can run, with trainctl installed where nobody can read it
    (tests/support/nobody.py): the clone's .venv may lie where only root can enter (/root)."""
    import shutil
    import tempfile
    from pathlib import Path

    from support.nobody import make_install

    root = Path(tempfile.mkdtemp(prefix="trainctl-nobody-"))
    try:
        yield make_install(root)
    finally:
        shutil.rmtree(root)


@pytest.fixture(autouse=True)
def _no_unkillable_drain_carried_over(request) -> Iterator[None]:
    """A cluster test starts with no node drained by Slurm for "Kill task failed" (an earlier
    fault test's step slow to die); any such drain is resumed and reported on stderr."""
    if "devcluster" in request.fixturenames:
        from trainctl.devcluster.faults import new_unkillable_step_records, resume_unkillable_drains

        cluster = request.getfixturevalue("devcluster")
        resumed = resume_unkillable_drains(cluster)
        if resumed:
            print(f"conftest: resumed {','.join(resumed)} (drained by Slurm: Kill task failed)", file=sys.stderr)
        for record in new_unkillable_step_records(cluster):  # shown with the next failing test's output
            print(f"conftest: Slurm could not kill a step; UnkillableStepProgram recorded {record}", file=sys.stderr)
    yield
