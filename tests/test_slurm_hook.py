"""`trainctl health slurm-hook`: the plan per role (pure), and on the dev cluster as Slurm's own
HealthCheckProgram and Prolog, with node2's nvidia-smi replaying a recorded NVLink fault."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from support.replay import LIBRARY, write_replay
from support.slurm_jobs import TERMINAL_STATES, restarted_with
from trainctl.health.slurm_hook import (DRAIN, EPILOG, HEALTH_CHECK, KEEP, NONE, PROLOG, RELEASE, RESUME, SKIP,
                                        OwnDrain, Plan, exit_code, plan_action, role_from_env)
from trainctl.cli import cli
from trainctl.proc import run, run_checked
from trainctl.slurm import (SINFO_FORMAT, NodeState, parse_scontrol_config, parse_scontrol_oneliner,
                            parse_sinfo_states)

TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
CONTRIB = Path(__file__).resolve().parents[1] / "contrib"
CONTRIB_CONF, CONTRIB_SCRIPT = CONTRIB / "trainctl-slurm-hook.conf", CONTRIB / "trainctl-slurm-hook.sh"
CONTRIB_HOOK_PATH = "/etc/slurm/trainctl-slurm-hook.sh"
DEMO_SITE = Path(__file__).resolve().parents[1] / "site-configs" / "local-demo.toml"
HEALTHY_NVLINK = LIBRARY / "nvidia-smi/nvlink/h100-80gb-hbm3-1gpu-18links-26.562GBps-nvlink-s.txt"
INACTIVE_LINKS = Path(__file__).parent / "health/fixtures/azhpc-diagnostics-73-v100-nvlink-s-links-3-5-inactive.txt"
FAILING = [("nvlink.links", "GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive")]
OUR_REASON = "trainctl: nvlink.links: GPU 3 (Tesla V100-SXM2-32GB): NVLink 3, 5 inactive"
WHEN = "2026-11-23T06:44:32"


def node(state="idle", reason="", user="", when=""):
    return NodeState("node2", "10.77.0.2", state, "", reason, user, when)


OWN = OwnDrain(OUR_REASON, WHEN, 0.0, HEALTH_CHECK)


def test_role_comes_from_slurms_script_context():
    assert role_from_env({"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}) == PROLOG
    assert role_from_env({"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}) == EPILOG
    assert role_from_env({"SLURMD_NODENAME": "node2"}) == HEALTH_CHECK   # what slurmd gives a health check


def test_a_failing_node_is_drained_only_without_anyones_reason():
    assert plan_action(FAILING, False, node(), None) == Plan(DRAIN, OUR_REASON, True)
    admin = plan_action(FAILING, False, node("drained", "bad DIMM", "alice", WHEN), None)
    assert admin.action == SKIP and "alice: 'bad DIMM'" in admin.text
    assert plan_action(FAILING, False, node("drained", OUR_REASON, "root", WHEN), OWN).action == KEEP
    # Same text, but drained again later by someone else: not the hook's any more, so not kept as its own.
    assert plan_action(FAILING, False, node("drained", OUR_REASON, "bob", "2026-11-23T07:00:00"), OWN).action == SKIP


def test_a_passing_node_gets_back_only_the_hooks_own_drain():
    assert plan_action([], False, node("drained", OUR_REASON, "root", WHEN), OWN).action == RESUME
    changed = plan_action([], False, node("drained", "bad DIMM", "alice", WHEN), OWN)
    assert changed.action == RELEASE and "bad DIMM" in changed.text
    assert plan_action([], False, node("drained", "bad DIMM", "alice", WHEN), None).action == NONE
    # A check that could not decide neither drains nor lifts a drain.
    assert plan_action([], True, node("drained", OUR_REASON, "root", WHEN), OWN).action == NONE


@pytest.mark.parametrize("role, plan, acted, expected", [
    (PROLOG, Plan(DRAIN, OUR_REASON, True), True, 1),     # the job must not start here: Slurm requeues it
    (PROLOG, Plan(SKIP, "admin's reason", True), False, 1),
    (PROLOG, Plan(NONE, "passes", False), False, 0),
    (EPILOG, Plan(DRAIN, OUR_REASON, True), True, 0),     # drained with our reason: nothing more to ask
    (EPILOG, Plan(DRAIN, OUR_REASON, True), False, 1),    # could not drain: let Slurm drain it
    (HEALTH_CHECK, Plan(DRAIN, OUR_REASON, True), True, 0),
    (HEALTH_CHECK, Plan(DRAIN, OUR_REASON, True), False, 1),
    (HEALTH_CHECK, Plan(RESUME, "passes now", False), False, 0),
])
def test_exit_code_per_role(role, plan, acted, expected):
    assert exit_code(role, plan, acted) == expected


# ---------------------------------------------------------------- on the dev cluster

HEALTH_CHECK_INTERVAL_S = 5
# The hook gives each Slurm call a third of what its budget has left. With the default 8 s that is
# about 2.6 s, and at load 8 on the 2 shared cores a prolog's `sinfo` was seen to take longer: the
# hook then rightly leaves the drain to Slurm ("Prolog error"), which is not what these tests are
# about. 20 s stays inside PrologEpilogTimeout=30 (contrib's) and HealthCheckProgram's 60 s; a
# prolog may outlast MessageTimeout, since slurmd answers the launch RPC before running it
# (`_rpc_prolog`, src/slurmd/slurmd/req.c, 22.05.8 and 24.11.5).
HOOK_BUDGET_S = 20


def states(cluster) -> dict[str, NodeState]:
    return parse_sinfo_states(run_checked(["sinfo", "-h", "-N", "-o", SINFO_FORMAT], timeout=15,
                                          env=cluster.client_env()).stdout)


def scontrol(cluster, *args: str) -> None:
    run_checked(["scontrol", *args], timeout=15, env=cluster.client_env())


def job_record(cluster, job_id: str) -> dict[str, str]:
    """The job's `scontrol show job` fields; empty when slurmctld did not answer this poll (busy past
    MessageTimeout on the loaded 2-core machine): the caller polls again until its deadline."""
    result = run(["scontrol", "show", "job", "-o", job_id], timeout=15, env=cluster.client_env())
    record: dict[str, str] = {}
    for part in parse_scontrol_oneliner(result.stdout if result.ok else ""):
        record.update(part)
    return record


def config_seconds(cluster, *keys: str) -> int:
    """The sum of the running cluster's timeouts `keys`, from `scontrol show config` ("10 sec" or "30")."""
    config = parse_scontrol_config(run_checked(["scontrol", "show", "config"], timeout=15,
                                               env=cluster.client_env()).stdout)
    return sum(int(config[key].split()[0]) for key in keys)


def wait_for_requeue(cluster, job_id: str, timeout_s: float) -> dict[str, str]:
    """The job's record once Slurm has finished requeueing it: JobState=PENDING with Restarts >= 1.

    `Restarts=1` alone is not that. slurmctld counts the restart when the requeue starts
    (`restart_cnt++` in `_job_requeue_op`) and leaves a job that still has a node to hear from
    PENDING|COMPLETING (`_set_requeued_job_pending_completing`), which scontrol prints as COMPLETING
    (`job_state_string` names the flags before the base state); plain PENDING comes only from
    `batch_requeue_fini`, once the node has reported the job's end or been set DOWN (Slurm 22.05.8
    and 24.11.5 alike, src/slurmctld/job_mgr.c and src/common/slurm_protocol_defs.c). A job that
    ends instead (CANCELLED, FAILED, ...) will never be requeued: that fails at once.
    """
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while True:
        record = job_record(cluster, job_id)
        state = record.get("JobState", "(no answer)")
        if not seen or seen[-1] != f"{state} Restarts={record.get('Restarts', '?')}":
            seen.append(f"{state} Restarts={record.get('Restarts', '?')}")
        if state == "PENDING" and int(record.get("Restarts", "0")) >= 1:
            return record
        history = " -> ".join(seen)
        assert state not in TERMINAL_STATES, f"job {job_id} ended instead of being requeued: {history}"
        assert time.monotonic() < deadline, f"job {job_id} not requeued after {timeout_s:.0f} s: {history}"
        time.sleep(0.25)


def wait_for(cluster, predicate, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not predicate(states(cluster)):
        assert time.monotonic() - start < timeout_s, f"{what}: not after {timeout_s:.0f} s: {states(cluster)}"
        time.sleep(0.25)
    return time.monotonic() - start


def hook_wrapper(cluster, tmp_path: Path) -> Path:
    """What contrib/trainctl-slurm-hook.sh does, for this cluster.

    slurmd gives its hooks no PATH and no SLURM_CONF; the dev cluster also puts the node's
    bin dir (where the test stages the replayed nvidia-smi) first, as its TaskProlog does for jobs.
    The budget is HOOK_BUDGET_S, not the 8 s default: see there.
    """
    script = tmp_path / "hook.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'PATH={cluster.base}/nodes/$SLURMD_NODENAME/bin:/usr/sbin:/usr/bin:/sbin:/bin\n'
        f"SLURM_CONF={cluster.slurm_conf}\n"
        "export PATH SLURM_CONF\n"
        f"exec {TRAINCTL} health slurm-hook --site {DEMO_SITE} --budget {HOOK_BUDGET_S} "
        f"--state-dir {tmp_path}/state --log {tmp_path}/hook.log\n")
    script.chmod(0o755)
    return script


def stage_nvlink(cluster, faulty: set[str]) -> None:
    for name in cluster.spec.node_names:
        write_replay(cluster.node_bin_dir(name), "nvidia-smi",
                     {"nvlink -s": INACTIVE_LINKS if name in faulty else HEALTHY_NVLINK})


def contrib_conf(hook: Path, keys: tuple[str, ...], **overrides: str) -> list[str]:
    """contrib/trainctl-slurm-hook.conf's lines for `keys`, pointing at `hook`: the tests run what admins copy."""
    lines = {}
    for line in CONTRIB_CONF.read_text().splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            lines[key] = value.replace(CONTRIB_HOOK_PATH, str(hook))
    return [f"{key}={overrides.get(key, lines[key])}" for key in keys]


def test_contrib_hook_script_runs_a_command_trainctl_accepts():
    text = CONTRIB_SCRIPT.read_text()
    argv = shlex.split(text[text.index("exec ") + len("exec "):].replace("\\\n", " "))
    assert argv[0] == "/usr/local/bin/trainctl" and argv[1:3] == ["health", "slurm-hook"]
    health = cli.get_command(click.Context(cli), "health")
    health.get_command(click.Context(health), "slurm-hook").make_context("slurm-hook", argv[3:])
    assert subprocess.run(["shellcheck", str(CONTRIB_SCRIPT)], capture_output=True, text=True).returncode == 0
    assert CONTRIB_HOOK_PATH in CONTRIB_CONF.read_text()


def test_an_unwritable_log_is_a_warning_and_the_outcome_stands(tmp_path):
    """A prolog exiting non-zero drains the node: a read-only log place must not do that."""
    out = subprocess.run([TRAINCTL, "health", "slurm-hook", "--role", "prolog", "--only", "host.memory",
                          "--state-dir", str(tmp_path / "state"), "--log", str(tmp_path / "no" / "such" / "hook.log")],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert f"trainctl: warning: --log {tmp_path}/no/such/hook.log: No such file or directory" in out.stderr
    assert len(out.stdout.splitlines()) == 1  # the outcome line is still printed


@pytest.mark.cluster
def test_slurmd_health_check_drains_the_faulty_node_and_resumes_it_when_fixed(devcluster, tmp_path):
    hook = hook_wrapper(devcluster, tmp_path)
    conf = contrib_conf(hook, ("HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState"),
                        HealthCheckInterval=str(HEALTH_CHECK_INTERVAL_S))
    with restarted_with(devcluster, extra_slurm_conf=tuple(conf)) as cluster:
        scontrol(cluster, "update", "NodeName=node3", "State=DRAIN", "Reason=bad DIMM")   # an admin's drain
        scontrol(cluster, "update", "NodeName=node4", "State=DRAIN", "Reason=swap PSU")   # failing, and an admin's
        stage_nvlink(cluster, faulty={"node2", "node4"})

        waited = wait_for(cluster, lambda s: s["node2"].drained, 6 * HEALTH_CHECK_INTERVAL_S, "node2 drained")
        node2 = states(cluster)["node2"]
        assert node2.reason == OUR_REASON, node2
        print(f"node2 drained by slurmd's health check {waited:.1f} s after the fault was staged "
              f"(HealthCheckInterval={HEALTH_CHECK_INTERVAL_S})")

        stage_nvlink(cluster, faulty={"node4"})
        waited = wait_for(cluster, lambda s: not s["node2"].drained and not s["node2"].reason,
                          6 * HEALTH_CHECK_INTERVAL_S, "node2 resumed")
        print(f"node2 resumed {waited:.1f} s after the fault was removed")
        after = states(cluster)
        log = (tmp_path / "hook.log").read_text()
    assert (after["node3"].reason, after["node4"].reason) == ("bad DIMM", "swap PSU")   # never touched
    assert after["node3"].drained and after["node4"].drained
    assert "node4: fail (nvlink.links" in log and "left alone: has a reason trainctl did not set" in log
    assert "node2: ok; resumed: passes now" in log


@pytest.mark.cluster
def test_prolog_keeps_the_job_off_a_failing_node_and_drains_it_with_trainctls_reason(devcluster, tmp_path):
    hook = hook_wrapper(devcluster, tmp_path)
    conf = contrib_conf(hook, ("Prolog", "PrologFlags", "PrologEpilogTimeout", "SchedulerParameters"))
    with restarted_with(devcluster, extra_slurm_conf=tuple(conf)) as cluster:
        stage_nvlink(cluster, faulty={"node2"})
        job = run_checked(["sbatch", "--parsable", "-N1", "-w", "node2", "-o", str(tmp_path / "job.out"),
                           "--wrap", "hostname"], timeout=15, env=cluster.client_env(), cwd=tmp_path).stdout.strip()
        wait_for(cluster, lambda s: s["node2"].drained, 30, "node2 drained by the prolog")
        # From the hook's drain to the end of the requeue, each step has its own bound in Slurm:
        # the prolog ends (PrologEpilogTimeout kills it), slurmd sends slurmctld two RPCs, prolog
        # complete then requeue (`_notify_result_rpc_prolog` in src/slurmd/slurmd/req.c; each
        # MessageTimeout), and node2 reports the job's end or is set DOWN after SlurmdTimeout.
        bound_s = config_seconds(cluster, "PrologEpilogTimeout", "MessageTimeout", "MessageTimeout",
                                 "SlurmdTimeout")
        record = wait_for_requeue(cluster, job, bound_s)
        node2 = states(cluster)["node2"]
        log = (tmp_path / "hook.log").read_text()
    assert node2.reason == OUR_REASON                         # Slurm kept trainctl's reason, not "Prolog error"
    assert record["Restarts"] == "1"                          # requeued once ...
    assert record.get("BatchHost", "(null)") == "(null)"      # ... and never started anywhere
    assert record["Priority"] != "0"   # not held: nohold_on_prolog_fail lets it start elsewhere
    assert not (tmp_path / "job.out").exists() or "node2" not in (tmp_path / "job.out").read_text()
    assert "trainctl slurm-hook prolog node2: fail" in log and "exit 1]" in log


@pytest.mark.cluster
def test_epilog_drains_a_node_that_broke_during_the_job_and_exits_0(devcluster, tmp_path):
    hook = hook_wrapper(devcluster, tmp_path)
    conf = contrib_conf(hook, ("Epilog", "PrologEpilogTimeout"))
    with restarted_with(devcluster, extra_slurm_conf=tuple(conf)) as cluster:
        stage_nvlink(cluster, faulty=set())
        # The NVLinks "fail" while the job runs: the job stages the fault itself, then ends.
        faulty = cluster.node_bin_dir("node2") / "nvidia-smi"
        breaks = f"sed -i 's#{HEALTHY_NVLINK}#{INACTIVE_LINKS}#' {faulty}"
        run_checked(["srun", "-N1", "-w", "node2", "sh", "-c", breaks], timeout=60, env=cluster.client_env())
        wait_for(cluster, lambda s: s["node2"].drained, 30, "node2 drained by the epilog")
        node2 = states(cluster)["node2"]
        log = (tmp_path / "hook.log").read_text()
    assert node2.reason == OUR_REASON                          # ours, not Slurm's "Epilog error"
    assert "trainctl slurm-hook epilog node2: fail" in log and "drained:" in log and "exit 0]" in log
