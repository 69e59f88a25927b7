"""Drain and resume on the real Slurm test cluster: tagged reasons, admins' drains left alone, operator rights."""

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.sweeps import PORTS_ACTIVE, PORTS_DOWN, slurm, stage_ibstat, trainctl, unstage, write_site
from trainctl.slurm import SINFO_FORMAT, parse_sinfo_states
from trainctl.sweep.db import History

pytestmark = pytest.mark.cluster
NODES = ["node1", "node2", "node3", "node4"]


@pytest.fixture
def cluster(devcluster):
    """All ports Active everywhere but node2 (two ports Down); drains and replays undone afterwards."""
    for node in NODES:
        stage_ibstat(devcluster, node, PORTS_DOWN if node == "node2" else PORTS_ACTIVE)
    yield devcluster
    unstage(devcluster, NODES)
    drained = [n for n, s in states(devcluster).items() if s.drained or s.reason]
    if drained:
        slurm(devcluster, "scontrol", "update", f"NodeName={','.join(drained)}", "State=RESUME")
    devcluster.wait_idle(timeout_s=60)


def states(cluster):
    return parse_sinfo_states(slurm(cluster, "sinfo", "-h", "-N", "-o", SINFO_FORMAT))


def sweep_once(cluster, tmp_path, db: Path) -> Path:
    site = write_site(tmp_path / "site.toml", db)
    assert trainctl(cluster, "sweep", "--site", site).returncode == 2
    return site


def recheck_site(cluster, tmp_path, db: Path) -> Path:
    """Resume re-checks over SSH, where the TaskProlog's PATH does not apply: the site names node2's ibstat."""
    endpoint = cluster.start_sshd("node2")
    return write_site(tmp_path / "recheck.toml", db, ssh=endpoint,
                      probes={"ibstat": str(cluster.node_bin_dir("node2") / "ibstat")})


def test_drain_tags_its_reason_and_resume_leaves_an_admins_drain_alone(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    sweep_once(cluster, tmp_path, db)

    dry = trainctl(cluster, "drain", "--db", db)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("node2") and "would drain" in dry.stdout
    assert states(cluster)["node2"].reason == ""                        # a dry run changes nothing

    applied = trainctl(cluster, "drain", "--db", db, "--apply", "--json")
    assert applied.returncode == 0, applied.stderr
    (action,) = json.loads(applied.stdout)["actions"]
    assert (action["host"], action["action"]) == ("node2", "drain")
    reasons = dict(line.split("|", 1) for line in slurm(cluster, "sinfo", "-R", "-h", "-o", "%n|%E").splitlines())
    assert reasons["node2"].startswith("trainctl: ib.ports: mlx5_11 port 1 is Down/Disabled")
    assert len(reasons["node2"].encode()) <= 255

    slurm(cluster, "scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bad DIMM")  # an admin
    site = recheck_site(cluster, tmp_path, db)

    still_broken = trainctl(cluster, "resume", "--site", site, "--apply", "--json")
    assert still_broken.returncode == 0, still_broken.stderr
    (kept,) = json.loads(still_broken.stdout)["actions"]
    assert kept["host"] == "node2" and kept["action"] == "skip" and "still fail" in kept["text"]
    assert states(cluster)["node2"].drained

    stage_ibstat(cluster, "node2", PORTS_ACTIVE)                          # node2 is repaired
    resumed = trainctl(cluster, "resume", "--site", site, "--apply", "--json")
    assert resumed.returncode == 0, resumed.stderr
    actions = json.loads(resumed.stdout)["actions"]
    assert [(a["host"], a["action"]) for a in actions] == [("node2", "resume")]   # node3 is not even considered
    now = states(cluster)
    assert now["node2"].state == "idle" and now["node2"].reason == ""
    assert now["node3"].drained and now["node3"].reason == "bad DIMM"
    with History.open(db) as history:
        (drain,) = history.drains()
    assert drain.host == "node2" and drain.closed_how == "resumed"
    assert json.loads(trainctl(cluster, "report", "--db", db, "--format", "json").stdout)["drained"] == []


def test_a_drain_an_admin_took_over_is_released_never_resumed(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    sweep_once(cluster, tmp_path, db)
    assert trainctl(cluster, "drain", "--db", db, "--apply").returncode == 0
    slurm(cluster, "scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=cable swap, ticket 42")
    stage_ibstat(cluster, "node2", PORTS_ACTIVE)                          # healthy now, but no longer ours
    out = trainctl(cluster, "resume", "--site", recheck_site(cluster, tmp_path, db), "--apply", "--json")
    assert out.returncode == 0, out.stderr
    (action,) = json.loads(out.stdout)["actions"]
    assert action["action"] == "release" and "cable swap, ticket 42" in action["text"]
    assert states(cluster)["node2"].reason == "cable swap, ticket 42"
    with History.open(db) as history:
        (drain,) = history.drains()
    assert drain.closed_how.startswith("released")


def as_nobody(cluster, python: str, *args) -> subprocess.CompletedProcess:
    """trainctl as user nobody, run by `python` (the `nobody_python` fixture: an install nobody can reach)."""
    argv = ["runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={cluster.slurm_conf}", python, "-P", "-m",
            "trainctl", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")


def fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_without_operator_rights_one_line_exit_2_history_unchanged(cluster, tmp_path, nobody_python):
    shared = Path(tempfile.mkdtemp(prefix="trainctl-nobody-"))
    try:
        shared.chmod(0o777)
        db = shared / "sweeps.db"
        sweep_once(cluster, tmp_path, db)
        db.chmod(0o666)                                  # writable: only trainctl's own rule keeps it unchanged

        before = fingerprint(db)
        out = as_nobody(cluster, nobody_python, "drain", "--db", db, "--apply")
        assert out.returncode == 2, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("trainctl: error: user nobody may not drain or resume nodes")
        assert fingerprint(db) == before and states(cluster)["node2"].reason == ""

        assert trainctl(cluster, "drain", "--db", db, "--apply").returncode == 0   # root drains node2
        site = write_site(shared / "site.toml", db)
        site.chmod(0o644)
        before = fingerprint(db)
        out = as_nobody(cluster, nobody_python, "resume", "--site", site, "--db", db, "--apply")
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "may not drain or resume" in out.stderr
        assert fingerprint(db) == before and states(cluster)["node2"].drained
    finally:
        shutil.rmtree(shared)
