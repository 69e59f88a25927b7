"""Every report format tells the same story about the same history: the verdict, the latest
sweep (never a resume's re-check), which nodes are in trouble now, and a grid that holds every
node the report names, whose newest cell is that node's state now."""

import datetime
import json
import re

import pytest

from support.sweeps import DAY, night
from trainctl.slurm import expand_hostlist
from trainctl.sweep import render
from trainctl.sweep.db import History
from trainctl.sweep.report import build_report, load_report_data

T0 = 1_700_000_000.0
UTC = datetime.timezone.utc
PORTS = ("fail", "mlx5_2/1 rate 200 Gb/s < 400")
XID = ("fail", "Xid 79 on GPU 3")


def build(tmp_path, nights, *, recheck=None, drains=(), since_days=3):
    """`nights`: one dict per night (see tests/support/sweeps.py); `recheck`: a re-check's nodes, the last day."""
    db = tmp_path / "sweeps.db"
    with History.open(db, write=True) as history:
        ids = [night(history, T0 + i * DAY, nodes) for i, nodes in enumerate(nights)]
        if recheck:
            ids.append(night(history, T0 + (len(nights) - 1) * DAY + 8 * 3600, recheck, kind="recheck"))
        for host, check, when in drains:
            history.record_drain(host=host, reason=f"trainctl: {check}: broken", reason_time="", sweep_id=ids[0],
                                 check=check, drained_at=T0 + when * DAY + 3600)
    now = T0 + len(nights) * DAY
    with History.open(db) as history:
        return build_report(load_report_data(history, now - since_days * DAY), now, now - since_days * DAY, tz=UTC), ids


def views(report):
    """What each format says: its verdict line, its latest sweep, and (JSON, HTML) the grid."""
    text, md, page = render.to_text(report, UTC), render.to_markdown(report, UTC), render.to_html(report, UTC)
    data = json.loads(render.to_json(report))
    html_cells: dict[str, dict[str, str]] = {}
    for hostlist, day, state in re.findall(r"<title>(\S+) (\d{4}-\d\d-\d\d): ([a-z ]+)</title>", page):
        for host in expand_hostlist(hostlist):   # nodes with the same history share a row
            html_cells.setdefault(host, {})[day] = state.replace("not swept", "not_swept").replace("no sweep", "")
    return {
        "text": (re.search(r"^(every checked|\d+ of \d+ nodes|no nodes).*$", text, re.M).group(0),
                 re.search(r"^latest sweep #(\d+) (\w+)", text, re.M).groups()),
        "markdown": (re.search(r"^\*\*(.*)\.\*\*$", md, re.M).group(1),
                     re.search(r"^Latest sweep #(\d+) (\w+)", md, re.M).groups()),
        "html": (re.search(r'<p class="verdict"><strong>(.*)\.</strong>', page).group(1),
                 re.search(r"Latest sweep #(\d+) (\w+)", page).groups()),
        "json": (data["verdict"], (str(data["latest_sweep"]), data["sweeps"][-1]["kind"])),
    }, data, html_cells


def assert_one_story(report):
    said, data, html_cells = views(report)
    verdicts = {fmt: verdict.lower() for fmt, (verdict, _) in said.items()}
    assert len(set(verdicts.values())) == 1, verdicts
    assert {latest for _, latest in said.values()} == {(str(report.latest.id), "sweep")}
    now = {n["host"]: n["state"] for n in data["nodes"]}
    named = set(report.failing_hosts) | {d.host for d in report.drained}
    json_grid = {row["host"]: row["cells"] for row in data["grid"]["rows"]}
    assert named <= set(json_grid) and set(json_grid) == set(html_cells)   # every node named is in the grid
    for host, cells in json_grid.items():
        newest = [c for c in cells if c is not None][-1]
        assert newest == now[host], (host, cells, now[host])              # its newest cell is its state now
        assert [c or "" for c in cells] == [html_cells[host].get(day, "") for day in data["grid"]["nights"]]
    return verdicts["json"], now, json_grid


def test_a_passing_recheck_is_the_nodes_state_but_never_the_latest_sweep(tmp_path):
    report, ids = build(tmp_path, [
        {"gpu1": "ok", "gpu2": {"ib.ports": PORTS}, "gpu3": "ok", "gpu4": "ok"},
        {"gpu1": "ok", "gpu2": {"ib.ports": PORTS}, "gpu3": {"gpu.xid": XID}, "gpu4": "timeout"},
        {"gpu1": "ok", "gpu2": "drained", "gpu3": {"gpu.xid": XID}, "gpu4": "ok"},
    ], recheck={"gpu3": "ok"}, drains=[("gpu2", "ib.ports", 1)])
    verdict, now, grid = assert_one_story(report)
    assert report.latest.id == ids[2] and [s.id for s in report.rechecks] == [ids[3]]
    assert now["gpu3"] == "ok" and grid["gpu3"][-1] == "ok"     # failed at night, passed its re-check that day
    assert now["gpu2"] == "not_swept" and "gpu2" in grid          # held drained by trainctl
    assert verdict.startswith("every checked node passed its latest check; earlier in the window, trouble on")
    assert "re-checks of drained nodes: #" in render.to_text(report, UTC)


def test_a_node_drained_before_the_window_is_still_in_the_grid(tmp_path):
    nights = [{"gpu1": "ok", "gpu2": {"ib.ports": PORTS}}] + [{"gpu1": "ok", "gpu2": "drained"}] * 4
    report, _ = build(tmp_path, nights, drains=[("gpu2", "ib.ports", 0)], since_days=2)
    _, _, grid = assert_one_story(report)
    assert list(grid) == ["gpu2"] and set(grid["gpu2"]) == {"not_swept"}


@pytest.mark.parametrize("last", [
    {"gpu1": {"ib.ports": PORTS}, "gpu2": "ok", "gpu3": "error"},
    {"gpu1": "ok", "gpu2": "ok", "gpu3": "ok"},
    {"gpu1": "warn", "gpu2": "allocated", "gpu3": {"gpu.xid": XID}},
])
def test_every_format_says_the_same_about_now_and_the_past(tmp_path, last):
    earlier = {"gpu1": "ok", "gpu2": {"gpu.xid": XID}, "gpu3": "timeout"}
    report, _ = build(tmp_path, [earlier, last])
    verdict, now, grid = assert_one_story(report)
    troubled_now = sorted(h for h, state in now.items() if state not in ("ok", "not_swept"))
    assert verdict.startswith(f"{len(troubled_now)} of 3 nodes" if troubled_now else "every checked node passed")
    assert set(grid) == {"gpu2", "gpu3"} | set(troubled_now)
