"""The sbatch script: goldens per sample site, bash -n and shellcheck, quoting and injection."""

import dataclasses
import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.submit_standins import (nasty, read_dumps, write_dump_program, write_scontrol, write_squeue,
                                     write_srun, write_trainctl)
from trainctl.launcher.plan import SbatchOption, SubmitRequest, plan_job
from trainctl.launcher.render import (command_line, directive_safe, render_script, sbatch_argv,
                                      shell_word, template_environment)
from trainctl.site import load_site

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
REGEN_FLAG = "TRAINCTL_REGEN_GOLDEN"
NODE_TRAINCTL = "/opt/trainctl/bin/trainctl"
NODE_PYTHON = "/opt/trainctl/bin/python"

# One request per sample site, each exercising a different part of the template.
GOLDEN_REQUESTS = {
    "local-demo": SubmitRequest(site_ref="local-demo", program=("examples/train_ddp.py", "--steps", "5"),
                                nodes=2, spare=2),
    "dgx-h100": SubmitRequest(site_ref="dgx-h100", program=("train.py", "--config", "llama 70b.yaml"),
                              nodes=16, spare=2, min_nodes=15, time_limit="2-00:00:00", job_name="llama 70b",
                              nccl_debug="warn"),
    "a100-roce": SubmitRequest(site_ref="a100-roce", program=("./run.sh", "--epochs=3"), nodes=4, spare=1,
                               gpus_per_node=4, time_limit="12:00:00"),
}


def plan_for(request: SubmitRequest, site: str | None = None):
    command = ("trainctl", "submit", "--site", request.site_ref, "--nodes", str(request.nodes), "--",
               *request.program)
    return plan_job(load_site(site or request.site_ref).config, request, node_trainctl=NODE_TRAINCTL,
                    node_python=NODE_PYTHON, command=command, version="0.1.0")


def assert_matches_golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; rewrite it only when TRAINCTL_REGEN_GOLDEN=1."""
    path = GOLDEN_DIR / name
    how = f"{REGEN_FLAG}=1 .venv/bin/python -m pytest tests/test_render.py, then review `git diff {path}`"
    if os.environ.get(REGEN_FLAG) == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; to create it: {how}")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True),
                                            text.splitlines(keepends=True), f"golden/{name}", "rendered"))
        pytest.fail(f"rendered script differs from golden/{name}:\n{diff}\nIf the change is intended: {how}")


def check_shell(script: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    lint = subprocess.run(["/usr/bin/shellcheck", "--shell=bash", str(path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("site", sorted(GOLDEN_REQUESTS))
def test_golden_script_per_sample_site(site, tmp_path):
    script = render_script(plan_for(GOLDEN_REQUESTS[site]))
    check_shell(script, tmp_path)
    assert_matches_golden(f"{site}.sbatch", script)


def test_every_sample_site_has_a_golden():
    samples = {p.stem for p in (Path(__file__).resolve().parents[1] / "site-configs").glob("*.toml")}
    assert samples == set(GOLDEN_REQUESTS)


def test_a_missing_golden_fails_instead_of_being_written(monkeypatch):
    monkeypatch.delenv(REGEN_FLAG, raising=False)
    with pytest.raises(pytest.fail.Exception, match="missing"):
        assert_matches_golden("no-such-site.sbatch", "#!/bin/bash\n")
    assert not (GOLDEN_DIR / "no-such-site.sbatch").exists()


def test_a_changed_script_fails_with_a_unified_diff(monkeypatch):
    monkeypatch.delenv(REGEN_FLAG, raising=False)
    script = render_script(plan_for(GOLDEN_REQUESTS["local-demo"])).replace("--nodes=4", "--nodes=5")
    with pytest.raises(pytest.fail.Exception) as failure:
        assert_matches_golden("local-demo.sbatch", script)
    assert "-#SBATCH --nodes=4\n+#SBATCH --nodes=5" in str(failure.value)


def test_sample_sites_get_their_fabric_settings():
    h100 = render_script(plan_for(GOLDEN_REQUESTS["dgx-h100"]))
    assert "export NCCL_IB_HCA='=mlx5_0:1,mlx5_3:1," in h100
    assert "NCCL_IB_GID_INDEX" not in h100 and "export NCCL_DEBUG=WARN" in h100
    roce = render_script(plan_for(GOLDEN_REQUESTS["a100-roce"]))
    assert "export NCCL_IB_GID_INDEX=3" in roce and "#SBATCH --gres=gpu:4" in roce
    demo = render_script(plan_for(GOLDEN_REQUESTS["local-demo"]))
    assert "export NCCL_IB_DISABLE=1" in demo and "export GLOO_SOCKET_IFNAME=eth0" in demo


def test_a_cpu_job_requests_no_gpus_and_runs_ranks_unbound(tmp_path):
    script = render_script(plan_for(SubmitRequest(site_ref="dgx-h100", program=("./prep.sh",), nodes=2,
                                                  gpus_per_node=0)))
    check_shell(script, tmp_path)
    assert "--gpus-per-node" not in script and "#SBATCH --ntasks-per-node=1" in script
    assert '"bind": false' in script and '"tasks_per_node": 1' in script


def test_values_not_safe_in_sbatch_lines_go_on_sbatch_argv():
    plan = plan_for(GOLDEN_REQUESTS["dgx-h100"])
    script = render_script(plan)
    assert sbatch_argv(plan) == ["sbatch", "--parsable", "--job-name=llama 70b"]
    assert "#SBATCH --job-name" not in script
    assert [line for line in script.splitlines() if line.startswith("#SBATCH")] == [
        "#SBATCH --partition=h100", "#SBATCH --nodes=18", "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=2-00:00:00", "#SBATCH --exclusive", "#SBATCH --no-kill"]


@pytest.mark.parametrize("value, safe", [("train", True), ("gpu:8", True), ("node[1-3]", True),
                                         ("a b", False), ("x\n#SBATCH --qos=high", False), ("it's", False),
                                         ('"q"', False), ("a\\b", False), ("a#b", False)])
def test_directive_safety(value, safe):
    assert directive_safe(SbatchOption("--job-name", value)) is safe


def test_an_unfiltered_value_is_a_render_error_not_an_injection():
    environment = template_environment()
    with pytest.raises(TypeError, match="unfiltered value"):
        environment.from_string("echo {{ name }}").render(name="$(reboot)")
    assert environment.from_string("echo {{ name | q }}").render(name="$(reboot)") == "echo '$(reboot)'"


def test_an_undefined_variable_is_a_render_error():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        template_environment().from_string("echo {{ missing | q }}").render()


def test_provenance_header_stays_one_line_per_field():
    request = SubmitRequest(site_ref="local-demo", program=("x.py", "a\nb", "#SBATCH --qos=high"), nodes=1,
                            job_name="j\n#SBATCH --qos=high")
    script = render_script(plan_for(request))
    assert script.splitlines()[3] == ("# Command: trainctl submit --site local-demo --nodes 1 -- x.py "
                                      "$'a\\nb' '#SBATCH --qos=high'")
    assert not any(line.startswith("#SBATCH --qos") for line in script.splitlines())


# bash reads back exactly what shell_word wrote (NUL cannot be in an argv element)
@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                        max_size=12), min_size=1, max_size=25))
def test_shell_words_read_back_unchanged_by_bash(words):
    line = command_line(["printf", "%s\\0", *words])
    assert "\n" not in line
    out = subprocess.run(["bash", "-c", line], capture_output=True, timeout=30).stdout
    assert out.decode().split("\0")[:-1] == words


def test_shell_word_forms():
    assert shell_word("plain-1.0") == "plain-1.0"
    assert shell_word("=mlx5_0:1") == "'=mlx5_0:1'"
    assert shell_word("it's") == "'it'\"'\"'s'"
    assert shell_word("a\nb'c") == "$'a\\nb\\'c'"
    assert shell_word("") == "''"


def run_with_standins(tmp_path: Path, request: SubmitRequest, job_id: str, *, refuse_update: str = "",
                      **gate_answers: str):
    """Render `request` and run it with bash here: srun, scontrol and the gate are stand-ins.
    The job holds node1..nodeN (N: nodes + spare) and its batch host is node1."""
    trainctl = write_trainctl(tmp_path / "bin" / "trainctl", log=tmp_path / "gate.log", **gate_answers)
    write_srun(tmp_path / "bin")
    write_scontrol(tmp_path / "bin", refuse_update=refuse_update)
    write_squeue(tmp_path / "bin")
    plan = plan_job(load_site(request.site_ref).config, request, node_trainctl=str(trainctl),
                    node_python=sys.executable, command=("trainctl", "submit", *request.program),
                    version="0.1.0")
    script = render_script(plan)
    check_shell(script, tmp_path)
    nodes = f"node[1-{plan.allocated_nodes}]"   # and their older names, as a batch job has them
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(tmp_path),
               SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NUM_NODES=str(plan.allocated_nodes),
               SLURM_NNODES=str(plan.allocated_nodes), SLURM_JOB_NODELIST=nodes, SLURM_NODELIST=nodes,
               SLURMD_NODENAME="node1")
    script_path = tmp_path / "job.sh"   # as slurmd runs it: a file, whose path is the script's $0
    script_path.write_text(script)
    result = subprocess.run(["bash", str(script_path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=60)
    return plan, result


def test_nasty_script_path_job_name_and_args_reach_the_program_unchanged(tmp_path):
    mark = tmp_path / "pwned"
    words = nasty(mark)
    program = write_dump_program(tmp_path / "we 'ird' $(touch pwned) `x`\nname.py", tmp_path / "dumps")
    request = SubmitRequest(site_ref="local-demo", program=(str(program), *words), nodes=1,
                            job_name=words[2] + words[5])
    plan, result = run_with_standins(tmp_path, request, "77", decision="node1\n127.0.0.1")
    assert result.returncode == 0, result.stderr
    assert sbatch_argv(plan)[-1] == "--job-name=" + words[2] + words[5]
    dumps = read_dumps(tmp_path / "dumps")
    assert dumps[0]["argv"] == words
    assert not mark.exists() and not (tmp_path / "pwned").exists()
    assert dumps[0]["env"]["MASTER_ADDR"] == "127.0.0.1"
    assert dumps[0]["env"]["MASTER_PORT"] == str(20000 + 77 * 2)
    gate_dir = tmp_path / "trainctl-gate-77"
    # the gate step runs in the background beside `gate decide --wait`: either may log first
    assert sorted((tmp_path / "gate.log").read_text().splitlines()) == [
        f"decide gate decide --site local-demo --partition gpu --dir {gate_dir} --nodes 1 --min-nodes 1 --wait",
        f"node1 gate node --site local-demo --partition gpu --dir {gate_dir}"]  # SLURMD_NODENAME of the job
    _, job_step = srun_steps(tmp_path)
    assert job_step[:4] == ["--nodelist=node1", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]


def srun_steps(tmp_path: Path) -> tuple[list[str], list[str]]:
    """The gate step's and the job step's srun arguments (the gate's may be logged second)."""
    # one entry per srun: each argument NUL-terminated, then a newline (arguments may hold newlines)
    steps = [entry.split("\0") for entry in (tmp_path / "bin" / "srun.log").read_text().split("\0\n") if entry]
    (gate_step,) = [step for step in steps if "--job-name=trainctl-gate" in step]
    (job_step,) = [step for step in steps if not any(a.startswith("--job-name=trainctl-") for a in step)]
    return gate_step, job_step


def test_the_job_step_runs_on_as_many_nodes_as_the_gate_chose(tmp_path):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/true",), nodes=4, min_nodes=2, spare=1)
    _, result = run_with_standins(tmp_path, request, "80", decision="node[1,4-5]\n10.0.0.1")
    assert result.returncode == 0, result.stderr
    assert "running on node[1,4-5], MASTER_ADDR 10.0.0.1" in result.stdout
    gate_step, job_step = srun_steps(tmp_path)
    assert gate_step[:5] == ["--overlap", "--job-name=trainctl-gate", "--ntasks=5", "--ntasks-per-node=1",
                             "--kill-on-bad-exit=0"]
    assert job_step[:4] == ["--nodelist=node[1,4-5]", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1"]


def scontrol_updates(tmp_path: Path) -> list[str]:
    log = tmp_path / "bin" / "scontrol-update.log"
    return log.read_text().splitlines() if log.exists() else []


def sentinel_starts(tmp_path: Path) -> int:
    steps = (tmp_path / "bin" / "srun.log").read_text().split("\0\n")
    return sum("--job-name=trainctl-sentinel" in step.split("\0") for step in steps)


def test_the_job_is_shrunk_to_the_chosen_nodes_and_later_steps_see_the_new_size(tmp_path):
    # node1 (batch host) and node[4-5] chosen: node[2-3] released; the sentinel ran on node2, so
    # it is started again (on the new second node)
    request = SubmitRequest(site_ref="local-demo", program=("/bin/sh", "-c", "echo NODES=$SLURM_JOB_NUM_NODES"),
                            nodes=4, min_nodes=2, spare=1)
    _, result = run_with_standins(tmp_path, request, "81", decision="node[1,4-5]\n10.0.0.1")
    assert result.returncode == 0, result.stderr
    assert scontrol_updates(tmp_path) == ["update JobId=81 NodeList=node[1,4-5]"]
    assert (tmp_path / "trainctl-gate-81" / "slurm_job_81_resize.sh").exists()  # not in the submit directory
    assert "released the nodes the job does not use; it now holds node[1,4-5]" in result.stdout
    assert "NODES=3" in result.stdout  # the program's step sees the sourced size
    assert sentinel_starts(tmp_path) == 2
    _, job_step = srun_steps(tmp_path)
    assert job_step[:2] == ["--nodelist=node[1,4-5]", "--nodes=3"]
    journal = [json.loads(line) for line in (tmp_path / "trainctl-gate-81" / "journal.jsonl").read_text().splitlines()]
    assert [event["event"] for event in journal] == ["job_start", "gate_start", *["node_verdict"] * 5, "gate_end",
                                                     "released", "training_start", "step_end", "job_end"]
    assert [(event["node"], event["verdict"]) for event in journal[2:7]] == [
        ("node1", "chosen"), ("node2", "excluded"), ("node3", "excluded"), ("node4", "chosen"), ("node5", "chosen")]
    assert journal[7]["chosen"] == ["node1", "node4", "node5"] and journal[7]["master_addr"] == "10.0.0.1"
    assert journal[8]["holds"] == "node[1,4-5]" and journal[10]["status"] == 0
    assert all(a["t"] <= b["t"] for a, b in zip(journal, journal[1:]))


def test_the_batch_host_stays_in_the_job_when_the_gate_left_it_out(tmp_path):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/true",), nodes=2, spare=2)
    _, result = run_with_standins(tmp_path, request, "82", decision="node[2-3]\n10.0.0.2")
    assert result.returncode == 0, result.stderr
    assert scontrol_updates(tmp_path) == ["update JobId=82 NodeList=node[1-3]"]
    assert sentinel_starts(tmp_path) == 1  # node2 stays: the sentinel keeps running there
    _, job_step = srun_steps(tmp_path)
    assert job_step[:2] == ["--nodelist=node[2-3]", "--nodes=2"]


def test_nothing_to_release_no_update(tmp_path):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/true",), nodes=2, spare=1)
    _, result = run_with_standins(tmp_path, request, "83", decision="node[1-3]\n10.0.0.1")
    assert result.returncode == 0, result.stderr
    assert scontrol_updates(tmp_path) == []


def test_a_refused_resize_is_one_warning_and_the_job_runs_on(tmp_path):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/echo", "PROGRAM RAN"), nodes=2, spare=2)
    refusal = "slurm_update error: Access/permission denied"
    _, result = run_with_standins(tmp_path, request, "84", decision="node1,node4\n10.0.0.1",
                                  refuse_update=refusal)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [f"trainctl: warning: the job keeps all its nodes: scontrol update "
                        f"NodeList=node[1,4]: {refusal}"]
    assert "PROGRAM RAN" in result.stdout
    assert sentinel_starts(tmp_path) == 2  # cancelled before the attempt (node2 was to go), started again


def test_release_unused_off_renders_no_resize():
    site = load_site("local-demo").config
    site = dataclasses.replace(site, launch=dataclasses.replace(site.launch, release_unused=False))
    request = GOLDEN_REQUESTS["local-demo"]
    script = render_script(plan_job(site, request, node_trainctl=NODE_TRAINCTL, node_python=NODE_PYTHON,
                                    command=("trainctl",), version="0"))
    assert '"release_unused": false' in script and "go back to Slurm" not in script
    assert '"release_unused": true' in render_script(plan_for(request))


def test_too_few_healthy_nodes_stop_the_script_with_the_gates_line(tmp_path):
    failure = "gate: 1 of 4 nodes healthy, need 2: node2 nvlink.links failed; node3 straggler"
    request = SubmitRequest(site_ref="local-demo", program=("/bin/echo", "PROGRAM RAN"), nodes=2, spare=2)
    _, result = run_with_standins(tmp_path, request, "78", failure=failure)
    assert result.returncode == 2
    assert failure in result.stderr.splitlines()
    assert "PROGRAM RAN" not in result.stdout


def test_a_decision_without_master_address_stops_the_script(tmp_path):
    request = SubmitRequest(site_ref="local-demo", program=("/bin/echo", "PROGRAM RAN"), nodes=1)
    _, result = run_with_standins(tmp_path, request, "79", decision="node1")
    assert result.returncode == 2
    assert "decision.json names no chosen nodes and MASTER_ADDR" in result.stderr
    assert "PROGRAM RAN" not in result.stdout


def test_site_launch_env_is_exported_quoted_after_trainctls_own(tmp_path):
    import dataclasses

    from trainctl.site import LaunchConfig

    site = load_site("a100-roce").config
    nasty_value = "a b 'q' \"dq\" $(touch pwned) `touch pwned`\nline2"
    site = dataclasses.replace(site, launch=LaunchConfig(env={"NCCL_IB_TC": "106", "UCX_TLS": nasty_value}))
    plan = plan_job(site, GOLDEN_REQUESTS["a100-roce"], node_trainctl=NODE_TRAINCTL, node_python=NODE_PYTHON,
                    command=("trainctl",), version="0.1.0")
    assert [s.name for s in plan.environment][-2:] == ["NCCL_IB_TC", "UCX_TLS"]
    script = render_script(plan)
    check_shell(script, tmp_path)
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    echoed = subprocess.run(["bash", "-c", exports + '\nprintf %s "$UCX_TLS"'], capture_output=True, text=True,
                            cwd=tmp_path)
    assert echoed.stdout == nasty_value and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["NCCL_IB_HCA", "RANK", "MASTER_PORT", "SLURM_NTASKS", "NCCL_DEBUG"])
def test_site_launch_env_may_not_set_what_trainctl_sets(name):
    import dataclasses

    from trainctl.errors import UsageError
    from trainctl.site import LaunchConfig

    site = load_site("a100-roce").config
    site = dataclasses.replace(site, launch=LaunchConfig(env={name: "x"}))
    with pytest.raises(UsageError, match=f"launch.env.{name}: trainctl sets {name} itself"):
        plan_job(site, GOLDEN_REQUESTS["a100-roce"], node_trainctl=NODE_TRAINCTL, node_python=NODE_PYTHON,
                 command=("trainctl",), version="0.1.0")
