"""The HTML report renders in a real browser (headless Chromium): failure tables and the node x night grid."""

import subprocess
import sys
from pathlib import Path

from support.chromium import chromium, page_dom, screenshot  # noqa: F401 (chromium: the fixture)
from support.sweeps import DAY, night
from trainctl.sweep.db import History

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))


def report_in_chromium(chromium, tmp_path, db: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`trainctl report --format html` of `db`, and the page's DOM as Chromium builds it."""
    page = tmp_path / "report.html"
    out = subprocess.run([TRAINCTL, "report", "--db", str(db), "--format", "html", "--out", str(page)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return page, page_dom(chromium, tmp_path, page)


def test_html_report_renders_failure_tables_and_grid_in_chromium(chromium, tmp_path):
    import time

    db = tmp_path / "sweeps.db"
    now = time.time()
    rate = ("fail", "mlx5_2/1 rate 200 Gb/s < 400")
    with History.open(db, write=True) as history:
        for day in range(6, -1, -1):
            nodes = {f"gpu{i:02d}": "ok" for i in range(1, 13)}
            nodes |= {f"gpu{i:02d}": {"ib.ports": rate} for i in range(3, 8) if day < 4}
            nodes |= {"gpu09": {"gpu.xid": ("fail", "Xid 79: GPU 3 fell off the bus")} if day % 2 == 0 else "ok",
                      "gpu10": "allocated" if day else "timeout", "gpu11": "drained" if day < 2 else "ok"}
            sweep = night(history, now - day * DAY - 3600, nodes)
        history.record_drain(host="gpu03", reason=f"trainctl: ib.ports: {rate[1]}", reason_time="",
                             sweep_id=sweep, check="ib.ports", drained_at=now - 1800)
    page, dom = report_in_chromium(chromium, tmp_path, db)
    assert '<table class="failures">' in dom.stdout
    assert "<code>gpu[03-07]</code>" in dom.stdout and "mlx5_2/1 rate 200 Gb/s &lt; 400" in dom.stdout
    assert "Xid 79: GPU 3 fell off the bus" in dom.stdout and "yes, 6 changes" in dom.stdout
    # the grid: the 7 nodes that had trouble x 7 nights, gpu03-07 (the same nights) folded into one row
    assert '<svg class="grid"' in dom.stdout and dom.stdout.count("<rect") == 3 * 7
    assert "<title>gpu[03-07]</title>" in dom.stdout and "7 nodes in 3 rows" in dom.stdout

    screenshot(chromium, tmp_path, page, ARTIFACTS / "report-html.png", "1280,900")


def test_html_node_timeline_shows_strikes_by_family_service_and_drains_in_chromium(chromium, tmp_path):
    import time

    from trainctl.sweep.model import JobEventRow, JobRow

    db = tmp_path / "sweeps.db"
    now = time.time()
    ecc = "gpu.ecc: GPU 2 (PCI 0000:3b:00.0): 4 uncorrectable (double-bit) ECC errors, volatile"

    def job(number: int, at: float, *events: tuple[str, str, str, str]) -> tuple[JobRow, list[JobEventRow]]:
        # each event with the families the fold finds for it: an ECC error's, or none for a job served
        rows = [JobEventRow(str(number), line, host, kind, at + line, what, detail,
                            ("gpu-memory",) if kind == "exclusion" else ())
                for line, (host, kind, what, detail) in enumerate(events, start=2)]
        return JobRow(str(number), "test", at, at + 60, 0, f"/drop/{number}.jsonl", len(rows) + 1, 100, now,
                      number), rows   # each job another user's

    with History.open(db, write=True) as history:
        # gpu05 keeps failing on its memory; gpu06 did too, then served twelve jobs since its last strike
        jobs = [job(200 + n, now - 6 * DAY + n * 3600, (host, "exclusion", "gpu.ecc", ecc), ("gpu01", "served", "", ""))
                for n, host in enumerate(("gpu05", "gpu06") * 3)]
        jobs += [job(300 + n, now - 3 * DAY + n * 3600, ("gpu06", "served", "", ""), ("gpu05", "served", "", ""))
                 for n in range(2)]
        jobs += [job(400 + n, now - 2 * DAY + n * 3600, ("gpu06", "served", "", "")) for n in range(10)]
        history.record_jobs(jobs)
        sweep = night(history, now - DAY, {"gpu05": "ok", "gpu06": "ok"})
        history.record_drain(host="gpu05", reason="trainctl: fleet.lemon: 3 gpu-memory strikes in 7 days: job 200",
                             reason_time="", sweep_id=sweep, check="fleet.lemon", drained_at=now - 1800)
    page, dom = report_in_chromium(chromium, tmp_path, db)
    lemon, _, cleared = dom.stdout.partition("Cleared by service")
    assert '<h3 class="lemon" data-host="gpu05">gpu05: 3 gpu-memory strikes, 3 jobs of 3 users; served 2 jobs since its last gpu-memory strike' in lemon
    assert lemon.count('<tr data-kind="exclusion" data-family="gpu-memory">') == 3
    assert lemon.count('<tr data-kind="served" data-family="">') == 2
    assert lemon.count('<tr data-kind="drained" data-family="">') == 1 and "3 gpu-memory strikes in 7 days" in lemon
    assert "<code>gpu-memory</code>: GPU memory" in lemon   # the legend says what the family counts
    assert '<h3 class="cleared" data-host="gpu06">gpu06: gpu-memory 3 (forgiven: served 12 jobs' in cleared
    assert cleared.count('<tr data-kind="served" data-family="">') == 12
    assert dom.stdout.count('<svg class="timeline"') == 2

    screenshot(chromium, tmp_path, page, ARTIFACTS / "report-html-node-timeline.png", "1280,2400")
