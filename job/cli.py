"""`trainctl job run` (the supervisor, inside the job script) and `trainctl job show` (after or
during a job: its timeline and goodput, what the gate decided and where each rank stopped)."""

from __future__ import annotations

import json
import os

import click


@click.group("job")
def job() -> None:
    """A job trainctl submitted: run its life (inside the job), or look at it afterwards."""


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
@click.option("--follow", is_flag=True,
              help="Follow the chain as it runs, from its job directories on this machine: redrawn at the "
                   "site's watch.poll_s on a terminal, a line per event otherwise; exits with the job's "
                   "status when the chain ends. Ctrl-C leaves the job alone.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the chain as one self-contained HTML page to this file: a timeline of each job, "
                   "the step time with each detection, where the goodput went.")
def show(job_id, gate_dir, line_count, remote, identity, known_hosts, as_json, follow, html_file):
    """The timeline and goodput, the gate decision, Slurm's record and attempts, each rank's last lines.

    The timeline is every event of every attempt's journal (trainctl-gate-JOBID/journal.jsonl),
    from the first submit. Goodput is productive training time over the wall time since the
    first submit; productive time is the training step's time, less the work after the last
    checkpoint seen when a step failed (a file named by submit --checkpoints or the site's
    launch.checkpoints written, $TRAINCTL_CHECKPOINT_FILE written, or progress.checkpoint()
    called; without any, a failed step's whole time is lost). The lost time is split
    into queue, gate, restart and lost work. With the watch, each detection's cost (to training
    again) and the work it threw away, and the goodput without the watch where the journal
    allows an estimate (a slowdown that left a node out or was not localised).

    Ranks whose last lines are identical are folded into one group; the odd ones out come
    first, with how long before the newest write each stopped writing: in a hung job, that is
    usually the rank everyone else is waiting for. NCCL flight recorder dumps in the gate
    directory are listed.

    --follow shows the chain live instead: its phase, each training node's agent and step
    time against the job's own baseline, the last checkpoint's age, the goodput so far and each
    event as it happens. --html draws the chain on one page.
    """
    import getpass
    import time

    from trainctl.errors import UsageError
    from trainctl.job.show import LocalFiles, RemoteFiles, collect_job, format_job, json_text, to_json

    if follow:
        if remote or as_json or html_file:
            raise UsageError("--follow reads the job directory on this machine and draws it: "
                             "not with --remote, --json or --html (run it on a login node that sees the directory)")
        return follow_chain(job_id, gate_dir)
    if html_file and (as_json or remote):
        raise UsageError("--html draws the job directory on this machine as a page: not with --json or --remote")
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
    now = time.time()
    if html_file:
        from trainctl.files import write_atomically
        from trainctl.job.chain_html import chain_page, collect_rounds

        write_atomically(html_file, chain_page(view, collect_rounds(view), now))
        click.echo(f"trainctl: wrote {html_file}: the chain of job {job_id} on one page")
        return 0
    text = json_text(to_json(view, line_count, now)) if as_json else format_job(view, line_count, now)
    click.echo(text, nl=False)


def follow_chain(job_id: str, gate_dir: str | None) -> int:
    import sys

    from trainctl.job.follow import Follower, follow, site_watch
    from trainctl.job.show import LocalFiles, find_job

    gate_dir, _, _ = find_job(LocalFiles(), job_id, gate_dir)
    return follow(Follower(gate_dir, job_id, site_watch), sys.stdout, tty=sys.stdout.isatty())


@job.command("run", context_settings={"allow_interspersed_args": False})
@click.option("--plan", "plan_file", required=True, type=click.File("r"),
              help="The job plan `trainctl submit` wrote into the job script ('-': stdin).")
@click.option("--script", "script_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="The batch script itself (its $0): a retry submits it again.")
@click.argument("training_line", nargs=-1, type=click.UNPROCESSED, metavar="[-- TRAINING LINE...]")
def run_command(plan_file, script_path, training_line):
    """Inside the batch script: run the job's life, gate -> release -> training -> retry or end.

    The supervisor trainctl's job scripts hand over to. It runs the health gate step on every
    node and `gate decide`, gives back the nodes the job does not use, runs the training step
    on the chosen nodes and, with submit --retries, submits the successor around bad nodes.
    Every event goes to trainctl-gate-JOBID/journal.jsonl (`trainctl job show`). Exits with
    the status of the step that ended the job.

    After `--`, the training line of the user's own job script, as bash expanded it
    (`trainctl submit job.sbatch`): its srun and launcher are translated here, and each rank runs
    the program they would have run.
    """
    from trainctl.errors import UsageError
    from trainctl.job.driver import run_job
    from trainctl.launcher.plan import JobPlan

    try:
        document = json.loads(plan_file.read())
    except ValueError as exc:
        raise UsageError(f"--plan: not JSON: {exc}") from None
    plan = JobPlan.from_document(document)
    if training_line:
        import dataclasses

        from trainctl.launcher.job_script import JOB_SCRIPT_PYTHON, program_at_run_time
        from trainctl.site import load_site

        python = load_site(plan.site_ref).config.launch.python or JOB_SCRIPT_PYTHON
        program, line = program_at_run_time(tuple(training_line), python)
        click.echo(f"trainctl: {line}")
        plan = dataclasses.replace(plan, program=program)
    return run_job(plan, script_path, dict(os.environ))


@job.command("agent")
@click.option("--dir", "gate_dir", required=True, type=click.Path(file_okay=False),
              help="The job's gate directory: the node file goes to DIR/watch/NODE.json.")
@click.option("--site", "site_ref", required=True, help="Site name or .toml file (its [watch] section).")
@click.option("--partition", "partition_name", help="Partition (default: the site's default_partition).")
def agent_command(gate_dir, site_ref, partition_name):
    """Inside the job, one task per training node: watch the training on this node.

    Reads the ranks' progress reports (trainctl.progress) on the node's socket, re-runs the
    site's watch.checks every watch.check_interval_s (the first run is the baseline: a check
    that fails later, and did not then, is reported; one that cannot tell is reported as
    unknown), and rewrites DIR/watch/NODE.json every watch.agent_write_s for the supervisor.
    When DIR/watch/dump-request holds a new token, it writes each rank's Python stacks
    (py-spy dump) to DIR/watch/stacks-NODE.txt, then the token to DIR/watch/dump-done-NODE.
    Runs until SIGTERM.
    """
    from trainctl.job.agent import run_agent

    return run_agent(gate_dir, site_ref, partition_name, dict(os.environ))
