"""`job/slurm_actions.py`: srun's own messages for the steps trainctl ends on purpose stay out of
the job's output."""

import os
from pathlib import Path

import pytest

from trainctl.job import machine as sv
from trainctl.job.slurm_actions import own_step_srun_log, start_step, wait_step
from trainctl.launcher.plan import SubmitRequest, plan_job
from trainctl.site import load_site
from trainctl.slurm import config_binds_tasks, parse_scontrol_config


def _plan():
    return plan_job(load_site("local-demo").config, SubmitRequest(site_ref="local-demo", program=("/bin/true",),
                                                                  nodes=2, spare=1),
                    node_trainctl="/n/trainctl", node_python="/n/python", command=("trainctl", "submit"), version="0")


def test_trainctls_own_steps_log_srun_beside_their_output_and_the_training_step_does_not():
    plan, gate = _plan(), "/shared/trainctl-gate-7"
    action = sv.RunTraining(job_nodes="node[1-2]", node_count=2, master_addr="node1", start_sentinel=False)
    assert own_step_srun_log(sv.gate_step_argv(plan, gate, 3)) == f"{gate}/srun-trainctl-gate.log"
    assert own_step_srun_log(sv.sentinel_argv(plan, gate)) == f"{gate}/srun-trainctl-sentinel.log"
    assert own_step_srun_log(sv.agent_argv(plan, action, gate)) == f"{gate}/watch/srun-trainctl-agent.log"
    assert own_step_srun_log(sv.training_argv(plan, action, gate)) is None


def test_an_own_steps_srun_stderr_goes_to_its_log(tmp_path):
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\necho 'srun: error: node2: task 0: Killed' >&2\nexit 0\n")
    srun.chmod(0o755)
    argv = [str(srun), f"--job-name={sv.GATE_STEP}", f"--output={tmp_path}/node-%N.log", "trainctl"]
    assert wait_step(start_step(argv, dict(os.environ)), poll_s=5) == 0
    assert (tmp_path / "srun-trainctl-gate.log").read_text() == "srun: error: node2: task 0: Killed\n"


RECORDED = Path(__file__).parent / "fixtures" / "recorded"


@pytest.mark.parametrize("recording", ["devcluster-slurm-22.05.8/scontrol-show-config.txt",    # task/none
                                       "devcluster-slurm-26.05.5/scontrol-show-config.txt"])   # (null)
def test_a_cluster_without_a_task_plugin_does_not_bind(recording):
    assert config_binds_tasks(parse_scontrol_config((RECORDED / recording).read_text())) is False


@pytest.mark.parametrize("plugins, binds", [("task/affinity", True), ("task/cgroup,task/affinity", True),
                                            ("task/cgroup", True), ("none", False)])
def test_a_task_plugin_that_binds_is_named_in_the_recorded_config(plugins, binds):
    text = (RECORDED / "devcluster-slurm-22.05.8/scontrol-show-config.txt").read_text()
    text = text.replace("TaskPlugin              = task/none", f"TaskPlugin              = {plugins}")
    assert config_binds_tasks(parse_scontrol_config(text)) is binds


def test_a_config_that_cannot_be_read_keeps_slurms_binding_off():
    assert config_binds_tasks(parse_scontrol_config("")) is True
