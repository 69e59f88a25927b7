"""The job's supervisor without Slurm: each decision of the state machine, the argv of each step,
what it reads back from gate decide and scontrol, and the goodput of a chain of journals."""

import pytest

from trainctl.job import supervisor as sv
from trainctl.job.goodput import goodput
from trainctl.job.jobdir import Journal, parse_journal
from trainctl.launcher.plan import JobPlan, SubmitRequest, plan_job
from trainctl.site import load_site

ALLOCATED = ("node1", "node2", "node3", "node4")


def facts(*, release=True, retries=0, batch_host="node1", restarts=0, spares=0):
    return sv.JobFacts(ALLOCATED, batch_host, release, retries, restarts, spares)


def plan(**changes):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/true", "a b"), nodes=2, spare=2, **changes)
    return plan_job(load_site("local-demo").config, request, node_trainctl="/opt/trainctl", node_python="/py",
                    command=("trainctl", "submit"), version="0")


def run_events(job: sv.JobFacts, *events):
    """The actions the supervisor takes for `events`, from the start."""
    state, action = sv.advance(job, sv.JobState(), sv.Started())
    actions = [action]
    for event in events:
        state, action = sv.advance(job, state, event)
        actions.append(action)
    return actions


def test_a_healthy_job_gates_releases_the_spares_trains_and_ends_with_the_steps_status():
    actions = run_events(facts(), sv.GateDecided("node[1,4]", ("node1", "node4"), "10.0.0.1"), sv.Resized(2),
                         sv.StepEnded(0))
    assert actions == [sv.RunGate(), sv.Release("node[1,4]", move_sentinel=True),
                       sv.RunTraining("node[1,4]", 2, "10.0.0.1", start_sentinel=True), sv.Finish(0)]


def test_the_batch_host_is_kept_when_the_gate_left_it_out_and_the_sentinel_stays_on_a_kept_node():
    actions = run_events(facts(), sv.GateDecided("node[2-3]", ("node2", "node3"), "10.0.0.2"), sv.Resized(3))
    assert actions[1] == sv.Release("node[1-3]", move_sentinel=False)
    assert actions[2] == sv.RunTraining("node[2-3]", 2, "10.0.0.2", start_sentinel=False)


def test_nothing_to_release_goes_straight_to_training():
    job = sv.JobFacts(("node1", "node2"), "node1", True, 0)
    actions = run_events(job, sv.GateDecided("node[1-2]", ("node1", "node2"), "10.0.0.1"))
    assert actions[1] == sv.RunTraining("node[1-2]", 2, "10.0.0.1", start_sentinel=False)
    assert run_events(facts(release=False), sv.GateDecided("node1", ("node1",), "a"))[1] == \
        sv.RunTraining("node1", 1, "a", start_sentinel=False)


def test_a_refused_release_restarts_the_cancelled_sentinel_on_the_nodes_the_job_kept():
    actions = run_events(facts(), sv.GateDecided("node1,node4", ("node1", "node4"), "a"), sv.Resized(4))
    assert actions[-1].start_sentinel


def test_a_failed_gate_retries_around_the_allocation_only_with_retries():
    assert run_events(facts(), sv.GateRefused(2))[-1] == sv.Finish(2)
    actions = run_events(facts(retries=1), sv.GateRefused(2), sv.RetryHandled())
    assert actions[1:] == [sv.Retry("gate", 2, ALLOCATED), sv.Finish(2)]
    # nonsense from gate decide is not a verdict about nodes: no retry
    assert run_events(facts(retries=1), sv.GateRefused(2, retryable=False))[-1] == sv.Finish(2)


def test_a_failed_step_retries_around_its_nodes_and_ends_with_its_status():
    actions = run_events(facts(retries=1, release=False), sv.GateDecided("node[1-2]", ("node1", "node2"), "a"),
                         sv.StepEnded(137), sv.RetryHandled())
    assert actions[2:] == [sv.Retry("step", 137, ("node1", "node2")), sv.Finish(137)]
    assert run_events(facts(release=False), sv.GateDecided("node1", ("node1",), "a"), sv.StepEnded(3))[-1] == \
        sv.Finish(3)


def test_a_held_spare_stays_through_training_and_the_rest_go_back():
    actions = run_events(facts(spares=1), sv.GateDecided("node[1-2]", ("node1", "node2"), "a", ("node3", "node4")))
    assert actions[1] == sv.Release("node[1-3]", move_sentinel=False)


def test_a_hung_node_is_left_out_of_the_next_gate_and_training_restarts_on_the_spare():
    job = facts(restarts=2, spares=1)
    state, _ = sv.advance(job, sv.JobState(), sv.Started())
    state, _ = sv.advance(job, state, sv.GateDecided("node[1-2]", ("node1", "node2"), "a", ("node3", "node4")))
    state, action = sv.advance(job, state, sv.Resized(3))
    assert state.held == ("node1", "node2", "node3") and action.restart == 0
    state, action = sv.advance(job, state, sv.WatchStopped("hung", ("node2",), 143))
    assert action == sv.RunGate(("node1", "node3")) and state.condemned == ("node2",)
    state, action = sv.advance(job, state, sv.GateDecided("node[1,3]", ("node1", "node3"), "a"))
    assert action == sv.Release("node[1,3]", move_sentinel=True)
    state, action = sv.advance(job, state, sv.Resized(2))
    assert action == sv.RunTraining("node[1,3]", 2, "a", start_sentinel=True, restart=1)
    assert state.held == ("node1", "node3")


def test_a_slowdown_runs_the_gate_on_every_held_node_and_names_nobody_itself():
    job = facts(restarts=1, release=False)
    state, _ = sv.advance(job, sv.JobState(), sv.Started())
    state, _ = sv.advance(job, state, sv.GateDecided("node[1-2]", ("node1", "node2"), "a"))
    state, action = sv.advance(job, state, sv.WatchStopped("slow", (), 143))
    assert action == sv.RunGate(ALLOCATED) and state.condemned == ()
    state, action = sv.advance(job, state, sv.GateDecided("node[1-2]", ("node1", "node2"), "a"))
    assert action == sv.RunTraining("node[1-2]", 2, "a", start_sentinel=False, restart=1)
    # restarts used up: the next detection ends the job, or retries excluding what the watch named
    assert sv.advance(job, state, sv.WatchStopped("sick", ("node2",), 143))[1] == sv.Finish(143)
    retrying = facts(restarts=1, release=False, retries=1)
    assert sv.advance(retrying, state, sv.WatchStopped("sick", ("node2",), 143))[1] == \
        sv.Retry("step", 143, ("node1", "node2"), ("node2",))


def test_too_few_healthy_nodes_after_a_detection_retries_excluding_the_condemned():
    job = facts(restarts=1, retries=1, release=False)
    state, _ = sv.advance(job, sv.JobState(), sv.Started())
    state, _ = sv.advance(job, state, sv.GateDecided("node[1-2]", ("node1", "node2"), "a"))
    state, _ = sv.advance(job, state, sv.WatchStopped("hung", ("node2",), 143))
    assert sv.advance(job, state, sv.GateRefused(2))[1] == sv.Retry("gate", 2, ALLOCATED, ("node2",))


@pytest.mark.parametrize("value, expected", [("USR1@120", 10), ("R:USR2@60", 12), ("SIGTERM", 15), ("10@5", 10),
                                             ("B:USR1@60", None), ("", None), ("NOPE", None)])
def test_the_checkpoint_signal_comes_from_the_plans_sbatch_signal(value, expected):
    assert sv.checkpoint_signal(value) == expected


def test_an_event_out_of_place_is_a_bug_not_a_silent_skip():
    with pytest.raises(ValueError, match="StepEnded cannot happen in phase gate"):
        run_events(facts(), sv.StepEnded(0))


def test_step_argv_from_the_plan():
    job = plan(gpus_per_node=0)
    gate = sv.gate_step_argv(job, "/g", 4)
    assert gate[:7] == ["srun", "--overlap", "--job-name=trainctl-gate", "--ntasks=4", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0", "--input=none"]
    assert gate[-9:] == ["/opt/trainctl", "gate", "node", "--site", "local-demo", "--partition", "gpu", "--dir", "/g"]
    training = sv.training_argv(job, sv.RunTraining("node[1,4]", 2, "10.0.0.1", False), "/g")
    assert training[:6] == ["srun", "--nodelist=node[1,4]", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                            "--kill-on-bad-exit=1"]
    assert "--cpu-bind=none" not in training and "--output=/g/rank-%N-%t.out" in training
    assert training[-4:] == ["--no-bind", "--", "/bin/true", "a b"]
    assert sv.decide_argv(job, "/g")[-5:] == ["--nodes", "2", "--min-nodes", "2", "--wait"]
    # after a detection: only the nodes the job still trusts
    assert sv.decide_argv(job, "/g", ("node1", "node3"))[-3:] == ["--allocated", "node[1,3]", "--wait"]
    assert sv.gate_step_argv(job, "/g", 4, ("node1", "node3"))[3:6] == ["--nodelist=node[1,3]", "--nodes=2",
                                                                          "--ntasks=2"]
    restart = sv.training_argv(job, sv.RunTraining("node[1,4]", 2, "10.0.0.1", False, restart=1), "/g")
    assert "--overlap" in restart and "--overlap" not in training
    agents = sv.agent_argv(job, sv.RunTraining("node[1,4]", 2, "10.0.0.1", False), "/g")
    assert agents[:7] == ["srun", "--overlap", "--job-name=trainctl-agent", "--nodelist=node[1,4]", "--nodes=2",
                          "--ntasks=2", "--ntasks-per-node=1"]
    assert "--relative=1" in sv.sentinel_argv(job, "/g")


def test_the_plan_travels_through_the_script_unchanged():
    job = plan(retries=2, signal="USR1@120", job_name="x y")
    assert JobPlan.from_document(job.to_document()) == job
    from trainctl.errors import UsageError

    with pytest.raises(UsageError):
        JobPlan.from_document({"format": 1, "nodes": 2})
    with pytest.raises(UsageError):
        JobPlan.from_document({"format": 99})


@pytest.mark.parametrize("stdout, decided", [("node[1-2]\n10.0.0.1\n", ("node[1-2]", "10.0.0.1")),
                                             ("node1\n", None), ("", None), ("\n10.0.0.1\n", None)])
def test_gate_decides_two_lines_or_nothing(stdout, decided):
    assert sv.parse_decision(stdout) == decided


def test_the_resize_script_is_read_as_words_never_run():
    text = ('export SLURM_NODELIST="node[1,4]"\nexport SLURM_JOB_NODELIST="node[1,4]"\nexport SLURM_NNODES=2\n'
            'export SLURM_JOB_CPUS_PER_NODE="1(x2)"\nunset SLURM_NPROCS\nunset SLURM_TASKS_PER_NODE\n'
            'export X="$(touch pwned)"\n')
    exported, unset = sv.parse_resize_script(text)
    assert exported["SLURM_JOB_NODELIST"] == "node[1,4]" and exported["SLURM_NNODES"] == "2"
    assert exported["SLURM_JOB_CPUS_PER_NODE"] == "1(x2)" and exported["X"] == "$(touch pwned)"
    assert unset == ("SLURM_NPROCS", "SLURM_TASKS_PER_NODE")


def journal_of(tmp_path, name, timed_events):
    """A journal written by Journal with a fake clock: [(t, event, fields), ...]."""
    times = iter([t for t, _, _ in timed_events])
    journal = Journal(str(tmp_path / name), clock=lambda: next(times))
    for _, event, fields in timed_events:
        journal.add(event, **fields)
    return parse_journal((tmp_path / name).read_text())


def test_goodput_splits_the_chain_into_queue_gate_training_restart_and_lost_work(tmp_path):
    first = journal_of(tmp_path, "1.jsonl", [
        (10, "job_start", {}), (11, "submitted", {"submitted_t": 0}), (30, "training_start", {}),
        (80, "checkpoint", {"checkpoint_t": 70}),
        (100, "step_end", {"status": 1, "training_start_t": 30, "last_checkpoint_t": 70}),
        (110, "job_end", {"status": 1})])
    second = journal_of(tmp_path, "2.jsonl", [
        (120, "job_start", {}), (121, "submitted", {"submitted_t": 105}), (140, "training_start", {}),
        (200, "step_end", {"status": 0, "training_start_t": 140}), (201, "job_end", {"status": 0})])
    result = goodput([first, second], now=1000)
    assert result.wall_s == 201 and not result.running
    # training 30-100 (70 s, of which 70-100 lost) and 140-200 (60 s); the latest mark sets the phase:
    # the successor, submitted at 105, is queued from then on
    assert result.productive_s == pytest.approx(40 + 60)
    assert result.lost_s == pytest.approx({"queue": 10 + 15, "gate": 20 + 20, "restart": 5, "lost_work": 30})
    # the second leaves its finished step at 200 and ends at 201: that second is the job's own end
    assert result.productive_s + sum(result.lost_s.values()) == pytest.approx(result.wall_s - 1)


def test_goodput_of_a_running_job_counts_up_to_now_and_a_step_without_checkpoints_loses_all(tmp_path):
    running = journal_of(tmp_path, "r.jsonl", [(0, "job_start", {}), (10, "training_start", {})])
    result = goodput([running], now=50)
    assert result.running and result.wall_s == 50 and result.productive_s == 40
    failed = journal_of(tmp_path, "f.jsonl", [(0, "job_start", {}), (10, "training_start", {}),
                                              (50, "step_end", {"status": 9, "training_start_t": 10}),
                                              (55, "job_end", {"status": 9})])
    result = goodput([failed], now=999)
    assert result.productive_s == 0 and result.lost_s["lost_work"] == 40 and result.ratio == 0


def test_a_journal_that_cannot_be_written_warns_once_and_never_ends_the_job(tmp_path, capsys):
    journal = Journal(str(tmp_path / "no-such-dir" / "journal.jsonl"), clock=lambda: 5.0)
    assert journal.add("job_start")["t"] == 5.0
    journal.add("gate_start")
    assert capsys.readouterr().err.count("cannot write the journal") == 1
