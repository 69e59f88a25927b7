"""The sweep writer: what arrives together is one transaction, the write lock is free while the
collector waits, and a sweep stopped half-way keeps everything that had arrived."""

import sqlite3
import time
from pathlib import Path

import pytest

from support.sweeps import outcome
from trainctl.sweep.db import History
from trainctl.sweep.runner import record_sweep

T0 = 1_700_000_000.0


def start(history: History) -> int:
    return history.start_sweep(kind="sweep", started_at=T0, site="test", via="slurm", target="gpu", checks="all")


def test_nodes_that_arrive_together_share_a_few_transactions(tmp_path, monkeypatch):
    calls = []
    real = History.record_nodes

    def counting(self, sweep_id, nodes, recorded_at):
        nodes = list(nodes)
        calls.append(len(nodes))
        real(self, sweep_id, nodes, recorded_at)

    monkeypatch.setattr(History, "record_nodes", counting)
    nodes = [outcome(f"gpu{i:04d}", "ok") for i in range(600)]
    with History.open(tmp_path / "h.db", write=True) as history:
        sweep_id = start(history)
        result = record_sweep(history, sweep_id=sweep_id, not_swept=[outcome("gpu9999", "allocated")],
                              outcomes=nodes, progress=lambda _: None, batch_max=200)
        assert len(history.sweep_nodes(sweep_id)) == 601
        assert len(history.sweep_results(sweep_id)) == 600 * 3
    assert len(result.nodes) == 601
    assert sum(calls) == 601 and max(calls) <= 200
    assert len(calls) < 20, calls      # one commit per node was 601


def test_a_node_is_committed_and_the_lock_free_while_the_collector_waits(tmp_path):
    path = tmp_path / "h.db"
    seen_while_waiting = []

    def slow_collector():
        yield outcome("gpu1", "ok")
        # The collector now waits on the next node: gpu1 must be on disk, and another writer
        # must get the write lock at once (timeout 0: no waiting on the sweep).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with History.open(path) as reader:
                if reader.sweep_nodes(sweep_id):
                    break
            time.sleep(0.01)
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
        other.close()
        with History.open(path) as reader:
            seen_while_waiting.extend(n.host for n in reader.sweep_nodes(sweep_id))
        yield outcome("gpu2", "fail")

    with History.open(path, write=True) as history:
        sweep_id = start(history)
        result = record_sweep(history, sweep_id=sweep_id, not_swept=[], outcomes=slow_collector(),
                              progress=lambda _: None)
    assert seen_while_waiting == ["gpu1"]
    assert sorted(result.nodes) == ["gpu1", "gpu2"] and result.exit_code == 2


def test_a_collector_that_breaks_keeps_what_arrived_and_the_sweep_says_why(tmp_path):
    def breaking():
        yield outcome("gpu1", "ok")
        yield outcome("gpu2", "warn")
        raise RuntimeError("srun lost its allocation")

    with History.open(tmp_path / "h.db", write=True) as history:
        sweep_id = start(history)
        with pytest.raises(RuntimeError):
            record_sweep(history, sweep_id=sweep_id, not_swept=[], outcomes=breaking(), progress=lambda _: None)
        assert [n.host for n in history.sweep_nodes(sweep_id)] == ["gpu1", "gpu2"]
        assert history.sweeps()[-1].error == "srun lost its allocation"


def test_ctrl_c_in_the_collector_still_writes_what_had_arrived(tmp_path):
    def interrupted():
        for i in range(50):
            yield outcome(f"gpu{i:02d}", "ok")
        raise KeyboardInterrupt

    with History.open(tmp_path / "h.db", write=True) as history:
        sweep_id = start(history)
        with pytest.raises(KeyboardInterrupt):
            record_sweep(history, sweep_id=sweep_id, not_swept=[], outcomes=interrupted(), progress=lambda _: None)
        assert len(history.sweep_nodes(sweep_id)) == 50
        assert history.sweeps()[-1].finished_at is None       # shown as incomplete, as before


def test_a_failed_write_stops_the_sweep_with_that_error(tmp_path, monkeypatch):
    def refuse(self, sweep_id, nodes, recorded_at):
        raise sqlite3.OperationalError("database or disk is full")

    with History.open(tmp_path / "h.db", write=True) as history:
        sweep_id = start(history)
        monkeypatch.setattr(History, "record_nodes", refuse)
        with pytest.raises(sqlite3.OperationalError):
            record_sweep(history, sweep_id=sweep_id, not_swept=[],
                         outcomes=(outcome(f"gpu{i}", "ok") for i in range(10)), progress=lambda _: None)
        monkeypatch.undo()
        assert history.sweeps()[-1].error == "database or disk is full"


# ---------------------------------------------------------------- retention ([sweep] keep_days)

def page_count(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA page_count").fetchone()[0]
    finally:
        conn.close()


def sweep_of(history: History, started_at: float, hosts: int = 300, status: str = "ok") -> int:
    sweep_id = history.start_sweep(kind="sweep", started_at=started_at, site="test", via="slurm", target="gpu",
                                   checks="all")
    history.record_nodes(sweep_id, [outcome(f"gpu{i:04d}", status) for i in range(hosts)], started_at + 1)
    history.finish_sweep(sweep_id, started_at + 60)
    return sweep_id


def test_prune_removes_old_sweeps_with_their_rows_but_not_a_held_drains_sweep(tmp_path):
    day = 86400.0
    with History.open(tmp_path / "h.db", write=True) as history:
        held = sweep_of(history, T0 - 10 * day, hosts=3, status="fail")
        let_go = sweep_of(history, T0 - 9 * day, hosts=3, status="fail")
        old = sweep_of(history, T0 - 5 * day, hosts=3)
        kept = sweep_of(history, T0 - 1 * day, hosts=3)
        history.record_drain(host="gpu0001", reason="trainctl: x", reason_time="", sweep_id=held, check="ib.ports",
                             drained_at=T0 - 10 * day)
        history.record_drain(host="gpu0002", reason="trainctl: x", reason_time="", sweep_id=let_go,
                             check="ib.ports", drained_at=T0 - 9 * day)
        history.close_drain(history.drains()[-1].id, T0 - 8 * day, "resumed")

        assert history.prune(T0 - 3 * day) == 2
        assert [s.id for s in history.sweeps()] == [held, kept]
        assert history.sweep_nodes(old) == [] and history.sweep_results(old) == []
        assert history.sweep_results(let_go) == []
        assert len(history.sweep_results(held)) == 3 * 3 and len(history.sweep_results(kept)) == 3 * 3
        assert [d.host for d in history.drains()] == ["gpu0001"]      # the closed old drain went too
        assert history.prune(T0 - 3 * day) == 0


def test_with_retention_the_file_stops_growing_and_vacuum_gives_the_space_back(tmp_path):
    day, keep = 86400.0, 2
    path = tmp_path / "h.db"
    sizes = []
    with History.open(path, write=True) as history:
        for number in range(8):
            now = T0 + number * day
            sweep_of(history, now)
            history.prune(now - keep * day + 1)       # what `trainctl sweep` does with keep_days = 2
            sizes.append(page_count(path))
        assert len(history.sweeps()) == keep
        grown_by = sizes[-1] / sizes[keep]
        assert grown_by < 1.2, sizes                   # freed pages are reused: no growth after `keep` sweeps
        history.prune(T0 + 8 * day)                    # everything
        before = page_count(path)
        history.vacuum()
        assert page_count(path) < before / 3


def test_keep_days_is_a_site_key_with_bounds(tmp_path):
    from trainctl.errors import ConfigError
    from trainctl.site import load_site

    demo = (Path(__file__).resolve().parents[1] / "site-configs" / "local-demo.toml").read_text()
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(demo + "\n[sweep]\nkeep_days = 90\n" if "[sweep]" not in demo else
                    demo.replace("[sweep]", "[sweep]\nkeep_days = 90", 1))
    bad.write_text(good.read_text().replace("keep_days = 90", "keep_days = -1"))
    assert load_site(str(good)).config.sweep.keep_days == 90
    with pytest.raises(ConfigError, match="keep_days"):
        load_site(str(bad))
