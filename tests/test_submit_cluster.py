"""`trainctl submit` on the real test cluster: real sbatch and srun, real sshd for --remote.

The gate half of trainctl is a stand-in here (its own tests cover it): it logs each call and
answers `gate decide` as told, so these tests check what submit owns. The script's
quoting, the steps, the hand-over to the real rank-exec, and the program's view of its job.
"""

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from support.slurm_jobs import submit, wait_for_job
from support.submit_standins import nasty, read_dumps, standin_site, write_dump_program, write_trainctl
from trainctl.proc import run_checked
from trainctl.slurm import parse_slurm_version

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
TRAINCTL = str(Path(sys.executable).with_name("trainctl"))


def slurm_knows_job_named(devcluster, name: str) -> bool:
    """Whether a job of that (space-free) name was submitted in the last MinJobAge seconds."""
    result = run_checked(["scontrol", "show", "job", "-o"], timeout=15, env=devcluster.client_env())
    return f"JobName={name} " in result.stdout


def gate_site(tmp_path: Path, devcluster, *, decision: str = "", failure: str = "") -> Path:
    trainctl = write_trainctl(tmp_path / "standin" / "trainctl", log=tmp_path / "gate.log",
                              decision=decision, failure=failure)
    return standin_site(tmp_path, trainctl)


def first_and_last(devcluster) -> str:
    return f"node[1,4]\n{devcluster.spec.address('node1')}"


def test_train_ddp_runs_on_the_nodes_the_gate_chose(devcluster, tmp_path):
    site = gate_site(tmp_path, devcluster, decision=first_and_last(devcluster))
    result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "2", "--spare", "2", "--",
                    str(REPO / "examples" / "train_ddp.py"), "--steps", "3")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    record = wait_for_job(devcluster, job_id)
    # The job's output, then each rank's own file (the site's launch.rank_output).
    output = "".join(path.read_text() for path in [tmp_path / f"slurm-{job_id}.out",
                                                   *sorted((tmp_path / f"trainctl-gate-{job_id}").glob("rank-*.out"))])
    assert record["JobState"] == "COMPLETED", output
    gate_calls = (tmp_path / "gate.log").read_text().splitlines()
    assert sorted(line.split()[0] for line in gate_calls if " gate node " in line) == [
        "node1", "node2", "node3", "node4"]
    ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert len(ranks) == 2 and all("parameters agree" in line for line in ranks), output
    assert [line.split(" on ")[1].split(":")[0] for line in ranks] == ["node1", "node4"]


def slurm_release(devcluster) -> tuple[int, int, int]:
    """(24, 11, 5) from the cluster's `scontrol --version`."""
    result = run_checked(["scontrol", "--version"], timeout=15, env=devcluster.client_env())
    return parse_slurm_version(result.stdout)


def test_a_signal_this_slurm_refuses_is_one_line_at_submit_not_a_hung_job(devcluster, tmp_path):
    """From Slurm 24.11.1 `--signal R:...` needs preemption (CHANGELOG/slurm-24.11.md, 24.11.1: 'Deny jobs
    using the "R:" option of --signal if PreemptMode=OFF globally'); the dev cluster has PreemptMode=OFF."""
    site = gate_site(tmp_path, devcluster, decision=first_and_last(devcluster))
    result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "2", "--spare", "2",
                    "--signal", "R:USR1@60", "--", str(REPO / "examples" / "train_ddp.py"), "--steps", "1")
    if slurm_release(devcluster) >= (24, 11, 1):
        assert result.returncode == 4 and result.stdout == ""
        assert result.stderr.splitlines() == [
            "trainctl: error: sbatch exited with status 1: sbatch: error: Batch job submission failed: "
            "Preemption is required but is disabled on this system"]
    else:
        assert result.returncode == 0, result.stderr
        assert wait_for_job(devcluster, result.stdout.strip())["JobState"] == "COMPLETED"


def test_nasty_job_name_script_path_and_args_arrive_unchanged(devcluster, tmp_path):
    mark = tmp_path / "pwned"
    words = nasty(mark)
    program = write_dump_program(tmp_path / "my 'job' $(touch pwned) `touch pwned`\nx.py", tmp_path / "dumps")
    job_name = f"name 'q' \"dq\" $(touch {mark}) `touch {mark}`\nsecond line"
    site = gate_site(tmp_path, devcluster, decision=first_and_last(devcluster))
    result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "2", "--spare", "2",
                    "--job-name", job_name, "--", program.name, *words)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    record = wait_for_job(devcluster, job_id)
    assert record["JobState"] == "COMPLETED", (tmp_path / f"slurm-{job_id}.out").read_text()
    dumps = read_dumps(tmp_path / "dumps")
    assert sorted(dumps) == [0, 1]
    for rank, dump in dumps.items():
        assert dump["argv"] == words
        assert dump["env"]["SLURM_JOB_NAME"] == job_name
        assert dump["env"]["WORLD_SIZE"] == "2" and dump["env"]["NODE_RANK"] == str(rank)
        assert dump["env"]["MASTER_ADDR"] == devcluster.spec.address("node1")
        assert dump["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and dump["env"]["NCCL_IB_DISABLE"] == "1"
    assert [dumps[r]["env"]["SLURMD_NODENAME"] for r in (0, 1)] == ["node1", "node4"]
    assert not mark.exists() and not (tmp_path / "pwned").exists()


def test_a_bare_executable_name_in_the_submit_dir_is_what_the_ranks_run(devcluster, tmp_path):
    """`submit -- run.sh` (no slash, not on PATH): the pre-submit check finds it in the submit
    directory, and so must the exec inside the job, which would otherwise search PATH."""
    run_sh = tmp_path / "run.sh"
    run_sh.write_text('#!/bin/sh\necho "$RANK $1" > "ran.$RANK"\n')
    run_sh.chmod(0o755)
    site = gate_site(tmp_path, devcluster, decision=first_and_last(devcluster))
    result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "2", "--spare", "2", "--", "run.sh", "hi")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    record = wait_for_job(devcluster, job_id)
    assert record["JobState"] == "COMPLETED", (tmp_path / f"slurm-{job_id}.out").read_text()
    assert [(tmp_path / f"ran.{rank}").read_text() for rank in (0, 1)] == ["0 hi\n", "1 hi\n"]


def test_too_few_healthy_nodes_fail_the_job_with_the_gates_line(devcluster, tmp_path):
    failure = "gate: 1 healthy of 4, need 2: node2 nvlink.links failed; node3 straggler; node4 host.memory"
    site = gate_site(tmp_path, devcluster, failure=failure)
    result = submit(devcluster, tmp_path, "--site", str(site), "--nodes", "2", "--spare", "2", "--",
                    "/bin/echo", "PROGRAM RAN")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    record = wait_for_job(devcluster, job_id)
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert record["JobState"] == "FAILED" and record["ExitCode"] == "2:0"
    assert failure in output.splitlines()
    assert "PROGRAM RAN" not in output


# ---------------------------------------------------------------- --remote through a real sshd


@pytest.fixture
def login_node(devcluster):
    return devcluster.start_sshd("node1")


def remote(devcluster, cwd: Path, endpoint, *args: str, known_hosts: str | None = None):
    return submit(devcluster, cwd, "--remote", f"{endpoint.user}@{endpoint.host}", "--identity",
                  endpoint.key_path, "--known-hosts", known_hosts or endpoint.known_hosts_path, *args)


def test_remote_submit_runs_the_job(devcluster, login_node, tmp_path):
    program = write_dump_program(tmp_path / "dump args.py", tmp_path / "dumps")
    site = gate_site(tmp_path, devcluster, decision=first_and_last(devcluster))
    result = remote(devcluster, tmp_path, login_node, "--site", str(site), "--nodes", "2", "--spare", "2",
                    "--chdir", str(tmp_path), "--json", "--", program.name, "a b", "$(touch pwned)")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["where"] == f"root@{login_node.host}"
    record = wait_for_job(devcluster, report["job_id"])
    assert record["JobState"] == "COMPLETED", (tmp_path / f"slurm-{report['job_id']}.out").read_text()
    assert record["WorkDir"] == str(tmp_path)
    dumps = read_dumps(tmp_path / "dumps")
    assert sorted(dumps) == [0, 1] and all(d["argv"] == ["a b", "$(touch pwned)"] for d in dumps.values())
    assert not (tmp_path / "pwned").exists()

    # a job script over SSH: its #SBATCH lines, its environment line and its "$@" reach the ranks
    # of the training line it names, run on the gate's nodes
    scripted = tmp_path / "job-script"
    program = write_dump_program(scripted / "dump.py", scripted / "dumps")
    (scripted / "job.sbatch").write_text('#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --job-name=remote-job-script\n'
                                         'export GREETING="set by the job script"\n'
                                         f'srun {shlex.quote(sys.executable)} {program.name} "$GREETING" "$@"\n')
    result = remote(devcluster, scripted, login_node, "--site", str(site), "--spare", "2", "--chdir", str(scripted),
                    "--json", "job.sbatch", "c d")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["where"] == f"root@{login_node.host}"
    record = wait_for_job(devcluster, report["job_id"])
    output = (scripted / f"slurm-{report['job_id']}.out").read_text()
    assert record["JobState"] == "COMPLETED" and record["WorkDir"] == str(scripted), output
    assert "the job script's training line, as bash expanded it" in output, output
    dumps = read_dumps(scripted / "dumps")
    assert sorted(dumps) == [0, 1], output
    assert all(d["argv"] == ["set by the job script", "c d"] and d["env"]["SLURM_JOB_NAME"] == "remote-job-script"
               and d["env"]["WORLD_SIZE"] == "2" for d in dumps.values()), dumps
    assert [dumps[r]["env"]["SLURMD_NODENAME"] for r in (0, 1)] == ["node1", "node4"]


def test_remote_refuses_a_host_key_it_does_not_know(devcluster, login_node, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    (tmp_path / "job.py").write_text("")
    name = f"unknown-host-{os.getpid()}"
    result = remote(devcluster, tmp_path, login_node, "--site", "local-demo", "--nodes", "1",
                    "--job-name", name, "--chdir", str(tmp_path), "--", "job.py", known_hosts=str(empty))
    assert result.returncode == 4
    assert result.stderr.splitlines() == [
        f"trainctl: error: host key of {login_node.host} is not in {empty}: refusing to connect "
        "(verify the host's fingerprint out of band, then add it to that file)"]
    assert empty.read_text() == ""  # nothing was added
    assert not slurm_knows_job_named(devcluster, name)


def test_remote_refuses_a_changed_host_key(devcluster, login_node, tmp_path):
    run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], timeout=15)
    key_type, key = (tmp_path / "other.pub").read_text().split()[:2]
    forged = tmp_path / "known_hosts"
    forged.write_text(f"{login_node.host} {key_type} {key}\n")
    (tmp_path / "job.py").write_text("")
    result = remote(devcluster, tmp_path, login_node, "--site", "local-demo", "--nodes", "1",
                    "--chdir", str(tmp_path), "--", "job.py", known_hosts=str(forged))
    assert result.returncode == 4
    assert "offers a host key that does not match" in result.stderr and len(result.stderr.splitlines()) == 1


def test_remote_script_that_does_not_exist(devcluster, login_node, tmp_path):
    name = f"missing-script-{os.getpid()}"
    result = remote(devcluster, tmp_path, login_node, "--site", "local-demo", "--nodes", "1",
                    "--job-name", name, "--chdir", str(tmp_path), "--", "no_such.py")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"trainctl: error: script 'no_such.py' does not exist on the remote host "
        f"(looked for {tmp_path}/no_such.py)"]
    assert not slurm_knows_job_named(devcluster, name)


def test_a_remote_command_is_bounded_in_time_and_output(devcluster, login_node):
    """paramiko's timeout is per read: a command that keeps printing, or never exits, must
    still end at the deadline, and what it printed is capped."""
    from trainctl.errors import ExternalCommandError
    from trainctl.launcher.submit import exec_remote
    from trainctl.ssh import connect

    client = connect(login_node.user, login_node.host, login_node.port, identity=login_node.key_path,
                     known_hosts=str(login_node.known_hosts_path))
    try:
        started = time.monotonic()
        with pytest.raises(ExternalCommandError, match="timed out after 2 s"):
            exec_remote(client, "while :; do echo tick; sleep 0.1; done", "", 2.0)
        assert time.monotonic() - started < 30  # the bound holds; not a timing measurement
        status, out, _ = exec_remote(client, "head -c 5000000 /dev/zero; exit 3", "", 60.0, cap_bytes=1000)
        assert status == 3 and len(out) == 1000
    finally:
        client.close()
