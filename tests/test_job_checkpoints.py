"""Checkpoints seen without code: the program's own files (submit --checkpoints, the site's
launch.checkpoints), $TRAINCTL_CHECKPOINT_FILE and progress.checkpoint(), through one rule
(`checkpoint_seen`), and the goodput that follows for a program that knows nothing of trainctl.
File times are set with os.utime: no test here waits for a clock."""

from __future__ import annotations

import itertools
import math
import os

import pytest

from trainctl.job import jobdir
from trainctl.job.goodput import goodput
from trainctl.job.jobdir import (Checkpoints, JobPaths, Journal, Kind, NodeReading, RankProgress, Save,
                                 checkpoint_seen, file_saves, newest_inside, rank_saves, read_journal)
from test_hostile_jobdir import finishes


def test_the_newest_save_after_the_step_start_and_after_the_last_one_seen_wins_whatever_its_source():
    saves = [Save(90.0, "snapshot.pt"), Save(120.0, "progress.checkpoint()", "step 5"), Save(110.0, "checkpoint.seen")]
    assert checkpoint_seen(None, 100.0, saves) == Save(120.0, "progress.checkpoint()", "step 5")
    assert checkpoint_seen(120.0, 100.0, saves) is None                # nothing newer
    assert checkpoint_seen(None, 130.0, saves) is None                 # all before the step started
    assert checkpoint_seen(None, 100.0, []) is None


def write(path, mtime, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_the_programs_files_count_by_mtime_regular_files_only_and_a_fifo_is_never_opened(tmp_path):
    write(tmp_path / "ckpt" / "epoch1.pt", 100.0)
    write(tmp_path / "ckpt" / "epoch2.pt", 200.0)
    (tmp_path / "ckpt" / "epoch9.pt").mkdir()                          # an empty directory: no save
    os.mkfifo(tmp_path / "ckpt" / "epoch8.pt")                         # stat only: never blocks
    write(tmp_path / "snapshot.pt", 150.0)
    assert file_saves(["ckpt/*.pt", "snapshot.pt", "missing.pt"], tmp_path) == ([
        Save(200.0, "ckpt/*.pt", "ckpt/epoch2.pt"), Save(150.0, "snapshot.pt", "snapshot.pt")], {})


def test_the_newest_save_is_seen_however_many_names_a_pattern_matches(tmp_path):
    """Every name is looked at: the newest is found even where the directory lists it last, past
    the first ten thousand (which a glob cut at that many names never reached)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for n in range(12_000):
        (folder / f"step{n}.ckpt").touch()
    listed = [entry.path for entry in os.scandir(folder)]        # the order a listing gives them
    stamp(*listed, mtime=100.0)
    stamp(listed[-1], mtime=500.0)
    assert file_saves(["ckpt/*.ckpt"], tmp_path) == ([Save(500.0, "ckpt/*.ckpt", os.path.relpath(listed[-1], tmp_path))],
                                                     {})


def test_a_poll_takes_one_slice_of_a_large_pattern_and_reports_a_save_only_after_a_whole_pass(tmp_path):
    """A pattern over a large tree (`/*/*/*/*.pt` from the submit directory's point of view) costs
    each poll its slice (here none: one name a poll), and the next poll goes on from there."""
    tree = tmp_path / "tree"
    for a, b in itertools.product(range(6), range(6)):
        (tree / f"d{a}" / f"e{b}").mkdir(parents=True)
    write(tree / "d5" / "e5" / "model.pt", 300.0)
    names = 6 + 6 * 6 + 1                                               # the d folders, the e folders, the file
    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.root.mkdir()
    seen = Checkpoints(paths, ("*/*/*.pt",), tree, since=100.0, slice_s=0.0)
    journal = Journal(paths.journal)
    polls = [seen.poll() for _ in range(2 * names)]
    reported = [n for n, save in enumerate(polls) if save is not None]
    assert reported == [names] and polls[names] == Save(300.0, "*/*/*.pt", "d5/e5/model.pt")


def test_the_patterns_time_counts_in_the_watchs_poll_cost(tmp_path):
    """The driver spaces its polls by what a poll cost (WATCH_SHARE): the checkpoint patterns' time included."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from trainctl.job import machine
    from trainctl.job.driver import JobDriver
    from trainctl.site import WatchConfig

    for n in range(2_000):
        (tmp_path / f"step{n}.pt").touch()
    driver = JobDriver.__new__(JobDriver)                               # no Slurm: the wait and the poll only
    driver.paths = JobPaths(tmp_path / "trainctl-gate-9")
    driver.paths.root.mkdir()
    driver.gate_dir, driver.journal, driver.readings = str(driver.paths.root), Journal(driver.paths.journal), {}
    driver.policy = SimpleNamespace(watch=WatchConfig(poll_s=0.01))
    driver.state, driver.poll_cost_s = machine.JobState(), 0.0
    driver.checkpoints = Checkpoints(driver.paths, ("*.pt",), tmp_path, since=0.0, slice_s=float("inf"))
    driver.step = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert isinstance(driver._wait_step(machine.WaitStep(poll=True)), machine.Polled)
    finally:
        driver.step.kill()
        driver.step.wait()
    assert driver.checkpoints.cost_s > 0 and driver.poll_cost_s >= driver.checkpoints.cost_s


def stamp(*paths, mtime):
    for path in paths:
        os.utime(path, (mtime, mtime), follow_symlinks=False)


def saves_seen(tmp_path, pattern, poll_s=jobdir.DIRECTORY_QUIET_S):
    """A training step's Checkpoints for `pattern` under tmp_path, started at t=100, polled every
    `poll_s` seconds of its clock (each poll a whole pass), and its journal."""
    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.root.mkdir(exist_ok=True)
    ticks = itertools.count(0.0, poll_s)
    return (Checkpoints(paths, (pattern,), tmp_path, since=100.0, clock=lambda: next(ticks), slice_s=math.inf),
            Journal(paths.journal, clock=lambda: 1000.0))


def test_a_directory_is_a_save_once_its_newest_time_held_for_a_poll(tmp_path):
    """Transformers' checkpoint-N/: a save when its writing has ended, at the newest time inside it."""
    first = tmp_path / "out" / "checkpoint-100"
    write(first / "model.safetensors", 200.0)
    write(first / "optimizer.pt", 210.0)
    stamp(first, mtime=205.0)
    seen, journal = saves_seen(tmp_path, "out/checkpoint-*")
    assert seen.poll() is None                                  # first sight: it may still be written
    assert seen.poll() == Save(210.0, "out/checkpoint-*", "out/checkpoint-100")
    second = tmp_path / "out" / "checkpoint-200"
    write(second / "model.safetensors", 300.0)                         # being written: newer each poll
    stamp(second, mtime=300.0)
    assert seen.poll() is None
    write(second / "optimizer.pt", 310.0)
    stamp(second, mtime=310.0)
    assert seen.poll() is None
    assert seen.poll() == Save(310.0, "out/checkpoint-*", "out/checkpoint-200") and seen.poll() is None


def test_a_nested_checkpoint_counts_by_its_newest_file_and_a_renamed_one_by_its_folder(tmp_path):
    """Megatron's iter_N/mp_rank_00/...: the file's time; a file renamed into place: its folder's."""
    rank_file = tmp_path / "ckpt" / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt"
    write(rank_file, 400.0)
    stamp(rank_file.parent, rank_file.parent.parent, mtime=150.0)
    seen, journal = saves_seen(tmp_path, "ckpt/iter_*")
    assert seen.poll() is None and seen.poll().t == 400.0
    stamp(rank_file.parent, mtime=450.0)                               # a rename inside changes only the folder
    assert seen.poll() is None and seen.poll().t == 450.0


def test_a_directory_held_for_less_than_the_quiet_time_is_not_a_save_yet(tmp_path):
    """The supervisor polls every 0.2 s while it waits for a save it asked for: a writer's pause
    that short does not end a save."""
    write(tmp_path / "state" / "step-7" / "model.pt", 700.0)
    stamp(tmp_path / "state" / "step-7", mtime=690.0)
    seen, journal = saves_seen(tmp_path, "state/*", poll_s=0.2)
    polls = [seen.poll() for _ in range(round(jobdir.DIRECTORY_QUIET_S / 0.2) + 1)]
    assert polls[:-1] == [None] * (len(polls) - 1) and polls[-1].t == 700.0


def test_an_empty_directory_or_one_of_empty_folders_is_never_a_save(tmp_path):
    (tmp_path / "state" / "empty").mkdir(parents=True)
    (tmp_path / "state" / "folders" / "a" / "b").mkdir(parents=True)
    seen, journal = saves_seen(tmp_path, "state/*")
    assert [seen.poll() for _ in range(3)] == [None, None, None]


def test_links_inside_a_checkpoint_are_not_followed_and_a_fifo_is_never_opened(tmp_path):
    folder = tmp_path / "ckpt" / "step-5"
    write(folder / "weights.pt", 500.0)
    (folder / "loop").symlink_to(".")                                  # a walk that followed it would not end
    (folder / "up").symlink_to("..")
    (folder / "elsewhere").symlink_to("/")
    os.mkfifo(folder / "pipe")                                         # lstat only: opening it would block
    (tmp_path / "ckpt" / "a").symlink_to("b")                          # a loop of links matched by the glob
    (tmp_path / "ckpt" / "b").symlink_to("a")
    stamp(folder / "loop", folder / "up", folder / "elsewhere", folder / "pipe", folder, mtime=120.0)
    saves, directories = finishes(file_saves, ["ckpt/*"], tmp_path, {}, 0.0)
    assert saves == [] and directories == {str(folder): (500.0, 0.0)}
    saves, _ = finishes(file_saves, ["ckpt/*"], tmp_path, directories, jobdir.DIRECTORY_QUIET_S)
    assert saves == [Save(500.0, "ckpt/*", "ckpt/step-5")]


def test_a_walk_is_bounded_in_depth_and_in_entries(tmp_path):
    top = tmp_path / "deep"
    write(top / "shallow.pt", 100.0)
    bottom = top.joinpath(*["d"] * (jobdir.MAX_WALK_DEPTH + 4))
    write(bottom / "too-deep.pt", 900.0)                               # below the bound: never looked at
    folders = [bottom, *bottom.parents]
    stamp(*folders[:folders.index(tmp_path)], mtime=50.0)
    newest, looked = finishes(newest_inside, str(top), jobdir.MAX_WALK_ENTRIES)
    assert newest == 100.0 and looked <= jobdir.MAX_WALK_DEPTH + 1
    many = tmp_path / "many"
    for n in range(50):
        write(many / f"shard-{n}.distcp", 100.0 + n)
    newest, looked = newest_inside(str(many), 10)
    assert looked == 10 and newest is not None


def test_progress_checkpoint_reaches_the_supervisor_through_the_node_files():
    readings = [NodeReading("node1", 10.0, (RankProgress(0, steps=50, step_seconds=1.0, checkpoint_step=50,
                                                         checkpoint_t=9.0), RankProgress(1, steps=50, step_seconds=1.0))),
                None]
    assert rank_saves(readings) == [Save(9.0, "progress.checkpoint()", "step 50")]


def test_a_save_seen_with_no_code_reaches_the_supervisor_with_its_path(tmp_path):
    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.root.mkdir()
    seen = Checkpoints(paths, (), tmp_path, since=100.0)
    node = NodeReading("node1", 300.0, (RankProgress(0, save_t=280.0, save_api="torch.distributed.checkpoint",
                                                     save_path="/ckpt/step_40"),))
    assert rank_saves([node]) == [Save(280.0, "torch.distributed.checkpoint", "/ckpt/step_40")]
    assert seen.poll([node]) == Save(280.0, "torch.distributed.checkpoint", "/ckpt/step_40")
    assert seen.poll([node]) is None                                     # once
    assert not paths.journal.exists()                                    # the machine journals it


def test_each_new_save_is_seen_once_with_where_it_was_seen(tmp_path):
    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.root.mkdir()
    seen = Checkpoints(paths, ("snapshot.pt",), tmp_path, since=100.0, slice_s=math.inf)
    write(tmp_path / "snapshot.pt", 90.0)                              # the last run's: not this step's
    assert seen.poll() is None
    write(tmp_path / "snapshot.pt", 200.0)
    assert seen.poll() == Save(200.0, "snapshot.pt", "snapshot.pt") and seen.poll() is None
    write(paths.checkpoint_marker, 250.0, "step 40\x1b[2J\n")
    node = NodeReading("node1", 300.0, (RankProgress(0, checkpoint_step=60, checkpoint_t=260.0),))
    assert seen.poll([node]).source == "progress.checkpoint()" and seen.last == 260.0


@pytest.mark.parametrize("saved_at, lost", [(None, 100.0), (150.0, 50.0)])
def test_an_unmodified_programs_own_snapshot_makes_its_lost_work_right(tmp_path, saved_at, lost):
    """A program that keeps its own snapshot.pt and knows nothing of trainctl: a failed step loses
    only the work after its last snapshot (before: all of it)."""
    paths = JobPaths(tmp_path / "trainctl-gate-9")
    paths.root.mkdir()
    times = iter([0.0, 100.0, 200.0, 200.0, 201.0])
    journal = Journal(paths.journal, clock=lambda: next(times))
    journal.add(Kind.JOB_START)
    started = journal.add(Kind.TRAINING_START)["t"]
    seen = Checkpoints(paths, ("snapshot.pt",), tmp_path, since=started, slice_s=math.inf)
    if saved_at is not None:
        write(tmp_path / "snapshot.pt", saved_at)
    seen.poll()
    journal.add(Kind.STEP_END, status=1, training_start_t=started, last_checkpoint_t=seen.last)
    journal.add(Kind.JOB_END, status=1)
    result = goodput([read_journal(paths.journal)], now=1000.0)
    assert result.lost_s["lost_work"] == lost and result.productive_s == 100.0 - lost
