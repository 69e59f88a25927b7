"""The drain report: grouping, folding, since-when streaks, flapping, not-swept nodes, and every format."""

import datetime
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.sweeps import DAY, night
from trainctl.sweep import render
from trainctl.sweep.db import History
from trainctl.sweep.model import ResultRow
from trainctl.sweep.report import build_report, load_report_data, status_changes, streak_start

T0 = 1_700_000_000.0
UTC = datetime.timezone.utc
RATE = ("fail", "mlx5_2/1 rate 200 Gb/s < 400")


def report_of(tmp_path, nights, *, now=None, since_days=7, finished_last=True):
    db = tmp_path / "sweeps.db"
    ids = []
    with History.open(db, write=True) as history:
        for i, nodes in enumerate(nights):
            ids.append(night(history, T0 + i * DAY, nodes, finished=finished_last or i < len(nights) - 1))
    now = now or T0 + len(nights) * DAY
    with History.open(db) as history:
        return build_report(load_report_data(history, now - since_days * DAY), now, now - since_days * DAY,
                            tz=UTC), ids


def test_same_check_and_reason_fold_into_one_group(tmp_path):
    nodes = {f"gpu{i:02d}": {"ib.ports": RATE} for i in range(3, 8)}
    nodes |= {"gpu01": "ok", "gpu02": {"gpu.xid": ("fail", "Xid 79 on GPU 3")}, "gpu09": "allocated"}
    report, _ = report_of(tmp_path, [nodes])
    assert [(g.hostlist, g.check, g.reason) for g in report.groups] == [
        ("gpu[03-07]", "ib.ports", RATE[1]), ("gpu02", "gpu.xid", "Xid 79 on GPU 3")]
    text = render.to_text(report, UTC)
    assert re.search(r"gpu\[03-07\]\s+ib\.ports\s+mlx5_2/1 rate 200 Gb/s < 400", text)
    assert report.counts == {"ok": 1, "fail": 6, "not_swept": 1}


def test_since_is_the_first_sweep_of_the_current_streak_and_busy_nights_do_not_break_it(tmp_path):
    report, ids = report_of(tmp_path, [
        {"gpu1": "ok"},
        {"gpu1": {"ib.ports": RATE}},
        {"gpu1": "allocated"},            # not checked that night: neither breaks nor extends the streak
        {"gpu1": {"ib.ports": RATE}},
    ])
    (group,) = report.groups
    assert group.since_sweep == ids[1] and group.since == T0 + DAY
    assert not group.flapping


def test_a_check_that_recovers_and_fails_again_flaps_and_its_streak_restarts(tmp_path):
    report, ids = report_of(tmp_path, [
        {"gpu1": {"ib.ports": RATE}}, {"gpu1": "ok"}, {"gpu1": {"ib.ports": RATE}}])
    (group,) = report.groups
    assert group.flapping and group.changes == 2
    assert group.since_sweep == ids[2]
    assert "flapping (2 changes)" in render.to_text(report, UTC)


def test_since_reaches_back_beyond_the_window(tmp_path):
    nights = [{"gpu1": {"ib.ports": RATE}}] * 10
    report, ids = report_of(tmp_path, nights, since_days=3)
    assert report.groups[0].since_sweep == ids[0]
    assert len(report.sweeps) == 3


def test_not_swept_timeouts_and_errors_are_listed_apart_from_failures(tmp_path):
    report, _ = report_of(tmp_path, [{"gpu1": "ok", "gpu2": "allocated", "gpu3": "allocated", "gpu4": "drained",
                                      "gpu5": "timeout", "gpu6": "error"}])
    assert report.groups == ()
    assert [(h.hostlist, h.label) for h in report.not_swept] == [("gpu[2-3]", "allocated"), ("gpu4", "drained")]
    assert sorted(h.label for h in report.unanswered) == ["error", "timeout"]
    assert report.counts["timeout"] == 1 and report.counts["error"] == 1
    text = render.to_text(report, UTC)
    assert "NOT SWEPT" in text and "gpu[2-3]" in text and "NO VERDICT" in text


def test_a_node_is_judged_by_its_newest_row(tmp_path):
    report, _ = report_of(tmp_path, [{"gpu1": {"ib.ports": RATE}}, {"gpu1": "allocated"}])
    assert report.groups == ()
    assert [h.hostlist for h in report.not_swept] == ["gpu1"]


def test_incomplete_sweep_is_shown_as_incomplete(tmp_path):
    report, ids = report_of(tmp_path, [{"gpu1": "ok"}, {"gpu1": {"ib.ports": RATE}}], finished_last=False)
    assert [s.id for s in report.incomplete] == [ids[1]]
    assert "INCOMPLETE" in render.to_text(report, UTC)
    assert json.loads(render.to_json(report))["sweeps"][1]["complete"] is False
    assert "Incomplete sweep" in render.to_html(report, UTC)


def test_grid_has_one_column_per_night_and_each_nodes_last_verdict_of_it(tmp_path):
    report, _ = report_of(tmp_path, [{"gpu1": "ok", "gpu2": "ok"}, {"gpu1": "timeout", "gpu2": "ok"},
                                     {"gpu1": {"ib.ports": RATE}, "gpu2": "ok"}])
    assert len(report.grid.nights) == 3
    assert report.grid.rows == (("gpu1", ("ok", "timeout", "fail")),)   # gpu2 never had trouble
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:   # the same night, later: gpu1 passes again
        night(history, T0 + 2 * DAY + 3600, {"gpu1": "ok", "gpu2": "ok"})
    with History.open(db) as history:
        now = T0 + 3 * DAY
        report = build_report(load_report_data(history, now - 7 * DAY), now, now - 7 * DAY, tz=UTC)
    assert report.grid.rows == (("gpu1", ("ok", "timeout", "ok")),)


def test_drained_nodes_show_with_their_reason(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        sweep = night(history, T0, {"gpu1": {"ib.ports": RATE}})
        history.record_drain(host="gpu1", reason="trainctl: ib.ports: mlx5_2/1 rate", reason_time="t",
                             sweep_id=sweep, check="ib.ports", drained_at=T0 + 100)
    with History.open(db) as history:
        report = build_report(load_report_data(history, T0 - DAY), T0 + DAY, T0 - DAY, tz=UTC)
    assert [d.host for d in report.drained] == ["gpu1"]
    assert "DRAINED BY TRAINCTL" in render.to_text(report, UTC)
    assert "trainctl: ib.ports" in render.to_markdown(report, UTC)


def test_formats_escape_what_they_must(tmp_path):
    evil = ("fail", 'a|b <script>alert("x")</script> & "q"')
    report, _ = report_of(tmp_path, [{"gpu1": {"ib.ports": evil}}])
    page = render.to_html(report, UTC)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "a\\|b" in render.to_markdown(report, UTC)
    assert json.loads(render.to_json(report))["groups"][0]["reason"] == evil[1]


def test_html_is_self_contained(tmp_path):
    report, _ = report_of(tmp_path, [{"gpu1": "ok", "gpu2": {"ib.ports": RATE}}] * 2)
    page = render.to_html(report, UTC)
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and 'class="failures"' in page
    # nothing fetched: no external URLs, scripts, stylesheets or images
    assert not re.search(r"(src|href)\s*=|@import|url\(|<script|<link", page)


def test_prometheus_text_format(tmp_path):
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        night(history, T0, {"gpu1": {"ib.ports": RATE}, "gpu2": "ok"})
        night(history, T0 + DAY, {"gpu1": "allocated"}, finished=False)
    with History.open(db) as history:
        text = render.to_prometheus(history.latest_checked_results(), history.current_nodes(1),
                                    history.drains(open_only=True), history.sweeps()[-1])
    assert 'trainctl_check_status{node="gpu1",check="ib.ports"} 2' in text  # the last time it was checked
    assert 'trainctl_node_outcome{node="gpu1",outcome="not_swept"} 1' in text
    assert render._label('we"ird\\\n') == 'we\\"ird\\\\\\n'   # a label stays one quoted string
    assert "trainctl_sweep_complete 0" in text
    for line in text.splitlines():
        assert line.startswith("# ") or re.fullmatch(r'[a-z_]+(\{[^}]*\})? -?[0-9.e+]+', line), line


def rows(statuses):
    return [ResultRow(i + 1, "n", "c", s, "", {}) for i, s in enumerate(statuses)]


@given(st.lists(st.sampled_from(["ok", "warn", "fail", "unknown"]), min_size=1, max_size=30))
@settings(max_examples=200)
def test_streak_and_changes_properties(statuses):
    history = rows(statuses)
    start = streak_start(history, history[-1])
    run = statuses[start - 1:]
    assert set(run) == {statuses[-1]}                       # the streak is one status
    assert start == 1 or statuses[start - 2] != statuses[-1]  # and cannot reach further back
    bad = [s != "ok" for s in statuses]
    assert status_changes(history) == sum(a != b for a, b in zip(bad, bad[1:]))


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_cli_formats_and_empty_history(tmp_path, fmt):
    import subprocess
    import sys
    from pathlib import Path

    db = tmp_path / "sweeps.db"
    with History.open(db, write=True):
        pass
    exe = str(Path(sys.executable).with_name("trainctl"))
    out = subprocess.run([exe, "report", "--db", str(db), "--format", fmt], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout
