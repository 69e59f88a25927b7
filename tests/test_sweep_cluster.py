"""Sweeps on the real Slurm test cluster, running the real `trainctl health check` on each node.

Every node replays a recorded ibstat (all ports Active); node2 replays the same node type
with two ports Down. Tests restore what they change: replays, jobs, drains.
"""

import json
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from support.sweeps import (DAY, PORTS_ACTIVE, PORTS_DOWN, TRAINCTL, slurm, stage_ibstat, trainctl,
                                  unstage, write_site)
from trainctl.sweep.db import History

pytestmark = pytest.mark.cluster
NODES = ["node1", "node2", "node3", "node4"]


@pytest.fixture
def cluster(devcluster):
    for node in NODES:
        stage_ibstat(devcluster, node, PORTS_ACTIVE)
    yield devcluster
    unstage(devcluster, NODES)
    devcluster.wait_idle(timeout_s=60)


def hold(cluster, node: str) -> str:
    """Someone else's job takes `node`; returns its id once it runs."""
    job = slurm(cluster, "sbatch", "--parsable", "--job-name=someone-else", f"--nodelist={node}", "--nodes=1",
                "--exclusive", "--output=/dev/null", "--wrap", "sleep 600").strip().split(";")[0]
    deadline = time.monotonic() + 30
    while slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T").strip() != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} did not start"
        time.sleep(0.2)
    return job


def shift_back(db, sweep_id: int, seconds: float) -> None:
    """Make a sweep look as if it ran `seconds` earlier (the test cannot wait a night)."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE sweeps SET started_at = started_at - ?, finished_at = finished_at - ? WHERE id = ?",
                     (seconds, seconds, sweep_id))
        for table in ("nodes", "results"):
            conn.execute(f"UPDATE {table} SET recorded_at = recorded_at - ? WHERE sweep_id = ?", (seconds, sweep_id))
    conn.close()


def test_sweep_records_the_failure_the_busy_node_and_since_when(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    site = write_site(tmp_path / "site.toml", db)
    stage_ibstat(cluster, "node2", PORTS_DOWN)
    job = hold(cluster, "node4")
    try:
        first = trainctl(cluster, "sweep", "--site", site, "--json")
        assert first.returncode == 2, first.stderr            # the worst node fails
        swept = json.loads(first.stdout)
        nodes = {n["host"]: n for n in swept["nodes"]}
        assert set(nodes) == set(NODES)                       # the busy node is recorded, not dropped
        assert nodes["node4"]["outcome"] == "not_swept" and nodes["node4"]["slurm_state"] == "allocated"
        assert [nodes[n]["status"] for n in ("node1", "node2", "node3")] == ["ok", "fail", "ok"]
        failing = [c for c in nodes["node2"]["checks"] if c["status"] != "ok"]
        assert [c["name"] for c in failing] == ["ib.ports"] and "mlx5_11 port 1 is Down" in failing[0]["reason"]
        assert "idle; checking node[1-3] in one Slurm job" in first.stderr   # progress on stderr

        shift_back(db, swept["sweep"], DAY)                   # that was last night
        second = trainctl(cluster, "sweep", "--site", site, "--json")
        assert second.returncode == 2, second.stderr
    finally:
        slurm(cluster, "scancel", job)

    report = trainctl(cluster, "report", "--db", db, "--format", "json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    (group,) = data["groups"]
    assert (group["hostlist"], group["check"], group["status"]) == ("node2", "ib.ports", "fail")
    assert group["since_sweep"] == swept["sweep"] and group["since"] == data["sweeps"][0]["started_at"]
    assert data["not_swept"] == [{"slurm_state": "allocated", "hostlist": "node4", "hosts": ["node4"]}]
    assert data["counts"] == {"ok": 2, "fail": 1, "not_swept": 1}
    assert len(data["grid"]["nights"]) == 2
    text = trainctl(cluster, "report", "--db", db).stdout
    assert re.search(r"node2\s+ib\.ports\s+mlx5_11 port 1 is Down/Disabled.*\[fail since", text)
    assert re.search(r"NOT SWEPT.*\n\s+node4\s+allocated", text)


def test_a_node_that_outruns_the_deadline_is_timed_out_not_failed(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    site = write_site(tmp_path / "site.toml", db)
    stage_ibstat(cluster, "node3", PORTS_ACTIVE, sleep_s=60)  # a hung ibstat on node3
    out = trainctl(cluster, "sweep", "--site", site, "--timeout", "4", "--json")
    assert out.returncode == 3, out.stderr                     # no verdict counts as unknown, not fail
    nodes = {n["host"]: n for n in json.loads(out.stdout)["nodes"]}
    assert nodes["node3"]["outcome"] == "timeout" and nodes["node3"]["status"] is None
    assert "within 4 s" in nodes["node3"]["detail"]
    assert all(nodes[n]["status"] == "ok" for n in ("node1", "node2", "node4"))
    data = json.loads(trainctl(cluster, "report", "--db", db, "--format", "json").stdout)
    assert data["groups"] == [] and [h["hostlist"] for h in data["no_verdict"]] == ["node3"]


def test_sweep_killed_mid_way_leaves_a_readable_history_marked_incomplete(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    site = write_site(tmp_path / "site.toml", db)
    stage_ibstat(cluster, "node3", PORTS_ACTIVE, sleep_s=8)   # node3 answers last
    sweep = subprocess.Popen([TRAINCTL, "sweep", "--site", str(site)], env=cluster.client_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = ""
    try:
        deadline = time.monotonic() + 60
        while checked_nodes(db) < 3:                          # node1, 2 and 4 are in, node3 still checking
            assert sweep.poll() is None and time.monotonic() < deadline, "sweep ended before it could be killed"
            time.sleep(0.1)
        sweep.send_signal(signal.SIGKILL)
        sweep.wait(timeout=10)
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        job = conn.execute("SELECT slurm_job_id FROM sweeps").fetchone()[0]
        conn.close()
    finally:
        if sweep.poll() is None:
            sweep.kill()
        if job:
            slurm(cluster, "scancel", job)                    # srun outlives the killed sweep

    report = trainctl(cluster, "report", "--db", db, "--format", "json")
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    assert [s["complete"] for s in data["sweeps"]] == [False]
    assert data["counts"] == {"ok": 3}
    assert "INCOMPLETE" in trainctl(cluster, "report", "--db", db).stdout
    # a later sweep carries on with the same file
    assert trainctl(cluster, "sweep", "--site", site).returncode == 0


def checked_nodes(db) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT COUNT(*) FROM nodes WHERE outcome = 'checked'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.OperationalError:                          # created, schema not committed yet
        return 0


def test_ssh_sweep_checks_nodes_in_parallel_and_verifies_host_keys(cluster, tmp_path):
    endpoints = [cluster.start_sshd(node) for node in ("node1", "node2")]
    db = tmp_path / "sweeps.db"
    # Over SSH the TaskProlog's PATH does not apply: judge what needs no staged recording.
    site = write_site(tmp_path / "site.toml", db, checks=("host.memory", "host.defunct"), ssh=endpoints[0])
    out = trainctl(cluster, "sweep", "--site", site, "--via", "ssh", "--nodes", "node[1-2]", "--fanout", "2",
                   "--json")
    assert out.returncode == 0, out.stderr
    nodes = {n["host"]: n for n in json.loads(out.stdout)["nodes"]}
    assert {h: (n["outcome"], n["status"]) for h, n in nodes.items()} == {
        "node1": ("checked", "ok"), "node2": ("checked", "ok")}
    assert {c["name"] for c in nodes["node1"]["checks"]} == {"host.memory", "host.defunct"}

    stranger = tmp_path / "known_hosts"
    stranger.write_text("")                                   # these hosts' keys are not known
    untrusted = endpoints[0].__class__(**{**endpoints[0].__dict__, "known_hosts_path": str(stranger)})
    site = write_site(tmp_path / "untrusted.toml", db, checks=("host.memory",), ssh=untrusted)
    out = trainctl(cluster, "sweep", "--site", site, "--via", "ssh", "--nodes", "node1", "--json")
    assert out.returncode == 3, out.stderr                    # no verdict, not a failing node
    (node,) = json.loads(out.stdout)["nodes"]
    assert node["outcome"] == "error" and f"is not in {stranger}: refusing to connect" in node["detail"]


def test_fabric_add_on_records_each_nodes_verdict_as_a_check(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    site = write_site(tmp_path / "site.toml", db)
    cluster.set_rate("node3", "1gbit")                        # 5-7x slower than its peers over the veths
    try:
        out = trainctl(cluster, "sweep", "--site", site, "--fabric", "--json", timeout=300)
    finally:
        cluster.set_rate("node3", None)
    assert out.returncode == 2, out.stderr
    fabric = {n["host"]: c for n in json.loads(out.stdout)["nodes"] for c in n["checks"]
              if c["name"] == "fabric.allreduce"}
    assert set(fabric) == set(NODES)
    assert fabric["node3"]["status"] == "fail" and "straggler" in fabric["node3"]["reason"]
    assert all(fabric[n]["status"] == "ok" for n in ("node1", "node2", "node4"))
    data = json.loads(trainctl(cluster, "report", "--db", db, "--format", "json").stdout)
    assert [(g["hostlist"], g["check"]) for g in data["groups"]] == [("node3", "fabric.allreduce")]


def test_when_slurm_cannot_run_the_sweep_job_the_sweep_exits_4_and_says_why(cluster, tmp_path):
    db = tmp_path / "sweeps.db"
    site = write_site(tmp_path / "site.toml", db, gpus_per_node=16)  # the nodes have 8 GPUs
    out = trainctl(cluster, "sweep", "--site", site)
    assert out.returncode == 4, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("trainctl: error: sweep job failed: srun exited with status") and "srun: error" in last
    with History.open(db) as history:
        (sweep,) = history.sweeps()
        assert sweep.complete and sweep.error.startswith("sweep job failed")
        assert {n.outcome for n in history.sweep_nodes(sweep.id)} == {"error"}
