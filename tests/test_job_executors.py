"""Every executor of the job's driver (`JobDriver.executors()`), carried out through
`carry_out(effect)` by a real driver for a job directory in tmp_path, with real processes and
real files, and no Slurm.

Slurm's commands are stand-ins run as real processes (tests/support/slurm_standins.py): the
driver reaches them as it reaches Slurm, by name on its environment's PATH, and they print only
what the real commands printed on the dev cluster (recorded under tests/fixtures/recorded/). So
each executor is tested in seconds, on what it ran (the stand-ins' argv log), what it wrote,
journaled and printed, the event it answered with and the processes it started and ended; the
dev-cluster tests still run the same code against real Slurm.

COVERED lists the effect types whose executor a test here carries out (`covers`);
tests/test_job_machine.py fails for an effect type of the machine that is not in it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from support.sites import site_variant
from support.slurm_standins import RECORDED, install, node_address, running
from test_gate import fabric_report, node_report
from trainctl.detections import DetectionKind
from trainctl.job import machine
from trainctl.job.driver import JobDriver
from trainctl.job.follow import HTML_COMMAND
from trainctl.job.jobdir import Kind
from trainctl.launcher.plan import SubmitRequest, plan_job
from trainctl.site import load_site
from trainctl.slurm import PARTITION_FORMAT, SINFO_FORMAT

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
JOB_ID = "4242"
ALLOCATED = ["node1", "node2", "node3", "node4"]
COVERED: set[type] = set()
# The training program: counts steps; on SIGUSR1 writes the checkpoint marker (note: its step).
LOOP = """import os, signal, sys, time
steps = 0
def save(signum, frame):
    with open(os.environ["TRAINCTL_CHECKPOINT_FILE"], "w") as marker:
        marker.write(f"step {steps}")
signal.signal(signal.SIGUSR1, save)
open(sys.argv[1], "w").write(os.environ["RANK"] + " " + os.environ["MASTER_ADDR"])
while True:
    steps += 1
    time.sleep(0.05)
"""


# The gate step's task: what `gate node` leaves on each node of the step (SLURM_STEP_NODELIST),
# as the test set it in argv[1], written as `gate node` writes it (whole or not at all): each
# node's report, marked final, then rank 0's fabric report.
GATE_TASK = """import json, os, sys
from pathlib import Path
from trainctl.job.jobdir import JobPaths, write_json
from trainctl.slurm import expand_hostlist
answers, paths = json.loads(Path(sys.argv[1]).read_text()), JobPaths(Path(sys.argv[2]))
paths.node_reports.mkdir(parents=True, exist_ok=True)
hosts = expand_hostlist(os.environ["SLURM_STEP_NODELIST"])
for host in hosts:
    write_json(paths.node_report(host), answers["reports"][host])
    write_json(paths.node_report_final(host), {"host": host})
write_json(paths.fabric, dict(answers["fabric"], nodes={host: answers["fabric"]["nodes"][host] for host in hosts}))
"""


def covers(*effects):
    """Marks a test as carrying out these effects' executors (COVERED)."""
    COVERED.update(effects)
    return lambda test: test


def fields(event: dict) -> dict:
    """A journal event without its times."""
    return {key: value for key, value in event.items() if key not in ("t", "at")}


def wait_for(condition, what: str, bound_s: float = 30.0):
    """Until `condition()` is true (its value), at most `bound_s`."""
    deadline = time.monotonic() + bound_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {bound_s} s: {what}"
        time.sleep(0.05)
    return value


class Job:
    """A real JobDriver for job 4242 on node[1-4] (batch host node1), its stand-in Slurm, and its files."""

    def __init__(self, tmp_path: Path, *, site_changes: dict | None = None, drain_on: tuple[str, ...] = (),
                 tasks: dict | None = None, program: tuple[str, ...] = ("/bin/true",), **request):
        self.answers = tmp_path / "gate-answers.json"
        self.submit_dir = tmp_path / "submit"
        self.submit_dir.mkdir()
        site = site_variant(tmp_path, "local-demo", site_changes or {})
        if drain_on:   # a key the demo site leaves at its default (off)
            setting = f"drain_on = {json.dumps(list(drain_on))}"
            site.write_text(site.read_text().replace("[gate]\n", f"[gate]\n{setting}\n"))
        gate_dir = self.submit_dir / f"trainctl-gate-{JOB_ID}"
        gate_task = {machine.GATE_STEP: [sys.executable, "-c", GATE_TASK, str(self.answers), str(gate_dir)]}
        self.slurm = install(tmp_path / "slurm", job_id=JOB_ID, nodes=ALLOCATED, tasks=gate_task | (tasks or {}))
        self.plan = plan_job(load_site(str(site)).config,
                             SubmitRequest(site_ref=str(site), program=program, nodes=2, spare=2, **request),
                             node_trainctl=TRAINCTL, node_python=sys.executable, command=("trainctl", "submit"),
                             version="0")
        self.script = self.submit_dir / "job.sh"
        self.script.write_text("#!/bin/bash\n#SBATCH --nodes=4\nexec trainctl job run --plan plan.json\n")
        env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM")}
        # what Slurm 22.05.8 exported to the recorded batch job (tests/fixtures/recorded/README.md)
        env.update(PATH=self.slurm.path, SLURM_JOB_ID=JOB_ID, SLURM_JOBID=JOB_ID, SLURM_JOB_NAME="job.sh",
                   SLURM_SUBMIT_DIR=str(self.submit_dir), SLURM_JOB_NODELIST="node[1-4]",
                   SLURM_NODELIST="node[1-4]", SLURM_JOB_NUM_NODES="4", SLURM_NNODES="4",
                   SLURM_TASKS_PER_NODE="1(x4)", SLURM_JOB_CPUS_PER_NODE="1(x4)", SLURMD_NODENAME="node1")
        self.driver = JobDriver(self.plan, str(self.script), env)
        self.gate_dir = Path(self.driver.gate_dir)

    def journal(self, *kinds: Kind) -> list[dict]:
        """The journal file's events of these kinds, in order (all without kinds)."""
        path = self.driver.journal.path
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [event for event in events if not kinds or event["event"] in kinds]

    def gate_answers(self, failing: dict[str, str]):
        """What the next gate step's nodes report (GATE_TASK): NVLink failing where named, and
        rank 0's fabric report with nobody excluded."""
        reports = {host: node_report(host, ("nvlink.links", "fail", failing[host]) if host in failing
                                     else ("nvlink.links", "ok", "fine")) for host in ALLOCATED}
        fabric = fabric_report().to_json()
        fabric["nodes"] = {f"node{n[1:]}": value for n, value in fabric["nodes"].items()}
        self.answers.write_text(json.dumps({"reports": reports, "fabric": fabric}))

    def end(self):
        for step in (self.driver.step, self.driver.agents):
            if step is not None and step.poll() is None:
                step.kill()
                step.wait()
        self.slurm.end_steps()


@pytest.fixture
def job(tmp_path):
    made = []

    def make(**options) -> Job:
        made.append(Job(tmp_path, **options))
        return made[-1]

    yield make
    for each in made:
        each.end()


@covers(machine.Journal, machine.Say, machine.Finish)
def test_journal_say_and_finish_write_the_journal_and_the_jobs_output(job, capsys):
    run = job()
    assert run.driver.carry_out(machine.Journal(Kind.CONFIRMATION, {"nodes": ["node2"], "note": "x"})) is None
    run.driver.carry_out(machine.Say("trainctl: to stdout", err=False))
    run.driver.carry_out(machine.Say("trainctl: to stderr"))
    assert run.driver.carry_out(machine.Finish(3, why="node2 hung; no successor")) == 3
    assert run.driver.carry_out(machine.Finish(0)) == 0
    out, err = capsys.readouterr()
    chain = HTML_COMMAND.format(job=JOB_ID)
    assert out.splitlines() == ["trainctl: to stdout",
                                f"trainctl: job {JOB_ID} ended with status 3; the chain drawn: {chain}",
                                f"trainctl: job {JOB_ID} ended with status 0; the chain drawn: {chain}"]
    assert err.splitlines() == ["trainctl: to stderr", "trainctl: the job cannot go on: node2 hung; no successor"]
    events = run.journal()
    assert [fields(e) for e in events] == [{"event": "confirmation", "nodes": ["node2"], "note": "x"},
                                           {"event": "job_end", "status": 3, "cause": "node2 hung; no successor"},
                                           {"event": "job_end", "status": 0}]
    assert run.slurm.calls("srun") == []


@covers(machine.RunGate)
def test_a_passing_gate_answers_the_nodes_gate_decide_chose_and_journals_each_verdict(job, capsys):
    run = job()
    run.gate_answers({"node2": "GPU 3: NVLink 3, 5 inactive"})
    decided = run.driver.carry_out(machine.RunGate())
    assert decided == machine.GateDecided("node[1,3]", ("node1", "node3"), node_address("node1"), ("node4",),
                                          {"node2": "nvlink.links: GPU 3: NVLink 3, 5 inactive"})
    (srun,) = run.slurm.calls("srun")
    assert srun[1:] == machine.gate_step_argv(run.plan, str(run.gate_dir), 4)[1:]
    assert (run.gate_dir / "gate-step.status").read_text() == "0\n"         # the step's end, for decide
    decision = json.loads((run.gate_dir / "decision.json").read_text())     # written by the real gate decide
    assert decision["ok"] and decision["chosen"] == ["node1", "node3"]
    events = run.journal()
    assert [e["event"] for e in events] == ["gate_start", "submitted"] + ["node_verdict"] * 4 + ["gate_end"]
    # scontrol show job's SubmitTime, local time (the recorded job's)
    assert events[1]["submitted_t"] == datetime.fromisoformat("2026-11-28T05:55:28").timestamp()
    assert [(e["node"], e["verdict"]) for e in events[2:6]] == [
        ("node1", "chosen"), ("node2", "excluded"), ("node3", "chosen"), ("node4", "healthy, not needed")]
    assert events[3]["reasons"] == ["nvlink.links: GPU 3: NVLink 3, 5 inactive"]
    assert fields(events[-1]) == {"event": "gate_end", "status": 0, "chosen": ["node1", "node3"],
                                  "master_addr": node_address("node1")}
    out = capsys.readouterr().out
    assert (f"trainctl: running on node[1,3], MASTER_ADDR {node_address('node1')} "
            f"(gate report: {run.gate_dir}/report.txt)") in out

    # again after a detection named node3: the first round's files go aside, the gate checks the others
    run.gate_answers({})
    again = run.driver.carry_out(machine.RunGate(("node1", "node2", "node4"), archive=1))
    assert again == machine.GateDecided("node[1-2]", ("node1", "node2"), node_address("node1"), ("node4",), {})
    assert json.loads((run.gate_dir / "rounds" / "1" / "decision.json").read_text())["chosen"] == ["node1", "node3"]
    assert run.slurm.calls("srun")[-1][1:] == machine.gate_step_argv(run.plan, str(run.gate_dir), 4,
                                                                     ("node1", "node2", "node4"))[1:]
    events = run.journal()[len(events):]
    assert [e["event"] for e in events] == ["gate_start"] + ["node_verdict"] * 3 + ["gate_end"]   # no "submitted"
    assert fields(events[0]) == {"event": "gate_start", "nodes": ["node1", "node2", "node4"],
                                 "evidence": "rounds/1"}


@covers(machine.Retry)
def test_a_refused_gate_answers_its_status_and_the_retry_submits_the_successor_around_the_bad_nodes(job, capsys):
    run = job(retries=1)
    run.gate_answers({"node2": "GPU 3: NVLink 3, 5 inactive", "node3": "GPU 0: NVLink 1 inactive",
                      "node4": "GPU 1: NVLink 2 inactive"})
    refused = run.driver.carry_out(machine.RunGate())
    assert refused.status == 2 and refused.retryable
    assert set(refused.gate_named) == {"node2", "node3", "node4"}
    end = run.journal(Kind.GATE_END)[-1]
    assert end["status"] == 2 and "exited with status 2: trainctl: error: only 1 of 4" in end["why"]
    err = capsys.readouterr().err
    assert "trainctl: error: only 1 of 4 nodes healthy, need 2:" in err     # gate decide's one line
    assert (f"trainctl: not starting the job: gate decide exited with status 2 "
            f"(report: {run.gate_dir}/report.txt)") in err

    handled = run.driver.carry_out(machine.Retry("gate", 2, tuple(ALLOCATED), budget=1))
    assert handled == machine.RetryHandled(successor=True)
    (submitted,) = run.slurm.submitted()
    assert submitted["script"] == run.script.read_text()                    # the same script, on stdin
    assert submitted["argv"] == ["--parsable", "--nodes=2-4", "--exclude=node[2-4]",
                                 f"--dependency=afterany:{JOB_ID}", submitted["argv"][-1]]
    assert submitted["argv"][-1].startswith("--comment=")
    assert submitted["env"]["TRAINCTL_ATTEMPT"] == "2" and "SLURM_JOB_ID" not in submitted["env"]
    retry = run.journal(Kind.RETRY)[-1]
    assert (retry["retry"], retry["successor"], retry["exclude"]) == (True, submitted["job_id"],
                                                                      ["node2", "node3", "node4"])
    assert f"submitted job {submitted['job_id']} excluding node[2-4]" in capsys.readouterr().out
    assert (run.gate_dir.parent / f"trainctl-gate-{submitted['job_id']}" / "attempt.json").is_file()


@covers(machine.StartSentinel, machine.Release)
def test_the_release_moves_the_sentinel_and_answers_what_scontrols_resize_script_exports(job, capsys):
    run = job()
    run.driver.carry_out(machine.StartSentinel())
    (srun,) = wait_for(lambda: run.slurm.calls("srun"), "srun's start")
    assert srun[1:] == machine.sentinel_argv(run.plan, str(run.gate_dir))[1:]
    log = run.gate_dir / "sentinel.log"   # the real `gate sentinel`, on the job's second node
    wait_for(lambda: log.is_file() and "watching" in log.read_text(), "the sentinel's first line")
    sentinel = run.slurm.step(machine.SENTINEL_STEP)

    resized = run.driver.carry_out(machine.Release("node[1,3]", move_sentinel=True))
    assert resized == machine.Resized(2, (("SLURM_NODELIST", "node[1,3]"), ("SLURM_JOB_NODELIST", "node[1,3]"),
                                          ("SLURM_NNODES", "2"), ("SLURM_JOB_NUM_NODES", "2"),
                                          ("SLURM_JOB_CPUS_PER_NODE", "1(x2)")),
                                      ("SLURM_NPROCS", "SLURM_NTASKS", "SLURM_TASKS_PER_NODE"))
    assert ["scancel", "--quiet", sentinel["id"]] in run.slurm.calls("scancel")
    wait_for(lambda: not running(sentinel), "the sentinel's end")
    assert ["scontrol", "update", f"JobId={JOB_ID}", "NodeList=node[1,3]"] in run.slurm.calls("scontrol")
    assert (run.gate_dir / f"slurm_job_{JOB_ID}_resize.sh").is_file()       # scontrol ran in the gate directory
    assert not (run.submit_dir / f"slurm_job_{JOB_ID}_resize.sh").exists()
    assert run.journal(Kind.RELEASED)[-1]["holds"] == "node[1,3]"
    assert "trainctl: released the nodes the job does not use; it now holds node[1,3]" in capsys.readouterr().out


@covers(machine.Release)
def test_a_release_without_the_resize_script_keeps_the_jobs_environment_and_says_so(job, capsys):
    run = job()
    del run.driver.base_env["SLURM_JOBID"]   # scontrol then rewrites no job environment (update_job.c)
    assert run.driver.carry_out(machine.Release("node[1,3]", move_sentinel=False)) == machine.Resized(4)
    assert run.slurm.calls("scancel") == [] and run.journal(Kind.RELEASED) == []
    assert capsys.readouterr().err == (f"trainctl: warning: released the unused nodes, but scontrol wrote no "
                                       f"{run.gate_dir}/slurm_job_{JOB_ID}_resize.sh\n")   # it printed nothing


@covers(machine.RunTraining, machine.StartAgents, machine.WaitStep, machine.PostCheckpointRequest,
        machine.SendSignal, machine.AwaitSave, machine.RequestStacks, machine.StopStep, machine.StepOver)
def test_a_training_step_runs_is_watched_asked_to_save_and_stopped_with_its_agents(job, tmp_path):
    started = tmp_path / "rank0"
    run = job(program=(sys.executable, "-c", LOOP, str(started)),
              tasks={machine.AGENT_STEP: ["sleep", "600"]})    # an agent that never writes
    training = machine.RunTraining("node[1,3]", 2, node_address("node1"), start_sentinel=False)
    answer = run.driver.carry_out(training)
    assert isinstance(answer, machine.TrainingStarted)
    assert run.journal(Kind.TRAINING_START)[-1]["t"] == answer.t
    (srun,) = wait_for(lambda: run.slurm.calls("srun"), "srun's start")
    assert srun[1:] == machine.training_argv(run.plan, training, str(run.gate_dir),
                                             run.driver.facts.binds_tasks)[1:]
    # the real rank-exec made the program rank 0 of the job, with the gate's MASTER_ADDR
    rank = wait_for(lambda: started.is_file() and started.read_text(), "the program's start")
    assert rank == f"0 {node_address('node1')}"
    run.driver.carry_out(machine.StartAgents("node[1,3]", 2))
    agents = wait_for(lambda: run.slurm.step(machine.AGENT_STEP), "the agents' step")

    polled = run.driver.carry_out(machine.WaitStep(poll=True))               # the step runs: the next poll
    assert isinstance(polled, machine.Polled) and polled.saved is None
    assert run.driver.carry_out(machine.PostCheckpointRequest()) == machine.CheckpointAsked(
        posted=True, listening=False, refused="", running=True)
    assert (run.gate_dir / "watch" / "checkpoint-request").is_file()
    run.driver.carry_out(machine.SendSignal(signal.SIGUSR1))                 # the program saves on it
    awaited = run.driver.carry_out(machine.AwaitSave(30.0))
    assert awaited.saved is not None and awaited.saved.source == "checkpoint.seen"
    assert awaited.saved.note.startswith("step ")

    run.driver.carry_out(machine.RequestStacks(("node1", "node3"), 0.0))     # no agent answers
    assert run.journal(Kind.STACKS)[-1]["files"] == {node: "no answer from its agent within 0 s"
                                                     for node in ("node1", "node3")}
    assert (run.gate_dir / "watch" / "dump-request").is_file()

    stopped = run.driver.carry_out(machine.StopStep(grace_s=10.0))
    assert stopped == machine.StepStopped(128 + signal.SIGTERM)             # srun's SIGTERM ended it
    run.driver.carry_out(machine.StepOver(143, "ended by the watch (hung)", agents=True,
                                          detection=DetectionKind.HUNG, training_start_t=answer.t))
    assert ["scancel", "--quiet", agents["id"]] in run.slurm.calls("scancel")
    assert run.driver.agents is None
    end = run.journal(Kind.STEP_END)[-1]
    assert (end["status"], end["cause"], end["detection"]) == (143, "ended by the watch (hung)", "hung")


@covers(machine.WaitStep)
def test_a_step_that_ends_by_itself_answers_its_status(job):
    run = job(program=(sys.executable, "-c", "raise SystemExit(3)"), watch=False)
    run.driver.carry_out(machine.RunTraining("node[1-2]", 2, node_address("node1"), start_sentinel=False))
    assert run.driver.carry_out(machine.WaitStep(poll=False)) == machine.StepEnded(3)


@covers(machine.WaitStep)
def test_an_unwatched_step_that_saves_answers_the_save(job):
    saves = ("import os, time; open(os.environ['TRAINCTL_CHECKPOINT_FILE'], 'w').write('epoch 1'); "
             "time.sleep(600)")
    run = job(program=(sys.executable, "-c", saves), watch=False)
    run.driver.carry_out(machine.RunTraining("node[1-2]", 2, node_address("node1"), start_sentinel=False))
    seen = run.driver.carry_out(machine.WaitStep(poll=False))   # at the next look, STEP_POLL_S on
    assert isinstance(seen, machine.SaveSeen)
    assert (seen.save.source, seen.save.note) == ("checkpoint.seen", "epoch 1")


@covers(machine.Drain)
def test_a_drain_the_site_asks_for_is_made_and_read_back_from_slurms_record(job, tmp_path, capsys, monkeypatch):
    run = job(drain_on=("unknown",), site_changes={"sweep.db": str(tmp_path / "sweeps.db")})
    # the drain's Slurm commands take the process's PATH, as in the job, where it is the driver's
    monkeypatch.setenv("PATH", run.slurm.path)
    subprocess.run(["scontrol", "update", "NodeName=node3", "State=DRAIN", "Reason=bad DIMM"], check=True,
                   timeout=30)                                       # an admin's drain, before the job's
    run.driver.carry_out(machine.Drain({
        "node2": (DetectionKind.HUNG, (("watch.hung", "no step for 60 s"),)),
        "node3": (DetectionKind.HUNG, (("watch.hung", "no step for 60 s"),))}))
    reasons = run.slurm.state()["reasons"]
    reason = f"trainctl: watch.hung: no step for 60 s (watch of job {JOB_ID})"
    assert reasons["node2"]["reason"] == reason and reasons["node3"]["reason"] == "bad DIMM"
    drains = {event["node"]: event for event in run.journal(Kind.DRAIN)}
    assert (drains["node2"]["outcome"], drains["node2"]["reason"]) == ("drained", reason)
    assert drains["node3"]["outcome"] == "not drained: has a reason trainctl did not set (root: 'bad DIMM')"
    err = capsys.readouterr().err
    assert f"trainctl: drain node2: {reason} (recorded in {tmp_path / 'sweeps.db'}" in err
    # looked at right before, and read back after (sinfo), drained through scontrol
    drained = ["scontrol", "update", "NodeName=node2", "State=DRAIN", f"Reason={reason}"]
    assert drained in run.slurm.calls("scontrol")
    assert [call for call in run.slurm.calls("sinfo") if "node2" in call]


@covers(machine.Drain)
def test_a_site_without_drain_on_drains_nothing(job, capsys):
    run = job()
    run.driver.carry_out(machine.Drain({"node2": (DetectionKind.SICK, (("gpu.xid", "Xid 79"),))}))
    assert run.journal(Kind.DRAIN) == [] and capsys.readouterr().err == ""
    assert run.slurm.calls("scontrol") == [["scontrol", "show", "config"]]   # the driver's start only


@covers(machine.Alert)
def test_the_alert_runs_the_jobs_alert_command_on_the_newest_event_of_its_kind(job, tmp_path):
    sent = tmp_path / "alerts.jsonl"
    run = job(alert_command=("sh", "-c", 'cat >> "$0"', str(sent)))
    run.driver.carry_out(machine.Journal(Kind.DETECTION, {"kind": "sick", "suspects": ["node2"],
                                                          "evidence": "Xid 79"}))
    run.driver.carry_out(machine.Alert(Kind.DETECTION))
    run.driver.alerts.close()                                     # waits for the command's end
    (event,) = [json.loads(line) for line in sent.read_text().splitlines()]
    assert (event["job_id"], event["evidence"], event["suspects"]) == (JOB_ID, "Xid 79", ["node2"])


def test_the_standins_print_what_slurm_printed_on_the_dev_cluster(tmp_path):
    """The recorded job (tests/fixtures/recorded/README.md): the same commands in the same
    situation print the recorded outputs, byte for byte (a drain's time aside)."""
    recorded = RECORDED / "devcluster-slurm-22.05.8"
    slurm = install(tmp_path / "slurm", job_id="1", nodes=ALLOCATED, next_job_id="1",
                    tasks={machine.SENTINEL_STEP: ["sleep", "60"], machine.GATE_STEP: ["sleep", "60"]})
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM")}
    env.update(PATH=slurm.path, SLURM_JOBID="1", SLURM_JOB_ID="1", SLURM_NODELIST="node[1-4]",
               SLURM_JOB_NODELIST="node[1-4]", SLURM_NNODES="4", SLURM_JOB_NUM_NODES="4",
               SLURM_JOB_CPUS_PER_NODE="1(x4)", SLURM_TASKS_PER_NODE="1(x4)")

    def run(*argv, **options):
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, check=True,
                              **options).stdout

    steps = []
    for argv in (["--overlap", f"--job-name={machine.SENTINEL_STEP}", "--nodes=1", "--relative=1", "sleep", "60"],
                 ["--nodelist=node[1,4]", "sleep", "60"],
                 ["--overlap", f"--job-name={machine.GATE_STEP}", "--ntasks=4", "sleep", "60"]):
        steps.append(subprocess.Popen(["srun", *argv], env=env))
        wait_for(lambda: len(slurm.state()["steps"]) == len(steps), "the step's start")
    try:
        assert run("squeue", "--noheader", "--steps", "--jobs=1", "--format=%i %j") == \
            (recorded / "squeue-steps.txt").read_text()
    finally:
        for step in steps:
            step.kill()
            step.wait()
    assert run("sinfo", "-h", "-N", "-o", SINFO_FORMAT) == (recorded / "sinfo-states.txt").read_text()
    assert run("sinfo", "-h", "-N", "-o", PARTITION_FORMAT) == (recorded / "sinfo-partitions.txt").read_text()
    run("scontrol", "update", "NodeName=node4", "State=DRAIN", "Reason=trainctl: gpu.xid: Xid 79 (watch of job 1)")
    draining = run("sinfo", "-h", "-N", "-o", SINFO_FORMAT)
    when = slurm.state()["reasons"]["node4"]["time"]
    assert draining.replace(when, "2026-12-05T01:32:26") == (recorded / "sinfo-states-draining.txt").read_text()
    (tmp_path / "gate").mkdir()
    assert run("scontrol", "update", "JobId=1", "NodeList=node[1,4]", cwd=tmp_path / "gate") == \
        (recorded / "scontrol-update-nodelist.txt").read_text()
    assert (tmp_path / "gate" / "slurm_job_1_resize.sh").read_text() == \
        (recorded / "scontrol-update-nodelist-resize-sh.txt").read_text()
    assert run("sbatch", "--parsable", input="#!/bin/bash\n") == (recorded / "sbatch-parsable.txt").read_text()
    assert run("scontrol", "--version") == (recorded / "scontrol-version.txt").read_text()
