"""Sweep plumbing without a cluster: which nodes are swept, the srun line, the node task's envelope."""

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from trainctl.proc import ProcResult
from trainctl.slurm import NodeState
from trainctl.sweep.collect import (NODE_PENDING_CAP, FabricVerdict, NodeCommand, Reassembler, gpu_request_args,
                                    outcome_from_envelope, srun_argv)
from trainctl.sweep.model import CHECKED, ERROR, NOT_SWEPT, TIMEOUT, CheckRow
from trainctl.sweep.node_task import PIECE_CHARS, emit, interpret
from trainctl.sweep.runner import FABRIC_CHECK, SweepResult, fabric_rows, select_idle

VERDICT = {"host": "node2", "status": "fail", "checks": [
    {"name": "ib.ports", "status": "fail", "reason": "mlx5_11/1 Down", "details": {"port": "mlx5_11/1"}},
    {"name": "host.memory", "status": "ok", "reason": "61 GiB available", "details": {}}]}
COMMAND = NodeCommand(python="/opt/py", site="local-demo", partition="gpu", only=("ib.ports", "host.memory"),
                      timeout_s=90)


def state(name, label, reason=""):
    base = label.rstrip("*")
    return NodeState(name, name, base, label[len(base):], reason, "root" if reason else "", "")


def test_only_idle_responding_nodes_are_swept_the_rest_recorded_with_their_state():
    states = {"node1": state("node1", "idle"), "node2": state("node2", "idle*"),
              "node3": state("node3", "drained", "bad DIMM"), "node4": state("node4", "allocated"),
              "node5": state("node5", "mixed")}
    selection = select_idle(states)
    assert selection.to_check == ["node1"]
    recorded = {n.host: n for n in selection.not_swept}
    assert set(recorded) == {"node2", "node3", "node4", "node5"}
    assert all(n.outcome == NOT_SWEPT for n in recorded.values())
    assert recorded["node4"].slurm_state == "allocated" and recorded["node2"].slurm_state == "idle*"
    assert recorded["node3"].detail == "Slurm state drained (bad DIMM)"


def test_srun_line_is_one_task_per_whole_node_and_never_kills_the_others():
    argv = srun_argv(["node1", "node2", "node4"], COMMAND, partition="gpu", extra=["--gpus-per-node=8"])
    assert argv[0] == "srun"
    assert "--nodelist=node[1-2,4]" in argv and "--nodes=3" in argv and "--ntasks-per-node=1" in argv
    assert "--exclusive" in argv and "--kill-on-bad-exit=0" in argv and "--partition=gpu" in argv
    assert argv[argv.index("/opt/py") - 1] == "--gpus-per-node=8"
    tail = argv[argv.index("/opt/py"):]
    assert tail == ["/opt/py", "-m", "trainctl.sweep.node_task", "--timeout", "90", "--site", "local-demo",
                    "--only", "ib.ports,host.memory", "--partition", "gpu"]
    assert gpu_request_args("gres", 8) == ["--gres=gpu:8"] and gpu_request_args("none", 8) == []


def test_envelope_with_a_verdict_becomes_a_checked_node():
    envelope = {"node": "node2", "job_id": "12", "outcome": "checked", "exit_code": 2, "duration_s": 1.5,
                "report": VERDICT, "detail": ""}
    node = outcome_from_envelope("node2", envelope, "idle")
    assert node.outcome == CHECKED and node.status == "fail" and node.duration_s == 1.5
    assert [(c.name, c.status) for c in node.checks] == [("ib.ports", "fail"), ("host.memory", "ok")]
    assert node.exit_code == 2


def test_envelopes_survive_srun_interleaving_their_short_pieces(capsys):
    """srun cuts lines at 1 KiB and mixes tasks' output: each piece is a whole short line."""
    rng = random.Random(1)   # incompressible reasons: an envelope of many pieces
    big = {**VERDICT, "checks": [{"name": f"c{i}", "status": "ok", "reason": f"{rng.getrandbits(128):x}"}
                                 for i in range(60)]}
    sent = {}
    for host in ("node1", "node2", "node3"):
        sent[host] = {"node": host, "outcome": "checked", "report": {**big, "host": host}}
        emit(host, 0, sent[host])
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) < 1000 for line in lines) and len(lines) > 3
    by_node = [[l for l in lines if f'"node": "{h}"' in l] for h in sent]
    mixed = [l for trio in zip(*by_node) for l in trio] + sum((group[len(by_node[-1]):] for group in by_node), [])
    pieces = Reassembler()
    got = [e for e in (pieces.feed(l) for l in ["srun: job 12 queued", *mixed, "{}"]) if e is not None]
    assert sorted(got, key=lambda e: e["node"]) == [sent[h] for h in sorted(sent)]
    assert PIECE_CHARS < 1000


def test_timeouts_and_errors_are_their_own_classes():
    timed_out = outcome_from_envelope("node3", {"node": "node3", "outcome": "timeout", "detail": "90 s"})
    assert timed_out.outcome == TIMEOUT and timed_out.status is None and timed_out.exit_code == 3
    broken = outcome_from_envelope("node3", {"node": "node3", "outcome": "checked", "report": "garbage"})
    assert broken.outcome == ERROR


@given(st.dictionaries(st.sampled_from(["node", "outcome", "report", "detail", "duration_s", "checks"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                                        st.sampled_from(["status", "checks", "name", "reason", "host"]), inner,
                                        max_size=4), max_leaves=12)))
def test_any_envelope_gives_an_outcome_never_a_crash(envelope):
    node = outcome_from_envelope("n1", envelope)
    assert node.host == "n1" and node.outcome in (CHECKED, TIMEOUT, ERROR)


def test_a_node_flooding_unfinished_pieces_loses_them_and_not_the_others(capsys):
    emit("node2", 0, {"node": "node2", "outcome": "timeout", "detail": "90 s"})
    honest = capsys.readouterr().out.splitlines()
    pieces = Reassembler()
    flood = ('{"node": "node1", "msg": %d, "part": 0, "parts": 2, "data": "%s"}' % (msg, "A" * 60000)
             for msg in range(1000))  # 60 MB of envelopes that never complete
    assert not any(pieces.feed(line) for line in flood)
    assert sum(map(len, pieces._pieces.values())) * 60000 <= NODE_PENDING_CAP
    assert [pieces.feed(line) for line in honest][-1]["node"] == "node2"


def test_stray_and_damaged_lines_are_not_envelopes():
    pieces = Reassembler()
    assert pieces.feed("srun: job 12 queued") is None
    assert pieces.feed("[1, 2]") is None
    assert pieces.feed('{"node": "n1", "msg": 0, "part": 0, "parts": 1, "data": "not base64!"}') is None
    assert pieces.feed('{"node": "n1", "msg": 0, "part": 3, "parts": 1, "data": ""}') is None


def proc(returncode, stdout="", stderr="", timed_out=False):
    return ProcResult(("/opt/py", "-m", "trainctl.cli", "health", "check", "--json"), returncode, stdout, stderr,
                      0.5, timed_out=timed_out, timeout_s=90)


def test_node_task_interprets_the_health_check_run():
    assert interpret(proc(2, json.dumps(VERDICT)), 90)["outcome"] == "checked"   # exit 2 is a verdict
    assert interpret(proc(None, timed_out=True), 90) == {
        "exit_code": None, "duration_s": 0.5, "outcome": "timeout", "report": None,
        "detail": "checks did not finish within 90 s"}
    crashed = interpret(proc(70, "", "Traceback ...\nKeyError: 'x'"), 90)
    assert crashed["outcome"] == "error" and crashed["detail"] == "`health check` exited with status 70: KeyError: 'x'"


def test_fabric_verdicts_become_a_check_per_node():
    verdict = FabricVerdict("checked", {"status": "fail", "nodes": {
        "node1": {"status": "ok", "reason": "busbw 2.1 GB/s", "intra_busbw_gbps": 9.0},
        "node2": {"status": "fail", "reason": "straggler: 0.3x peers' median"}},
        "excluded": [{"host": "node3", "reason": "did not join within 30 s"}]}, "")
    rows = fabric_rows(verdict, ["node1", "node2", "node3", "node4"])
    assert {h: r.status for h, r in rows.items()} == {"node1": "ok", "node2": "fail", "node3": "fail",
                                                      "node4": "unknown"}
    assert all(r.name == FABRIC_CHECK for r in rows.values())
    assert rows["node1"].details == {"intra_busbw_gbps": 9.0}


def test_sweep_exit_code_is_the_worst_node():
    from trainctl.sweep.model import NodeOutcome

    result = SweepResult(1, {"a": NodeOutcome("a", CHECKED, status="warn"),
                             "b": NodeOutcome("b", NOT_SWEPT, slurm_state="allocated")})
    assert result.exit_code == 1
    result.nodes["c"] = NodeOutcome("c", TIMEOUT)
    assert result.exit_code == 3
    # a failing node is the sweep's verdict even beside nodes that gave no verdict
    result.nodes["d"] = NodeOutcome("d", CHECKED, status="fail")
    assert result.exit_code == 2


def test_a_failing_check_outranks_an_unknown_one_on_the_node():
    from trainctl.sweep.model import NodeOutcome
    from trainctl.sweep.runner import with_check

    node = NodeOutcome("a", CHECKED, status="fail", checks=(CheckRow("ib.ports", "fail", "Down", {}),))
    node = with_check(node, CheckRow(FABRIC_CHECK, "unknown", "the fabric test reported nothing", {}))
    assert node.status == "fail" and node.exit_code == 2
