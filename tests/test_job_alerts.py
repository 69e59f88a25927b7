"""Alerts: the machine decides when (its Alert effects), the supervisor runs the job's command with
the event on stdin, in a thread of its own: real commands that succeed, hang, fail and flood."""

from __future__ import annotations

import json
import os
import time

from trainctl.job import machine
from trainctl.job.alerts import OUTPUT_MAX_BYTES, AlertSender, alert_event
from trainctl.job.driver import JobDriver
from trainctl.job.jobdir import Journal, Kind, NodeReading, RankProgress
from trainctl.job.metrics import JobIdentity
from trainctl.job.policy import load_gate_policy
from trainctl.launcher.plan import parse_alert_command

IDENTITY = JobIdentity("1234", "1200", "alice", "llama-70b")
EVENT = alert_event({"t": 1200.0, "at": "2025-01-01T00:20:00+00:00", "event": Kind.DETECTION, "kind": "hung",
                     "suspects": ["node2"], "evidence": "no rank finished a step for 60 s"},
                    IDENTITY, "/home/alice/run/trainctl-gate-1234")


def sender(tmp_path, argv, timeout_s=5.0):
    said: list[str] = []
    return AlertSender(argv, timeout_s, str(tmp_path / "alerts.log"), dict(os.environ), said.append), said


def wait_for(path, deadline_s=60.0):
    end = time.monotonic() + deadline_s
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.02)
    assert os.path.exists(path)


def test_a_command_that_succeeds_gets_the_event_as_one_json_line_on_stdin(tmp_path):
    out = tmp_path / "event.json"
    alerts, said = sender(tmp_path, ["sh", "-c", 'cat > "$0"', str(out)])
    alerts.send(EVENT)
    alerts.close()
    line = out.read_text()
    assert line.endswith("\n") and line.count("\n") == 1
    event = json.loads(line)
    assert list(event)[0] == "summary"
    assert event["summary"] == ("trainctl: job 1234 (llama-70b, alice): watch: hung (node2): "
                                "no rank finished a step for 60 s")
    assert event["event"] == "detection" and event["kind"] == "hung" and event["suspects"] == ["node2"]
    assert event["t"] == 1200.0 and event["at"] == "2025-01-01T00:20:00+00:00"
    assert (event["job_id"], event["chain"], event["user"], event["job_name"]) == ("1234", "1200", "alice",
                                                                                  "llama-70b")
    assert event["show"] == "trainctl job show 1234 --dir /home/alice/run/trainctl-gate-1234"
    assert said == []
    assert "detection: ok" in (tmp_path / "alerts.log").read_text()


def test_a_command_that_hangs_is_killed_at_the_limit_and_the_job_goes_on(tmp_path):
    started = tmp_path / "started"
    alerts, said = sender(tmp_path, ["sh", "-c", 'touch "$0"; exec sleep 600', str(started)], timeout_s=1.0)
    alerts.send(EVENT)                      # returns at once: the command runs in the sender's thread
    wait_for(started)
    assert not (tmp_path / "alerts.log").exists()   # the command still runs, and the caller went on
    alerts.close()
    log = (tmp_path / "alerts.log").read_text()
    assert "detection: sh: timed out after 1 s" in log
    assert said == [f"trainctl: warning: the alert command failed on the detection event: sh: timed out after 1 s "
                    f"(the job goes on; every run is in {tmp_path / 'alerts.log'})"]


def test_a_command_that_fails_says_so_in_one_warning_line_for_the_whole_job(tmp_path):
    alerts, said = sender(tmp_path, ["sh", "-c", "echo 'no route to hooks.example' >&2; exit 3"])
    for _ in range(3):
        alerts.send(EVENT)
    alerts.close()
    assert len(said) == 1 and "sh exited with status 3: no route to hooks.example" in said[0]
    log = (tmp_path / "alerts.log").read_text()
    assert log.count("detection: sh exited with status 3") == 3 and "stderr:\nno route to hooks.example" in log


def test_a_command_that_floods_its_output_is_kept_to_the_cap(tmp_path):
    flood = "yes 'all work and no play' | head -c 50000000; yes err | head -c 50000000 >&2"
    alerts, said = sender(tmp_path, ["sh", "-c", flood], timeout_s=60.0)
    alerts.send(EVENT)
    alerts.close()
    log = (tmp_path / "alerts.log").read_text()
    assert "detection: ok" in log and said == []
    assert len(log.encode()) < 2 * OUTPUT_MAX_BYTES + 4096
    assert "stdout:\nall work and no play" in log
    assert f"stderr (its last {OUTPUT_MAX_BYTES} bytes):\nerr\n" in log


def test_a_missing_command_is_one_warning_and_the_log_says_which(tmp_path):
    alerts, said = sender(tmp_path, ["/nonexistent/trainctl-slack"])
    alerts.send(EVENT)
    alerts.close()
    assert len(said) == 1 and "/nonexistent/trainctl-slack" in said[0]


def test_submit_splits_the_alert_command_into_words_and_empty_is_none():
    assert parse_alert_command("/opt/site/trainctl-slack 'https://hooks.example/T0 B1'") == (
        "/opt/site/trainctl-slack", "https://hooks.example/T0 B1")
    assert parse_alert_command("") == ()


# ---------------------------------------------------------------- the machine decides when

def facts(alerts: bool, retries: int = 0) -> machine.JobFacts:
    policy = load_gate_policy("local-demo", None)
    watch = machine.WatchFacts(policy.watch_limits, None, 1.0, 1.0, 1.0, policy.watch.pay_factor,
                               policy.watch.restart_cost_s)
    return machine.JobFacts(("node1", "node2", "node3"), "node1", False, retries, max_restarts=3, min_nodes=2,
                            watch=watch, alerts=alerts)


def xid_on_node2(t: float) -> dict:
    return {"node1": NodeReading("node1", t, (RankProgress(0, 5, 2.5, t),), ()),
            "node2": NodeReading("node2", t, (RankProgress(1, 5, 2.5, t),), (("gpu.xid", "Xid 79"),))}


def run_to_a_restart(job: machine.JobFacts) -> list:
    effects_seen = []
    state = machine.JobState()
    for event in (machine.Started(), machine.GateDecided("node[1-2]", ("node1", "node2"), "10.0.0.1"),
                  machine.TrainingStarted(1000.0), machine.Polled(1001.0, xid_on_node2(1001.0)),
                  machine.CheckpointAsked(posted=True, listening=False),   # no signal, no listener: no wait
                  machine.StepStopped(143), machine.GateDecided("node[1,3]", ("node1", "node3"), "10.0.0.1"),
                  machine.TrainingStarted(1100.0), machine.StepEnded(0, 1200.0, {})):
        state, effects = machine.advance(job, state, event)
        effects_seen += effects
    return effects_seen


def test_the_machine_alerts_on_a_detection_a_restart_and_the_end_only_where_the_job_has_a_command():
    effects = run_to_a_restart(facts(alerts=True))
    alerts = [effect for effect in effects if isinstance(effect, machine.Alert)]
    assert alerts == [machine.Alert(Kind.DETECTION), machine.Alert(Kind.TRAINING_START), machine.Alert(Kind.JOB_END)]
    detection = effects.index(machine.Alert(Kind.DETECTION))
    assert effects[detection - 1].kind == Kind.DETECTION           # right after the event it alerts on
    assert isinstance(effects[effects.index(machine.Alert(Kind.JOB_END)) - 1], machine.Finish)
    assert not any(isinstance(effect, machine.Alert) for effect in run_to_a_restart(facts(alerts=False)))


def test_the_machine_alerts_on_a_successor_and_on_a_stop_by_signal():
    job = facts(alerts=True, retries=1)
    state = machine.JobState(phase="retry", status=2)
    assert machine.advance(job, state, machine.RetryHandled(successor=True))[1] == (
        machine.Alert(Kind.RETRY), machine.Finish(2), machine.Alert(Kind.JOB_END))
    assert machine.advance(job, state, machine.RetryHandled())[1] == (machine.Finish(2), machine.Alert(Kind.JOB_END))
    assert machine.stopped(job, 15) == (machine.Journal(Kind.JOB_END, {"status": 143, "cause": "stopped by signal 15"}),
                                        machine.Alert(Kind.JOB_END))
    assert machine.stopped(facts(alerts=False), 15)[1:] == ()


def test_the_supervisor_sends_the_journals_newest_event_of_the_kind(tmp_path):
    out = tmp_path / "events"
    driver = JobDriver.__new__(JobDriver)     # the executors only, no Slurm
    driver.journal = Journal(tmp_path / "journal.jsonl", keep=True)
    driver.identity, driver.gate_dir = IDENTITY, str(tmp_path)
    driver.alerts, said = sender(tmp_path, ["sh", "-c", 'cat >> "$0"', str(out)])
    for effect in (machine.Journal(Kind.DETECTION, {"kind": "slow", "suspects": [], "evidence": "first"}),
                   machine.Journal(Kind.DETECTION, {"kind": "sick", "suspects": ["node2"], "evidence": "Xid 79"}),
                   machine.Alert(Kind.DETECTION)):
        driver.carry_out(effect)
    driver.alerts.close()
    (event,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert event["kind"] == "sick" and event["evidence"] == "Xid 79" and event["job_id"] == "1234"
