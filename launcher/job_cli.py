"""`trainctl job show`: after (or during) a job, what the gate decided and where each rank stopped."""

from __future__ import annotations

import json
import os

import click


@click.group("job")
def job() -> None:
    """Look at a job trainctl submitted: its gate decision, its attempts, its ranks' logs."""


@job.command("show")
@click.argument("job_id")
@click.option("--dir", "gate_dir", help="The job's gate directory (default: trainctl-gate-JOBID in the job's "
                                        "working directory, as Slurm reports it).")
@click.option("--lines", "line_count", type=click.IntRange(1, 200), default=5, show_default=True,
              help="Last lines of each rank's log.")
@click.option("--remote", metavar="[USER@]HOST[:PORT]",
              help="Read it on the login node over SSH (SFTP and scontrol there); "
                   "keys and host keys as for submit.")
@click.option("--identity", type=click.Path(dir_okay=False),
              help="Private key for --remote (default: ssh-agent).")
@click.option("--known-hosts", type=click.Path(dir_okay=False),
              help="Verify the login node's host key against this file (default: ~/.ssh/known_hosts).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(job_id, gate_dir, line_count, remote, identity, known_hosts, as_json):
    """The gate decision, Slurm's record and attempts, and the last lines of each rank's log.

    Ranks whose last lines are identical are folded into one group; the odd ones out come
    first, with how long before the newest write each stopped writing: in a hung job, that is
    usually the rank everyone else is waiting for. NCCL flight recorder dumps in the gate
    directory are listed.
    """
    import getpass

    from trainctl.launcher.job_show import LocalFiles, RemoteFiles, collect_job, format_job, to_json

    if remote:
        from trainctl.launcher.submit import parse_remote
        from trainctl.ssh import connect

        target = parse_remote(remote, getpass.getuser())
        files = RemoteFiles(connect(target.user, target.host, target.port, identity=identity,
                                    known_hosts=known_hosts or os.path.expanduser("~/.ssh/known_hosts")))
    else:
        files = LocalFiles()
    try:
        view = collect_job(files, job_id, gate_dir, line_count)
    finally:
        if remote:
            files.close()
    text = json.dumps(to_json(view, line_count), indent=1) + "\n" if as_json else format_job(view, line_count)
    click.echo(text, nl=False)


@job.command("retry", context_settings={"allow_interspersed_args": False})
@click.option("--dir", "gate_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="This job's gate directory (retry.json and the report are written there).")
@click.option("--after", "phase", type=click.Choice(["gate", "step"]), required=True,
              help="What failed: the gate (too few healthy nodes) or the training step.")
@click.option("--status", type=int, required=True, help="Exit status of gate decide or of the training srun.")
@click.option("--nodes", "hostlist", required=True, help="The step's nodes (gate: the job's allocated nodes).")
@click.option("--retries", type=click.IntRange(min=0), required=True, help="submit --retries of this job.")
@click.option("--script", "script_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The batch script to submit again (the job script's own $0).")
@click.argument("sbatch_options", nargs=-1, type=click.UNPROCESSED, metavar="-- [SBATCH OPTIONS]...")
def retry(gate_dir, phase, status, hostlist, retries, script_path, sbatch_options):
    """Inside a job whose gate or training step failed: submit its successor around the bad nodes.

    Run by the job script trainctl renders with --retries N. A node counts as bad when the gate
    excluded it (after too few were healthy), or, after the training step failed, when Slurm
    removed it from the job or marks it down or not responding, or a probe step cannot start a
    task on it. A program that failed on nodes that all still answer is not retried. The
    successor is the same script with --exclude (earlier and new bad nodes),
    --dependency=afterany:THIS_JOB and a --comment naming the attempt. Always exits 0: the job
    script exits with the status of what failed.
    """
    from trainctl.errors import TrainctlError
    from trainctl.launcher import retry as retrying
    from trainctl.slurm import expand_hostlist

    env = dict(os.environ)
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        from trainctl.errors import UsageError
        raise UsageError("job retry runs inside a Slurm job (no SLURM_JOB_ID)")
    attempt = retrying.attempt_from_environment(env, job_id, retries)
    evidence = retrying.collect_evidence(phase, status, expand_hostlist(hostlist), gate_dir, env)
    decision = retrying.decide_retry(attempt, evidence)
    successor = error = None
    if decision.retry:
        argv = retrying.successor_argv(attempt, decision, tuple(sbatch_options))
        try:
            with open(script_path) as handle:
                script_text = handle.read()
            successor_env = retrying.successor_environment(env, attempt, decision)
            successor = retrying.submit_successor(script_text, argv, successor_env,
                                                  env.get("SLURM_SUBMIT_DIR") or os.getcwd())
        except (OSError, TrainctlError) as exc:
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    rec = retrying.record(attempt, evidence, decision, successor, error)
    retrying.write_json(os.path.join(gate_dir, retrying.RETRY_FILE), rec)
    if successor:
        next_dir = os.path.join(os.path.dirname(os.path.abspath(gate_dir)), f"trainctl-gate-{successor}")
        os.makedirs(next_dir, exist_ok=True)
        retrying.write_json(os.path.join(next_dir, retrying.ATTEMPT_FILE), {
            "job_id": successor, "attempt": decision.next_attempt, "retries": retries,
            "previous_job": job_id, "excluded": list(decision.exclude)})
    line = "trainctl: " + retrying.summary_line(rec)
    try:
        with open(os.path.join(gate_dir, "report.txt"), "a") as report:
            report.write(f"\nretry: {retrying.summary_line(rec)}\n")
    except OSError:
        pass
    click.echo(line)
