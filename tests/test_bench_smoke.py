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


def test_gate_scale_bench_names_slow_missing_and_dead_nodes_at_tiny_n():
    out = subprocess.run([sys.executable, str(BENCH / "gate_scale.py"), "--nodes", "24,40", "--join-timeout", "3"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = json_lines(out.stdout)
    rows, fit = lines[:-1], lines[-1]
    assert [row["nodes"] for row in rows] == [24, 40]
    for row in rows:
        assert row["errors"] == [] and row["rounds"] == 3
        assert row["found"] == {24: "1/1", 40: "2/2"}[row["nodes"]]   # 5 % planted at 0.5x
        assert row["false"] == 0 and row["missing"] == "1/1" and row["died"] == "1/1"
        assert row["rank0_fds"] > 0 and row["store_keys"] > 0 and row["peak_rss_mb"] > 0
    assert "exponent_of_coordination_s_in_N" in fit and "n_log_n_exponent_over_same_range" in fit


def test_watch_scale_bench_polls_real_node_files_at_tiny_n():
    out = subprocess.run([sys.executable, "-P", str(BENCH / "watch_scale.py"), "--nodes", "2,4",
                          "--ranks", "2", "--rounds", "1", "--polls", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()
            if line.split()[:1] in (["2"], ["4"]) and len(line.split()) == 11]   # the table's rows
    assert [(row[0], row[1]) for row in rows] == [("2", "4"), ("4", "8")]   # nodes, ranks
    assert all(int(row[-1].replace(",", "")) > 0 for row in rows)           # bytes per node file
    assert all(float(row[7]) >= 1.0 for row in rows)                        # polls every: at least poll_s
    assert "4 nodes:" in out.stdout and "cores" in out.stdout


def test_fleet_scale_bench_folds_a_day_and_reports_at_tiny_n():
    out = subprocess.run([sys.executable, str(BENCH / "fleet_scale.py"), "--nodes", "300", "--days", "3",
                          "--jobs-per-day", "40", "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    (setup,) = json_lines(out.stdout)
    assert setup["journals"] == 120 and setup["job_event_rows"] > 0
    for row in ("ingest, new day", "ingest, new day, no accounting", "ingest, nothing new", "report text",
                "report html without jobs"):
        assert row in out.stdout
    assert "sacct calls for the 40 new journals, each round: [1] (batches of 500)" in out.stdout
    assert "targets: report <= 5 s" in out.stdout


def test_hostile_journal_bench_folds_each_shape_in_rows_bounded_by_the_jobs_nodes_at_tiny_n():
    out = run_bench("hostile_journal.py", "--mib", "0.2", "--nodes", "20", "--rounds", "1")
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
    rows = {line.split()[0]: int(line.split()[2]) for line in out.stdout.splitlines()
            if line.split()[:1] in (["honest"], ["steps"], ["detections"])}
    assert rows == {"honest": 20, "steps": 20, "detections": 20}
    assert "rows at most 40" in out.stdout and "met" in out.stdout


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", str(BENCH / argv[0]), *argv[1:]],
                          capture_output=True, text=True, timeout=300)


def test_progress_cost_bench_reports_from_each_watched_process():
    out = run_bench("progress_cost.py", "--calls", "2000", "--rounds", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    for mode in ("bare loop", "not under job", "under job", "every call"):
        assert mode in out.stdout
    # "every call" sends a datagram a call (some lost when the reader's queue is full), which it
    # does only as the rank's own process, the first of its rank and Slurm step
    received = int(out.stdout.split("datagrams received:")[1].split()[0].replace(",", ""))
    assert received > 100


def test_guest_step_bench_times_the_hook_at_tiny_n():
    out = run_bench("guest_step.py", "--steps", "200", "--rounds", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    for mode in ("no hook", "hook, own steps", "call nothing", "hook call, own"):
        assert mode in out.stdout
    steps = int(out.stdout.split("steps counted:")[1].split(")")[0].replace(",", ""))
    assert steps > 0   # the hook counted the optimizer's steps for the rank


def test_guest_startup_bench_runs_interpreters_with_and_without_the_bootstrap():
    # `pass` alone: each torch program is seconds of imports (the bench runs them by hand)
    out = run_bench("guest_startup.py", "--programs", "pass", "--rounds", "1", "--pass-repeats", "1")
    assert "Traceback" not in out.stderr, out.stderr[-2000:]   # its exit code says whether the target was met
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("pass ")]
    assert [row[1] for row in rows[:2]] == ["without", "with"] and "target <= 5 ms" in out.stdout


def test_guest_sampler_bench_times_blocks_with_the_sampler_running_and_not():
    out = run_bench("guest_sampler.py", "--rounds", "1", "--blocks", "1", "--loop", "20000",
                    "--workloads", "python")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [line.split()[:3] for line in out.stdout.splitlines() if line.startswith("python loop")] == \
        [["python", "loop", "wall"], ["python", "loop", "CPU"]]


def test_gpu_own_time_bench_reads_a_ranks_own_time_from_outside_it_on_a_cpu():
    # its mechanics where there is no GPU: the reader process, the interleaved modes, a slowdown
    out = run_bench("gpu_own_time.py", "--device", "cpu", "--width", "32", "--batch", "8", "--rounds", "1",
                    "--block-s", "0.3", "--phase-s", "1.5")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [line.split()[0] for line in out.stdout.splitlines()
            if line.startswith(("alone", "agent", "hook"))] == ["alone", "agent", "agent", "hook"]
    assert "of the step's rise" in out.stdout and "no schedstat" not in out.stdout


def test_job_follow_scale_bench_redraws_a_real_job_directory_at_tiny_n():
    out = run_bench("job_follow_scale.py", "--nodes", "2,4", "--ranks", "2", "--redraws", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json_lines(out.stdout)
    assert [(row["nodes"], row["ranks"]) for row in rows] == [(2, 4), (4, 8)]
    assert all(row["first_s"] > 0 and row["redraw_s"] > 0 and row["journal_bytes"] > 0 for row in rows)
    assert "not judged below 4,096 nodes" in out.stdout


def test_job_metrics_bench_writes_the_file_at_tiny_n():
    out = subprocess.run([sys.executable, str(BENCH / "job_metrics_scale.py"), "--nodes", "4,40", "--rounds", "1",
                          "--polls", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = json_lines(out.stdout)
    assert [line["nodes"] for line in lines] == [4, 40]
    for line in lines:
        assert line["poll_s"] > 0 and line["file_bytes"] > 0 and line["samples"] > 0
    assert "under the 50 ms target" in out.stdout
