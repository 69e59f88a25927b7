"""A running job's metrics for Prometheus: the chain's journals and the machine's state in, samples
out, rendered in Prometheus's text format and read back by prometheus_client's own parser; the
file written into a real directory as node_exporter's textfile collector reads it."""

from __future__ import annotations

import json
import os
import stat

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainctl.errors import UsageError
from trainctl.job import machine, metrics
from trainctl.job.goodput import goodput
from trainctl.job.jobdir import AttemptRecord, JobPaths, Journal, Kind, NodeReading, RankProgress, earlier_attempts
from trainctl.job.policy import load_gate_policy

IDENTITY = metrics.JobIdentity("1234", "1200", "alice", "llama-70b")


def parsed(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, its labels sorted): value}, as Prometheus's Python client parses the text."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def labels(**extra: str) -> tuple:
    return tuple(sorted({"job_id": "1234", "chain": "1200", "user": "alice", "job_name": "llama-70b",
                         **extra}.items()))


def a_job_with_a_hang_and_a_restart(path) -> list[dict]:
    """A journal as the supervisor writes it: submitted at 900, the gate from 1000 to 1030 leaving
    node3 out, training from 1040, a save at 1100, node2 hung at 1200, the restart's training at 1300."""
    clock = [1000.0]
    journal = Journal(path, clock=lambda: clock[0], keep=True)

    def at(t: float, event: Kind, **fields) -> None:
        clock[0] = t
        journal.add(event, **fields)

    at(1000, Kind.JOB_START, job="1234", nodes=["node1", "node2", "node3"])
    at(1001, Kind.SUBMITTED, submitted_t=900.0)
    at(1001, Kind.GATE_START)
    for node, verdict in (("node1", "chosen"), ("node2", "chosen"), ("node3", "excluded")):
        at(1029, Kind.NODE_VERDICT, node=node, verdict=verdict, reasons=["gpu.xid: Xid 79"] if node == "node3" else [])
    at(1031, Kind.GATE_END, status=0, chosen=["node1", "node2"])
    at(1040, Kind.TRAINING_START, nodes="node[1-2]")
    at(1101, Kind.CHECKPOINT, checkpoint_t=1100.0)
    at(1200, Kind.DETECTION, kind="hung", suspects=["node2"], evidence="no rank finished a step for 60 s")
    at(1210, Kind.STEP_END, status=143, training_start_t=1040.0, last_checkpoint_t=1100.0)
    at(1211, Kind.GATE_START, nodes=["node1", "node3"])
    at(1240, Kind.GATE_END, status=0, chosen=["node1", "node3"])
    at(1300, Kind.TRAINING_START, nodes="node[1,3]", restart=1)
    return journal.events


def test_the_metrics_of_a_job_that_restarted_read_back_as_the_journal_says(tmp_path):
    events = a_job_with_a_hang_and_a_restart(tmp_path / "journal.jsonl")
    now = 1400.0
    live = metrics.Live("training", 2, step_s=0.5, steps=200)
    text = metrics.render(IDENTITY, metrics.job_samples([events], live, now))
    got = parsed(text)

    assert got[("trainctl_job_restarts_total", labels(kind="hung"))] == 1
    assert got[("trainctl_job_restarts_total", labels(kind="slow"))] == 0
    assert got[("trainctl_job_detections_total", labels(kind="hung"))] == 1
    assert got[("trainctl_job_phase", labels(phase="training"))] == 1
    assert got[("trainctl_job_phase", labels(phase="gate"))] == 0
    assert got[("trainctl_job_step_seconds", labels())] == 0.5
    assert got[("trainctl_job_steps_per_second", labels())] == 2.0
    assert got[("trainctl_job_steps_total", labels())] == 200
    assert got[("trainctl_job_last_checkpoint_timestamp_seconds", labels())] == 1100.0
    # the latest gate round: the one after the detection, which left nobody out
    assert got[("trainctl_job_gate_duration_seconds", labels())] == 29.0
    assert got[("trainctl_job_gate_rounds_total", labels())] == 2
    assert got[("trainctl_job_gate_excluded_nodes", labels())] == 0
    # goodput and badput are goodput()'s own, to the digit
    result = goodput([events], now)
    assert got[("trainctl_job_goodput_ratio", labels())] == pytest.approx(result.ratio, abs=0)
    assert got[("trainctl_job_wall_seconds", labels())] == result.wall_s == 500.0
    for cause in ("queue", "gate", "restart", "lost_work"):
        assert got[("trainctl_job_badput_seconds", labels(cause=cause))] == result.lost_s[cause]
    assert result.lost_s["lost_work"] == 110.0   # the hung step's time after its last save


def test_every_family_has_help_and_type_and_follows_the_naming_conventions(tmp_path):
    events = a_job_with_a_hang_and_a_restart(tmp_path / "journal.jsonl")
    text = metrics.render(IDENTITY, metrics.job_samples([events], metrics.Live("training", 2, 0.5, 10), 1400.0))
    families = list(text_string_to_metric_families(text))
    assert {family.type for family in families} <= {"gauge", "counter"}
    for family in families:
        assert family.name.startswith("trainctl_job_") and family.documentation
        # the client strips _total from a counter's family name; its samples keep it
        assert family.type != "counter" or all(s.name.endswith("_total") for s in family.samples)
    # a time is a Unix time in seconds, and says so; no label is Prometheus's own `job`
    assert "trainctl_job_last_checkpoint_timestamp_seconds{" in text
    assert text.endswith("\n") and "job=" not in text.replace("job_id=", "").replace("job_name=", "")


def test_the_gate_that_left_a_node_out_names_it(tmp_path):
    events = a_job_with_a_hang_and_a_restart(tmp_path / "journal.jsonl")
    first_round = events[:events.index(next(e for e in events if e["event"] == Kind.TRAINING_START))]
    got = parsed(metrics.render(IDENTITY, metrics.job_samples([first_round], metrics.Live("gate", 0), 1035.0)))
    assert got[("trainctl_job_gate_excluded_nodes", labels())] == 1
    assert got[("trainctl_job_gate_excluded", labels(node="node3"))] == 1
    assert got[("trainctl_job_gate_duration_seconds", labels())] == 30.0
    assert ("trainctl_job_step_seconds", labels()) not in got                 # no training yet: no step time
    assert ("trainctl_job_last_checkpoint_timestamp_seconds", labels()) not in got


def test_a_job_name_with_quotes_backslashes_newlines_and_bad_bytes_reads_back_whole():
    name = 'a "b" \\c\nd' + "\udce9"
    identity = metrics.JobIdentity("7", "7", "bob", name)
    text = metrics.render(identity, metrics.job_samples([], metrics.Live("gate", 0), 0.0))
    text.encode("utf-8")   # the format is UTF-8: an undecodable byte of the name cannot break it
    (family, *_) = [f for f in text_string_to_metric_families(text) if f.name == "trainctl_job_phase"]
    assert family.samples[0].labels["job_name"] == 'a "b" \\c\nd\ufffd'


def test_the_live_state_comes_from_the_machine_and_its_watch():
    policy = load_gate_policy("local-demo", None)
    watch = machine.WatchFacts(policy.watch_limits, None, 1.0, 1.0, 1.0, policy.watch.pay_factor,
                               policy.watch.restart_cost_s)
    facts = machine.JobFacts(("node1", "node2"), "node1", False, 0, max_restarts=3, watch=watch)
    state, _ = machine.advance(facts, machine.JobState(), machine.Started())
    assert metrics.live_state(state, 60.0, 0.0) == metrics.Live("gate", 0)
    state, _ = machine.advance(facts, state, machine.GateDecided("node[1-2]", ("node1", "node2"), "10.0.0.1"))
    state, _ = machine.advance(facts, state, machine.TrainingStarted(1000.0))
    for second in range(1, 31):   # two steps a second on both nodes
        t = 1000.0 + second
        readings = {node: NodeReading(node, t, (RankProgress(rank, 2 * second, second, t),), ())
                    for rank, node in enumerate(("node1", "node2"))}
        state, _ = machine.advance(facts, state, machine.Polled(t, readings))
    live = metrics.live_state(state, 60.0, 1030.0)
    assert live == metrics.Live("training", 2, 0.5, 60)
    assert metrics.live_state(machine.JobState(phase="gate", restarts=1), 60.0, 0.0).phase == "restarting"


def test_a_successor_carries_the_chain_its_counts_and_its_goodput_on(tmp_path):
    first, second = JobPaths.of(tmp_path, "1200"), JobPaths.of(tmp_path, "1234")
    first.root.mkdir()
    second.root.mkdir()
    earlier = a_job_with_a_hang_and_a_restart(first.journal)
    second.attempt.write_text(json.dumps(AttemptRecord("1234", 2, 1, "1200").to_json()))
    found = earlier_attempts(second)
    assert [job for job, _ in found] == ["1200"] and len(found[0][1]) == len(earlier)
    assert earlier_attempts(first) == []
    now = Journal(second.journal, clock=lambda: 2000.0, keep=True)
    now.add(Kind.JOB_START, job="1234")
    got = parsed(metrics.render(IDENTITY, metrics.job_samples([found[0][1], now.events], metrics.Live("gate", 0),
                                                              2010.0)))
    assert got[("trainctl_job_attempt", labels())] == 2
    assert got[("trainctl_job_restarts_total", labels(kind="hung"))] == 1
    assert got[("trainctl_job_last_checkpoint_timestamp_seconds", labels())] == 1100.0
    assert got[("trainctl_job_wall_seconds", labels())] == 2010.0 - 900.0


def test_the_file_is_written_whole_readable_by_node_exporter_and_removed_at_the_end(tmp_path):
    text = metrics.render(IDENTITY, metrics.job_samples([], metrics.Live("gate", 0), 0.0))
    metrics.publish(str(tmp_path), "1234", text)
    metrics.publish(str(tmp_path), "1234", text)
    path = tmp_path / "trainctl-job-1234.prom"
    assert os.listdir(tmp_path) == [path.name]             # no temporary file left beside it
    assert path.read_text() == text
    assert stat.S_IMODE(path.stat().st_mode) == 0o644       # node_exporter runs as another user
    metrics.unpublish(str(tmp_path), "1234")
    assert os.listdir(tmp_path) == []
    metrics.unpublish(str(tmp_path), "1234")               # gone already: nothing to say
    with pytest.raises(UsageError, match="no such directory"):
        metrics.publish(str(tmp_path / "missing"), "1234", text)
    assert not (tmp_path / "missing").exists()


def test_what_another_user_placed_at_the_jobs_name_is_refused_never_waited_on_or_written_through(tmp_path):
    # the textfile directory is shared (mode 1777): a job's name is known before it runs
    shared = tmp_path / "textfile"
    shared.mkdir()
    victim = tmp_path / "victims-own-file"
    victim.write_text("theirs\n")
    os.symlink(victim, metrics.textfile_path(str(shared), "41"))
    os.mkfifo(metrics.textfile_path(str(shared), "42"))
    for job_id in ("41", "42"):
        with pytest.raises(UsageError, match="not a regular file"):
            metrics.publish(str(shared), job_id, "trainctl_job_attempt 1\n")
    assert victim.read_text() == "theirs\n"
    assert stat.S_ISFIFO(os.lstat(metrics.textfile_path(str(shared), "42")).st_mode)


def test_every_phase_of_the_machine_shows_as_one_of_the_metrics_phases():
    """A phase the machine gains must be given its metrics phase, not end the job with a KeyError."""
    from typing import get_args

    assert set(get_args(machine.Phase)) == set(metrics.METRIC_PHASE)
    assert set(metrics.METRIC_PHASE.values()) <= set(metrics.PHASES)
    for phase in get_args(machine.Phase):
        assert metrics.live_state(machine.JobState(phase=phase), 10.0, 0.0).phase in metrics.PHASES
