"""`trainctl submit`: bad input, dry run, local sbatch (stand-in), imports, and the plan's rules."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.submit_standins import JOB_ID, write_sbatch
from trainctl.errors import UsageError
from trainctl.launcher.plan import SubmitRequest, plan_job
from trainctl.site import load_site
from trainctl.launcher.submit import parse_parsable, parse_remote

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))
TRAIN_DDP = str(REPO / "examples" / "train_ddp.py")


def submit(tmp_path: Path, *args: str, cwd: Path | None = None):
    """Run `trainctl submit ARGS` with a recording stand-in sbatch first on PATH."""
    write_sbatch(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return subprocess.run([TRAINCTL, "submit", *args], capture_output=True, text=True, env=env,
                          cwd=cwd or tmp_path, timeout=60)


def sbatch_ran(tmp_path: Path) -> bool:
    return (tmp_path / "bin" / "sbatch.argv.json").exists()


def plan(request: SubmitRequest, site: str = "local-demo"):
    return plan_job(load_site(site).config, request, node_trainctl="/n/trainctl", node_python="/n/python",
                    command=("trainctl", "submit"), version="0")


# ---------------------------------------------------------------- bad input: one line, exit 2, no job

def test_bad_site_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((REPO / "site-configs" / "local-demo.toml").read_text().replace(
        "gpus_per_node = 1", 'gpus_per_node = "one"'))
    result = submit(tmp_path, "--site", str(bad), "--nodes", "1", "--", TRAIN_DDP)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"trainctl: error: {bad}: partitions.gpu.gpus_per_node: expected an integer, got a string 'one'"]
    assert not sbatch_ran(tmp_path)


def test_unknown_site(tmp_path):
    result = submit(tmp_path, "--site", "no-such-site", "--nodes", "1", "--", TRAIN_DDP)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "unknown site 'no-such-site'" in result.stderr
    assert not sbatch_ran(tmp_path)


def test_unknown_partition(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--partition", "h100", "--nodes", "1", "--", TRAIN_DDP)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "trainctl: error: site 'local-demo' has no partition 'h100' (known: gpu)"]
    assert not sbatch_ran(tmp_path)


def test_zero_nodes(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "0", "--", TRAIN_DDP)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["trainctl: error: --nodes must be at least 1, got 0"]
    assert not sbatch_ran(tmp_path)


def test_script_that_does_not_exist(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--", "examples/no_such.py")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"trainctl: error: script 'examples/no_such.py' does not exist (relative to {tmp_path})"]
    assert not sbatch_ran(tmp_path)


def test_script_that_is_not_executable(tmp_path):
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--", "run.sh")
    assert result.returncode == 2
    assert "is not executable" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not sbatch_ran(tmp_path)


@pytest.mark.parametrize("args, message", [
    (["--spare", "-1"], "--spare must be 0 or more, got -1"),
    (["--min-nodes", "3"], "--min-nodes must be between 1 and --nodes (2), got 3"),
    (["--gpus-per-node", "2"], "--gpus-per-node must be between 0 and 1 (partition gpu), got 2"),
    (["--time", "tomorrow"], "--time 'tomorrow' is not a Slurm time limit"),
    (["--chdir", "no/such/dir"], "--chdir no/such/dir: no such directory"),
])
def test_other_bad_options_are_one_line(tmp_path, args, message):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "2", *args, "--", TRAIN_DDP)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr
    assert not sbatch_ran(tmp_path)


HOSTILE_CHECKPOINTS = {
    "/*/*/*/*/*.pt": "an absolute pattern names 2 directories before its first wildcard",
    "/scratch/*/ckpt.pt": "an absolute pattern names 2 directories before its first wildcard",
    "../../*.pt": "climbs out of the submit directory with '..'",
    "out/**/*.pt": "holds '**'",
    "a*/b*/c*/d*/e.pt": "has wildcards in 4 levels, more than 3",
    "ckpt/\x1b[2J*.pt": "holds a control character",
    "ckpt/*.pt\nrm": "holds a control character",
}


@pytest.mark.parametrize("pattern", HOSTILE_CHECKPOINTS)
def test_a_checkpoint_pattern_that_would_search_far_or_move_the_terminal_is_refused_at_submit(tmp_path, pattern):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--checkpoints", pattern, "--", TRAIN_DDP)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainctl: error: --checkpoints: {HOSTILE_CHECKPOINTS[pattern]}")
    assert not sbatch_ran(tmp_path)


@pytest.mark.parametrize("pattern", ["snapshot.pt", "out/checkpoint-*", "runs/*/seed-?/ckpt/*.pt",
                                     "/scratch/me/ckpt-*.pt", ""])
def test_a_checkpoint_pattern_of_the_programs_own_files_is_taken(tmp_path, pattern):
    request = SubmitRequest(site_ref="local-demo", program=(TRAIN_DDP,), nodes=1, checkpoints=pattern)
    assert plan(request).checkpoints == pattern


def test_a_sites_checkpoint_pattern_is_held_to_the_same_rules(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site-configs" / "local-demo.toml").read_text().replace(
        "[launch]", '[launch]\ncheckpoints = "/*/*.pt"'))
    result = submit(tmp_path, "--site", str(site), "--nodes", "1", "--", TRAIN_DDP)
    assert result.returncode == 2
    assert result.stderr.startswith(f"trainctl: error: {site}: launch.checkpoints: an absolute pattern names 2 "
                                    "directories before its first wildcard")
    assert not sbatch_ran(tmp_path)


# ---------------------------------------------------------------- dry run and local submission

def test_dry_run_prints_script_and_command_and_submits_nothing(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "2", "--spare", "2", "--job-name", "a b",
                    "--dry-run", "--", TRAIN_DDP, "--steps", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=4" in result.stdout
    assert result.stderr.splitlines() == [
        f"trainctl: dry run, nothing submitted; would run in {tmp_path}: sbatch --parsable "
        "'--job-name=a b' < script"]
    assert not sbatch_ran(tmp_path)


def test_the_watch_is_the_sites_choice_unless_the_job_says_otherwise(tmp_path):
    from support.sites import site_variant

    unwatched = str(site_variant(tmp_path, "local-demo", {"watch.enabled": False}))
    program = (TRAIN_DDP,)
    assert plan(SubmitRequest(site_ref="local-demo", program=program, nodes=2)).watch is True
    assert plan(SubmitRequest(site_ref="local-demo", program=program, nodes=2, watch=False)).watch is False
    assert plan(SubmitRequest(site_ref=unwatched, program=program, nodes=2), unwatched).watch is False
    assert plan(SubmitRequest(site_ref=unwatched, program=program, nodes=2, watch=True), unwatched).watch is True
    # the dry run shows it, in the script's account of the job's life and in its plan
    watched = submit(tmp_path, "--site", "local-demo", "--nodes", "2", "--dry-run", "--", TRAIN_DDP)
    off = submit(tmp_path, "--site", "local-demo", "--nodes", "2", "--no-watch", "--dry-run", "--", TRAIN_DDP)
    assert watched.returncode == off.returncode == 0, watched.stderr + off.stderr
    assert '"watch": true' in watched.stdout and '"watch": false' in off.stdout
    assert "# - the watch beside the training" in watched.stdout
    assert "# - the watch beside the training" not in off.stdout
    on = submit(tmp_path, "--site", unwatched, "--nodes", "2", "--watch", "--json", "--dry-run", "--", TRAIN_DDP)
    assert json.loads(on.stdout)["plan"]["watch"] is True, on.stderr


def test_local_submit_sends_the_script_on_stdin_and_prints_the_job_id(tmp_path):
    args = ["--site", "local-demo", "--nodes", "2", "--spare", "1", "--job-name", "it's $(x)", "--",
            TRAIN_DDP, "--steps", "3"]
    dry = submit(tmp_path, *args[:-4], "--dry-run", *args[-4:])
    result = submit(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{JOB_ID}\n"
    assert json.loads((tmp_path / "bin" / "sbatch.argv.json").read_text()) == [
        "--parsable", "--job-name=it's $(x)"]
    submitted = (tmp_path / "bin" / "sbatch.stdin").read_text()
    # the same script as the dry run, but for the command line in its header and in its plan
    assert submitted.splitlines()[4:] == [line for line in dry.stdout.splitlines()[4:] if line != '  "--dry-run",']
    assert "# Command: trainctl submit --site local-demo --nodes 2 --spare 1 --job-name 'it'\"'\"'s $(x)' " \
           f"-- {TRAIN_DDP} --steps 3" in submitted


def test_json_says_what_was_submitted(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--json", "--", TRAIN_DDP)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["job_id"] == JOB_ID and report["submitted"] is True and report["where"] == "local"
    assert report["sbatch"] == ["sbatch", "--parsable"]
    assert report["script"] == (tmp_path / "bin" / "sbatch.stdin").read_text()
    python, *program = report["plan"]["program"]
    assert report["plan"]["nodes"] == 1 and program == [TRAIN_DDP]
    assert Path(python).parent == Path(sys.executable).parent  # the venv's python runs .py scripts


def test_chdir_submits_from_that_directory(tmp_path):
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    (workdir / "job.py").write_text("print(1)\n")
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--chdir", str(workdir), "--dry-run",
                    "--", "job.py")
    assert result.returncode == 0, result.stderr
    assert f"would run in {workdir}:" in result.stderr


def test_a_site_name_reaches_the_nodes_as_the_absolute_path_it_resolved_to(tmp_path):
    # A site found by name in ./site-configs of the directory submit runs in: the job runs in
    # --chdir, where that name would not be found again; the nodes get the loaded file's path.
    sites = tmp_path / "site-configs"
    sites.mkdir()
    (sites / "mine.toml").write_text((REPO / "site-configs" / "local-demo.toml").read_text())
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "job.py").write_text("print(1)\n")
    result = submit(tmp_path, "--site", "mine", "--nodes", "1", "--chdir", str(workdir), "--dry-run", "--json",
                    "--", "job.py")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    plan_text = report["script"].split("<<'TRAINCTL_PLAN'\n", 1)[1].rsplit("TRAINCTL_PLAN", 1)[0]
    assert json.loads(plan_text)["site_ref"] == str((sites / "mine.toml").resolve())


def test_a_bare_script_name_runs_the_file_the_check_found(tmp_path):
    # `submit -- run.sh`: an executable in the submit directory, no slash. Exec'd by that bare
    # name, the job's exec would search PATH; the plan names the file the check found instead.
    run_sh = tmp_path / "run.sh"
    run_sh.write_text("#!/bin/sh\necho ran\n")
    run_sh.chmod(0o755)
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--dry-run", "--json", "--", "run.sh", "x")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["plan"]["program"] == [str(run_sh), "x"]
    plan_text = report["script"].split("<<'TRAINCTL_PLAN'\n", 1)[1].rsplit("TRAINCTL_PLAN", 1)[0]
    assert json.loads(plan_text)["program"] == [str(run_sh), "x"]   # what the job's supervisor runs
    # a command found on PATH runs as the file found there
    on_path = json.loads(submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--dry-run", "--json",
                                "--", "sbatch").stdout)
    assert on_path["plan"]["program"] == [str(tmp_path / "bin" / "sbatch")]


def test_a_failing_sbatch_is_an_external_error(tmp_path):
    bin_dir = tmp_path / "bin"
    write_sbatch(bin_dir).write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                     "Invalid partition name specified' >&2\nexit 1\n")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    result = subprocess.run([TRAINCTL, "submit", "--site", "local-demo", "--nodes", "1", "--", TRAIN_DDP],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 4
    assert result.stderr.splitlines() == [
        "trainctl: error: sbatch exited with status 1: sbatch: error: Batch job submission failed: "
        "Invalid partition name specified"]


@pytest.mark.parametrize("args", [["--help"],
                                  ["--site", "local-demo", "--nodes", "2", "--dry-run", "--", TRAIN_DDP]])
def test_help_and_dry_run_load_neither_torch_nor_paramiko(args):
    code = ("import sys; from trainctl.cli import main; rc = main(sys.argv[1:]); "
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'paramiko'}); "
            "print('HEAVY', heavy, 'JINJA', 'jinja2' in sys.modules, rc, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, "submit", *args], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert "HEAVY [] " in result.stderr and result.stderr.rstrip().endswith(" 0")
    if args == ["--help"]:
        assert "JINJA False" in result.stderr


def test_remote_without_a_host_and_no_login_host_in_the_site(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--remote", "--", TRAIN_DDP)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "trainctl: error: --remote needs [USER@]HOST: site 'local-demo' sets no login_host"]


# ---------------------------------------------------------------- the plan (pure)

def test_plan_defaults_come_from_the_partition():
    job = plan(SubmitRequest(site_ref="dgx-h100", program=("train.py",), nodes=4), site="dgx-h100")
    assert (job.gpus_per_node, job.tasks_per_node, job.min_nodes, job.allocated_nodes, job.job_name) == (
        8, 8, 4, 4, "train")
    assert job.trainctl == "/opt/trainctl/bin/trainctl"  # the site's launch.trainctl wins
    assert job.program == ("/opt/trainctl/bin/python", "train.py")


def test_a_cpu_job_has_one_rank_per_node_and_no_binding():
    job = plan(SubmitRequest(site_ref="local-demo", program=("./run",), nodes=2, gpus_per_node=0))
    assert (job.tasks_per_node, job.bind) == (1, False)
    assert not any(option.name.startswith("--gpus") for option in job.sbatch_options)
    assert job.trainctl == "/n/trainctl" and job.program == ("./run",)


def test_gpu_request_follows_the_sites_slurm():
    roce = plan(SubmitRequest(site_ref="a100-roce", program=("t.py",), nodes=1), site="a100-roce")
    assert [o.argv for o in roce.sbatch_options if "gpu" in o.name or "gres" in o.name] == ["--gres=gpu:8"]


def test_site_extra_sbatch_must_be_options(tmp_path):
    text = (REPO / "site-configs" / "local-demo.toml").read_text().replace(
        "extra_sbatch = []", 'extra_sbatch = ["exclusive"]')
    (tmp_path / "x.toml").write_text(text)
    with pytest.raises(UsageError, match="extra_sbatch item 'exclusive' is not an option"):
        plan_job(load_site(str(tmp_path / "x.toml")).config,
                 SubmitRequest(site_ref="x", program=("t.py",), nodes=1),
                 node_trainctl="t", node_python="p", command=(), version="0")


@pytest.mark.parametrize("limit", ["30", "10:00", "2:00:00", "1-0", "1-12:00", "7-00:00:00"])
def test_slurm_time_formats_are_accepted(limit):
    assert plan(SubmitRequest(site_ref="local-demo", program=("t.py",), nodes=1, time_limit=limit))


def test_sbatch_parsable_output():
    assert parse_parsable("1234\n") == ("1234", None)
    assert parse_parsable("1234;cluster2\n") == ("1234", "cluster2")
    with pytest.raises(Exception, match="no job id"):
        parse_parsable("sbatch: error: something\n")


@pytest.mark.parametrize("text, expected", [("login1", ("me", "login1", 22)),
                                            ("alice@login1", ("alice", "login1", 22)),
                                            ("alice@10.0.0.1:2222", ("alice", "10.0.0.1", 2222))])
def test_remote_targets(text, expected):
    target = parse_remote(text, "me")
    assert (target.user, target.host, target.port) == expected


def test_a_bad_remote_target_is_a_usage_error():
    with pytest.raises(UsageError, match="expected"):
        parse_remote("a b@c", "me")


def test_sbatch_passes_more_options_for_this_job_and_refuses_what_trainctl_sets(tmp_path):
    result = submit(tmp_path, "--site", "local-demo", "--nodes", "1", "--sbatch=--qos=high", "--sbatch",
                    "--constraint=h100&ib", "--sbatch=--exclusive", "--dry-run", "--", TRAIN_DDP)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.index("#SBATCH --qos=high") < lines.index("#SBATCH --constraint=h100&ib") \
        < lines.index("#SBATCH --exclusive")
    for option, message in (("--time=1", "trainctl sets --time itself; use --time"),
                            ("--nodes=3", "trainctl sets --nodes itself; use --nodes and --spare"),
                            ("-A", "expected a long sbatch option"),
                            ("--qos high", "expected a long sbatch option")):
        refused = submit(tmp_path, "--site", "local-demo", "--nodes", "1", f"--sbatch={option}", "--", TRAIN_DDP)
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1 and message in refused.stderr
        assert not sbatch_ran(tmp_path)
