"""Finding the rank that hung: per-rank output files, the NCCL flight recorder settings, and
`trainctl job show` (pure folding, the rendered settings, and a real hung job on the dev cluster,
read here and over SSH)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.replay import LIBRARY, write_replay
from support.sites import site_variant
from support.slurm_jobs import submit, wait_for_job
from trainctl.errors import ExternalCommandError
from trainctl.job.show import LocalFiles, RankLog, fold_numbers, fold_tails, last_lines
from trainctl.launcher.plan import (FLIGHT_RECORDER_PIPE_PREFIX, FLIGHT_RECORDER_PREFIX, SubmitRequest,
                                   flight_recorder_environment, flight_recorder_pipe, plan_job)
from trainctl.launcher.render import render_script
from trainctl.proc import run_checked
from trainctl.site import load_site

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"


def test_numbers_fold_into_ranges():
    assert fold_numbers([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
    assert fold_numbers([3]) == "3"


def test_last_lines_skip_blanks_and_slurms_notices_and_keep_a_progress_bars_last_state():
    assert last_lines("a\n\nb\r50%\r100%\n\n", 2) == ("a", "100%")
    cancelled = "slurmstepd-node1: error: *** STEP 1.1 ON node1 CANCELLED AT 2026-11-23T06:59:08 ***"
    assert last_lines(f"step 2 done\n{cancelled}\n", 1) == ("step 2 done",)


def test_identical_tails_fold_and_the_odd_one_out_comes_first():
    same = ("step 41 loss 2.1", "step 42 loss 2.0")
    logs = [RankLog(r, f"node{r // 2 + 1}", same, 100.0 + r) for r in (0, 2, 3, 4, 5)]
    logs.append(RankLog(1, "node1", ("step 41 loss 2.1",), 60.0))
    groups = fold_tails(logs)
    assert [(g.rank_list, g.nodes) for g in groups] == [("1", ("node1",)), ("0,2-5", ("node1", "node2", "node3"))]
    assert groups[0].newest == 60.0 and groups[1].newest == 105.0


def render_for(site_name: str, **launch) -> str:
    config = load_site(site_name).config
    config = dataclasses.replace(config, launch=dataclasses.replace(config.launch, **launch))
    request = SubmitRequest(site_ref=site_name, program=("train.sh",), nodes=2)
    return render_script(plan_job(config, request, node_trainctl="/x/trainctl", node_python="/x/python",
                                  command=("trainctl",), version="0"))


def test_rank_files_and_flight_recorder_are_per_site_and_can_be_turned_off():
    on = render_for("dgx-h100")
    assert '"rank_output": true' in on
    assert 'export TORCH_FR_DUMP_TEMP_FILE="$gate_dir"/nccl-trace-rank-' in on
    assert "export TORCH_FR_BUFFER_SIZE=2000" in on and "export TORCH_NCCL_DUMP_ON_TIMEOUT=1" in on
    assert 'export TORCH_NCCL_DEBUG_INFO_PIPE_FILE="$gate_dir"/nccl-trace-pipe-rank-' in on
    off = render_for("dgx-h100", rank_output=False, flight_recorder_entries=0)
    assert '"rank_output": false' in off
    # PyTorch keeps 2000 entries when the variable is unset: off must be said
    assert [line for line in off.splitlines() if line.startswith("export TORCH_")] == [
        "export TORCH_FR_BUFFER_SIZE=0"]


def test_each_rank_gets_a_dump_pipe_that_job_show_does_not_take_for_a_dump():
    """PyTorch names the pipe <TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe (ProcessGroupNCCL.hpp,
    DumpPipe) and the dump <TEMP_FILE><rank>: the pipes must not match the dumps' prefix."""
    settings = {s.name: s for s in flight_recorder_environment(2000)}
    pipe = settings["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]
    assert pipe.in_gate_dir and pipe.value == FLIGHT_RECORDER_PIPE_PREFIX
    assert flight_recorder_pipe(12) == "nccl-trace-pipe-rank-12.pipe"
    assert not flight_recorder_pipe(0).startswith(FLIGHT_RECORDER_PREFIX)


# ---------------------------------------------------------------- a hung job on the dev cluster

# Every rank logs two steps; rank 1 never reaches step 2 (as if stuck before a collective).
# `exec`: no shell is left to print "Terminated" when the job is cancelled.
HANGING_PROGRAM = """#!/bin/sh
echo "started"
echo "step 1 done"
if [ "$RANK" = 1 ]; then exec sleep 600; fi
echo "step 2 done"
exec sleep 600
"""


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.25)


@pytest.mark.cluster
def test_job_show_points_at_the_rank_that_hung_here_and_over_ssh(devcluster, tmp_path):
    program = tmp_path / "hang.sh"
    program.write_text(HANGING_PROGRAM)
    program.chmod(0o755)
    staged = [write_replay(devcluster.node_bin_dir(node), "nvidia-smi", {"nvlink -s": HEALTHY_NVLINK})
              for node in devcluster.spec.node_names]
    try:
        # all 4 nodes must train and there is no spare: the fabric test judges the wire only on a
        # gross fault here, so a dev cluster sharing its cores with other work cannot fail the gate
        site = site_variant(tmp_path, "local-demo", {"gate.straggler_factor": 0.05})
        result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "4", "--", str(program))
        assert result.returncode == 0, result.stderr
        job_id = result.stdout.strip().splitlines()[-1]
        gate_dir = tmp_path / f"trainctl-gate-{job_id}"

        def all_ranks_stuck() -> bool:
            logs = sorted(gate_dir.glob("rank-*.out"))
            texts = [path.read_text() for path in logs]
            return (len(texts) == 4 and all("step 1 done" in text for text in texts)
                    and sum("step 2 done" in text for text in texts) == 3)
        wait_until(all_ranks_stuck, 180, "four rank logs, three past step 2")
        run_checked(["scancel", job_id], timeout=15, env=devcluster.client_env())
        wait_for_job(devcluster, job_id)
    finally:
        for script in staged:
            script.unlink()

    here = subprocess.run([TRAINCTL, "job", "show", job_id, "--lines", "2"], capture_output=True, text=True,
                          timeout=60, env=devcluster.client_env())
    assert here.returncode == 0, here.stderr
    lines = here.stdout.splitlines()
    assert lines[0] == f"job {job_id} (hang): gate directory {gate_dir}"
    assert lines[1].startswith("slurm: CANCELLED") and "attempts: 1" in lines[2]
    assert lines[3].startswith("gate: ok: 4 of 4 allocated nodes healthy, need 4; ran on node[1-4]")
    odd = next(i for i, line in enumerate(lines) if line.startswith("  rank 1 on node2 ("))
    assert lines[odd + 1:odd + 3] == ["    | started", "    | step 1 done"]
    rest = next(i for i, line in enumerate(lines) if line.startswith("  ranks 0,2-3 on node[1,3-4] ("))
    assert odd < rest and lines[rest + 1:rest + 3] == ["    | step 1 done", "    | step 2 done"]
    assert any(line.startswith("slurm in the rank logs: slurmstepd") and "CANCELLED" in line for line in lines)

    login = devcluster.start_sshd("node1")
    remote = subprocess.run([TRAINCTL, "job", "show", job_id, "--lines", "2", "--json", "--remote",
                             f"{login.user}@{login.host}", "--identity", login.key_path,
                             "--known-hosts", login.known_hosts_path], capture_output=True, text=True, timeout=60)
    assert remote.returncode == 0, remote.stderr
    data = json.loads(remote.stdout)
    assert [(g["ranks"], g["tail"]) for g in data["groups"]] == [
        ([1], ["started", "step 1 done"]), ([0, 2, 3], ["step 1 done", "step 2 done"])]
    assert data["decision"]["chosen"] == ["node1", "node2", "node3", "node4"]


def test_a_directory_in_a_files_place_reads_as_no_file_and_an_unreadable_file_is_one_error_line(tmp_path):
    (tmp_path / "decision.json").mkdir()
    assert LocalFiles().read(str(tmp_path / "decision.json"), 100) is None
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert LocalFiles().read(str(tmp_path / "loop"), 100) is None
    with pytest.raises(ExternalCommandError, match="cannot list"):
        LocalFiles().listdir(str(tmp_path / "loop"))


def test_job_show_follows_the_attempts_of_a_retried_job(tmp_path):
    """Attempt files as a job's supervisor writes them (tests/test_retry_cluster.py makes real ones)."""
    from trainctl.job.show import chain_lines, collect_chain

    first, second = tmp_path / "trainctl-gate-7", tmp_path / "trainctl-gate-8"
    first.mkdir()
    second.mkdir()
    retry = {"job_id": "7", "attempt": 1, "retries": 1, "previous_job": None, "excluded_before": [],
             "phase": "step", "status": 1, "retry": True, "reason": "a node was lost during training",
             "bad_nodes": {"node3": "Slurm state down*"}, "exclude": ["node3"], "successor": "8", "error": None}
    (first / "retry.json").write_text(json.dumps(retry))
    (second / "attempt.json").write_text(json.dumps({"job_id": "8", "attempt": 2, "retries": 1, "previous_job": "7",
                                                     "excluded": ["node3"]}))
    for gate_dir, job_id in ((first, "7"), (second, "8")):
        chain = collect_chain(LocalFiles(), str(gate_dir), job_id)
        assert [link["job_id"] for link in chain] == ["7", "8"]
    assert chain_lines(chain, "8") == [
        "submit --retries: 2 jobs, one per attempt, linked by job id:",
        "  job 7: attempt 1 of 2 (job 7): a node was lost during training (node3: Slurm state down*); "
        "submitted job 8 excluding node3",
        "  job 8 (this job): attempt 2: no retry recorded (still running, or it ended without one)"]
    assert chain_lines(collect_chain(LocalFiles(), str(tmp_path / "trainctl-gate-9"), "9"), "9") == []


def test_job_show_prints_the_chains_timeline_and_goodput_from_the_journals(tmp_path):
    from trainctl.job.show import collect_job, format_job, to_json

    first, second = tmp_path / "trainctl-gate-7", tmp_path / "trainctl-gate-8"
    first.mkdir()
    second.mkdir()
    (first / "retry.json").write_text(json.dumps({"job_id": "7", "attempt": 1, "retries": 1, "reason": "lost",
                                                  "phase": "step", "status": 1, "bad_nodes": {}, "exclude": [],
                                                  "successor": "8", "retry": True}))
    (second / "attempt.json").write_text(json.dumps({"job_id": "8", "attempt": 2, "retries": 1, "previous_job": "7",
                                                     "excluded": ["node3"]}))

    def journal(directory, events):
        (directory / "journal.jsonl").write_text("".join(json.dumps({"t": t, "event": e, **f}) + "\n"
                                                         for t, e, f in events) + "{torn")

    journal(first, [(100, "job_start", {"attempt": 1}), (100.5, "submitted", {"submitted_t": 90}),
                    (110, "training_start", {"nodes": "node[1-2]"}), (140, "checkpoint", {"checkpoint_t": 140}),
                    (150, "step_end", {"status": 1, "training_start_t": 110, "last_checkpoint_t": 140}),
                    (155, "job_end", {"status": 1})])
    journal(second, [(160, "job_start", {"attempt": 2}), (160.5, "submitted", {"submitted_t": 152}),
                     (170, "training_start", {}), (200, "step_end", {"status": 0, "training_start_t": 170}),
                     (200, "job_end", {"status": 0})])
    view = collect_job(LocalFiles(), "8", str(second), 5)
    text = format_job(view, 5, now=10_000)
    assert text.index("  +0:00:00 job 7: submitted to Slurm") < text.index("  +0:00:10 job 7: job started: attempt 1")
    assert "  +0:00:50 job 7: checkpoint seen" in text and "  +0:01:50 job 8: training step ended: status 0" in text
    # productive: 110-140 and 170-200 of 110 s; lost: queue 10+8, gate 10+10, restart 2, lost work 10
    assert "goodput: 54.5% (0:01:00 productive of 0:01:50 since the first submit)" in text
    assert "  lost: queue 0:00:18, gate 0:00:20, restart 0:00:02, lost work 0:00:10" in text
    data = to_json(view, 5, now=10_000)
    assert data["goodput"]["goodput"] == pytest.approx(60 / 110, abs=1e-4)
    assert [link["job_id"] for link in data["timeline"]] == ["7", "8"] and len(data["timeline"][1]["events"]) == 5


def test_a_restart_inside_the_allocation_shows_the_detection_its_evidence_and_counts_in_goodput(tmp_path):
    from trainctl.job.show import collect_job, format_job

    gate = tmp_path / "trainctl-gate-9"
    gate.mkdir()
    events = [(100, "job_start", {"attempt": 1}), (100.5, "submitted", {"submitted_t": 100}),
              (110, "training_start", {"nodes": "node[1-3]"}), (130, "checkpoint", {"checkpoint_t": 130}),
              (140, "detection", {"kind": "hung", "suspects": ["node2"],
                                  "evidence": "no rank finished a step for 30 s; the agent of node2 fell silent"}),
              (150, "step_end", {"status": 143, "cause": "ended by the watch (hung)", "training_start_t": 110,
                                 "last_checkpoint_t": 130}),
              (160, "confirmation", {"kind": "hung", "named": {"node2": "hung: the agent fell silent"}}),
              (170, "training_start", {"nodes": "node[1,3-4]", "restart": 1}),
              (200, "step_end", {"status": 0, "training_start_t": 170}), (200, "job_end", {"status": 0})]
    (gate / "journal.jsonl").write_text("".join(json.dumps({"t": t, "event": e, **f}) + "\n" for t, e, f in events))
    text = format_job(collect_job(LocalFiles(), "9", str(gate), 5), 5, now=10_000)
    assert "+0:00:40 job 9: watch: hung (node2): no rank finished a step for 30 s; the agent of node2 fell silent" in text
    assert "+0:01:00 job 9: watch: left out node2: hung: the agent fell silent" in text
    # productive: 110-130 (the 20 s after the checkpoint are lost work) and 170-200, of 100 s
    assert "goodput: 50.0% (0:00:50 productive of 0:01:40 since the first submit)" in text
    assert "restart 0:00:20, lost work 0:00:20" in text


def test_a_slowdown_named_by_its_links_shows_each_links_numbers_under_the_detection(tmp_path):
    from trainctl.job.show import collect_job, format_job

    gate = tmp_path / "trainctl-gate-9"
    gate.mkdir()
    links = [{"node": "node2", "link": "eth0", "source": "qdisc", "wait_per_mb": [54.8, 61.7],
              "sent_bytes_per_s": [5696037, 2859026]},
             {"node": "node3", "link": "mlx5_0:1", "source": "ib", "wait_per_mb": [12.0, 0.0],
              "sent_bytes_per_s": [5600000, 2800000]},
             {"node": "node4", "link": "eth0", "source": "qdisc", "wait_per_mb": "from another version"}]
    events = [(100, "job_start", {"attempt": 1}), (110, "training_start", {"nodes": "node[2-4]"}),
              (140, "detection", {"kind": "slow", "suspects": ["node2"], "evidence": "step time 0.965 s ...",
                                  "details": {"step_s": 0.965, "baseline_s": 0.512, "links": links}})]
    (gate / "journal.jsonl").write_text("".join(json.dumps({"t": t, "event": e, **f}) + "\n" for t, e, f in events))
    lines = format_job(collect_job(LocalFiles(), "9", str(gate), 5), 5, now=10_000).splitlines()
    at = next(i for i, line in enumerate(lines) if "watch: slow (node2)" in line)
    assert [line.strip() for line in lines[at + 1:at + 3]] == [
        "node2 eth0: held back (qdisc overlimits + requeues + drops) 61.7 per MB sent, 54.8 before; "
        "sent 2.86 MB/s, 5.7 before",
        "node3 mlx5_0:1: waited for credit (PortXmitWait ticks) 0 per MB sent, 12 before; sent 2.8 MB/s, 5.6 before"]
    assert "node4" not in lines[at + 3]
