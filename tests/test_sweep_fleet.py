"""Fleet memory: jobs' journals folded into the sweep history once, the lemon rule, the report's
per-node columns, submit's and drain's opt-ins, and the bad journals refused with one line."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.slurm_records import slurm_vouching_for, write_sacct
from support.sweeps import DAY, night
from trainctl.errors import UsageError
from trainctl.site import FleetConfig
from trainctl.slurm import NodeState
from trainctl.sweep import render
from trainctl.sweep.db import BASE_TABLES, FLEET_TABLES, SCHEMA_VERSION, TABLES, History
from trainctl.sweep.drain import (DRAIN, LEMON_CHECK, RECHECK, SKIP, Action, keep_lemons_drained,
                                  plan_lemon_drains)
from trainctl.sweep.fleet import (DETECTION, EXCLUSION, SERVED, JournalRefused, LemonRule, current_lemons,
                                  find_lemons, fold_journals, parse_journal_bytes)
from trainctl.sweep.report import build_report, load_report_data

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
RULE = LemonRule.from_site(FleetConfig())
# The journals these tests write are all the test's user's files, so Slurm vouches for each job as that
# user's: one user, as at a single-team site (the rule for many users: tests/test_strike_aging.py)
ONE_TEAM = LemonRule.from_site(FleetConfig(lemon_min_users=1))
NOW = time.time()


def journal_lines(job: str, t: float, *, bad: str = "n3", site: str = "test", detection: str | None = None,
                  ended: bool = True) -> list[dict]:
    """A journal as the supervisor writes it: the gate leaves `bad` out, n1-n2 train (and, with
    `detection`, the watch names n2 and the step is ended by it)."""
    events = [{"t": t, "event": "job_start", "job": job, "site": site, "attempt": 1, "nodes": ["n1", "n2", bad]},
              {"t": t + 1, "event": "node_verdict", "node": "n1", "verdict": "chosen", "reasons": []},
              {"t": t + 1, "event": "node_verdict", "node": bad, "verdict": "excluded",
               "reasons": ["nvlink.links: GPU 3 link 5 inactive", "gpu.xid: Xid 74"]},
              {"t": t + 2, "event": "training_start", "nodes": "n[1-2]", "master_addr": "n1"}]
    if detection:
        events += [{"t": t + 3, "event": "detection", "kind": detection, "suspects": ["n2"],
                    "evidence": "n2 steps 2.1x slower", "details": {}},
                   {"t": t + 4, "event": "step_end", "status": 143, "cause": f"ended by the watch ({detection})"}]
    else:
        events.append({"t": t + 4, "event": "step_end", "status": 0, "cause": "completed"})
    if ended:
        events.append({"t": t + 5, "event": "job_end", "status": 0})
    return events


def write_journal(path: Path, events: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(event) + "\n" for event in events))
    return path


def parsed(events, **kwargs):
    text = "".join(json.dumps(event) + "\n" for event in events).encode()
    return parse_journal_bytes(text, **{"named_job": "7", "site": "test", "now": NOW} | kwargs)


# ---------------------------------------------------------------- reading a journal (pure)

def test_a_journal_gives_exclusions_detections_and_the_nodes_that_served():
    got = parsed(journal_lines("7", NOW - 100, detection="slow"))
    by_kind = {(e.kind, e.host): e for e in got.events}
    assert set(by_kind) == {(EXCLUSION, "n3"), (DETECTION, "n2"), (SERVED, "n1")}  # n2 was named: not served
    assert by_kind[(EXCLUSION, "n3")].what == "gpu.xid, nvlink.links"
    assert "GPU 3 link 5 inactive" in by_kind[(EXCLUSION, "n3")].detail
    assert by_kind[(DETECTION, "n2")].what == "slow" and by_kind[(DETECTION, "n2")].detail == "n2 steps 2.1x slower"
    assert got.job_id == "7" and got.status == 0 and got.lines == 7


def test_a_step_that_failed_on_its_own_serves_nobody():
    events = journal_lines("7", NOW - 100)
    events[4] = {"t": NOW - 96, "event": "step_end", "status": 1, "cause": "exit status 1"}
    assert [e.kind for e in parsed(events).events] == [EXCLUSION]


def test_nulls_the_supervisor_writes_and_kinds_this_version_does_not_know_are_read():
    events = journal_lines("7", NOW - 100)
    events[4] = dict(events[4], last_checkpoint_t=None, training_start_t=NOW - 98)
    events[5:5] = [{"t": NOW - 96, "event": "retry", "retry": False, "reason": "x", "successor": None},
                   {"t": NOW - 96, "event": "a_kind_from_a_later_version", "node": 5}]
    got = parsed(events)
    assert sorted((e.kind, e.host) for e in got.events) == [(EXCLUSION, "n3"), (SERVED, "n1"), (SERVED, "n2")]
    assert got.lines == 8 and got.status == 0


def test_a_torn_last_line_is_left_for_the_next_fold():
    text = "".join(json.dumps(e) + "\n" for e in journal_lines("7", NOW - 100))
    got = parse_journal_bytes(text.encode() + b'{"t": 1, "ev', named_job="7", site="test", now=NOW)
    assert got.lines == 6 and got.size == len(text.encode())


@pytest.mark.parametrize("change, message", [
    (lambda ev: ev[:2] + ["not json"] + ev[2:], "line 3 is not a journal event: damaged"),
    (lambda ev: ev[1:], "does not begin with job_start"),
    (lambda ev: [dict(ev[0], site="elsewhere")] + ev[1:], "from site 'elsewhere', not 'test'"),
    (lambda ev: ev + [{"t": NOW + 7 * DAY, "event": "job_end", "status": 0}], "is from the future"),
    (lambda ev: [dict(ev[0], job="8")] + ev[1:], "names job '8', but its file is job '7''s"),
    (lambda ev: ev[:2] + [dict(ev[2], node="../etc")] + ev[3:], "damaged"),
    # a field of another type than its kind's (jobdir.EVENT_FIELDS) is refused, never dropped and counted
    (lambda ev: [dict(ev[0], job=8)] + ev[1:], "line 1 is not a journal event: damaged"),
    (lambda ev: [dict(ev[0], site=["elsewhere"])] + ev[1:], "line 1 is not a journal event: damaged"),
    (lambda ev: ev[:2] + [dict(ev[2], reasons="gpu.xid")] + ev[3:], "line 3 is not a journal event: damaged"),
    (lambda ev: ev[:2] + [{k: v for k, v in ev[2].items() if k != "node"}] + ev[3:], "line 3: an exclusion names"),
    (lambda ev: ev[:3] + [dict(ev[3], nodes=["n1", "n2"])] + ev[4:], "line 4 is not a journal event: damaged"),
    (lambda ev: ev[:2] + [dict(ev[2], t=-1)] + ev[3:], "line 3 is not a journal event: damaged"),
    (lambda ev: ev[:2] + [dict(ev[2], pad="x" * (1 << 20))] + ev[3:], "line 3 is not a journal event: damaged"),
])
def test_a_journal_trainctl_never_wrote_is_refused(change, message):
    events = change(journal_lines("7", NOW - 100))
    text = "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events)
    with pytest.raises(JournalRefused, match=message.replace("(", r"\(")):
        parse_journal_bytes(text.encode(), named_job="7", site="test", now=NOW)


# ---------------------------------------------------------------- folding into the history

def counts(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT host, kind, COUNT(*) FROM job_events GROUP BY host, kind ORDER BY 1, 2").fetchall()


def test_folding_is_idempotent_copies_add_nothing_and_a_grown_journal_adds_its_new_lines(tmp_path):
    drop = tmp_path / "drop"
    first = write_journal(drop / "7.jsonl", journal_lines("7", NOW - 3600, ended=False)[:4])
    db = tmp_path / "h.db"
    with History.open(db, write=True) as history:
        assert fold_journals(history, [str(first)], site="test", now=NOW, ask=slurm_vouching_for([first])).folded == 1
        once = counts(db)
        assert once == [("n3", EXCLUSION, 1)]
        write_journal(first, journal_lines("7", NOW - 3600))              # the job went on and ended
        copy = write_journal(tmp_path / "submit" / "trainctl-gate-7" / "journal.jsonl", journal_lines("7", NOW - 3600))
        slurm = slurm_vouching_for([first])
        result = fold_journals(history, [str(first), str(copy), str(first)], site="test", now=NOW, ask=slurm)
        assert (result.folded, result.unchanged, result.refused) == (1, 2, [])
        assert counts(db) == [("n1", SERVED, 1), ("n2", SERVED, 1), ("n3", EXCLUSION, 1)]
        again = fold_journals(history, [str(first), str(copy)], site="test", now=NOW, ask=slurm)
        assert (again.folded, again.unchanged) == (0, 2)
        assert counts(db) == [("n1", SERVED, 1), ("n2", SERVED, 1), ("n3", EXCLUSION, 1)]


def test_bad_journals_cost_one_line_each_and_change_nothing(tmp_path):
    drop = tmp_path / "drop"
    good = write_journal(drop / "7.jsonl", journal_lines("7", NOW - 3600))
    db = tmp_path / "h.db"
    said = []
    with History.open(db, write=True) as history:
        fold_journals(history, [str(good)], site="test", now=NOW, ask=slurm_vouching_for([good]))
        before = counts(db)
        write_journal(drop / "7.jsonl", journal_lines("7", NOW - 3600)[:3])                 # cut short
        write_journal(drop / "8.jsonl", journal_lines("8", NOW - 3600, site="other"))        # another site
        write_journal(drop / "9.jsonl", journal_lines("9", NOW + 2 * DAY))                   # the future
        (drop / "10.jsonl").write_bytes(b"\x00\xff" * 100 + b"\n")                          # damaged
        write_journal(drop / "11.jsonl", journal_lines("11", NOW - 3600 + 50))
        os.mkfifo(drop / "12.jsonl")                                                         # never blocks
        write_journal(tmp_path / "again" / "11.jsonl", [dict(journal_lines("11", NOW - 999)[0])])  # another job 11
        paths = sorted(str(p) for p in drop.iterdir()) + [str(tmp_path / "again" / "11.jsonl")]
        result = fold_journals(history, paths, site="test", now=NOW, say=said.append, ask=slurm_vouching_for(paths))
    assert result.folded == 1 and len(result.refused) == len(said) == 6
    assert all(line.count("\n") == 0 and line.endswith("; skipped") for line in said)
    joined = "\n".join(said)
    for expected in ("fewer than the 6 folded in", "from site 'other'", "from the future", "not a journal event",
                     "not a regular file", "a different job with the same id"):
        assert expected in joined
    assert before == [("n1", SERVED, 1), ("n2", SERVED, 1), ("n3", EXCLUSION, 1)]
    assert counts(db) == [("n1", SERVED, 2), ("n2", SERVED, 2), ("n3", EXCLUSION, 2)]   # job 11 only
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT job_id FROM jobs ORDER BY job_id").fetchall() == [("11",), ("7",)]
        assert conn.execute("SELECT COUNT(*) FROM job_events WHERE kind = 'exclusion'").fetchone() == (2,)


def test_a_version_1_history_is_read_without_job_rows_and_gains_the_tables_at_its_first_write(tmp_path):
    db = tmp_path / "old.db"
    with History.open(db, write=True) as history:
        night(history, NOW - DAY, {"n1": "ok"})
    with sqlite3.connect(db) as conn:   # back to what trainctl wrote before fleet memory
        conn.executescript("DROP TABLE job_events; DROP TABLE jobs; UPDATE schema_version SET version = 1;")
    with History.open(db) as history:
        assert history.version == 1 and history.job_counts(0) == [] and history.folded_jobs() == {}
        report = build_report(load_report_data(history, NOW - 7 * DAY, RULE, NOW), NOW, NOW - 7 * DAY)
        assert report.fleet.lemons == ()
    with History.open(db, write=True) as history:
        assert history.version == SCHEMA_VERSION
        journal = write_journal(tmp_path / "7.jsonl", journal_lines("7", NOW - 60))
        fold_journals(history, [str(journal)], site="test", now=NOW, ask=slurm_vouching_for([journal]))
    assert counts(db)[-1] == ("n3", EXCLUSION, 1)


def test_a_version_2_history_is_read_with_its_jobs_users_unknown_and_gains_them_at_its_first_write(tmp_path):
    db = tmp_path / "old.db"
    paths = [str(write_journal(tmp_path / f"{job}.jsonl", journal_lines(job, NOW - DAY * day)))
             for job, day in (("101", 3), ("102", 2))]
    with History.open(db, write=True) as history:
        fold_journals(history, paths[:1], site="test", now=NOW, ask=slurm_vouching_for(paths))
    with sqlite3.connect(db) as conn:   # back to what trainctl wrote before it kept the jobs' users
        conn.executescript("ALTER TABLE jobs DROP COLUMN uid; ALTER TABLE job_events DROP COLUMN families; "
                           "UPDATE schema_version SET version = 2;")
    with History.open(db) as history:
        assert history.version == 2 and history.folded_jobs()["101"].uid is None
        assert history.job_users(["101"]) == {"101": None}
        report = build_report(load_report_data(history, NOW - 7 * DAY, RULE, NOW), NOW, NOW - 7 * DAY)
        assert [n.host for n in report.fleet.nodes] == ["n1", "n2", "n3"]
    with History.open(db, write=True) as history:
        assert history.version == SCHEMA_VERSION
        fold_journals(history, paths, site="test", now=NOW, ask=slurm_vouching_for(paths))
        assert history.job_users(["101", "102"]) == {"101": None, "102": os.getuid()}
    with sqlite3.connect(db) as conn:
        assert [row[1] for row in conn.execute("PRAGMA table_info(jobs)")][-1] == "uid"
    History.open(db, write=True).close()   # the upgraded file passes a writer's verdict as a new one would


# A slow detection as the watch journals it (trainctl.job.watch): its evidence says the rule in words, its
# details name it; a sick one's evidence lists "node: check: reason", its details the failed checks.
LINK_WAIT_SLOW = {"kind": "slow", "suspects": ["n2"], "details": {"step_s": 2.0, "baseline_s": 1.0, "named_by": "link-wait"},
                  "evidence": "step 2.0 s, 2x the 1.0 s baseline; n2 (rule link-wait: ib0 waits 450x its peers per MB)"}
SICK_ECC = {"kind": "sick", "suspects": ["n2"], "evidence": "n2: gpu.ecc: 4 uncorrectable ECC errors",
            "details": {"failed": [{"node": "n2", "check": "gpu.ecc", "reason": "4 uncorrectable ECC errors"}]}}
HUNG = {"kind": "hung", "suspects": ["n2"], "evidence": "no rank finished a step for 600 s", "details": {"silent": ["n2"]}}


def with_detection(events: list[dict], detection: dict) -> list[dict]:
    """`events` (journal_lines) with `detection` ending its step."""
    t = events[3]["t"]
    return events[:4] + [{"t": t + 1, "event": "detection", **detection},
                         {"t": t + 2, "event": "step_end", "status": 143, "detection": detection["kind"]}] + events[5:]


def test_a_detection_strikes_by_its_typed_details_never_by_its_evidence_text():
    def families(detection: dict) -> tuple[str, ...]:
        rows = parsed(with_detection(journal_lines("7", NOW - 100), detection)).events
        return next(row.families for row in rows if row.kind == DETECTION)

    # the evidence is garbage, or names another rule, node or check: the details decide
    assert families(dict(SICK_ECC, evidence="n2: ib.ports: x; ;; n9: gpu.smi: y")) == ("gpu-memory",)
    assert families(dict(LINK_WAIT_SLOW, evidence="n2 (rule own-time: its own CPU time rose)")) == ("link",)
    assert families(dict(LINK_WAIT_SLOW, details={"named_by": "own-time"})) == ("compute",)
    assert families(dict(SICK_ECC, details={"failed": [{"node": "n9", "check": "gpu.ecc", "reason": "x"}]})) == \
        ("other",)                                   # n2 failed no check the details name
    assert families(dict(HUNG, evidence="")) == ("hang",)
    exclusion = next(row for row in parsed(journal_lines("7", NOW - 100)).events if row.kind == EXCLUSION)
    assert exclusion.families == ("nvlink",)        # nvlink.links, and gpu.xid's Xid 74 read from its own reason


def test_a_version_3_history_gains_its_events_families_at_its_upgrade_the_same_as_a_fold_finds_them(tmp_path):
    db = tmp_path / "old.db"
    paths = [str(write_journal(tmp_path / f"{job}.jsonl", with_detection(journal_lines(job, NOW - DAY * day), found)))
             for job, day, found in (("101", 3, LINK_WAIT_SLOW), ("102", 2, SICK_ECC), ("103", 1, HUNG),
                                     ("104", 1, LINK_WAIT_SLOW), ("105", 1, LINK_WAIT_SLOW))]
    with History.open(db, write=True) as history:
        fold_journals(history, paths, site="test", now=NOW, ask=slurm_vouching_for(paths))
        night(history, NOW - DAY / 2, {"n1": "ok", "n4": {"gpu.xid": ("fail", "Xid 79 (GPU has fallen off the bus)")}})
        folded, lemons = history.job_events(0, (EXCLUSION, DETECTION, SERVED)), current_lemons(history, ONE_TEAM, NOW)
    assert {(row.host, row.what, row.families) for row in folded if row.kind == DETECTION} == \
        {("n2", "slow", ("link",)), ("n2", "sick", ("gpu-memory",)), ("n2", "hung", ("hang",))}
    assert [(lemon.host, [f.family for f in lemon.families]) for lemon in lemons] == [("n3", ["nvlink"]),
                                                                                      ("n2", ["link"])]
    with sqlite3.connect(db) as conn:   # back to what trainctl wrote before the rows kept their families
        conn.executescript("ALTER TABLE job_events DROP COLUMN families; UPDATE schema_version SET version = 3;")
    with History.open(db) as history:   # read as it is: the families found from the text the rows kept
        assert history.version == 3
        assert history.job_events(0, (EXCLUSION, DETECTION, SERVED)) == folded
        assert current_lemons(history, ONE_TEAM, NOW) == lemons
    with History.open(db, write=True) as history:
        assert history.version == SCHEMA_VERSION
        assert history.job_events(0, (EXCLUSION, DETECTION, SERVED)) == folded
        assert current_lemons(history, ONE_TEAM, NOW) == lemons
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM job_events WHERE families IS NULL").fetchone() == (0,)
    History.open(db, write=True).close()   # the upgraded file passes a writer's verdict as a new one would


def test_a_failed_sweep_gives_its_checks_as_recorded_and_a_reason_that_reads_like_another_check_stays_its_own(
        tmp_path):
    from trainctl.sweep.families import failed_check_families
    from trainctl.sweep.model import SweepFailure

    db = tmp_path / "h.db"
    reason = "mlx5_2/1 Down; gpu.ecc: 4 uncorrectable ECC errors"   # words of a port's state, not a second check
    with History.open(db, write=True) as history:
        sweep = night(history, NOW - DAY, {"n4": {"ib.ports": ("fail", reason), "host.memory": ("fail", "2 GiB")},
                                           "n5": {"ib.ports": ("warn", "x")}, "n6": "ok"})
    with History.open(db) as history:
        failures = history.sweep_failures(0)
    assert failures == [SweepFailure("n4", sweep, NOW - DAY, (("host.memory", "2 GiB"), ("ib.ports", reason)))]
    assert failed_check_families(failures[0].failed) == ("host", "link")
    assert failures[0].text == f"host.memory: 2 GiB; ib.ports: {reason}"


@pytest.mark.parametrize("sql, message", [
    ("UPDATE jobs SET uid = 'root'", "job '7': uid 'root' is not a user id"),
    ("UPDATE jobs SET uid = -1", "job '7': uid '-1' is not a user id"),
    ("UPDATE job_events SET kind = 'sabotage' WHERE host = 'n3'", "kind 'sabotage' unknown"),
    ("""UPDATE job_events SET families = '["sabotage"]' WHERE host = 'n3'""", "are not a list of failure families"),
    ("UPDATE job_events SET families = NULL WHERE host = 'n3'", "families 'None' are not a list"),
    ("UPDATE job_events SET families = 'nvlink' WHERE host = 'n3'", "families 'nvlink' are not a list"),
    ("UPDATE job_events SET host = 'n[1-9]' WHERE host = 'n3'", "host 'n[1-9]' is not a node name"),
    ("UPDATE jobs SET started_at = 'yesterday'", "is not a time"),
    ("DELETE FROM jobs", "event of job '7'"),
])
def test_the_integrity_verdict_covers_the_job_tables(tmp_path, sql, message):
    db = tmp_path / "h.db"
    with History.open(db, write=True) as history:
        journal = write_journal(tmp_path / "7.jsonl", journal_lines("7", NOW - 60))
        fold_journals(history, [str(journal)], site="test", now=NOW, ask=slurm_vouching_for([journal]))
    with sqlite3.connect(db) as conn:
        conn.execute(sql)
    before = db.read_bytes()
    for judged in (TABLES, FLEET_TABLES):   # a sweep judges every table; `history ingest` the job tables
        with pytest.raises(UsageError, match="damaged sweep history") as refused:
            History.open(db, write=True, judged=judged)
        assert message in str(refused.value)
    assert db.read_bytes() == before


def test_a_foreign_table_beside_the_job_tables_is_refused(tmp_path):
    db = tmp_path / "h.db"
    History.open(db, write=True).close()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE job_events")
    with pytest.raises(UsageError, match="no table job_events"):
        History.open(db)
    assert "jobs" not in BASE_TABLES


# ---------------------------------------------------------------- the lemon rule and the report

def history_with_three_jobs_and_a_sweep(tmp_path) -> Path:
    db = tmp_path / "h.db"
    paths = [str(write_journal(tmp_path / f"{job}.jsonl", journal_lines(job, NOW - DAY * day, detection=kind)))
             for job, day, kind in (("101", 3, None), ("102", 2, "slow"), ("103", 1, None))]
    with History.open(db, write=True) as history:
        fold_journals(history, paths, site="test", now=NOW, ask=slurm_vouching_for(paths))
        night(history, NOW - DAY / 2, {"n1": "ok", "n2": "ok", "n4": {"gpu.xid": ("fail", "Xid 79")}})
    return db


def test_three_jobs_that_left_a_node_out_make_it_a_lemon_with_its_evidence(tmp_path):
    db = history_with_three_jobs_and_a_sweep(tmp_path)
    with History.open(db) as history:
        lemons = current_lemons(history, ONE_TEAM, NOW)
        report = build_report(load_report_data(history, NOW - 7 * DAY, ONE_TEAM, NOW), NOW, NOW - 7 * DAY)
        assert history.job_users(["101", "102", "103", "104"]) == dict.fromkeys(["101", "102", "103"], os.getuid())
        one_user = build_report(load_report_data(history, NOW - 7 * DAY, RULE, NOW), NOW, NOW - 7 * DAY)
        assert current_lemons(history, RULE, NOW) == []   # by default, one user's jobs make no lemon
    assert [(lemon.host, lemon.strikes, lemon.jobs) for lemon in lemons] == [("n3", 3.0, ("job 101", "job 102",
                                                                                         "job 103"))]
    assert [s.host for s in one_user.fleet.too_few_users] == ["n3"] and one_user.fleet.lemons == ()
    assert ("n3  nvlink 3 from the jobs of 1 user (job 101, job 102, job 103); a lemon once the jobs of 2 users "
            "strike a family, or a failed sweep agrees") in render.to_text(one_user)
    held = json.loads(render.to_json(one_user))["fleet"]["too_few_users"]
    assert [(h["host"], h["families"][0]["users"], h["families"][0]["swept"]) for h in held] == [("n3", 1, False)]
    assert '<h3 class="too-few-users" data-host="n3">' in render.to_html(one_user)
    nodes = {n.host: n for n in report.fleet.nodes}
    assert (nodes["n3"].jobs_excluded, nodes["n3"].jobs_served) == (3, 0)
    assert (nodes["n2"].detections, nodes["n2"].jobs_served) == (1, 2)
    assert (nodes["n1"].jobs_served, nodes["n4"].sweeps_failed) == (3, 1)
    text = render.to_text(report)
    assert "LEMONS (3 strikes of one failure family in 7 days" in text and "n3  3 nvlink strikes, 3 jobs of 1 user" in text
    assert "job 102 gate left it out: nvlink.links: GPU 3 link 5 inactive" in text
    document = json.loads(render.to_json(report))["fleet"]
    assert document["lemons"][0]["host"] == "n3" and len(document["lemons"][0]["evidence"]) == 3
    assert "**n3**: 3 nvlink strikes, 3 jobs" in render.to_markdown(report)
    page = render.to_html(report)
    assert '<h3 class="lemon" data-host="n3">' in page and page.count('<tr data-kind="exclusion" data-family="nvlink">') == 3
    prom = render.to_prometheus([], [], [], None, report.fleet)
    assert 'trainctl_node_jobs_excluded{node="n3"} 3' in prom and 'trainctl_node_lemon_strikes{node="n3"} 3' in prom


def test_strikes_are_weighted_by_kind_and_a_job_strikes_a_node_once_per_kind_and_family():
    from trainctl.sweep.model import JobEventRow, SweepFailure

    events = [JobEventRow("1", line, "n9", EXCLUSION, 100.0 + line, "lost during the gate", "", ("hang",))
              for line in (2, 9)]
    events.append(JobEventRow("2", 3, "n9", DETECTION, 200.0, "hung", "no step for 600 s", ("hang",)))   # as the gate's
    heavy = LemonRule(strikes=3, days=7, exclusion=1, detection=2, sweep=0.5, forgive_after_jobs=0, min_users=2)
    users = {"1": 1001, "2": 1002}
    assert [(lemon.strikes, lemon.families[0].family) for lemon in find_lemons(heavy, events, [], (), users)] == \
        [(3.0, "hang")]
    assert find_lemons(LemonRule(3, 7, 1, 1, 1, 0, 2), events, [], (), users) == []
    xid_79 = "Xid 79 (GPU has fallen off the bus) on GPU 3 (PCI 0000:9b:00.0): 1 event(s)"
    off_the_bus = [JobEventRow("1", 2, "n9", EXCLUSION, 100.0, "gpu.xid", f"gpu.xid: {xid_79}", ("gpu-reset",))]
    sweeps = [SweepFailure("n9", 4, 300.0, (("gpu.xid", xid_79),))] * 4
    assert [lemon.strikes for lemon in find_lemons(heavy, off_the_bus, sweeps, (), users)] == [3.0]


def test_drain_plans_lemons_like_sweep_failures_and_resume_keeps_a_lemon_drained():
    from trainctl.sweep.model import SweepFailure

    db_lemons = find_lemons(RULE, [], [SweepFailure(host, n, 1.0, ()) for host in ("n1", "n2", "n3") for n in range(3)],
                            (), {})
    states = {"n1": NodeState("n1", "n1", "idle", "", "", "", ""),
              "n2": NodeState("n2", "n2", "drained", "", "maintenance", "root", "2026-11-27T10:00:00")}
    actions = {a.host: a for a in plan_lemon_drains(db_lemons, RULE, states, [])}
    assert actions["n1"].action == DRAIN and actions["n1"].text.startswith("trainctl: fleet.lemon: 3 other strikes in "
                                                                          "7 days: sweep #0, sweep #1, sweep #2")
    assert actions["n2"].action == SKIP and "did not set" in actions["n2"].text
    assert actions["n3"].action == SKIP and actions["n3"].text == "not known to Slurm"
    candidates = [Action("n1", RECHECK, "", LEMON_CHECK, 1), Action("n5", RECHECK, "", LEMON_CHECK, 2),
                  Action("n6", RECHECK, "", "gpu.xid", 3)]
    recheck, kept = keep_lemons_drained(candidates, {"n1", "n6"}, RULE)
    assert [a.host for a in recheck] == ["n5", "n6"] and [a.host for a in kept] == ["n1"]


# ---------------------------------------------------------------- the commands

def site_file(tmp_path: Path, db: Path, **fleet) -> Path:
    settings = "".join(f"{key} = {json.dumps(value)}\n" for key, value in fleet.items())
    path = tmp_path / "test.toml"
    path.write_text(f'name = "test"\ndefault_partition = "p"\n[partitions.p]\ngpus_per_node = 0\n'
                    f'socket_ifname = "lo"\n[sweep]\ndb = "{db}"\n[fleet]\n{settings}')
    return path


def test_history_ingest_folds_the_sites_journal_dir_once_and_says_what_it_refused(tmp_path):
    drop = tmp_path / "drop"
    write_journal(drop / "7.jsonl", journal_lines("7", NOW - 60))
    write_journal(drop / "8.jsonl", journal_lines("8", NOW - 60, site="other"))
    site = site_file(tmp_path, tmp_path / "h.db", journal_dir=str(drop))
    write_sacct(tmp_path / "bin", drop.iterdir())
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    for _ in range(2):
        out = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site), "--json"], capture_output=True,
                             text=True, timeout=60, env=env)
        assert out.returncode == 1, out.stderr
        assert out.stderr.count("from site 'other'") == 1
    assert json.loads(out.stdout)["unchanged"] == 1 and counts(tmp_path / "h.db")[-1] == ("n3", EXCLUSION, 1)


def test_submit_leaves_the_lemons_out_where_the_site_opts_in_and_keeps_them_on_request(tmp_path):
    db = history_with_three_jobs_and_a_sweep(tmp_path)
    site = site_file(tmp_path, db, submit_excludes_lemons=True, lemon_min_users=1)
    (tmp_path / "train.py").write_text("print('hi')\n")
    probe = ("import sys; from trainctl.cli import main; code = main(sys.argv[1:]); "
             "print('sqlite3 imported' if 'sqlite3' in sys.modules else 'no sqlite3', file=sys.stderr)")

    def submit(*extra):
        return subprocess.run([sys.executable, "-c", probe, "submit", "--site", str(site), "--nodes", "2",
                               "--dry-run", *extra, "--", "train.py"], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)
    opted = submit()
    assert opted.returncode == 0, opted.stderr
    assert "leaving out the site's lemons (1): n3" in opted.stderr and "#SBATCH --exclude=n3\n" in opted.stdout
    kept = submit("--keep-lemons")
    assert "#SBATCH --exclude" not in kept.stdout and "leaving out" not in kept.stderr
    assert "no sqlite3" in kept.stderr     # a submit that does not look at the lemons never loads the history code
    site.write_text(site.read_text().replace("submit_excludes_lemons = true", ""))
    assert "#SBATCH --exclude=n3" in submit("--exclude-lemons").stdout


def test_submit_reads_the_published_lemons_file_and_never_the_history(tmp_path):
    db = history_with_three_jobs_and_a_sweep(tmp_path)
    lemons = tmp_path / "shared" / "lemons.json"
    lemons.parent.mkdir()
    site = site_file(tmp_path, db, lemons_file=str(lemons), submit_excludes_lemons=True, lemon_min_users=1)
    out = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "1 lemon(s) written to" in out.stderr, out.stderr
    assert json.loads(lemons.read_text())["lemons"][0]["host"] == "n3"
    db.rename(tmp_path / "elsewhere.db")   # a login node that cannot see the history
    (tmp_path / "train.py").write_text("print('hi')\n")

    def submit():
        return subprocess.run([TRAINCTL, "submit", "--site", str(site), "--nodes", "2", "--dry-run", "--",
                               "train.py"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    opted = submit()
    assert opted.returncode == 0 and "#SBATCH --exclude=n3\n" in opted.stdout, opted.stderr
    document = json.loads(lemons.read_text())
    for change, said in (({"site": "other"}, "of site 'other', not 'test'"),
                         ({"generated_at": NOW - 30 * DAY}, "not within the rule's 7 days"),
                         ({"lemons": [{"host": "n[1-9]"}]}, "is not a node name")):
        lemons.write_text(json.dumps(document | change))
        refused = submit()
        assert refused.returncode == 0 and "#SBATCH --exclude" not in refused.stdout
        assert "warning: not leaving out the site's lemons: lemons file" in refused.stderr and said in refused.stderr


# ---------------------------------------------------------------- Slurm vouches for each journal

# sacct's real answer (Slurm 22.05 with slurmdbd, the dev cluster with --accounting; the command is
# trainctl.slurm.sacct_argv with SLURM_TIME_FORMAT=%s): job 1 root's on node[1-2]; 2 nobody's (uid
# 65534) on node1; 3 root's, resized from node[1-3] to node1; 4 running on node1; 6 the array task
# 5_1; 7 a het job on node1 (7+0) and node2 (7+1); 999 never ran.
SACCT = (Path(__file__).parent / "fixtures" / "sacct" / "slurm-22.05-jobs.txt").read_text()
RAN_AT = 1796413858.0     # jobs 1 and 2 started and ended in that second
NOBODY = 65534


def accounting(job_ids):
    from trainctl.slurm import parse_sacct_jobs
    from trainctl.sweep.fleet import SlurmRecords

    return SlurmRecords(parse_sacct_jobs(SACCT, job_ids))


def slurm_journal(path: Path, job: str, t: float, *, excluded: str = "node2", trained: str = "node1",
                  owner: int | None = None, site: str = "test") -> Path:
    """An honest journal of `job`: its gate leaves `excluded` out, `trained` trains one step."""
    write_journal(path, [{"t": t, "event": "job_start", "job": job, "site": site, "attempt": 1,
                          "nodes": [trained, excluded]},
                         {"t": t, "event": "node_verdict", "node": excluded, "verdict": "excluded",
                          "reasons": ["nvlink.links: GPU 3 link 5 inactive"]},
                         {"t": t, "event": "training_start", "nodes": trained, "master_addr": trained},
                         {"t": t, "event": "step_end", "status": 0, "cause": "completed"},
                         {"t": t, "event": "job_end", "status": 0}])
    if owner is not None:
        os.chown(path, owner, -1)
    return path


def fold_vouched(tmp_path, paths, **kwargs):
    said = []
    with History.open(tmp_path / "h.db", write=True) as history:
        result = fold_journals(history, [str(p) for p in paths], site="test", now=RAN_AT + DAY, say=said.append,
                               **{"ask": accounting} | kwargs)
    assert len(said) == len(result.refused) and all("\n" not in line for line in said)
    return result, counts(tmp_path / "h.db")


def test_sacct_output_is_read_into_each_jobs_every_allocation():
    from trainctl.slurm import parse_sacct_jobs

    jobs = parse_sacct_jobs(SACCT, ["1", "2", "3", "4", "6", "7", "999"])
    assert sorted(jobs) == ["1", "2", "3", "4", "6", "7"]          # 999 never ran: no record
    assert (jobs["1"].uid, sorted(jobs["1"].nodes), jobs["1"].start) == (0, ["node1", "node2"], RAN_AT)
    assert jobs["2"].uid == NOBODY
    assert sorted(jobs["3"].nodes) == ["node1", "node2", "node3"]   # what it held before the resize counts
    assert jobs["4"].end is None and jobs["3"].end == RAN_AT + 2
    assert sorted(jobs["7"].nodes) == ["node1", "node2"]            # both het components
    assert parse_sacct_jobs(SACCT, ["8"])["8"].nodes == {"node2"}   # a component asked by its own id


def test_sacct_output_of_another_shape_is_one_error_line():
    from trainctl.errors import ParseError
    from trainctl.slurm import parse_sacct_jobs

    with pytest.raises(ParseError, match="expected a header line"):
        parse_sacct_jobs("JobID|User\n1|root\n", ["1"])
    with pytest.raises(ParseError, match="seconds since 1970"):
        parse_sacct_jobs(SACCT.replace("|1796413858|1796413858|", "|2026-12-04T19:30:58|1796413858|", 1), ["1"])


def test_a_journal_slurm_vouches_for_is_folded_in(tmp_path):
    honest = [slurm_journal(tmp_path / "1.jsonl", "1", RAN_AT),
              slurm_journal(tmp_path / "3.jsonl", "3", RAN_AT + 1, excluded="node3"),  # held before its resize
              slurm_journal(tmp_path / "4.jsonl", "4", RAN_AT + 500, excluded="node1")]  # still running
    result, rows = fold_vouched(tmp_path, honest)
    assert (result.folded, result.refused, result.unverified) == (3, [], 0)
    assert rows == [("node1", EXCLUSION, 1), ("node1", SERVED, 3), ("node2", EXCLUSION, 1), ("node3", EXCLUSION, 1)]


def forgeries(tmp_path) -> dict[str, Path]:
    forger = 4321 if os.geteuid() == 0 else os.geteuid()   # as root: files of another user; else the tester's own
    real = slurm_journal(tmp_path / "real" / "1.jsonl", "1", RAN_AT)
    appended = tmp_path / "appended" / "1.jsonl"
    appended.parent.mkdir()
    appended.write_text(real.read_text() + json.dumps({"t": RAN_AT, "event": "node_verdict", "node": "node1",
                                                       "verdict": "excluded", "reasons": ["gpu.xid: Xid 79"]}) + "\n")
    os.chown(appended, forger, -1) if os.geteuid() == 0 else None
    return {"never ran": slurm_journal(tmp_path / "999.jsonl", "999", RAN_AT, owner=None),
            "another user's job": slurm_journal(tmp_path / "2.jsonl", "2", RAN_AT, owner=forger
                                                if os.geteuid() == 0 else None),
            "a node it never held": slurm_journal(tmp_path / "held" / "1.jsonl", "1", RAN_AT, excluded="node3"),
            "lines appended to another user's journal": appended,
            "a time outside its run": slurm_journal(tmp_path / "late" / "1.jsonl", "1", RAN_AT + 3600)}


def test_forged_journals_add_nothing_each_refused_with_one_line_naming_why(tmp_path):
    forged = forgeries(tmp_path)
    result, rows = fold_vouched(tmp_path, forged.values())
    assert (result.folded, rows) == (0, [])
    why = dict(zip(forged, result.refused))
    assert "job 999 never ran, by Slurm's accounting" in why["never ran"]
    assert f"but job 2 was uid {NOBODY}'s" in why["another user's job"]
    assert "names node3, never allocated to job 1 (it held node[1-2])" in why["a node it never held"]
    assert "job 1 was uid 0's" in why["lines appended to another user's journal"] or os.geteuid() != 0
    assert "outside job 1's run" in why["a time outside its run"]
    assert all(line.endswith("not verified; skipped") for line in result.refused)


def test_slurm_is_asked_once_for_a_batch_of_journals(tmp_path):
    asked = []

    def ask(job_ids):
        asked.append(job_ids)
        return accounting(job_ids)
    paths = [slurm_journal(tmp_path / f"{job}.jsonl", job, RAN_AT) for job in ("1", "3", "999")]
    fold_vouched(tmp_path, paths, ask=ask)
    assert asked == [["1", "3", "999"]]


NO_ACCOUNTING = "sacct exited with status 1: sacct: error: Slurm accounting storage is disabled"


def test_without_accounting_journals_wait_unless_the_site_folds_them_unverified(tmp_path):
    from trainctl.sweep.fleet import SlurmRecords

    paths = [slurm_journal(tmp_path / "1.jsonl", "1", RAN_AT), slurm_journal(tmp_path / "2.jsonl", "2", RAN_AT,
                                                                              excluded="node9")]
    with History.open(tmp_path / "h.db", write=True) as history:
        night(history, RAN_AT - DAY, {"node1": "ok", "node2": "ok"})    # the nodes the history knows
    unanswered = {"ask": lambda job_ids: SlurmRecords({}, NO_ACCOUNTING)}
    result, rows = fold_vouched(tmp_path, paths, **unanswered)
    assert (result.folded, rows, result.no_accounting, result.uncounted, result.refused) == (0, [], NO_ACCOUNTING,
                                                                                             2, [])
    result, rows = fold_vouched(tmp_path, paths, unverified_journals=True, **unanswered)
    assert (result.folded, result.unverified) == (1, 1) and rows == [("node1", SERVED, 1), ("node2", EXCLUSION, 1)]
    assert "names node9, which no sweep or earlier job of the history names" in result.refused[0]


@pytest.mark.parametrize("job", ["7\x1b[31m", "7\x07", "1;2", "../1", "12345678901"])
def test_a_job_id_that_is_not_slurms_never_reaches_the_history(job):
    events = journal_lines("7", NOW - 100)
    events[0] = dict(events[0], job=job)
    text = "".join(json.dumps(event) + "\n" for event in events).encode()
    with pytest.raises(JournalRefused, match="which is no Slurm job id") as refused:
        parse_journal_bytes(text, named_job="", site="test", now=NOW)
    assert "\x1b" not in str(refused.value) and "\x07" not in str(refused.value)


def test_a_job_id_that_is_not_slurms_in_a_journals_name_never_reaches_the_history_or_the_terminal(tmp_path):
    bad = write_journal(tmp_path / "7\x1b]0;x\x07.jsonl", journal_lines("7", RAN_AT))
    result, rows = fold_vouched(tmp_path, [bad])
    assert rows == [] and len(result.refused) == 1
    assert "\x1b" not in result.refused[0] and "\x07" not in result.refused[0]


# ---------------------------------------------------------------- what a journal can add

def amplifying_journal(job: str, t: float, *, steps: int, hostlist: str, detections: int, suspects: list[str]) -> bytes:
    """A small journal that names many nodes many times: each step on `hostlist` serves all of them,
    each detection names every one of `suspects`."""
    events = [{"t": t, "event": "job_start", "job": job, "site": "test", "attempt": 1, "nodes": ["node1"]}]
    for _ in range(steps):
        events += [{"t": t, "event": "training_start", "nodes": hostlist, "master_addr": "node1"},
                   {"t": t, "event": "step_end", "status": 0, "cause": "completed"}]
    events += [{"t": t, "event": "detection", "kind": "hung", "suspects": suspects, "evidence": "no step",
                "details": {}, "note": "recorded"}] * detections
    return "".join(json.dumps(event) + "\n" for event in events).encode()


def test_rows_grow_with_the_nodes_a_journal_names_never_with_its_events_times_them():
    # 10 steps on node[1-65536]: 655,360 served rows before; each node's service is kept once, at its last step
    text = amplifying_journal("7", NOW - 100, steps=10, hostlist="node[1-65536]", detections=0, suspects=[])
    assert len(text) < 2048
    rows = parse_journal_bytes(text, named_job="7", site="test", now=NOW).events
    assert len(rows) == 65536 and {row.line for row in rows} == {21}
    # 2,000 detections naming the same 1,000 nodes: each node's strike kept once per kind and family
    text = amplifying_journal("7", NOW - 100, steps=1, hostlist="node[1-2]", detections=2000,
                              suspects=[f"node{n}" for n in range(1, 1001)])
    rows = parse_journal_bytes(text, named_job="7", site="test", now=NOW).events
    assert len([row for row in rows if row.kind == DETECTION]) == 1000 and len(rows) == 1002


def test_a_journal_is_read_only_as_far_as_the_nodes_its_job_held(tmp_path):
    # job 1 held node[1-2]: a step on node[1-65536] stops the reading at node3, and the fold refuses it
    path = tmp_path / "1.jsonl"
    path.write_bytes(amplifying_journal("1", RAN_AT, steps=100, hostlist="node[1-65536]", detections=0, suspects=[]))
    parsed_journal = parse_journal_bytes(path.read_bytes(), named_job="1", site="test", now=NOW,
                                         nodes=frozenset({"node1", "node2"}))
    assert parsed_journal.foreign == "node3" and len(parsed_journal.events) <= 2
    result, rows = fold_vouched(tmp_path, [path])
    assert rows == [] and "names node3, never allocated to job 1" in result.refused[0]


def test_steps_that_name_more_nodes_than_any_jobs_steps_can_are_refused_before_any_is_expanded():
    from trainctl.sweep.fleet import STEP_NAMES_MAX

    events = [{"t": NOW - 100, "event": "job_start", "job": "7", "site": "test", "attempt": 1, "nodes": ["n1"]}]
    for last in range(65536, 65536 - STEP_NAMES_MAX // 65536 - 1, -1):   # each hostlist another
        events += [{"t": NOW - 100, "event": "training_start", "nodes": f"n[1-{last}]", "master_addr": "n1"},
                   {"t": NOW - 100, "event": "step_end", "status": 0, "cause": "completed"}]
    with pytest.raises(JournalRefused, match=f"its steps name more than {STEP_NAMES_MAX} nodes in all"):
        parsed(events)


def test_two_folds_at_once_each_count_only_what_they_added(tmp_path):
    path = slurm_journal(tmp_path / "1.jsonl", "1", RAN_AT)
    beside = []

    def ask_while_another_folds(job_ids):   # the other fold commits after this one read the history
        with History.open(tmp_path / "h.db", write=True) as other:
            beside.append(fold_journals(other, [str(path)], site="test", now=RAN_AT + DAY, ask=accounting))
        return accounting(job_ids)
    result, rows = fold_vouched(tmp_path, [path], ask=ask_while_another_folds)
    assert (beside[0].folded, beside[0].events) == (1, 2)
    assert (result.folded, result.events, result.unchanged) == (0, 0, 1) and len(rows) == 2


def lemons_site(tmp_path: Path, lemons: Path) -> tuple[Path, dict]:
    path = slurm_journal(tmp_path / "drop" / "1.jsonl", "1", RAN_AT)
    write_sacct(tmp_path / "bin", [path])
    site = site_file(tmp_path, tmp_path / "h.db", journal_dir=str(path.parent), lemons_file=str(lemons))
    return site, {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}


@pytest.mark.skipif(os.geteuid() != 0, reason="what root writes")
def test_root_writes_the_lemons_file_only_where_its_directory_is_roots_alone(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    (shared / "lemons.json").symlink_to(secret)        # a user's link at the name
    os.lchown(shared / "lemons.json", NOBODY, NOBODY)
    site, env = lemons_site(tmp_path, shared / "lemons.json")
    out = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 1
    refusal = [line for line in out.stderr.splitlines() if "lemons.json not written" in line]
    assert len(refusal) == 1 and "mode 1777" in refusal[0], out.stderr
    assert secret.read_text() == "root's\n" and oct(secret.stat().st_mode & 0o777) == "0o600"
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    site, env = lemons_site(tmp_path, own / "lemons.json")
    out = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0 and json.loads((own / "lemons.json").read_text())["lemons"] == [], out.stderr


def test_ingest_into_another_history_leaves_the_sites_lemons_file_alone(tmp_path):
    lemons = tmp_path / "lemons.json"
    site, env = lemons_site(tmp_path, lemons)
    subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site)], capture_output=True, text=True,
                   timeout=60, env=env, check=True)
    published = lemons.read_bytes()
    out = subprocess.run([TRAINCTL, "history", "ingest", "--site", str(site), "--db", str(tmp_path / "other.db"),
                          "--json"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and lemons.read_bytes() == published
    assert "is not the site's history" in json.loads(out.stdout)["lemons_refused"]
    assert out.stderr.count("not written") == 1
