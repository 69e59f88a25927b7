"""The job directory's one owner (trainctl.job.jobdir): every file in its layout (the docs' table
is generated from it), every journal kind described, and each record read back as written."""

from __future__ import annotations

import json

from trainctl import journal_events
from trainctl.job import jobdir
from trainctl.gate_reasons import Reason
from trainctl.job.decision import Decision, Exclusion
from trainctl.job.jobdir import AttemptRecord, JobPaths, Kind, RetryRecord
from trainctl.job.journal import describe


def test_the_layout_names_every_file_of_the_directory():
    table = jobdir.layout_table()
    for name in (jobdir.DECISION, jobdir.REPORT, jobdir.JOURNAL, jobdir.RETRY, jobdir.ATTEMPT,
                 jobdir.CHECKPOINT_MARKER, f"{jobdir.WATCH}/<node>.json", f"{jobdir.ROUNDS}/<n>/", jobdir.FABRIC,
                 jobdir.GATE_STEP_STATUS, jobdir.BATCH_HOST_BEAT, jobdir.SENTINEL_LOG, jobdir.SENTINEL_OUT,
                 jobdir.rank_log("<node>", "<rank>"), jobdir.gate_log("<node>"), jobdir.resize_script("<jobid>"),
                 f"{jobdir.WATCH}/{jobdir.DUMP_REQUEST}"):
        assert f"`{name}`" in table, name
    assert table.splitlines()[0] == "| file | written by | what |"


def test_every_journal_kind_is_described_and_every_described_kind_reads_back():
    for kind in Kind:
        assert kind.description and kind in journal_events.EVENT_FIELDS, kind
        line = json.dumps({"t": 5.0, "event": kind.value})
        event = jobdir.parse_event(line)
        assert event["event"] is kind and describe(event)
    assert describe(jobdir.parse_event('{"t": 5, "event": "drain", "node": "node2", "outcome": "drained"}')) == \
        "watch: drained a node it named (the site's gate.drain_on): node node2, outcome drained"
    assert jobdir.parse_event('{"t": 5, "event": "from_a_newer_trainctl", "x": 1}')["event"] == "from_a_newer_trainctl"


def test_a_field_of_another_type_is_dropped_or_with_strict_makes_the_line_no_event():
    line = '{"t": 5, "event": "node_verdict", "node": 7, "verdict": "excluded", "reasons": null}'
    assert jobdir.parse_event(line) == {"t": 5.0, "event": Kind.NODE_VERDICT, "verdict": "excluded"}
    assert jobdir.parse_event(line, strict=True) is None
    assert jobdir.parse_event(line.replace("7", '"node2"'), strict=True)["node"] == "node2"   # null: none


def test_the_decision_reads_back_as_gate_decide_wrote_it_and_anything_else_is_unknown(tmp_path):
    decision = Decision(("node1", "node2", "node3"), ("node1", "node3"), ("node1",),
                        (Exclusion("node2", (Reason("nvlink.links", "NVLink 3 inactive"), Reason("lost during the gate", ""))),),
                        ("node3: slower",), 1, 1, master_addr="10.0.0.1")
    paths = JobPaths(tmp_path)
    jobdir.write_json(paths.decision, decision.to_json() | {"drains": []})
    assert jobdir.read_decision(paths) == decision
    for bad in ('{"allocated": "node1"}', '{"allocated": [], "excluded": [{"host": 3}]}', "[]", "{",
                '{"wanted": 1, "minimum": 1, "master_addr": 7}', '{"wanted": 1, "minimum": 1, "master_addr": "a\\nb"}'):
        paths.decision.write_text(bad)
        assert jobdir.read_decision(paths) is None, bad


def test_the_retry_and_attempt_records_read_back_as_written(tmp_path):
    record = RetryRecord("7", 1, 2, "step", 1, True, "a node was lost during training", {"node3": "Slurm state down*"},
                         ("node3",), "8", None, None, ())
    paths = JobPaths.of(tmp_path, "7")
    paths.root.mkdir()
    jobdir.write_json(paths.retry, record.to_json())
    assert jobdir.read_retry(paths) == record
    following = paths.sibling("8")
    following.root.mkdir()
    jobdir.write_json(following.attempt, AttemptRecord("8", 2, 2, "7", ("node3",)).to_json())
    assert jobdir.read_attempt(following) == AttemptRecord("8", 2, 2, "7", ("node3",))
    paths.retry.write_text('{"job_id": "7", "attempt": "1"}')
    assert jobdir.read_retry(paths) is None


def test_the_journal_is_written_as_strict_json_whatever_a_value_holds(tmp_path):
    journal = jobdir.Journal(tmp_path / "journal.jsonl", clock=lambda: 5.0)
    journal.add(Kind.DETECTION, kind="slow", suspects=[], evidence="x", details={"step_s": float("nan")})
    line = (tmp_path / "journal.jsonl").read_text()
    assert "NaN" not in line and json.loads(line)["details"] == {"step_s": None}
