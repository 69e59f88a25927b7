"""The per-GPU compute test: judging figures against the job's peers (pure), and measuring for real
on this machine's CPU (the GPU path runs when a GPU machine is lent; see the README's figures)."""

import json
import subprocess
import sys
import time
from pathlib import Path

from trainctl.site import GateConfig
from trainctl.job.gate_compute import ComputePolicy, judge_gate_dir, run_for_gate
from trainctl.job.jobdir import JobPaths
from trainctl.health.compute.judge import (FAILED, NOT_JUDGED, OK, SLOW, GpuFigures, figures_from_report,
                                           judge, node_reasons)
from trainctl.job.gate import decide, format_report

H100 = "NVIDIA H100 80GB HBM3"
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))


def dgx(host, tflops=700.0, copy=2600.0, slow=None):
    """One 8-GPU node's figures; `slow` = {index: (tflops, copy)}."""
    slow = slow or {}
    return [GpuFigures(host, i, H100, *slow.get(i, (tflops + i, copy - i))) for i in range(8)]


def by_key(verdicts):
    return {(v.figures.host, v.figures.index): v for v in verdicts}


def test_one_throttled_gpu_among_sixteen_is_slow_and_named_with_its_ratio():
    verdicts = by_key(judge(dgx("node1") + dgx("node2", slow={5: (546.0, 2590.0)})))
    slow = verdicts[("node2", 5)]
    assert slow.status == SLOW
    assert slow.reason.startswith(f"GPU 5 ({H100}): matmul 546 TFLOPS, 0.78x the job's median")
    assert [key for key, v in verdicts.items() if v.status != OK] == [("node2", 5)]
    assert node_reasons(verdicts.values()) == {"node2": [f"compute fail-slow: {slow.reason}"]}


def test_slow_memory_copy_alone_is_found():
    verdicts = by_key(judge(dgx("node1", slow={2: (701.0, 1500.0)})))
    assert verdicts[("node1", 2)].status == SLOW
    assert "copy 1500 GB/s, 0.58x" in verdicts[("node1", 2)].reason


def test_a_slow_minority_cannot_drag_the_reference_down():
    # two of four CPU-only nodes at half speed: the median stays between, both are below 0.8x
    figures = [GpuFigures(f"node{i}", -1, "cpu", t, c) for i, (t, c) in
               enumerate([(0.10, 30.0), (0.05, 15.0), (0.05, 14.0), (0.11, 31.0)], start=1)]
    slow = {v.figures.host for v in judge(figures) if v.status == SLOW}
    assert slow == {"node2", "node3"}


def test_with_one_slow_node_in_four_a_healthy_node_falls_only_below_half_the_next_healthy_one():
    # The reference is the mean of the two middle figures: the slowest healthy node's own and the
    # next one's. At factor 0.65 a healthy node is slow only under 0.65 / (2 - 0.65) = 0.48x the
    # next healthy node: 0.144 against 0.186 TFLOPS (0.77x) is no fail-slow, 0.085 against 0.186 is.
    def slow_hosts(node1_tflops: float) -> set[str]:
        figures = [GpuFigures(host, -1, "cpu", t, 30.0) for host, t in
                   (("node1", node1_tflops), ("node2", 0.19), ("node3", 0.04), ("node4", 0.186))]
        return {v.figures.host for v in judge(figures, factor=0.65) if v.status == SLOW}

    assert slow_hosts(0.144) == {"node3"}
    assert slow_hosts(0.085) == {"node1", "node3"}


def test_noise_within_the_factor_is_ok():
    figures = [GpuFigures(f"node{i}", -1, "cpu", t, 30.0) for i, t in enumerate([0.10, 0.09, 0.085, 0.11], 1)]
    assert {v.status for v in judge(figures)} == {OK}


def test_two_nodes_without_a_floor_are_not_judged_and_a_floor_judges_them():
    figures = [GpuFigures("node1", -1, "cpu", 0.10, 30.0), GpuFigures("node2", -1, "cpu", 0.02, 30.0)]
    verdicts = judge(figures)
    assert {v.status for v in verdicts} == {NOT_JUDGED}
    assert verdicts[0].reason == "CPU: not judged: 2 of this model in the job (need 3) and no site floor"
    floored = by_key(judge(figures, floor_tflops=0.05))
    assert floored[("node2", -1)].status == SLOW and "under the site's floor 0.05" in floored[("node2", -1)].reason
    assert floored[("node1", -1)].status == OK


def test_models_are_judged_apart():
    a100 = [GpuFigures("node3", i, "NVIDIA A100-SXM4-80GB", 250.0, 1700.0) for i in range(8)]
    assert {v.status for v in judge(dgx("node1") + a100)} == {OK}


def test_a_gpu_that_could_not_be_measured_fails_and_unreadable_figures_fail():
    report = {"devices": [{"index": 0, "name": H100, "tflops": 0, "copy_gbps": 0, "error": "CUDA error: ECC"},
                          {"index": "x"}]}
    figures = figures_from_report("node1", report)
    verdicts = judge(figures)
    assert [v.status for v in verdicts] == [FAILED, FAILED]
    assert verdicts[0].reason == f"GPU 0 ({H100}): could not be measured: CUDA error: ECC"
    assert "unreadable compute figures" in verdicts[1].reason


def test_measuring_this_cpu_gives_figures_and_the_gate_writes_and_judges_them(tmp_path):
    report = run_for_gate(JobPaths(tmp_path), "node1", rank=0, world=1, budget_s=0.3, in_turns=True)
    (device,) = report["devices"]
    assert device["error"] == "" and device["tflops"] > 0 and device["copy_gbps"] > 0
    assert device["matmul_iters"] >= 3 and device["copy_iters"] >= 3
    assert (tmp_path / "compute" / ".turn-0").exists()
    stored = json.loads((tmp_path / "compute" / "node1.json").read_text())
    assert stored["devices"] == report["devices"]
    for host, scale in (("node2", 1.0), ("node3", 0.4), ("node4", 1.0)):
        copy = dict(stored, host=host, devices=[dict(device, tflops=device["tflops"] * scale)])
        (tmp_path / "compute" / f"{host}.json").write_text(json.dumps(copy))
    verdicts, reasons = judge_gate_dir(JobPaths(tmp_path), ComputePolicy.from_gate(GateConfig()))
    assert set(reasons) == {"node3"} and reasons["node3"][0].startswith("compute fail-slow: CPU: matmul")
    healthy = {h: {"host": h, "status": "ok", "checks": []} for h in ("node1", "node2", "node3", "node4")}
    # without a fabric report node1 (its coordinator) is left out too
    decision = decide(list(healthy), healthy, None, 2, 2, compute_reasons=reasons)
    assert decision.chosen == ("node2", "node4")
    assert [str(r) for e in decision.excluded if e.host == "node3" for r in e.reasons] == reasons["node3"]
    text = format_report(decision, None, verdicts)
    assert "node3        CPU                          slow" in text


def test_a_node_not_ready_when_the_turns_start_gets_no_turn_and_delays_no_one(tmp_path, monkeypatch):
    import trainctl.job.gate_compute as gate_step

    monkeypatch.setattr(gate_step, "turn_limit_s", lambda budget_s: 0.3)
    (tmp_path / "compute").mkdir()
    (tmp_path / "compute" / ".ready-1").touch()   # node 1 finished its checks; node 2 never will
    (tmp_path / "compute" / ".turn-1").touch()    # and node 1 has measured by the time node 0 is done
    started = time.monotonic()
    report = run_for_gate(JobPaths(tmp_path), "node0", rank=0, world=3, budget_s=0.1, in_turns=True)
    assert json.loads((tmp_path / "compute" / ".order").read_text()) == [0, 1]
    assert 0.3 <= report["waited_s"] < 5          # slot 0: waiting for node 2's checks, once
    # the last turn is node 1's, already taken: node 0 does not wait out node 2's slot
    assert time.monotonic() - started < report["waited_s"] + report["seconds"] + 0.6


def test_without_node_0s_order_the_others_go_in_rank_order_and_a_missing_turn_is_skipped(tmp_path, monkeypatch):
    import trainctl.job.gate_compute as gate_step

    monkeypatch.setattr(gate_step, "turn_limit_s", lambda budget_s: 0.2)
    monkeypatch.setattr(gate_step, "ORDER_GRACE_S", 0.3)
    report = run_for_gate(JobPaths(tmp_path), "node2", rank=2, world=3, budget_s=0.1, in_turns=True)
    assert 0.5 <= report["waited_s"] < 5          # slot 0 and the grace for node 0's order; node 1's turn skipped
    assert (tmp_path / "compute" / ".turn-2").exists()


def test_cli_compute_prints_json():
    result = subprocess.run([TRAINCTL, "health", "compute", "--budget", "0.2", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["devices"][0]["name"] == "cpu" and data["devices"][0]["tflops"] > 0



def test_cpu_figure_is_the_fastest_chunk_and_each_chunk_spans_two_cfs_periods(monkeypatch):
    # someone else's load slows two of the three timed chunks 3x: on the shared CPU that is not
    # this node's speed, so the figure is the fast chunk (the median would be the slow one)
    import torch

    from trainctl.health.compute import measure

    timers_entered = []

    class CountingTimer(measure._Timer):
        def __enter__(self):
            timers_entered.append(self)
            return super().__enter__()

    def step():  # the first product, the warm-up and chunk 1 run fast, chunks 2 and 3 slow
        time.sleep(0.03 if len(timers_entered) > 3 else 0.01)

    monkeypatch.setattr(measure, "_Timer", CountingTimer)
    budget = 0.8  # 0.6 s timed: three chunks of 0.2 s
    per_step, steps = measure._timed_loop(torch.device("cpu"), step, budget)
    chunks = len(timers_entered) - 2
    assert chunks == int(budget * (1 - measure.WARMUP_SHARE) / measure.CPU_MIN_CHUNK_S) == 3
    assert per_step < 0.02, per_step  # the fast chunk's 10 ms, not the slow chunks' 30 ms
