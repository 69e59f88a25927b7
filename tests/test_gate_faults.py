"""A node lost during the gate, for real: `trainctl submit` on the dev cluster, then node4 is
killed (SIGKILL by PID: its slurmd, slurmstepd and tasks, or only its gate task) or hung
(SIGSTOP) at a given moment of the gate. Every run must end COMPLETED on healthy nodes with
node4 named "lost during the gate".

Moments: before it joins the fabric test (its nvidia-smi probe is still running), right
after it joined (connected to rank 0's store), and mid pairwise round (a gloo connection to
another node is open). One run per case here; TRAINCTL_GATE_FAULT_RUNS=5 repeats each (by
hand: the figures land in test-artifacts/gate-faults.tsv).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.replay import LIBRARY, write_replay
from support.slurm_jobs import TERMINAL_STATES, submit
from trainctl.devcluster import faults
from trainctl.devcluster.processes import log_tails
from trainctl.job.gate_compute import ComputePolicy, compute_deadline_s
from trainctl.job.gate import gate_deadline_s
from trainctl.proc import run, run_checked
from trainctl.site import load_site
from trainctl.slurm import job_port, parse_scontrol_oneliner

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "examples" / "train_ddp.py")
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
NODES = ("node1", "node2", "node3", "node4")
VICTIM = "node4"
RUNS = int(os.environ.get("TRAINCTL_GATE_FAULT_RUNS", "1"))
ARTIFACTS = REPO / "test-artifacts"
POLL_S = 0.05
MOMENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Case:
    moment: str   # before_join | after_join | mid_round
    fault: str    # node (slurmd, slurmstepd, tasks) | task (only the gate task) | stop (SIGSTOP)

    def __str__(self) -> str:
        return f"{self.fault}-{self.moment}"


CASES = [Case(moment, fault) for moment in ("before_join", "after_join", "mid_round") for fault in ("node", "task")]
CASES.append(Case("mid_round", "stop"))


def job_record(devcluster, job_id: str) -> dict:
    result = run_checked(["scontrol", "show", "job", "-o", job_id], timeout=15, env=devcluster.client_env())
    record: dict = {}
    for part in parse_scontrol_oneliner(result.stdout):
        record.update(part)
    return record


def wait_state(devcluster, job_id: str, states: set[str], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        record = job_record(devcluster, job_id)
        if record["JobState"] in states:
            return record
        assert time.monotonic() < deadline, f"job {job_id} still {record['JobState']} after {timeout_s} s"
        time.sleep(0.2)


def read_or_why(path: Path) -> str:
    try:
        return path.read_text()[-3000:] or "(empty)"
    except OSError as exc:
        return f"(unreadable: {exc})"


def gate_step(devcluster, job_id: str, timeout_s: float = MOMENT_TIMEOUT_S) -> str:
    """The gate step's id (the job script also starts a sentinel step: the order varies)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], timeout=15, env=devcluster.client_env())
        for line in out.stdout.splitlines():
            step, _, name = line.partition(" ")
            if name.strip() == "trainctl-gate":
                return step.partition(".")[2]
        time.sleep(0.2)
    raise AssertionError(f"job {job_id}: no trainctl-gate step after {timeout_s} s")


def victim_connections(devcluster, job_id: str, step: str, store_port: int, victim: str = VICTIM) -> tuple[bool, bool]:
    """(the victim's gate task is connected to rank 0's store, it is in a pair: a gloo
    connection to another node). Only the gate task's sockets count, not slurmstepd's."""
    tasks = set(faults.step_task_pids(devcluster, victim, job_id, step))
    others = {devcluster.spec.address(node) for node in NODES if node != victim}
    out = run(["ss", "-N", devcluster.spec.netns(victim), "-Htnp", "state", "established"], timeout=10).stdout
    store = pair = False
    for line in out.splitlines():
        fields = line.split()
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if len(fields) < 4 or not pids & tasks:
            continue
        host, _, port = fields[3].rpartition(":")
        host = host.strip("[]").removeprefix("::ffff:")
        if port == str(store_port):
            store = True
        elif host in others:
            pair = True
    return store, pair


def wait_for_moment(devcluster, job_id: str, moment: str, victim: str = VICTIM) -> None:
    store_port = job_port({"SLURM_JOB_ID": job_id}, offset=1)
    step = gate_step(devcluster, job_id)
    deadline = time.monotonic() + MOMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        if moment == "before_join":
            if faults.step_task_pids(devcluster, victim, job_id, step):
                time.sleep(1.0)  # inside its slow nvidia-smi probe, long before joining
                return
        else:
            store, pair = victim_connections(devcluster, job_id, step, store_port, victim)
            if (moment == "after_join" and store) or (moment == "mid_round" and pair):
                return
        time.sleep(POLL_S)
    raise AssertionError(f"job {job_id}: {victim} never reached the moment {moment}")


def inject(devcluster, job_id: str, fault: str, victim: str = VICTIM) -> list[int]:
    if fault == "node":
        return faults.kill_node(devcluster, victim)
    if fault == "task":
        return faults.kill_step_tasks(devcluster, victim, job_id, gate_step(devcluster, job_id))
    return faults.stop_node(devcluster, victim)


def run_case(devcluster, tmp_path: Path, case: Case, site: str = "local-demo") -> dict:
    made = [write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK},
                         sleep_s=30 if node == VICTIM and case.moment == "before_join" else 0) for node in NODES]
    try:
        result = submit(devcluster, tmp_path, "--site", site, "--nodes", "2", "--spare", "2",
                        "--", str(timed_train(tmp_path)), "--steps", "3")
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        wait_for_moment(devcluster, job_id, case.moment)
        faulted_at = time.time()
        assert inject(devcluster, job_id, case.fault), f"no process of {VICTIM} to {case.fault}"
        # the job ends on the healthy nodes; a dead node holds it in COMPLETING until it is back
        wait_state(devcluster, job_id, TERMINAL_STATES | {"COMPLETING"}, 240)
    finally:
        if case.fault == "stop":
            faults.cont_node(devcluster, VICTIM)
        for script in made:
            script.unlink()
    faults.restore_node(devcluster, VICTIM, timeout_s=120)
    record = wait_state(devcluster, job_id, TERMINAL_STATES, 120)
    gate_dir = tmp_path / f"trainctl-gate-{job_id}"
    decided_at = (gate_dir / "decision.json").stat().st_mtime
    job_start = datetime.datetime.fromisoformat(record["StartTime"]).timestamp()  # whole seconds
    trained_at = min(float(p.read_text()) for p in tmp_path.glob("started-*"))
    # the job script's output, then each rank's own file (the site's launch.rank_output)
    output = "".join(path.read_text() for path in [tmp_path / f"slurm-{job_id}.out",
                                                   *sorted(gate_dir.glob("rank-*.out"))])
    return {"job_id": job_id, "record": record, "output": output,
            "report": (gate_dir / "report.txt").read_text(), "death_to_decision_s": decided_at - faulted_at,
            "decision_to_training_s": trained_at - decided_at, "job_start_to_training_s": trained_at - job_start,
            "decision": json.loads((gate_dir / "decision.json").read_text())}


def timed_train(directory: Path) -> Path:
    """examples/train_ddp.py behind a wrapper that notes when each rank started."""
    wrapper = directory / "timed_train.py"
    wrapper.write_text(f"""import os, runpy, sys, time
from pathlib import Path
Path(__file__).with_name("started-" + os.environ["RANK"]).write_text(repr(time.time()))
sys.argv[0] = {TRAIN!r}
runpy.run_path({TRAIN!r}, run_name="__main__")
""")
    return wrapper


def record_figure(case: Case, run_number: int, outcome: dict) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "gate-faults.tsv", "a") as out:
        out.write(f"{case}\t{run_number}\t{outcome['job_id']}\t{outcome['record']['JobState']}\t"
                  f"{outcome['death_to_decision_s']:.2f}\t{outcome['decision_to_training_s']:.2f}\t"
                  f"{outcome['job_start_to_training_s']:.2f}\n")


@pytest.mark.parametrize("run_number", range(RUNS))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_node_lost_during_the_gate_is_left_out_and_the_job_completes(devcluster, tmp_path, case, run_number):
    outcome = run_case(devcluster, tmp_path, case)
    record_figure(case, run_number, outcome)
    output = outcome["output"]
    assert outcome["record"]["JobState"] == "COMPLETED", output
    assert outcome["record"]["Restarts"] == "0"
    ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert len(ranks) == 2 and all("parameters agree" in line for line in ranks), output
    ran_on = {line.split(" on ")[1].split(":")[0] for line in ranks}
    assert ran_on == set(outcome["decision"]["chosen"]) and VICTIM not in ran_on
    excluded = {e["host"]: e for e in outcome["decision"]["excluded"]}
    assert excluded[VICTIM]["lost"], outcome["report"]
    # On this shared 2-core machine a survivor's pairs are sometimes judged slow when only 3
    # nodes remain (the straggler reference is issue 10 item 2); nothing else may be excluded.
    others = {host: e for host, e in excluded.items() if host != VICTIM}
    assert all(r.startswith("fabric: straggler") for e in others.values() for r in e["reasons"]), others
    assert f"excluded {VICTIM}:\n  - lost during the gate: " in outcome["report"]
    # the training step starts within the gate's deadline + 10 s (the bound the site promises)
    gate = load_site("local-demo").config.gate
    deadline = gate_deadline_s(gate.probe_timeout_s, gate.fabric_timeout_s,
                               compute_deadline_s(ComputePolicy.from_gate(gate), 4))
    assert outcome["job_start_to_training_s"] < deadline + 10, outcome


def test_a_node_dead_before_the_compute_turns_delays_no_one(devcluster, tmp_path):
    """The compute test in turns (local-demo's nodes share 2 cores): node4, the last rank, dies
    before its node checks end. It gets no turn, so the others neither wait out its slot nor
    the end of every slot (long enough, before, for Slurm to declare node4 down mid-gate)."""
    text = Path(load_site("local-demo").path).read_text()
    site = tmp_path / "local-demo-compute.toml"
    site.write_text(text.replace("\ncompute = false", "\ncompute = true"))
    outcome = run_case(devcluster, tmp_path, Case("before_join", "node"), site=str(site))
    assert outcome["record"]["JobState"] == "COMPLETED", outcome["output"]
    excluded = {e["host"]: e for e in outcome["decision"]["excluded"]}
    assert excluded[VICTIM]["lost"], outcome["report"]
    gate_dir = tmp_path / f"trainctl-gate-{outcome['job_id']}"
    assert json.loads((gate_dir / "compute" / ".order").read_text()) == [0, 1, 2]
    assert sorted(p.stem for p in (gate_dir / "compute").glob("*.json")) == ["node1", "node2", "node3"]
    gate = load_site(str(site)).config.gate
    deadline = gate_deadline_s(gate.probe_timeout_s, gate.fabric_timeout_s,
                               compute_deadline_s(ComputePolicy.from_gate(gate), 4))
    assert outcome["job_start_to_training_s"] < deadline + 10, outcome


def test_the_batch_host_dying_ends_the_job_without_a_hang(devcluster, tmp_path):
    """node1 runs the batch script, the gate's srun and the fabric test's store (rank 0): when
    it dies nothing in the job can decide. The other nodes' gate tasks must end at once (not
    sit out the fabric timeout), and the job must end, not stay RUNNING (which is what a
    --no-kill job whose batch host died does on Slurm 22.05): the sentinel cancels it."""
    made = [write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})
            for node in NODES]
    job_id = None
    try:
        result = submit(devcluster, tmp_path, "--site", "local-demo", "--nodes", "2", "--spare", "2",
                        "--", TRAIN, "--steps", "3")
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        wait_for_moment(devcluster, job_id, "after_join", victim="node1")
        assert faults.kill_node(devcluster, "node1")
        killed = time.monotonic()
        others = [node for node in NODES if node != "node1"]
        step = gate_step(devcluster, job_id)
        while any(faults.step_task_pids(devcluster, node, job_id, step) for node in others):
            time.sleep(POLL_S)
        left_after_s = time.monotonic() - killed
        # the sentinel on node2 cancels the job once node1's beat has been silent for 30 s
        try:
            record = wait_state(devcluster, job_id, TERMINAL_STATES | {"PENDING", "REQUEUED"}, 240)
        except AssertionError as failure:
            sentinel_log = tmp_path / f"trainctl-gate-{job_id}" / "sentinel.log"
            raise AssertionError(f"{failure}; sentinel.log: {read_or_why(sentinel_log)}\n"
                                 f"{log_tails(devcluster.log_dir, 40)}") from None
        ended_after_s = time.monotonic() - killed
    finally:
        for script in made:
            script.unlink()
        if job_id:
            run(["scancel", job_id], timeout=15, env=devcluster.client_env())
        faults.restore_node(devcluster, "node1", timeout_s=120)
    gate = load_site("local-demo").config.gate
    # a rank still starting up retries the dead store until the join deadline; none waits longer
    assert left_after_s < gate_deadline_s(gate.probe_timeout_s, gate.fabric_timeout_s), left_after_s
    assert record["JobState"] == "CANCELLED", record
    shown = run_checked(["scontrol", "show", "job", job_id], timeout=15, env=devcluster.client_env()).stdout
    assert "Comment=trainctl: batch host lost: no heartbeat in " in shown, shown
    ARTIFACTS.mkdir(exist_ok=True)
    with open(ARTIFACTS / "gate-faults.tsv", "a") as out:
        out.write(f"batch-host-node\t0\t{job_id}\t{record['JobState']}\tothers gone {left_after_s:.2f} s, "
                  f"job left RUNNING {ended_after_s:.2f} s\n")
