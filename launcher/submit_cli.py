"""`trainctl submit` (login node) and `trainctl rank-exec` (inside the job, one per rank).

Both import their work inside the command, so `trainctl submit --help` loads Click alone and
`submit --dry-run` adds the site loader and Jinja; paramiko is loaded only for `--remote`,
torch never.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from trainctl.jobdir_names import dir_name

NCCL_DEBUG_CHOICES = ("VERSION", "WARN", "INFO", "TRACE")


class _CommandRecordingArgs(click.Command):
    """Keeps the raw arguments, so the script can say exactly which command produced it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["trainctl.raw_args"] = tuple(args)
        return super().parse_args(ctx, args)


@click.command("submit", cls=_CommandRecordingArgs, context_settings={"allow_interspersed_args": False})
@click.option("--site", required=True, help="Site name (searched on the site path) or a .toml file.")
@click.option("--partition", help="Partition of the site (default: the site's default_partition).")
@click.option("--nodes", type=int, help="Nodes the program runs on (default: a launcher's node count, "
              "e.g. torchrun --nnodes).")
@click.option("--spare", type=int, default=0, show_default=True,
              help="Extra nodes allocated so the gate can leave failed ones out.")
@click.option("--min-nodes", type=int, help="Start with at least this many healthy nodes (default: --nodes).")
@click.option("--gpus-per-node", type=int, help="GPUs (and ranks) per node (default: the partition's).")
@click.option("--time", "time_limit", help="Slurm time limit, e.g. 2:00:00 or 1-00:00:00.")
@click.option("--job-name", help="Job name (default: the script's name without suffix).")
@click.option("--nccl-debug", type=click.Choice(NCCL_DEBUG_CHOICES, case_sensitive=False),
              help="Set NCCL_DEBUG in the job.")
@click.option("--retries", type=int, default=None,
              help="Submit a successor around the bad nodes, up to this many times, when the gate finds too few "
                   "healthy nodes or a node is lost during training (default: the site's launch.retries, 0).")
@click.option("--signal", "signal_spec", metavar="[R:]SIG[@SECONDS]", default=None,
              help="Slurm sends SIG to the program's ranks SECONDS before the time limit, e.g. USR1@120, so it "
                   "can checkpoint (default: the site's launch.signal; '' for none).")
@click.option("--sbatch", "sbatch", multiple=True, metavar="--OPTION[=VALUE]",
              help="One more sbatch option for this job, after the site's [slurm] options, e.g. "
                   "--sbatch=--qos=high --sbatch=--constraint=h100 (repeat it; options trainctl sets itself "
                   "are refused).")
@click.option("--checkpoints", metavar="PATH|GLOB", default=None,
              help="The program's own checkpoint files or directories, relative to the submit directory, e.g. "
                   "'checkpoints/*.pt' or 'out/checkpoint-*': each one written during training (a directory: once "
                   "its writing has ended) counts as a checkpoint for goodput and lost work "
                   "(default: the site's launch.checkpoints; '' for none).")
@click.option("--watch/--no-watch", "watch", default=None,
              help="Watch the training for slow, sick and hung nodes and restart around them, or not, for this "
                   "job (default: the site's watch.enabled, on).")
@click.option("--alert-command", "alert_command", metavar="'COMMAND [ARGS]...'", default=None,
              help="Run this command (its words split as a shell would, never run by one) on each detection, "
                   "restart, successor and end of the job, with the event as one JSON object on stdin "
                   "(default: the site's alerts.command; '' for none).")
@click.option("--chdir", help="Submit from this directory (default: the current one): the job runs there, "
              "SCRIPT is relative to it, the gate report and slurm-<id>.out land there.")
@click.option("--exclude-lemons/--keep-lemons", "exclude_lemons", default=None,
              help="Leave the site's current lemons out of the allocation (sbatch --exclude), or not "
                   "(default: the site's fleet.submit_excludes_lemons, off).")
@click.option("--dry-run", is_flag=True, help="Print the script and the sbatch command; submit nothing.")
@click.option("--remote", is_flag=False, flag_value="", metavar="[USER@]HOST[:PORT]",
              help="Submit on this login node over SSH (without a value: the site's login_host).")
@click.option("--identity", type=click.Path(dir_okay=False),
              help="SSH private key (default: ssh-agent, ~/.ssh/id_*).")
@click.option("--known-hosts", type=click.Path(dir_okay=False),
              help="Verify the login node's host key against this file (default: ~/.ssh/known_hosts).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: job id, sbatch command, script, plan.")
@click.argument("program", nargs=-1, required=True, type=click.UNPROCESSED, metavar="JOB_SCRIPT|-- SCRIPT [ARGS]...")
@click.pass_context
def submit(ctx: click.Context, site: str, partition: str | None, nodes: int | None, spare: int,
           min_nodes: int | None, gpus_per_node: int | None, time_limit: str | None, job_name: str | None,
           nccl_debug: str | None, retries: int | None, signal_spec: str | None, sbatch: tuple[str, ...],
           checkpoints: str | None, watch: bool | None, alert_command: str | None, chdir: str | None, exclude_lemons: bool | None, dry_run: bool, remote: str | None,
           identity: str | None, known_hosts: str | None, as_json: bool, program: tuple[str, ...]) -> None:
    """Render an sbatch script for SITE's hardware and submit it (here, or over SSH).

    The job runs the health gate on all --nodes + --spare nodes, then runs SCRIPT on --nodes
    healthy ones (one rank per GPU, each bound to its GPU's CPUs and NUMA node; every rank of
    a node gets the node's HCA list for NCCL),
    or fails with one line naming the bad nodes if fewer than --min-nodes are healthy.
    A SCRIPT ending in .py, or `-m MODULE`, runs under the site's launch.python. A launcher
    before SCRIPT (torchrun, python -m torch.distributed.run, accelerate launch, deepspeed,
    after srun too) is replaced by trainctl's own ranks: one line says what was kept and dropped,
    and an option trainctl cannot honour is refused.

    A JOB_SCRIPT (a Slurm job script: named .sbatch or .slurm, or with #SBATCH lines under its
    #! line) runs as it is, with ARGS as its "$@": its #SBATCH lines are merged with the site's
    (one line for each that trainctl takes over), its environment and helper lines run once
    before the gate, and its one training line (srun with torchrun, accelerate launch, deepspeed
    or python) runs on the gate's chosen nodes, one rank per GPU. --dry-run says what it understood.
    """
    from trainctl import __version__
    from trainctl.errors import UsageError
    from trainctl.launcher.plan import SubmitRequest, parse_alert_command, plan_job, with_launcher
    from trainctl.launcher.job_script import JOB_SCRIPT_PYTHON
    from trainctl.launcher.render import command_line, job_script_parts, render_script, sbatch_argv
    from trainctl.health.check_names import check_site_check_names
    from trainctl.site import load_site
    from trainctl.launcher.submit import check_local_script, parse_remote

    _refuse_undecodable(ctx.meta["trainctl.raw_args"])
    loaded = load_site(site)
    check_site_check_names(loaded)
    target = None
    if remote is not None:
        login = remote or loaded.config.login_host
        if not login:
            raise UsageError(f"--remote needs [USER@]HOST: site {loaded.config.name!r} sets no login_host")
        import getpass

        target = parse_remote(login, getpass.getuser())
    # The nodes read the very file loaded here, by its absolute path: a name looked up again on a
    # node would search from the job's directory (missing ./site-configs under --chdir) and could
    # find another copy (/etc/trainctl/site-configs). Over --remote the file here may not exist
    # there, so the login node's search path resolves the name.
    site_ref = str(loaded.path.resolve()) if target is None else site
    job, job_args = _job_script(program[0]), program[1:]
    if job is not None:   # a job script: its #SBATCH lines under the command line's own options
        from trainctl.launcher.job_script import merge_directives

        given = {"nodes": nodes, "partition": partition, "time_limit": time_limit, "job_name": job_name,
                 "signal": signal_spec, "chdir": chdir, "gpus_per_node": gpus_per_node}
        merged = merge_directives(job.directives, given, job.name)
        for note in merged.notes if not dry_run else ():   # the dry run says them with the rest
            click.echo(f"trainctl: {note}", err=True)
        nodes, min_nodes = (nodes, min_nodes) if nodes is not None else (merged.nodes, min_nodes or merged.min_nodes)
        partition, time_limit = partition or merged.partition, time_limit or merged.time_limit
        gpus_per_node = gpus_per_node if gpus_per_node is not None else merged.gpus_per_node
        job_name = job_name or merged.job_name or Path(job.name).name.rsplit(".", 1)[0]
        signal_spec = signal_spec if signal_spec is not None else merged.signal
        chdir, sbatch = chdir or merged.chdir, merged.sbatch + sbatch
        job_program, job_launcher = _training_program(job)
    request = with_launcher(SubmitRequest(
        site_ref=site_ref, program=program if job is None else job_program, nodes=nodes, partition=partition,
        spare=spare, min_nodes=min_nodes, gpus_per_node=gpus_per_node, time_limit=time_limit, job_name=job_name,
        nccl_debug=nccl_debug, retries=retries, signal=signal_spec, sbatch=sbatch, checkpoints=checkpoints,
        watch=watch, launcher=None if job is None else job_launcher,
        alert_command=None if alert_command is None else parse_alert_command(alert_command)))
    program = request.program   # what each rank runs: a launcher on the command line translated

    # Only where asked for: reading the history costs sqlite3 and a query, which a plain submit never pays.
    if loaded.config.fleet.submit_excludes_lemons if exclude_lemons is None else exclude_lemons:
        lemons = _lemons_to_exclude(loaded.config)
    else:
        lemons = []
    if job is not None and merged.exclude:
        from trainctl.slurm import expand_hostlist

        lemons = [*lemons, *expand_hostlist(merged.exclude, source=f"{job.name}: #SBATCH --exclude")]

    def plan_for(resolved: str):
        """The plan with SCRIPT as the pre-submit check found it: the job execs that very file."""
        import dataclasses

        planned = plan_job(loaded.config, dataclasses.replace(request, program=(resolved, *program[1:])),
                           node_trainctl=loaded.config.launch.trainctl or _this_trainctl(),
                           node_python=sys.executable if job is None else JOB_SCRIPT_PYTHON, version=__version__,
                           command=("trainctl", "submit", *ctx.meta["trainctl.raw_args"]))
        if job is not None and not job.training.known:
            planned = dataclasses.replace(planned, launcher=planned.launcher + "; the job decides the rest, once "
                                                                              "bash has expanded the training line")
        return _excluding(planned, lemons) if lemons else planned

    submit_dir = Path.cwd() / (chdir or "")
    if target is None:
        if not submit_dir.is_dir():
            raise UsageError(f"--chdir {chdir}: no such directory")
        if job is None:
            plan = plan_for(check_local_script(program[0], submit_dir))
        else:   # the job runs its training line's words as written, from its own environment
            _check_training_script(job, job_program, submit_dir)
            plan = plan_for(job_program[0])
    else:
        plan = plan_for(program[0])   # checked and resolved on the login node, when submitting
    parts = None if job is None else job_script_parts(job, job_args)
    script = render_script(plan, parts)
    argv = sbatch_argv(plan)
    if plan.launcher and not (job is not None and dry_run):
        click.echo(f"trainctl: {plan.launcher}", err=True)
    if job is not None and dry_run:
        from trainctl.launcher.job_script import summary

        for line in summary(job, merged, plan.launcher, tuple(setting.name for setting in plan.environment)):
            click.echo(f"trainctl: {line}", err=True)

    if dry_run:
        where = f"in {submit_dir}" if target is None else f"on {target} over SSH, in {chdir or '~'}"
        if as_json:
            _echo_json(_summary(None, argv, script, plan, where))
        else:
            click.echo(script, nl=False)
            click.echo(f"trainctl: dry run, nothing submitted; would run {where}: "
                       f"{command_line(argv)} < script", err=True)
        return

    if target is None:
        from trainctl.launcher.submit import submit_local

        submitted = submit_local(script, argv, submit_dir)
    else:
        from trainctl.launcher.submit import submit_remote

        def render_for(resolved: str) -> str:
            nonlocal plan
            plan = plan_for(resolved or plan.program[0])
            return render_script(plan, parts)

        submitted, script = submit_remote(render_for, argv, target, script=program[0] if job is None else None,
                                          chdir=chdir,
                                          identity=identity,
                                          known_hosts=known_hosts or os.path.expanduser("~/.ssh/known_hosts"))
    if as_json:
        summary = _summary(submitted.job_id, argv, script, plan, submitted.where)
        summary["cluster"] = submitted.cluster
        _echo_json(summary)
    else:
        click.echo(submitted.job_id)
        click.echo(f"trainctl: submitted job {submitted.job_id} ({submitted.where}): {plan.nodes} nodes "
                   f"+ {plan.spare} spare on {plan.site_name}/{plan.partition}; the gate report lands in "
                   f"{dir_name(submitted.job_id)}/ in the submit directory", err=True)


def _job_script(word: str):
    """The parsed job script `word` names (relative to the current directory, as sbatch reads it), or
    None where it names a program: a file named .sbatch/.slurm, or one with #SBATCH lines under its
    interpreter line."""
    from trainctl.files import read_bytes
    from trainctl.launcher.job_script import looks_like_job_script, read_job_script

    try:
        head = read_bytes(word, 1 << 16)
    except OSError:
        return None
    if head is None or not looks_like_job_script(word, head):
        return None
    return read_job_script(word, word)


def _training_program(job):
    """(what each rank runs, as far as submit can tell, and the launcher's translation) for the job
    script's training line; a launcher trainctl refuses is one line, unless the words it depends on
    are only known in the job (then the job says it)."""
    from trainctl.errors import UsageError
    from trainctl.launcher.job_script import srun_command, training_program
    from trainctl.launcher.launchers import Translation

    try:
        program, translation = training_program(job.training.shown)
    except UsageError as exc:
        if job.training.known:
            raise UsageError(f"{job.name}:{job.training.first}: {exc}") from None
        program = srun_command(job.training.shown)[1]
        translation = None
    return program, translation or Translation("the job script's training line", program)


def _check_training_script(job, program: tuple[str, ...], submit_dir: Path) -> None:
    """The .py file the training line runs is there (where its name holds no $ and no `cd` came first)."""
    from trainctl.errors import UsageError

    script = next((word for word in program if word.endswith(".py")), None)
    if script is None or "$" in script or job.changes_directory or not job.training.known:
        return
    if not (submit_dir / script).is_file():
        raise UsageError(f"{job.name}:{job.training.first}: {script} does not exist in {submit_dir}")


def _lemons_to_exclude(config) -> list[str]:
    """The site's current lemons, said on stderr; a history this user cannot read is one warning, never a
    refused submit (the gate still checks every node)."""
    import time

    from trainctl.errors import UsageError
    from trainctl.slurm import fold_hostlist
    from trainctl.sweep.fleet import site_lemon_hosts

    try:
        hosts = site_lemon_hosts(config, time.time())
    except UsageError as exc:
        click.echo(f"trainctl: warning: not leaving out the site's lemons: {exc}", err=True)
        return []
    if hosts:
        click.echo(f"trainctl: leaving out the site's lemons ({len(hosts)}): {fold_hostlist(hosts)} "
                   "(fleet.submit_excludes_lemons; --keep-lemons keeps them in)", err=True)
    else:
        click.echo("trainctl: the site has no lemons to leave out", err=True)
    return hosts


def _excluding(plan, hosts: list[str]):
    """The plan with `hosts` added to its --exclude (one --exclude: sbatch keeps only the last one given)."""
    import dataclasses

    from trainctl.launcher.plan import SbatchOption
    from trainctl.slurm import expand_hostlist, fold_hostlist

    given = [option for option in plan.sbatch_options if option.name == "--exclude" and option.value]
    excluded = set(hosts) | {node for option in given for node in expand_hostlist(option.value, source="--exclude")}
    options = tuple(option for option in plan.sbatch_options if option.name != "--exclude")
    return dataclasses.replace(plan, sbatch_options=options + (SbatchOption("--exclude", fold_hostlist(sorted(excluded))),))


def _refuse_undecodable(args: tuple[str, ...]) -> None:
    """The job script is UTF-8 text: an argument that is not UTF-8 (Python holds its bytes as
    surrogates) could not reach the job exactly, so it is refused rather than mangled."""
    from trainctl.errors import UsageError

    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            from trainctl.text import printable  # here: its patterns cost a dry run ~1 ms to compile

            raise UsageError(f"argument '{printable(arg)}' is not valid UTF-8: the job script cannot carry it "
                             "exactly") from None


def _summary(job_id: str | None, argv: list[str], script: str, plan, where: str) -> dict:
    return {"job_id": job_id, "submitted": job_id is not None, "where": where, "sbatch": argv,
            "script": script, "plan": plan.to_json()}


def _echo_json(summary: dict) -> None:
    import json  # only for --json: a plain dry run skips the import

    click.echo(json.dumps(summary, indent=1))


def _this_trainctl() -> str:
    """Where this trainctl is installed: the job runs the same one on the nodes by default."""
    from trainctl.errors import UsageError

    beside_python = Path(sys.executable).with_name("trainctl")
    if beside_python.is_file():
        return str(beside_python)
    if Path(sys.argv[0]).name == "trainctl" and Path(sys.argv[0]).is_file():
        return str(Path(sys.argv[0]).absolute())
    from shutil import which

    found = which("trainctl")
    if found:
        return found
    raise UsageError("cannot tell where trainctl is installed; set launch.trainctl in the site config")


@click.command("rank-exec", context_settings={"allow_interspersed_args": False})
@click.option("--site", required=True, help="Site name or .toml file (for the HCA ports and probe paths).")
@click.option("--partition", help="Partition of the site (default: the site's default_partition).")
@click.option("--master-addr", required=True, help="Address of the node that hosts rank 0.")
@click.option("--gate-dir", help="The gate's directory: its topology snapshot of this node is used if there.")
@click.option("--bind/--no-bind", default=True, show_default=True,
              help="Bind each rank to its GPU's CPUs and NUMA node (every rank of a node gets the node's "
                   "whole HCA list for NCCL).")
@click.argument("program", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- PROGRAM [ARGS]...")
def rank_exec(site: str, partition: str | None, master_addr: str, gate_dir: str | None, bind: bool,
              program: tuple[str, ...]) -> None:
    """Inside an srun step: set RANK, WORLD_SIZE, MASTER_ADDR/PORT ..., bind this rank, exec PROGRAM."""
    from trainctl.launcher.rank_exec import rank_exec as run_rank

    run_rank(site_ref=site, partition_name=partition, master_addr=master_addr, gate_dir=gate_dir,
             bind=bind, program=program)
