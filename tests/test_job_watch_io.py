"""The supervisor's side of the watch's files (trainctl.job.watch_io), on a real directory."""

from __future__ import annotations

import json
from pathlib import Path

from trainctl.job.watch import NodeReading, RankProgress
from trainctl.job.watch_io import archive_gate_round, prepare_watch_dir, read_node_files


def node_file(node: str, t: float) -> str:
    return json.dumps({"format": 1, "node": node, "t": t, "started_t": 0,
                       "ranks": {"0": {"pid": 9, "steps": 4, "step_seconds": 1.0, "last_step_t": t}},
                       "checks": {"t": None, "runs": 0, "failed": []}})


def test_node_files_read_back_and_a_torn_or_misnamed_one_reads_as_none(tmp_path):
    watch = prepare_watch_dir(str(tmp_path))
    (tmp_path / "watch" / "node1.json").write_text(node_file("node1", 5.0))
    (tmp_path / "watch" / "node2.json").write_text(node_file("node2", 5.0)[:40])
    (tmp_path / "watch" / "node3.json").write_text(node_file("node9", 5.0))
    readings = read_node_files(str(tmp_path), ("node1", "node2", "node3", "node4"))
    assert readings == {"node1": NodeReading("node1", 5.0, (RankProgress(0, 4, 1.0, 5.0, 9),)),
                        "node2": None, "node3": None, "node4": None}
    assert watch == str(tmp_path / "watch")


def test_a_gate_round_and_the_watchs_evidence_move_aside_before_the_gate_runs_again(tmp_path):
    prepare_watch_dir(str(tmp_path))
    for name in ("decision.json", "report.txt", "fabric.json", "node-node1.log", "watch/node1.json",
                 "watch/stacks-node2.txt", "nodes/node1.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / "journal.jsonl").write_text("kept")
    archived = archive_gate_round(str(tmp_path), 1)
    assert archived == str(tmp_path / "rounds" / "1")
    for name in ("decision.json", "report.txt", "fabric.json", "node-node1.log", "watch/node1.json",
                 "watch/stacks-node2.txt", "nodes/node1.json"):
        assert (tmp_path / "rounds" / "1" / name).read_text() == name
        assert not (tmp_path / name).exists()
    assert (tmp_path / "journal.jsonl").read_text() == "kept"
    prepare_watch_dir(str(tmp_path))          # the next training step starts with an empty watch/
    assert list((tmp_path / "watch").iterdir()) == []


def test_a_poll_that_costs_more_than_its_share_of_poll_s_spaces_the_next_one():
    from trainctl.job.driver import WATCH_SHARE, poll_wait_s
    from trainctl.site import WatchConfig

    config = WatchConfig()
    assert poll_wait_s(config.poll_s, 0.0) == config.poll_s
    # a large job's poll
    assert poll_wait_s(config.poll_s, config.poll_s * WATCH_SHARE * 4) == config.poll_s * 4


def test_what_the_last_steps_ranks_said_of_themselves_is_cleared_for_the_next_step(tmp_path):
    watch = Path(prepare_watch_dir(str(tmp_path)))
    (watch / "checkpoint-signal-refused").write_text("rank 0: SIGUSR1 has its default action\n")
    (watch / "checkpoint-listening").touch()
    (watch / "checkpoint-request").write_text("token\n")   # the supervisor's own: kept, ranks compare tokens
    prepare_watch_dir(str(tmp_path))                        # the next training step (a restart)
    assert sorted(path.name for path in watch.iterdir()) == ["checkpoint-request"]
