"""The scale benchmarks at tiny sizes (CI's smoke test): they run the real writer and report
end to end and print their JSON lines. Big sizes are run by hand (README, "At scale")."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_sweep_ingest_bench_writes_real_results_at_tiny_n():
    out = subprocess.run([sys.executable, str(BENCH / "sweep_ingest.py"), "--nodes", "60", "--rounds", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {line["writer"]: line for line in json_lines(out.stdout)}
    assert set(lines) == {"per-node", "batched"}
    for line in lines.values():
        assert line["nodes"] == 60 and line["checks_per_node"] >= 24 and line["peak_rss_mb"] > 0
        assert line["db_mb_two_sweeps"] > 0


def test_report_scale_bench_times_every_format_at_tiny_n():
    out = subprocess.run([sys.executable, str(BENCH / "report_scale.py"), "--nodes", "40,80", "--sweeps", "3",
                          "--rounds", "1", "--no-sweep"], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in out.stderr, out.stderr[-2000:]   # its exit code says whether targets were met
    lines = json_lines(out.stdout)
    assert [line["nodes"] for line in lines] == [40, 80]
    for line in lines:
        for fmt in ("text", "json", "html"):
            assert line[f"{fmt}_s"] > 0 and line[f"{fmt}_peak_mb"] > 0 and line[f"{fmt}_out_kb"] >= 0
    assert "seconds grow as N^" in out.stdout
