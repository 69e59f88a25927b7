"""Every Slurm action the job's driver takes, through Slurm's own commands (srun, squeue,
scancel, scontrol, sbatch), each bounded.

Commands that answer (squeue, scancel, scontrol, sbatch, the probe step) run through
`trainctl.proc.run` with a timeout. Job steps are the job's own work: the training step runs
until the program ends or Slurm ends it at the job's time limit; the gate step is ended by
`cancel_steps` once the gate has decided; the sentinel lives as long as the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from trainctl.errors import ExternalCommandError, ParseError
from trainctl.files import open_append_regular
from trainctl.job import jobdir
from trainctl.job.machine import OWN_STEPS, PROBE_STEP
from trainctl.launcher.submit import parse_parsable
from trainctl.proc import ProcResult, run, run_checked
from trainctl.slurm import (SCONTROL_TIMEOUT_S, config_binds_tasks, fold_hostlist, parse_scontrol_config,
                            parse_scontrol_oneliner, parse_slurm_version)

SLURM_CMD_TIMEOUT_S = 30.0
RESIZE_TIMEOUT_S = 60.0
RESIZE_RETRY_S = 1.0
RESIZE_RETRY_BUDGET_S = 10.0
TRY_AGAIN = "try again in a bit"           # "Job update not available right now, the DB index is being set, ..."
SBATCH_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 45.0              # srun gives up on an unreachable slurmd after MessageTimeout (10 s)


def start_step(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A job step in the background. The training step's srun writes to the job's output, as the
    batch script's would. trainctl's own steps (gate, agents, sentinel) are ended by trainctl on
    purpose, and srun reports that as task errors ("task 0: Killed", "Job step aborted"): their
    srun's own messages go to `srun-<step>.log` beside the step's output files, and the job's
    output keeps trainctl's lines."""
    log = own_step_srun_log(argv)
    try:   # a regular file of the gate directory only: a FIFO or a directory there never holds the supervisor
        stderr = open_append_regular(log) if log is not None else None
    except OSError:   # then srun's messages go to the job's output, as another step's do
        stderr = None
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=stderr, env=env)
    except OSError as exc:   # no srun on this PATH, say: the machine's, not a bug
        raise ExternalCommandError(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    finally:
        if stderr is not None:
            os.close(stderr)


def own_step_srun_log(argv: list[str]) -> str | None:
    """Where srun's own messages go for one of trainctl's steps: `srun-<step>.log` in the folder of
    the step's `--output=` files (the job's gate directory); None for any other step."""
    options = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for arg in argv if arg.startswith("--") and "=" in arg}
    if options.get("--job-name") not in OWN_STEPS or "--output" not in options:
        return None
    return str(Path(options["--output"]).parent / f"srun-{options['--job-name']}.log")


def wait_step(step: subprocess.Popen, poll_s: float, on_poll: Callable[[], None] = lambda: None) -> int:
    """Wait for a step, calling `on_poll` every `poll_s`; its exit status as a shell reports it."""
    while True:
        try:
            status = step.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            on_poll()
            continue
        return _status(status)


def end_step(step: subprocess.Popen) -> None:
    """srun ends its step's tasks when it gets SIGTERM (srun(1), SIGNALS AND ESCAPE SEQUENCES)."""
    if step.poll() is None:
        step.send_signal(signal.SIGTERM)


def stop_step(step: subprocess.Popen, job_id: str, own_names: tuple[str, ...], env: dict[str, str],
              grace_s: float, cancel_others: bool = True) -> int:
    """End a step that may have a hung node: SIGTERM to its srun; after `grace_s`, scancel the
    job's steps not named in `own_names` (the training step carries the user's job name, which
    trainctl leaves alone); after another `grace_s`, SIGKILL srun. Its exit status.
    `cancel_others` False: the step was cancelled already; only wait, then SIGKILL its srun."""
    escalation = [step.kill]
    if cancel_others:
        end_step(step)
        escalation.insert(0, lambda: cancel_steps(job_id, None, env, but=own_names))
    for next_step in escalation:
        try:
            return _status(step.wait(timeout=grace_s))
        except subprocess.TimeoutExpired:
            next_step()
    return _status(step.wait())


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def cancel_steps(job_id: str, name: str | None, env: dict[str, str], but: tuple[str, ...] = ()) -> None:
    """scancel every step of this job named `name` (slurmctld kills it on every node that still answers);
    `name` None: every numbered step not named in `but`."""
    listed = run(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"],
                 timeout=SLURM_CMD_TIMEOUT_S, env=env)
    for line in listed.stdout.splitlines() if listed.ok else []:
        step_id, _, step_name = line.strip().partition(" ")
        numbered = step_id.rpartition(".")[2].isdigit()    # not the batch or extern step
        if step_name == name or (name is None and numbered and step_name not in but):
            run(["scancel", "--quiet", step_id], timeout=SLURM_CMD_TIMEOUT_S, env=env)


def shrink_job(job_id: str, keep: str, gate_dir: str, env: dict[str, str]) -> tuple[ProcResult, str | None]:
    """`scontrol update JobId= NodeList=` (scontrol(1): "Change the nodes allocated to a running job
    to shrink its size"), run in the gate directory, where scontrol writes slurm_job_<id>_resize.sh.
    Returns scontrol's result and that script's text (None when it wrote none)."""
    retry_until = time.monotonic() + RESIZE_RETRY_BUDGET_S
    while True:
        result = run(["scontrol", "update", f"JobId={job_id}", f"NodeList={keep}"], timeout=RESIZE_TIMEOUT_S,
                     env=env, cwd=gate_dir)
        # slurmctld answers ESLURM_JOB_SETTING_DB_INX while a job's accounting record is being
        # written (after a node failure, say); its text says to try again (src/common/slurm_errno.c).
        # Briefly: keeping every node costs only the release, and on the dev cluster (no slurmdbd)
        # the answer did not change for a minute after a node failure.
        if result.ok or TRY_AGAIN not in result.stderr or time.monotonic() + RESIZE_RETRY_S >= retry_until:
            break
        time.sleep(RESIZE_RETRY_S)
    paths = jobdir.JobPaths(Path(gate_dir))
    try:   # a regular file of the job directory only: a FIFO put there must not hold the supervisor
        text = (jobdir.read_bytes(paths.resize_script(job_id), jobdir.RESIZE_SCRIPT_MAX_BYTES, root=paths.root)
                if result.ok else None)
        return result, None if text is None else text.decode(errors="replace")
    except OSError:
        return result, None


def slurm_version(env: dict[str, str]) -> str:
    """"24.11.5" from `scontrol --version`; why not, when it cannot tell (for the journal)."""
    result = run(["scontrol", "--version"], timeout=SCONTROL_TIMEOUT_S, env=env)
    try:
        if not result.ok:
            return f"unknown: {result.describe_failure()}"
        major, minor, micro = parse_slurm_version(result.stdout)
        return f"{major}.{minor:02d}.{micro}"     # as Slurm names its releases: 22.05.8
    except ParseError as exc:
        return f"unknown: {exc}"


def binds_tasks(env: dict[str, str]) -> bool:
    """Whether this cluster's srun binds tasks to CPUs (`trainctl.slurm.config_binds_tasks`); True when
    scontrol cannot tell, so a binding cluster never loses --cpu-bind=none."""
    result = run(["scontrol", "show", "config"], timeout=SCONTROL_TIMEOUT_S, env=env)
    return config_binds_tasks(parse_scontrol_config(result.stdout)) if result.ok else True


def job_record(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """`scontrol show job -o` as {key: value}; empty when scontrol failed."""
    result = run(["scontrol", "show", "job", "-o", job_id], timeout=SCONTROL_TIMEOUT_S, env=env)
    record: dict[str, str] = {}
    for part in parse_scontrol_oneliner(result.stdout if result.ok else ""):
        record.update(part)
    return record


def probe_nodes(nodes: list[str], gate_dir: str, prefix: str, env: dict[str, str]) -> tuple[str, ...]:
    """Nodes on which a one-task-per-node step still starts: slurmstepd creates the task's output
    file before the task runs, so a node without its file did not start one."""
    for name in os.listdir(gate_dir):
        if name.startswith(prefix):
            os.unlink(os.path.join(gate_dir, name))
    count = len(nodes)
    run(["srun", "--overlap", f"--job-name={PROBE_STEP}", f"--nodelist={fold_hostlist(nodes)}",
         f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
         "--input=none", f"--output={gate_dir}/{prefix}%N.out", "true"],
        timeout=PROBE_TIMEOUT_S, env=env)
    present = set(os.listdir(gate_dir))
    return tuple(node for node in nodes if f"{prefix}{node}.out" in present)


def submit_successor(script_text: str, argv: list[str], env: dict[str, str], submit_dir: str) -> str:
    """sbatch the successor (the script on stdin); its job id."""
    result = run_checked(argv, timeout=SBATCH_TIMEOUT_S, input_text=script_text, cwd=submit_dir, env=env)
    return parse_parsable(result.stdout)[0]


def comment_job(job_id: str, text: str, env: dict[str, str]) -> ProcResult:
    return run(["scontrol", "update", f"JobId={job_id}", f"Comment={text}"], timeout=SLURM_CMD_TIMEOUT_S, env=env)


def cancel_job(job_id: str, env: dict[str, str]) -> ProcResult:
    return run(["scancel", job_id], timeout=SLURM_CMD_TIMEOUT_S, env=env)
