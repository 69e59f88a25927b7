"""`trainctl job run`: the supervisor on the batch host, from the gate to the end of the job.

It drives `supervisor.advance` (pure) and takes each action it returns through
`slurm_actions`, writing every event to the journal. It prints what the job script used to
print, on the job's stdout and stderr, in the same words.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from trainctl.job import supervisor as sv
from trainctl.job import slurm_actions as slurm
from trainctl.job.checkpoint_request import request_checkpoint
from trainctl.job.gate_cli import GATE_STEP_STATUS   # read by `gate decide --wait`: the gate step is over
from trainctl.job.journal import CHECKPOINT_ENV, CHECKPOINT_FILE, JOURNAL_FILE, Journal
from trainctl.agent_socket import WATCH_DIR_ENV
from trainctl.job.watch_io import archive_gate_round, prepare_watch_dir, read_node_files, request_stacks
from trainctl.launcher.plan import JobPlan
from trainctl.proc import run

GATE_STEP_GRACE_S = 5.0                 # the gate step ends by itself just after the decision, unless a node is lost
DECIDE_MARGIN_S = 60.0                  # beyond decide's own deadline, before it counts as hung
STEP_POLL_S = 2.0                       # how often the training step's checkpoint file is looked at
# The watch's polls take at most this share of the batch host's core (a training node's): a
# poll's cost grows with the job's nodes (bench/watch_scale.py), so large jobs poll less often.
WATCH_SHARE = 0.05


def say(line: str, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    print(line, file=stream, flush=True)  # flushed: the steps' srun write to the same file


class JobRun:
    def __init__(self, plan: JobPlan, script_path: str, env: dict[str, str]):
        from trainctl.job.policy import load_gate_policy
        from trainctl.slurm import expand_hostlist, this_node_name

        self.plan, self.script_path, self.env = plan, script_path, env
        self.job_id = env["SLURM_JOB_ID"]
        self.gate_dir = str(Path(env["SLURM_SUBMIT_DIR"]) / f"trainctl-gate-{self.job_id}")
        os.makedirs(self.gate_dir, exist_ok=True)
        self.journal = Journal(os.path.join(self.gate_dir, JOURNAL_FILE))
        allocated = tuple(expand_hostlist(env["SLURM_JOB_NODELIST"]))
        self.policy = load_gate_policy(plan.site_ref, plan.partition)   # the site, read once
        watch = self.policy.watch
        self.facts = sv.JobFacts(allocated, this_node_name(env), plan.release_unused, plan.retries,
                                 watch.max_restarts if watch.enabled else 0, watch.hold_spares if watch.enabled else 0)
        self.gate_rounds = 1                  # gate rounds so far (a detection runs the gate again)
        self.training_nodes: tuple[str, ...] = ()
        self.detection = None                 # the last detection, until the gate after it has judged
        self.accepted_step_s = 0.0            # a slowdown the gate could not localise: the new normal

    def run(self) -> int:
        from trainctl.errors import Stopped

        try:
            return self._run()
        except Stopped as exc:  # scancel or the time limit: the end is journaled, then the CLI reports it
            self.journal.add("job_end", status=128 + exc.signum, cause=f"stopped by signal {exc.signum}")
            raise

    def _run(self) -> int:
        from trainctl.job.retry import ENV_ATTEMPT, ENV_EXCLUDE

        attempt = self.env.get(ENV_ATTEMPT, "1")
        if self.plan.retries:
            excluding = self.env.get(ENV_EXCLUDE, "")
            say(f"trainctl: attempt {attempt} of {self.plan.retries + 1}"
                + (f", excluding {excluding}" if excluding else ""))
        self.journal.add("job_start", attempt=int(attempt) if attempt.isdigit() else attempt,
                         nodes=list(self.facts.allocated), batch_host=self.facts.batch_host,
                         slurm=slurm.slurm_version(self.env))
        self.sentinel = self._start_sentinel() if len(self.facts.allocated) > 1 else None
        state, action = sv.advance(self.facts, sv.JobState(), sv.Started())
        while not isinstance(action, sv.Finish):
            if isinstance(action, sv.RunGate):
                event = self._gate(action)
            elif isinstance(action, sv.Release):
                event = self._release(action)
            elif isinstance(action, sv.RunTraining):
                event = self._train(action)
            else:
                event = self._retry(action)
            state, action = sv.advance(self.facts, state, event)
        self.journal.add("job_end", status=action.status)
        return action.status

    # ------------------------------------------------------------ the gate

    def _gate(self, action: sv.RunGate) -> sv.Event:
        again = {}
        if action.nodes:   # again after a detection: the last round's files go aside, as evidence
            evidence = archive_gate_round(self.gate_dir, self.gate_rounds)
            self.gate_rounds += 1
            again = {"nodes": list(action.nodes), "evidence": os.path.relpath(evidence, self.gate_dir)}
        self.journal.add("gate_start", **again)
        step = slurm.start_step(sv.gate_step_argv(self.plan, self.gate_dir, int(self.env["SLURM_JOB_NUM_NODES"]),
                                                  action.nodes), self.env)
        watcher = threading.Thread(target=self._write_gate_status, args=(step,), daemon=True)
        watcher.start()
        if not action.nodes:
            self._journal_submit_time()
        result = run(sv.decide_argv(self.plan, self.gate_dir, action.nodes), timeout=self._decide_timeout_s(),
                     env=self.env)
        sys.stderr.write(result.stderr)   # the report, or the one line saying which nodes failed
        sys.stderr.flush()
        watcher.join(GATE_STEP_GRACE_S)
        if watcher.is_alive():   # a lost node's task never returns: end what is left of the step
            slurm.cancel_steps(self.job_id, sv.GATE_STEP, self.env)
        self._journal_verdicts()
        self._journal_confirmation(action.nodes)
        if not result.ok:
            status = result.returncode if result.returncode is not None else 4
            self.journal.add("gate_end", status=status, why=result.describe_failure())
            say(f"trainctl: not starting the job: gate decide exited with status {status} "
                f"(report: {self.gate_dir}/report.txt)", err=True)
            return sv.GateRefused(status)
        decided = sv.parse_decision(result.stdout)
        if decided is None:
            self.journal.add("gate_end", status=2, why="no nodes and MASTER_ADDR printed")
            say(f"trainctl: gate decide did not print the nodes and MASTER_ADDR: {result.stdout!r}", err=True)
            return sv.GateRefused(2, retryable=False)
        from trainctl.slurm import expand_hostlist

        job_nodes, master_addr = decided
        chosen = tuple(expand_hostlist(job_nodes))
        self.journal.add("gate_end", status=0, chosen=list(chosen), master_addr=master_addr)
        say(f"trainctl: running on {job_nodes}, MASTER_ADDR {master_addr} (gate report: {self.gate_dir}/report.txt)")
        return sv.GateDecided(job_nodes, chosen, master_addr, self._healthy_unused(chosen))

    def _journal_confirmation(self, checked: tuple[str, ...]) -> None:
        """After a detection, what the gate said about the nodes: whom it names, or nobody."""
        from trainctl.job.retry import _read_json, gate_bad_nodes
        from trainctl.job.watch import confirm

        detection, self.detection = self.detection, None
        if detection is None:
            return
        gate_named = gate_bad_nodes(_read_json(os.path.join(self.gate_dir, "decision.json")))
        confirmed = confirm(detection, gate_named, self.training_nodes, self.accepted_step_s)
        self.accepted_step_s = confirmed.accepted_step_s
        self.journal.add("confirmation", kind=confirmed.kind, named=dict(confirmed.named), checked=list(checked),
                         **({"note": confirmed.note} if confirmed.note else {}))
        if confirmed.named:
            say(f"trainctl: watch: leaving out {', '.join(sorted(confirmed.named))}", err=True)
            self._drain_condemned(detection)
        else:
            say(f"trainctl: watch: the gate names no node ({detection.kind} not localised): "
                "resuming on the same nodes", err=True)

    def _drain_condemned(self, detection) -> None:
        """Drain the nodes the detection named itself, where the site's `[gate] drain_on` asks
        (those the gate named were drained by `gate decide`)."""
        from trainctl.job.gate_drain import drain_condemned

        failed = {item["node"]: (item["check"], item["reason"]) for item in detection.details.get("failed", [])}
        condemned = {node: (detection.kind, *failed.get(node, ("watch." + detection.kind, detection.evidence)))
                     for node in detection.suspects}
        for drain in drain_condemned(self.policy.site, self.policy.config, condemned, self.env):
            self.journal.add("drain", node=drain.host, outcome=drain.outcome, reason=drain.reason)
            say(f"trainctl: {drain.line()}", err=True)

    def _healthy_unused(self, chosen: tuple[str, ...]) -> tuple[str, ...]:
        """Nodes the gate passed but did not choose (decision.json), in Slurm's order: the spares."""
        from trainctl.job.retry import _read_json

        decision = _read_json(os.path.join(self.gate_dir, "decision.json")) or {}
        excluded = {item.get("host") for item in decision.get("excluded", [])}
        return tuple(node for node in decision.get("allocated", []) if node not in chosen and node not in excluded)

    def _write_gate_status(self, step) -> None:
        status = slurm.wait_step(step, STEP_POLL_S)
        try:
            Path(self.gate_dir, GATE_STEP_STATUS).write_text(f"{status}\n")
        except OSError:  # decide then waits for its deadline instead: slower, not wrong
            pass

    def _decide_timeout_s(self) -> float:
        return self.policy.deadline_s(len(self.facts.allocated)) + DECIDE_MARGIN_S

    def _journal_submit_time(self) -> None:
        """When Slurm took this job (for the queue time in `job show`)."""
        submitted = slurm.job_record(self.job_id, self.env).get("SubmitTime", "")
        try:
            when = datetime.fromisoformat(submitted).timestamp()  # scontrol prints local time
        except ValueError:
            return
        self.journal.add("submitted", submitted_t=when)

    def _journal_verdicts(self) -> None:
        from trainctl.job.retry import _read_json

        decision = _read_json(os.path.join(self.gate_dir, "decision.json")) or {}
        chosen = set(decision.get("chosen", []))
        excluded = {item.get("host"): item.get("reasons", []) for item in decision.get("excluded", [])}
        for node in decision.get("allocated", []):
            verdict = "chosen" if node in chosen else "excluded" if node in excluded else "healthy, not needed"
            self.journal.add("node_verdict", node=node, verdict=verdict, reasons=excluded.get(node, []))

    # ------------------------------------------------------------ the release

    def _release(self, action: sv.Release) -> sv.Event:
        if action.move_sentinel:
            slurm.cancel_steps(self.job_id, sv.SENTINEL_STEP, self.env)
        result, resize = slurm.shrink_job(self.job_id, action.keep, self.gate_dir, self.env)
        output = " ".join((result.stdout + result.stderr).split()) if not result.timed_out \
            else result.describe_failure()
        if not result.ok:
            say(f"trainctl: warning: the job keeps all its nodes: scontrol update NodeList={action.keep}: {output}",
                err=True)
        elif resize is None:
            say(f"trainctl: warning: released the unused nodes, but scontrol wrote no "
                f"{self.gate_dir}/slurm_job_{self.job_id}_resize.sh: {output}", err=True)
        else:
            exported, unset = sv.parse_resize_script(resize)
            for name in unset:
                self.env.pop(name, None)
            self.env.update(exported)
            say(f"trainctl: released the nodes the job does not use; it now holds {self.env.get('SLURM_JOB_NODELIST')}")
            self.journal.add("released", holds=self.env.get("SLURM_JOB_NODELIST", ""))
        count = self.env.get("SLURM_JOB_NUM_NODES", "")
        return sv.Resized(int(count) if count.isdigit() else len(self.facts.allocated))

    # ------------------------------------------------------------ the training step

    def _train(self, action: sv.RunTraining) -> sv.Event:
        from trainctl.slurm import expand_hostlist

        if action.start_sentinel:
            self.sentinel = self._start_sentinel()
        if self.plan.rank_output and not action.restart:
            say(f"trainctl: each rank's output: {self.gate_dir}/rank-<node>-<rank>.out "
                f"(trainctl job show {self.job_id})")
        checkpoint = os.path.join(self.gate_dir, CHECKPOINT_FILE)
        env = dict(self.env, **{CHECKPOINT_ENV: checkpoint})
        watching = self.policy.watch.enabled
        self.training_nodes = tuple(expand_hostlist(action.job_nodes))
        if watching:
            env[WATCH_DIR_ENV] = prepare_watch_dir(self.gate_dir)
        started = self.journal.add("training_start", nodes=action.job_nodes, master_addr=action.master_addr,
                                   **({"restart": action.restart} if action.restart else {}))["t"]
        seen = CheckpointWatch(checkpoint, started)
        step = slurm.start_step(sv.training_argv(self.plan, action, self.gate_dir), env)
        agents = slurm.start_step(sv.agent_argv(self.plan, action, self.gate_dir), self.env) if watching else None
        watch = Watch(self, action, started) if watching else None
        detection = None
        while detection is None:
            try:
                status = step.wait(timeout=watch.wait_s() if watch else STEP_POLL_S)
                break
            except subprocess.TimeoutExpired:
                seen.poll(self.journal)
                detection = watch.poll() if watch else None
        if detection is None and status != 0 and watch is not None:
            detection = watch.lost(status)   # Slurm ended the step on a node it lost: the watch saw it go
            if detection is not None:
                self._journal_detection(detection)
        elif detection is not None:
            self._journal_detection(detection)
            status = self._stop_training(detection, step, seen)
        if agents is not None:   # scancel: each agent gets SIGTERM, then SIGKILL after KillWait (scancel(1))
            slurm.cancel_steps(self.job_id, sv.AGENT_STEP, self.env)
            slurm.stop_step(agents, self.job_id, sv.OWN_STEPS, self.env, self.policy.watch.end_grace_s,
                            cancel_others=False)
        seen.poll(self.journal)
        cause = (f"ended by the watch ({detection.kind})" if detection else
                 "completed" if status == 0 else f"exit status {status}")
        self.journal.add("step_end", status=status, cause=cause, training_start_t=started, last_checkpoint_t=seen.last)
        if detection is not None:
            return sv.WatchStopped(detection.kind, detection.suspects, status)
        return sv.StepEnded(status)

    def _journal_detection(self, detection) -> None:
        """Kept until the gate after it has judged (`_journal_confirmation`)."""
        self.detection = detection
        self.journal.add("detection", kind=detection.kind, suspects=list(detection.suspects),
                         evidence=detection.evidence, details=detection.details)
        say(f"trainctl: watch: {detection.kind}: {detection.evidence}", err=True)

    def _stop_training(self, detection, step: subprocess.Popen, seen: "CheckpointWatch") -> int:
        """Evidence first (stacks of a hung job, a checkpoint of a live one), then end the step."""
        watch = self.policy.watch
        if detection.kind == "hung":
            answering = tuple(node for node in self.training_nodes if node not in detection.suspects)
            stacks = request_stacks(self.gate_dir, answering, watch.dump_wait_s)
            self.journal.add("stacks", files=stacks)
        else:
            request_checkpoint(self.gate_dir, step, sv.checkpoint_signal(self.plan.signal), seen, self.journal,
                               watch.checkpoint_wait_s)
        return slurm.stop_step(step, self.job_id, sv.OWN_STEPS, self.env, watch.end_grace_s)

    def _start_sentinel(self):
        return slurm.start_step(sv.sentinel_argv(self.plan, self.gate_dir), self.env)

    # ------------------------------------------------------------ retry around bad nodes

    def _retry(self, action: sv.Retry) -> sv.Event:
        from trainctl.errors import TrainctlError
        from trainctl.job import retry as retrying
        from trainctl.launcher.render import split_sbatch_options

        _, on_argv = split_sbatch_options(self.plan.sbatch_options)
        try:
            rec = retrying.retry_around_bad_nodes(self.gate_dir, action.phase, action.status, list(action.nodes),
                                                  self.plan.retries, self.script_path,
                                                  tuple(option.argv for option in on_argv), self.env,
                                                  (self.plan.nodes, self.plan.spare), action.condemned)
        except (OSError, TrainctlError) as exc:  # the job still ends with the status of what failed
            say(f"trainctl: warning: could not decide on a retry: {exc}", err=True)
            self.journal.add("retry", retry=False, reason=f"could not decide: {exc}")
            return sv.RetryHandled()
        say("trainctl: " + retrying.summary_line(rec))
        self.journal.add("retry", retry=rec["retry"], reason=rec["reason"], successor=rec["successor"],
                         bad_nodes=sorted(rec["bad_nodes"]), exclude=rec["exclude"])
        return sv.RetryHandled()


class Watch:
    """The detectors (`trainctl.job.watch`, pure) fed with the node agents' files each poll."""

    def __init__(self, job: "JobRun", action: sv.RunTraining, started: float):
        from trainctl.job import watch
        from trainctl.slurm import expand_hostlist

        self.job = job
        self.nodes = tuple(expand_hostlist(action.job_nodes))
        self.limits = job.policy.watch_limits
        self.state = watch.start(started, job.accepted_step_s)
        self.poll_s = job.policy.watch.poll_s
        self.cost_s = 0.0                       # the last poll's

    def wait_s(self) -> float:
        """Until the next poll: the site's poll_s, longer where a poll costs more than WATCH_SHARE of it."""
        return max(self.poll_s, self.cost_s / WATCH_SHARE)

    def poll(self):
        began = time.monotonic()
        try:
            return self._poll()
        finally:
            self.cost_s = time.monotonic() - began

    def _poll(self):
        from trainctl.job import watch

        stepped = self.state.progress_steps >= 0
        seen = watch.observe(self.limits, self.state, time.time(), read_node_files(self.job.gate_dir, self.nodes))
        self.state = seen.state
        if not stepped and self.state.progress_steps >= 0:   # training again: the restart's cost ends here
            self.job.journal.add("first_step", steps=self.state.progress_steps)
        for node in seen.silent_while_progressing:
            self.job.journal.add("agent_silent", node=node, note="training goes on: not a detection")
        return seen.detection

    def lost(self, status: int):
        """The step failed by itself: the nodes whose agent fell silent before, as a detection
        (a node Slurm lost stops its agent too); None when every agent still wrote."""
        from trainctl.job import watch

        self.poll()
        silent = watch.silent_nodes(self.limits, self.state, time.time())
        if not silent:
            return None
        return watch.Detection("hung", silent, f"the training step ended with status {status} after the agent of "
                                               f"{', '.join(silent)} fell silent", {"silent": list(silent)})


class CheckpointWatch:
    """The program's checkpoints, as it reports them: it writes the file named by
    TRAINCTL_CHECKPOINT_FILE after each one (what it writes is its business: a step number, say)."""

    def __init__(self, path: str, since: float):
        self.path = path
        self.since = since
        self.last: float | None = None

    def poll(self, journal: Journal) -> None:
        try:
            written = os.stat(self.path).st_mtime
        except OSError:
            return
        if written > self.since and (self.last is None or written > self.last):
            self.last = written
            with open(self.path, errors="replace") as handle:
                note = handle.read(200).strip()
            journal.add("checkpoint", checkpoint_t=written, note=" ".join(note.split()))


def run_job(plan: JobPlan, script_path: str, env: dict[str, str]) -> int:
    from trainctl.errors import UsageError

    missing = [name for name in ("SLURM_JOB_ID", "SLURM_SUBMIT_DIR", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES")
               if not env.get(name)]
    if missing:
        raise UsageError(f"job run runs as a Slurm batch script: {', '.join(missing)} not set")
    from trainctl.job.gate_cli import ignore_checkpoint_signals

    ignore_checkpoint_signals()
    return JobRun(plan, script_path, env).run()
