"""Requeue around bad nodes, without Slurm: the pure retry decision, what the successor's sbatch
gets, submit's --retries/--signal, and the plan the job script hands to the supervisor."""

import subprocess

import pytest

from trainctl.errors import UsageError
from trainctl.job.decision import Decision
from trainctl.launcher.plan import JobPlan, SubmitRequest, check_signal, plan_job
from trainctl.launcher.render import render_script
from trainctl.job.retry import (Attempt, Evidence, attempt_from_environment, decide_retry, gate_bad_nodes,
                                plan_excludes, successor_argv, successor_environment, summary_line, record)
from trainctl.launcher.render import sbatch_argv
from trainctl.site import load_site

NODES = ("node1", "node3")
FIRST = Attempt("41", 1, 1)


def step_end(status=1, *, in_job=NODES, states=None, answered=NODES, batch_host="node1"):
    return Evidence("step", status, NODES, {}, in_job,
                    states if states is not None else {node: "mixed" for node in NODES}, answered, batch_host)


def test_a_program_failing_on_healthy_nodes_is_not_retried():
    decision = decide_retry(FIRST, step_end(status=1))
    assert not decision.retry and decision.bad_nodes == {}
    assert "on healthy nodes" in decision.reason and "status 1" in decision.reason


def test_a_node_the_probe_cannot_reach_is_lost_and_the_successor_excludes_it():
    decision = decide_retry(Attempt("41", 1, 2, ("node2",)), step_end(answered=("node1",)))
    assert decision.retry and decision.next_attempt == 2
    assert list(decision.bad_nodes) == ["node3"]
    assert decision.exclude == ("node2", "node3")  # earlier excludes carried on


@pytest.mark.parametrize("evidence", [
    step_end(in_job=("node1",)),                                  # Slurm removed it from the --no-kill job
    step_end(states={"node1": "mixed", "node3": "down*"}),
    step_end(states={"node1": "mixed", "node3": "mixed*"}),       # not responding, not yet down
    step_end(states={"node1": "mixed", "node3": "fail"}),
], ids=["removed", "down", "not-responding", "fail"])
def test_slurm_saying_a_node_is_gone_makes_it_lost(evidence):
    decision = decide_retry(FIRST, evidence)
    assert decision.retry and list(decision.bad_nodes) == ["node3"]


def test_after_a_lost_node_in_training_the_successor_also_excludes_the_nodes_this_jobs_gate_left_out():
    """node2 failed this job's gate (the job ran on its spare); node3 is lost in training: the
    successor excludes both, though only node3 is why it retries."""
    evidence = Evidence("step", 1, NODES, {"node2": "nvlink.links: NVLink 3 inactive"}, ("node1",),
                        {node: "mixed" for node in NODES}, NODES, "node1")
    decision = decide_retry(FIRST, evidence)
    assert decision.retry and list(decision.bad_nodes) == ["node3"]
    assert decision.exclude == ("node2", "node3")
    assert not decide_retry(FIRST, Evidence("step", 1, NODES, {"node2": "gpu.ecc: 3 errors"}, NODES,
                                            {node: "mixed" for node in NODES}, NODES, "node1")).retry


def test_a_drained_node_that_still_answers_is_not_lost():
    decision = decide_retry(FIRST, step_end(states={"node1": "mixed", "node3": "draining"}))
    assert not decision.retry


def test_a_probe_that_did_not_even_reach_the_batch_host_decides_nothing():
    decision = decide_retry(FIRST, step_end(answered=()))
    assert not decision.retry and "cannot tell" in decision.reason


def test_no_retries_left():
    decision = decide_retry(Attempt("42", 2, 1, ("node3",), "41"), step_end(answered=("node3",), batch_host="node3"))
    assert not decision.retry and "attempt 2 of 2" in decision.reason and decision.bad_nodes == {"node1": (
        "no task could be started on it after the step ended")}


def test_success_is_never_retried():
    assert not decide_retry(FIRST, step_end(status=0)).retry


def test_too_few_healthy_nodes_in_the_gate_retries_without_the_excluded_ones():
    decision_json = {"ok": False, "allocated": ["node1", "node2", "node3", "node4"], "healthy": ["node1", "node3"],
                     "chosen": [], "wanted": 3, "minimum": 3, "warnings": [], "unknown": [],
                     "excluded": [{"host": "node2", "reasons": ["nvlink.links: NVLink 3 inactive"]},
                                  {"host": "node4", "reasons": ["lost during the gate"]}]}
    evidence = Evidence("gate", 2, ("node1", "node2", "node3", "node4"),
                        gate_bad_nodes(Decision.from_json(decision_json)))
    decision = decide_retry(FIRST, evidence)
    assert decision.retry and decision.exclude == ("node2", "node4")
    assert decision.bad_nodes["node2"] == "nvlink.links: NVLink 3 inactive"


def test_a_gate_that_failed_for_another_reason_is_not_retried():
    evidence = Evidence("gate", 4, ("node1",), {"node2": "x"})
    assert not decide_retry(FIRST, evidence).retry


def test_the_successor_is_the_same_script_around_the_bad_nodes_linked_to_this_job():
    decision = decide_retry(Attempt("41", 1, 2, ("node7",)), step_end(answered=("node1",)))
    argv = successor_argv(Attempt("41", 1, 2, ("node7",)), decision, ("--job-name=a b",), 3, 1)
    assert argv[:4] == ["sbatch", "--parsable", "--job-name=a b", "--nodes=3-4"]
    assert "--exclude=node[3,7]" in argv and "--dependency=afterany:41" in argv
    comment = next(arg for arg in argv if arg.startswith("--comment="))
    assert comment.startswith("--comment=trainctl: attempt 2 of 3, after job 41 (a node was lost")


def test_the_successor_still_excludes_what_the_jobs_own_script_excludes(tmp_path):
    """The successor's command-line --exclude replaces the script's #SBATCH --exclude (the site's
    extra_sbatch, submit's lemons): it names the union, read from the job's plan."""
    site = tmp_path / "site.toml"
    site.write_text('name = "s"\ndefault_partition = "p"\n[partitions.p]\ngpus_per_node = 0\n'
                    'socket_ifname = "lo"\n[slurm]\nextra_sbatch = ["--exclude=node[8-9]"]\n')
    plan = plan_job(load_site(str(site)).config, SubmitRequest(site_ref=str(site), program=("/bin/true",), nodes=2,
                                                               retries=1),
                    node_trainctl="/t", node_python="/py", command=("trainctl", "submit"), version="0")
    assert "#SBATCH --exclude=node[8-9]" in render_script(plan).splitlines()
    attempt = attempt_from_environment({"TRAINCTL_ATTEMPT": "1"}, "41", 1, plan_excludes(plan.sbatch_options))
    assert attempt.kept_out == ("node8", "node9")
    decision = decide_retry(attempt, step_end(answered=("node1",)))
    assert decision.exclude == ("node3", "node8", "node9") and list(decision.bad_nodes) == ["node3"]
    extra = tuple(sbatch_argv(plan)[2:]) + ("--exclude=node5",)   # one on the command line is replaced too
    argv = successor_argv(attempt, decision, extra, 2, 0)
    assert [arg for arg in argv if arg.startswith("--exclude")] == ["--exclude=node[3,8-9]"]
    env = successor_environment({}, attempt, decision)
    assert env["TRAINCTL_EXCLUDE"] == "node3,node8,node9"
    with pytest.raises(UsageError, match="the job's --exclude"):
        plan_excludes(plan.sbatch_options[:1] + (type(plan.sbatch_options[0])("--exclude", "node[1-"),))


def test_a_successor_without_spares_asks_the_scripts_own_node_count():
    decision = decide_retry(FIRST, step_end(answered=("node1",)))
    assert not any(arg.startswith("--nodes") for arg in successor_argv(FIRST, decision, (), 3, 0))


def test_the_successor_gets_the_attempt_but_not_this_jobs_slurm_variables():
    environ = {"PATH": "/bin", "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "node[1,3]", "SLURM_CONF": "/etc/s.conf",
               "SBATCH_ACCOUNT": "ml", "NCCL_DEBUG": "WARN"}
    attempt = attempt_from_environment(environ, "41", 1)
    assert attempt == Attempt("41", 1, 1)
    env = successor_environment(environ, attempt, decide_retry(attempt, step_end(in_job=("node1",))))
    assert env == {"PATH": "/bin", "SLURM_CONF": "/etc/s.conf", "SBATCH_ACCOUNT": "ml", "NCCL_DEBUG": "WARN",
                   "TRAINCTL_ATTEMPT": "2", "TRAINCTL_EXCLUDE": "node3", "TRAINCTL_PREVIOUS_JOB": "41"}
    assert attempt_from_environment(env, "42", 1) == Attempt("42", 2, 1, ("node3",), "41")
    with pytest.raises(UsageError):
        attempt_from_environment({"TRAINCTL_ATTEMPT": "x"}, "1", 1)


def test_summary_line_names_the_successor():
    attempt = Attempt("41", 1, 1)
    evidence = step_end(in_job=("node1",))
    line = summary_line(record(attempt, evidence, decide_retry(attempt, evidence), "42", None))
    assert line == ("attempt 1 of 2 (job 41): a node was lost during training (node3: Slurm removed it from the "
                    "job (node failure)); submitted job 42 excluding node3")


@pytest.mark.parametrize("value", ["USR1@120", "R:USR2@60", "10@5", "SIGUSR1", "TERM"])
def test_signal_forms_sbatch_takes(value):
    assert check_signal(value) == value


@pytest.mark.parametrize("value, words", [("B:USR1@120", "batch shell"), ("KILL@10", "cannot catch"),
                                          ("USR1@70000", "0-65535"), ("USR1 @1", "expected")])
def test_signal_forms_refused(value, words):
    with pytest.raises(UsageError, match=words):
        check_signal(value)


def _plan(**changes):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/true",), nodes=2, spare=1, **changes)
    return plan_job(load_site("local-demo").config, request, node_trainctl="/opt/trainctl", node_python="/py",
                    command=("trainctl", "submit"), version="0")


def test_retries_and_signal_reach_the_script(tmp_path):
    plan = _plan(retries=2, signal="USR1@120", job_name="a b")
    script = render_script(plan)
    assert "#SBATCH --signal=USR1@120" in script.splitlines()
    assert '"retries": 2' in script and "at most 2 times" in script
    assert ' job run --script "$0" --plan - <<' in script  # a retry submits $0 again
    assert JobPlan.from_document(plan.to_document()) == plan
    (tmp_path / "job.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True, timeout=30)
    subprocess.run(["shellcheck", str(tmp_path / "job.sh")], check=True, timeout=60)


def test_no_retries_no_retry_code():
    script = render_script(_plan(retries=0, signal=""))
    assert '"retries": 0' in script and "submitted again" not in script and "--signal" not in script


def test_negative_retries_refused():
    with pytest.raises(UsageError, match="--retries"):
        _plan(retries=-1)
