"""Fleet memory on the dev cluster: three jobs whose gates leave node4 out (its `nvidia-smi
nvlink -s` replays a V100 with NVLinks 3 and 5 inactive) drop their journals into the site's
journal directory; `trainctl history ingest` folds them in. All three are root's: by the default
rule (lemon_min_users = 2) one user's jobs make no lemon, and the report says node4 is held back
for that; the site that opts in counts one user's jobs (lemon_min_users = 1, a single team), its
report names node4 a lemon with three jobs, and a fourth `submit` from it excludes node4 before
any gate runs (Slurm's ExcNodeList). That fourth job (`--retries 1`) finds its two nodes bad too
(every node replays the fault by then), and its successor excludes them and, still, node4 (its
command-line --exclude replaces the script's #SBATCH one). `drain --lemons` then drains node4
with trainctl's tagged reason (its family, nvlink, recurs), and `resume` keeps that drain while node4 is still a lemon.

Each of the three jobs asks for 2 nodes with node4 among them (the site's extra sbatch option
--nodelist=node4), so the gate always sees the replay, and trains 1 step on the other node."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from support.sites import site_variant
from support.slurm_jobs import TRAINCTL, job_output, restarted_with, submit, wait_for_job
from test_devcluster_jobs import HEALTHY_NVLINK, INACTIVE_LINKS, TRAIN, staged_nvidia_smi
from trainctl.proc import run_checked
from trainctl.slurm import accounted_jobs, expand_hostlist, parse_scontrol_oneliner
from trainctl.sweep.db import History

pytestmark = pytest.mark.cluster

LEMON = "node4"


@pytest.fixture(scope="module")
def accounted(devcluster):
    """The session's cluster, started again with Slurm's accounting (slurmdbd, MariaDB): `history
    ingest` folds a journal in only once sacct vouches for it. Restored afterwards."""
    with restarted_with(devcluster, accounting=True) as cluster:
        yield cluster


def test_three_jobs_that_exclude_node4_make_it_a_lemon_the_next_submit_leaves_out(accounted, tmp_path):
    devcluster = accounted
    journals = tmp_path / "journals"
    journals.mkdir()
    journals.chmod(0o1777)   # every user's jobs drop their journals here
    (tmp_path / "gating").mkdir()
    (tmp_path / "opting").mkdir()
    changes = {"sweep.db": str(tmp_path / "sweeps.db"), "fleet.journal_dir": str(journals)}
    gating = site_variant(tmp_path / "gating", "local-demo", changes | {"slurm.extra_sbatch": [f"--nodelist={LEMON}"]})
    opting = site_variant(tmp_path / "opting", "local-demo", changes | {"fleet.submit_excludes_lemons": True,
                                                                        "fleet.lemon_min_users": 1})

    with staged_nvidia_smi(devcluster, {"node1": HEALTHY_NVLINK, "node2": HEALTHY_NVLINK, "node3": HEALTHY_NVLINK,
                                        LEMON: INACTIVE_LINKS}):
        jobs = three_gated_jobs(devcluster, tmp_path, gating)
        lemon_reported(devcluster, journals, jobs, opting, gating)
    with staged_nvidia_smi(devcluster, {node: INACTIVE_LINKS for node in ("node1", "node2", "node3", LEMON)}):
        fourth_job_leaves_the_lemon_out(devcluster, tmp_path, opting)
    lemon_drained_and_kept_drained(devcluster, opting, jobs)


def three_gated_jobs(devcluster, tmp_path: Path, gating: Path) -> list[str]:
    jobs = []
    submitted = [submit(devcluster, tmp_path, "--site", str(gating), "--nodes", "1", "--spare", "1",
                        "--", TRAIN, "--steps", "1") for _ in range(3)]
    for result in submitted:
        assert result.returncode == 0, result.stderr
        jobs.append(result.stdout.strip().splitlines()[-1])
    for job in jobs:   # they queue one after another: each needs node4
        record = wait_for_job(devcluster, job, timeout_s=240)
        assert record["JobState"] == "COMPLETED", job_output(tmp_path, job)
    return jobs


def lemon_reported(devcluster, journals: Path, jobs: list[str], opting: Path, gating: Path) -> None:
    assert sorted(path.name for path in journals.iterdir()) == sorted(f"{job}.jsonl" for job in jobs)
    ingest = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(opting)], capture_output=True, text=True,
                            timeout=60, env=devcluster.client_env())
    assert ingest.returncode == 0, ingest.stderr
    assert "folded in 3 job journal(s)" in ingest.stderr

    def fleet_report(site: Path) -> dict:
        report = subprocess.run([TRAINCTL, "report", "--site", str(site), "--format", "json"], capture_output=True,
                                text=True, timeout=60)
        assert report.returncode == 0, report.stderr
        return json.loads(report.stdout)["fleet"]

    one_user = fleet_report(gating)   # the default rule: root's three jobs alone make no lemon
    assert one_user["lemons"] == [] and [held["host"] for held in one_user["too_few_users"]] == [LEMON], one_user
    assert [(f["family"], f["users"], f["swept"]) for f in one_user["too_few_users"][0]["families"]] == \
        [("nvlink", 1, False)]
    fleet = fleet_report(opting)
    assert [(lemon["host"], sorted(lemon["jobs"])) for lemon in fleet["lemons"]] == \
        [(LEMON, sorted(f"job {job}" for job in jobs))]
    assert all("nvlink.links" in strike["what"] for strike in fleet["lemons"][0]["evidence"])
    assert [family["family"] for family in fleet["lemons"][0]["families"]] == ["nvlink"]
    served = {node["host"]: node["jobs_served"] for node in fleet["nodes"]}
    assert served[LEMON] == 0 and sum(served.values()) == 3


def fourth_job_leaves_the_lemon_out(devcluster, tmp_path: Path, opting: Path) -> None:
    fourth = submit(devcluster, tmp_path, "--site", str(opting), "--nodes", "1", "--spare", "1", "--retries", "1",
                    "--", TRAIN, "--steps", "1")
    assert fourth.returncode == 0, fourth.stderr
    assert f"leaving out the site's lemons (1): {LEMON}" in fourth.stderr
    job = fourth.stdout.strip().splitlines()[-1]
    shown = run_checked(["scontrol", "show", "job", "-o", job], timeout=15, env=devcluster.client_env())
    record = {key: value for part in parse_scontrol_oneliner(shown.stdout) for key, value in part.items()}
    assert record["ExcNodeList"] == LEMON    # Slurm holds the exclusion: no gate had to find node4
    record = wait_for_job(devcluster, job, timeout_s=240)
    assert record["JobState"] == "FAILED", job_output(tmp_path, job)   # its gate found both its nodes bad
    start = json.loads((tmp_path / f"trainctl-gate-{job}" / "journal.jsonl").read_text().splitlines()[0])
    assert LEMON not in start["nodes"]
    retry = json.loads((tmp_path / f"trainctl-gate-{job}" / "retry.json").read_text())
    assert retry["retry"] and retry["successor"] and len(retry["bad_nodes"]) == 2, retry
    try:
        shown = run_checked(["scontrol", "show", "job", "-o", retry["successor"]], timeout=15,
                            env=devcluster.client_env())
        record = {key: value for part in parse_scontrol_oneliner(shown.stdout) for key, value in part.items()}
        assert set(expand_hostlist(record["ExcNodeList"])) == {*retry["bad_nodes"], LEMON}, record
    finally:   # the one node left replays the fault too: nothing to wait for
        run_checked(["scancel", retry["successor"]], timeout=15, env=devcluster.client_env())
        wait_for_job(devcluster, retry["successor"], timeout_s=120)


def lemon_drained_and_kept_drained(devcluster, opting: Path, jobs: list[str]) -> None:
    def trainctl(*args):
        done = subprocess.run([TRAINCTL, *args, "--site", str(opting), "--apply", "--json"], capture_output=True,
                              text=True, timeout=120, env=devcluster.client_env())
        assert done.returncode == 0, done.stderr
        return {action["host"]: action for action in json.loads(done.stdout)["actions"]}

    try:
        drained = trainctl("drain", "--lemons")[LEMON]
        head = "trainctl: fleet.lemon: 3 nvlink strikes in 7 days: "
        reason = drained["text"]   # the jobs in the order they struck (Slurm runs the queued three in any order)
        assert drained["action"] == "drain" and reason.startswith(head)
        assert sorted(reason[len(head):].split(", ")) == sorted(f"job {job}" for job in jobs)
        shown = run_checked(["sinfo", "-h", "-n", LEMON, "-o", "%E"], timeout=15, env=devcluster.client_env())
        assert shown.stdout.strip() == reason
        kept = trainctl("resume")[LEMON]
        assert kept["action"] == "skip" and kept["text"].startswith("kept drained: still a lemon")
    finally:
        run_checked(["scontrol", "update", f"nodename={LEMON}", "state=resume"], timeout=15,
                    env=devcluster.client_env())


def test_forged_journals_add_no_strike_by_slurms_accounting(accounted, tmp_path):
    """With accounting (slurmdbd, MariaDB), `history ingest` asks sacct: a journal for a job that never
    ran, for another user's job, naming a node its job never held, or another user's real journal with
    lines appended, each adds nothing and costs one line; the honest journal is folded in."""
    from support.nobody import NOBODY_UID, setpriv_nobody
    from test_sweep_fleet import slurm_journal

    env = accounted.client_env()

    def ran(*prefix, nodes):
        return run_checked([*prefix, "sbatch", "--parsable", "--wait", f"--nodelist={nodes}", "-N",
                            str(len(expand_hostlist(nodes))), "-o", "/dev/null", "--wrap", "hostname"],
                           timeout=120, env=env, cwd="/tmp").stdout.strip()
    roots, nobodys = ran(nodes="node[1-2]"), ran(*setpriv_nobody(), nodes="node1")
    # slurmctld sends its records to slurmdbd a moment later, and the first record of nobody's job can
    # say uid 0 until the next one (seen on 22.05 from a fresh database): wait for the settled ones
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        records = accounted_jobs([roots, nobodys], env=env)
        if len(records) == 2 and records[nobodys].uid == NOBODY_UID and all(r.end for r in records.values()):
            break
        time.sleep(0.5)
    journals = tmp_path / "journals"
    journals.mkdir()
    site = site_variant(tmp_path, "local-demo", {"sweep.db": str(tmp_path / "sweeps.db"),
                                                  "fleet.journal_dir": str(journals)})
    name = "local-demo"
    now = time.time()
    honest = slurm_journal(journals / f"{roots}.jsonl", roots, now, site=name)
    forged = tmp_path / "forged"
    paths = [slurm_journal(forged / "a" / "99999.jsonl", "99999", now, site=name, owner=NOBODY_UID),
             slurm_journal(forged / "b" / f"{roots}.jsonl", roots, now, site=name, owner=NOBODY_UID),
             slurm_journal(forged / "c" / f"{nobodys}.jsonl", nobodys, now, excluded="node3", site=name,
                           owner=NOBODY_UID)]
    appended = forged / "d" / f"{roots}.jsonl"
    appended.parent.mkdir()
    appended.write_text(honest.read_text() + json.dumps(
        {"t": now, "event": "node_verdict", "node": "node1", "verdict": "excluded",
         "reasons": ["gpu.xid: Xid 79"]}) + "\n")
    os.chown(appended, NOBODY_UID, -1)
    ingest = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site), "--json",
                             *map(str, paths + [appended])], capture_output=True, text=True, timeout=120, env=env)
    assert ingest.returncode == 1, ingest.stderr
    result = json.loads(ingest.stdout)
    assert (result["folded"], result["unverified"], len(result["refused"])) == (1, 0, 4), ingest.stderr
    why = "\n".join(result["refused"])
    assert "job 99999 never ran" in why and f"but job {roots} was uid 0's" in why
    assert f"names node3, never allocated to job {nobodys}" in why, why
    with History.open(tmp_path / "sweeps.db") as history:
        strikes = history.job_events(0.0, ("exclusion", "detection"))
    assert [(event.job_id, event.host) for event in strikes] == [(roots, "node2")]   # the honest one's
