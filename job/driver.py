"""`trainctl job run`: the driver of the job's state machine (`trainctl.job.machine`) on the batch
host, from the gate to the end of the job.

It feeds events to `machine.advance` (pure) and carries out the effects it returns, each
through one method here and Slurm's commands in `slurm_actions`; every decision is the
machine's. It prints what the job script used to print, on the job's stdout and stderr.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime
from typing import Callable, Mapping

from trainctl.errors import Stopped, TrainctlError, UsageError
from trainctl.job import machine, metrics, slurm_actions
from trainctl.job import jobdir
from trainctl.job.alerts import AlertSender, alert_event
from trainctl.job.checkpoint_request import await_save, post_checkpoint_request, send_signal
from trainctl.job.decision import Decision
from trainctl.job.follow import HTML_COMMAND
from trainctl.job.gate_cli import ignore_checkpoint_signals
from trainctl.job.gate_drain import drain_condemned
from trainctl.job.jobdir import CHECKPOINT_ENV, JobPaths, Journal, Kind, drop_journal
from trainctl.journal_events import Verdict
from trainctl.job.policy import GatePolicy, load_gate_policy
from trainctl.job.retry import (ENV_ATTEMPT, ENV_EXCLUDE, gate_bad_nodes, retry_around_bad_nodes,
                                summary_line)
from trainctl.job.watch_io import archive_gate_round, prepare_watch_dir, read_node_files, request_stacks
from trainctl.launcher.plan import JobPlan
from trainctl.launcher.rank_exec import OFF_WORDS
from trainctl.launcher.render import split_sbatch_options
from trainctl.proc import run
from trainctl.guest.wire import AUTO_STEPS_ENV, SIGNAL_ENV, WATCH_DIR_ENV
from trainctl.slurm import expand_hostlist, this_node_name

GATE_STEP_GRACE_S = 5.0                 # the gate step ends by itself just after the decision, unless a node is lost
DECIDE_MARGIN_S = 60.0                  # beyond decide's own deadline, before it counts as hung
STEP_POLL_S = 2.0                       # how often the training step's checkpoint file is looked at
# The watch's polls take at most this share of the batch host's core (a training node's): a
# poll's cost grows with the job's nodes (bench/watch_scale.py), so large jobs poll less often.
WATCH_SHARE = 0.05
# effects carried out at once: the metrics are written before each of the others (they may wait)
INSTANT_EFFECTS = (machine.Journal, machine.Say, machine.Alert, machine.SendSignal)
YEAR_S = 365 * 86400.0                  # an allocation end further than this from its start: no time limit


def say(line: str, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    print(line, file=stream, flush=True)  # flushed: the steps' srun write to the same file


def poll_wait_s(poll_s: float, cost_s: float) -> float:
    """Until the next poll: the site's poll_s, longer where a poll costs more than WATCH_SHARE of it."""
    return max(poll_s, cost_s / WATCH_SHARE)


class JobDriver:
    """Carries out the machine's effects for one job; holds only the live handles (the steps'
    sruns, the journal) and the machine's latest state."""

    def __init__(self, plan: JobPlan, script_path: str, env: dict[str, str]):
        self.plan, self.script_path, self.base_env = plan, script_path, env
        self.job_id = env["SLURM_JOB_ID"]
        self.paths = JobPaths.of(env["SLURM_SUBMIT_DIR"], self.job_id)
        self.gate_dir = str(self.paths.root)
        os.makedirs(self.gate_dir, exist_ok=True)
        self.journal = Journal(self.paths.journal, keep=True)   # kept: the metrics and alerts read it
        allocated = tuple(expand_hostlist(env["SLURM_JOB_NODELIST"]))
        self.policy = load_gate_policy(plan.site_ref, plan.partition)   # the site, read once
        self.facts = job_facts(plan, self.policy, allocated, this_node_name(env),
                               slurm_actions.binds_tasks(env), env)
        self.state = machine.JobState()
        # the chain's earlier jobs, read once (they have ended), for the metrics' goodput and counts
        earlier = jobdir.earlier_attempts(self.paths) if self.policy.metrics.textfile_dir or plan.alert_command \
            else []
        self.earlier = [events for _, events in earlier]
        self.identity = metrics.JobIdentity(self.job_id, earlier[0][0] if earlier else self.job_id,
                                            env.get("SLURM_JOB_USER") or getpass.getuser(), plan.job_name)
        self.metrics_warned = False
        self.alerts = AlertSender(plan.alert_command, self.policy.alerts.timeout_s, str(self.paths.alerts_log),
                                  env, lambda line: say(line, err=True)) if plan.alert_command else None
        # the training step now: its srun, the checkpoints seen, the last poll's cost
        self.step: subprocess.Popen | None = None
        self.agents: subprocess.Popen | None = None
        self.checkpoints: jobdir.Checkpoints | None = None
        self.readings: dict = {}                # the node files the last poll read
        self.poll_cost_s = 0.0

    @property
    def env(self) -> dict[str, str]:
        return machine.job_environment(self.base_env, self.state)

    def run(self) -> int:
        try:
            return self._run()
        except Stopped as exc:  # scancel or the time limit: the end is journaled, then the CLI reports it
            for effect in machine.stopped(self.facts, exc.signum):
                self.carry_out(effect)
            raise
        finally:
            if self.policy.metrics.textfile_dir:   # the job's series end with it
                metrics.unpublish(self.policy.metrics.textfile_dir, self.job_id)
            if self.alerts is not None:
                self.alerts.close()
            self._drop_journal()

    def _drop_journal(self) -> None:
        """Where the site names a journal directory, a copy of the finished journal goes there for
        the history to fold in (`trainctl.sweep.fleet`): written aside, then renamed into place."""
        config = self.policy.config
        if config is not None and config.fleet.journal_dir:
            problem = drop_journal(self.journal.path, config.fleet.journal_dir, self.job_id)
            if problem:
                say(f"trainctl: warning: the site's journal directory keeps no copy of this job's journal: {problem}",
                    err=True)

    def _run(self) -> int:
        attempt = self.env.get(ENV_ATTEMPT, "1")
        if self.plan.retries:
            excluding = self.env.get(ENV_EXCLUDE, "")
            say(f"trainctl: attempt {attempt} of {self.plan.retries + 1}"
                + (f", excluding {excluding}" if excluding else ""))
        self.journal.add(Kind.JOB_START, job=self.job_id,
                         site=self.policy.config.name if self.policy.config else "",
                         attempt=int(attempt) if attempt.isdigit() else attempt,
                         nodes=list(self.facts.allocated), batch_host=self.facts.batch_host,
                         slurm=slurm_actions.slurm_version(self.env))
        event: machine.Event = machine.Started()
        while True:
            self.state, effects = machine.advance(self.facts, self.state, event)
            event, status = None, None
            for effect in effects:
                if not isinstance(effect, INSTANT_EFFECTS):   # the metrics as they stand before a wait
                    self._publish()
                answer = self.carry_out(effect)
                if isinstance(effect, machine.Finish):
                    status = answer
                elif answer is not None:
                    event = answer
            if status is not None:
                return status
            if event is None:
                raise AssertionError(f"job driver: no event after {effects}")

    def _publish(self) -> None:
        """The job's metrics file, where the site names node_exporter's textfile directory; a
        failure is one warning line, once (the file is tried again at the next event)."""
        directory = self.policy.metrics.textfile_dir
        if not directory:
            return
        now = time.time()
        window_s = self.facts.watch.limits.slow_window_s if self.facts.watch is not None else 0.0
        samples = metrics.job_samples([*self.earlier, self.journal.events],
                                      metrics.live_state(self.state, window_s, now), now)
        try:
            metrics.publish(directory, self.job_id, metrics.render(self.identity, samples))
        except UsageError as exc:
            if not self.metrics_warned:
                say(f"trainctl: warning: no metrics for Prometheus: {exc}", err=True)
            self.metrics_warned = True

    def _alert(self, effect: machine.Alert) -> None:
        """The alert command on the journal's newest event of the kind (journaled just before)."""
        entry = next((event for event in reversed(self.journal.events) if event["event"] == effect.kind), None)
        if self.alerts is not None and entry is not None:
            self.alerts.send(alert_event(entry, self.identity, self.gate_dir))

    def carry_out(self, effect: machine.Effect) -> machine.Event | None:
        """One effect, by its one executor; the event it answers with, for those that answer."""
        return self.executors()[type(effect)](effect)

    def executors(self) -> dict[type, Callable[..., machine.Event | None]]:
        """The one way each effect is carried out (Finish ends the loop once its effects are carried out)."""
        return {
            machine.Journal: self._journal,
            machine.Say: lambda effect: say(effect.line, err=effect.err),
            machine.StartSentinel: self._start_sentinel,
            machine.RunGate: self._gate,
            machine.Drain: self._drain,
            machine.Release: self._release,
            machine.RunTraining: self._start_training,
            machine.StartAgents: self._start_agents,
            machine.WaitStep: self._wait_step,
            machine.RequestStacks: self._request_stacks,
            machine.PostCheckpointRequest: lambda effect: post_checkpoint_request(self.gate_dir, self.step),
            machine.SendSignal: lambda effect: send_signal(self.step, effect.signum),
            machine.AwaitSave: self._await_save,
            machine.StopStep: self._stop_step,
            machine.StepOver: self._step_over,
            machine.Retry: self._retry,
            machine.Finish: self._finish,
            machine.Alert: self._alert,
        }

    def _finish(self, effect: machine.Finish) -> int:
        """The job's exit status."""
        if effect.why:
            say(f"trainctl: the job cannot go on: {effect.why}", err=True)
        self.journal.add(Kind.JOB_END, status=effect.status, **({"cause": effect.why} if effect.why else {}))
        say(f"trainctl: job {self.job_id} ended with status {effect.status}; the chain drawn: "
            f"{HTML_COMMAND.format(job=self.job_id)}")
        return effect.status

    # ------------------------------------------------------------ the gate

    def _gate(self, effect: machine.RunGate) -> machine.Event:
        again = {}
        if effect.archive:   # again after a detection: the last round's files go aside, as evidence
            evidence = archive_gate_round(self.gate_dir, effect.archive)
            again = {"nodes": list(effect.nodes), "evidence": os.path.relpath(evidence, self.gate_dir)}
        self.journal.add(Kind.GATE_START, **again)
        argv = machine.gate_step_argv(self.plan, self.gate_dir, int(self.env["SLURM_JOB_NUM_NODES"]), effect.nodes)
        step = slurm_actions.start_step(argv, self.env)
        watcher = threading.Thread(target=self._write_gate_status, args=(step,), daemon=True)
        watcher.start()
        if not effect.archive:
            self._journal_submit_time()
        result = run(machine.decide_argv(self.plan, self.gate_dir, effect.nodes), timeout=self._decide_timeout_s(),
                     env=self.env)
        sys.stderr.write(result.stderr)   # the report, or the one line saying which nodes failed
        sys.stderr.flush()
        watcher.join(GATE_STEP_GRACE_S)
        if watcher.is_alive():   # a lost node's task never returns: end what is left of the step
            slurm_actions.cancel_steps(self.job_id, machine.GATE_STEP, self.env)
        decision = jobdir.read_decision(self.paths)   # the gate's result, read once
        self._journal_verdicts(decision)
        gate_named = gate_bad_nodes(decision)
        if not result.ok:
            status = result.returncode if result.returncode is not None else 4
            self.journal.add(Kind.GATE_END, status=status, why=result.describe_failure())
            if effect.archive:
                say(f"trainctl: the gate after the detection checked {machine.fold_hostlist(list(effect.nodes))} "
                    f"(left out before it, named by the watch: {', '.join(self.state.condemned) or 'none'}); "
                    f"gate decide exited with status {status} (report: {self.gate_dir}/report.txt)", err=True)
            else:
                say(f"trainctl: not starting the job: gate decide exited with status {status} "
                    f"(report: {self.gate_dir}/report.txt)", err=True)
            return machine.GateRefused(status, gate_named=gate_named)
        if decision is None or not decision.ok or not decision.chosen or not decision.master_addr:
            why = f"{self.paths.decision} names no chosen nodes and MASTER_ADDR"
            self.journal.add(Kind.GATE_END, status=2, why=why)
            say(f"trainctl: gate decide exited 0, but {why}", err=True)
            return machine.GateRefused(2, retryable=False, gate_named=gate_named)
        job_nodes = machine.fold_hostlist(list(decision.chosen))
        self.journal.add(Kind.GATE_END, status=0, chosen=list(decision.chosen), master_addr=decision.master_addr)
        say(f"trainctl: running on {job_nodes}, MASTER_ADDR {decision.master_addr} "
            f"(gate report: {self.gate_dir}/report.txt)")
        return machine.GateDecided(job_nodes, decision.chosen, decision.master_addr,
                                   healthy_unused(decision, decision.chosen), gate_named)

    def _drain(self, effect: machine.Drain) -> None:
        """Drain the nodes the detection named itself, where the site's `[gate] drain_on` asks
        (those the gate named were drained by `gate decide`)."""

        drains = drain_condemned(self.policy.site, self.policy.config, effect.nodes, self.env)
        for drain in drains.drains:
            self.journal.add(Kind.DRAIN, node=drain.host, outcome=drain.outcome, reason=drain.reason)
            say(f"trainctl: {drain.line()}", err=True)
        if drains.breaker:
            say(drains.breaker, err=True)

    def _write_gate_status(self, step) -> None:
        status = slurm_actions.wait_step(step, STEP_POLL_S)
        try:
            # read by `gate decide --wait`: the gate step is over; a regular file of the job's own only
            jobdir.write_regular(self.paths.gate_step_status, f"{status}\n")
        except UsageError:  # decide then waits for its deadline instead: slower, not wrong
            pass

    def _decide_timeout_s(self) -> float:
        return self.policy.deadline_s(len(self.facts.allocated)) + DECIDE_MARGIN_S

    def _journal_submit_time(self) -> None:
        """When Slurm took this job (for the queue time in `job show`)."""
        submitted = slurm_actions.job_record(self.job_id, self.env).get("SubmitTime", "")
        try:
            when = datetime.fromisoformat(submitted).timestamp()  # scontrol prints local time
        except ValueError:
            return
        self.journal.add(Kind.SUBMITTED, submitted_t=when)

    def _journal_verdicts(self, decision: Decision | None) -> None:
        if decision is None:
            return
        chosen = set(decision.chosen)
        excluded = {item.host: [str(reason) for reason in item.reasons] for item in decision.excluded}
        for node in decision.allocated:
            verdict = Verdict.CHOSEN if node in chosen else Verdict.EXCLUDED if node in excluded else Verdict.NOT_NEEDED
            self.journal.add(Kind.NODE_VERDICT, node=node, verdict=verdict.value, reasons=excluded.get(node, []))

    # ------------------------------------------------------------ the release

    def _release(self, effect: machine.Release) -> machine.Event:
        if effect.move_sentinel:
            slurm_actions.cancel_steps(self.job_id, machine.SENTINEL_STEP, self.env)
        result, resize = slurm_actions.shrink_job(self.job_id, effect.keep, self.gate_dir, self.env)
        output = " ".join((result.stdout + result.stderr).split()) if not result.timed_out \
            else result.describe_failure()
        exported: dict[str, str] = {}
        unset: tuple[str, ...] = ()
        if not result.ok:
            say(f"trainctl: warning: the job keeps all its nodes: scontrol update NodeList={effect.keep}: {output}",
                err=True)
        elif resize is None:
            say(f"trainctl: warning: released the unused nodes, but scontrol wrote no "
                f"{self.gate_dir}/slurm_job_{self.job_id}_resize.sh" + (f": {output}" if output else ""), err=True)
        else:
            exported, unset = machine.parse_resize_script(resize)
            holds = exported.get("SLURM_JOB_NODELIST", self.env.get("SLURM_JOB_NODELIST", ""))
            say(f"trainctl: released the nodes the job does not use; it now holds {holds}")
            self.journal.add(Kind.RELEASED, holds=holds)
        count = exported.get("SLURM_JOB_NUM_NODES", self.env.get("SLURM_JOB_NUM_NODES", ""))
        return machine.Resized(int(count) if count.isdigit() else len(self.facts.allocated), tuple(exported.items()),
                               unset)

    # ------------------------------------------------------------ the training step

    def _start_training(self, effect: machine.RunTraining) -> machine.Event:
        if effect.start_sentinel:
            self._start_sentinel()
        if self.plan.rank_output and not effect.restart:
            say(f"trainctl: each rank's output: {self.gate_dir}/rank-<node>-<rank>.out "
                f"(trainctl job show {self.job_id})")
        env = dict(self.env, **{CHECKPOINT_ENV: str(self.paths.checkpoint_marker)})
        if self.facts.watch is not None:
            env[WATCH_DIR_ENV] = prepare_watch_dir(self.gate_dir)
            if self.facts.watch.checkpoint_signal is not None:   # each rank judges its handler for it
                env[SIGNAL_ENV] = str(self.facts.watch.checkpoint_signal)
        started = self.journal.add(Kind.TRAINING_START, nodes=effect.job_nodes,
                                   master_addr=effect.master_addr,
                                   **({"restart": effect.restart} if effect.restart else {}))["t"]
        self.checkpoints, self.poll_cost_s = jobdir.Checkpoints(
            self.paths, (self.plan.checkpoints,), self.env["SLURM_SUBMIT_DIR"], started), 0.0
        self.readings = {}
        argv = machine.training_argv(self.plan, effect, self.gate_dir, self.facts.binds_tasks)
        self.step = slurm_actions.start_step(argv, env)
        return machine.TrainingStarted(started)

    def _start_agents(self, effect: machine.StartAgents) -> None:
        self.agents = slurm_actions.start_step(machine.agent_argv(self.plan, effect, self.gate_dir), self.env)

    def _request_stacks(self, effect: machine.RequestStacks) -> None:
        self.journal.add(Kind.STACKS, files=request_stacks(self.gate_dir, effect.nodes, effect.wait_s))

    def _stop_step(self, effect: machine.StopStep) -> machine.Event:
        status = slurm_actions.stop_step(self.step, self.job_id, machine.OWN_STEPS, self.env, effect.grace_s)
        self.readings = read_node_files(self.gate_dir, self.state.chosen)   # the agents' last word on saves
        return machine.StepStopped(status, self._look_for_save())

    def _wait_step(self, effect: machine.WaitStep) -> machine.Event:
        """Until the step ends (StepEnded) or, watching, the next poll (Polled); unwatched, a save
        seen (SaveSeen)."""
        wait_s = poll_wait_s(self.policy.watch.poll_s, self.poll_cost_s) if effect.poll else STEP_POLL_S
        while True:
            try:
                status = self.step.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                if effect.poll:
                    return self._poll(lambda t, readings, saved: machine.Polled(t, readings, saved))
                saved = self._look_for_save()
                if saved is not None:
                    return machine.SaveSeen(saved)
                continue
            status = 128 - status if status < 0 else status
            if effect.poll:
                return self._poll(lambda t, readings, saved: machine.StepEnded(status, t, readings, saved))
            return machine.StepEnded(status, saved=self._look_for_save())

    def _poll(self, event):
        """The agents' files now and a new save among them or the program's files, as
        `event(t, readings, saved)`; the poll's cost, the checkpoint patterns' time included,
        spaces the next poll (WATCH_SHARE)."""
        began = time.monotonic()
        readings = self.readings = read_node_files(self.gate_dir, self.state.chosen)
        t = time.time()
        saved = self._look_for_save()
        self.poll_cost_s = time.monotonic() - began
        return event(t, readings, saved)

    def _look_for_save(self) -> jobdir.Save | None:
        """A new save since the last look (`jobdir.Checkpoints`), with the node files last read."""
        return self.checkpoints.poll(self.readings.values())

    def _await_save(self, effect: machine.AwaitSave) -> machine.Event:
        """The first new save after a checkpoint request, the node files read again at each look."""
        def look() -> jobdir.Save | None:
            self.readings = read_node_files(self.gate_dir, self.state.chosen)
            return self._look_for_save()
        return machine.SaveAwaited(await_save(self.step, look, effect.wait_s))

    def _step_over(self, effect: machine.StepOver) -> None:
        if effect.agents and self.agents is not None:
            # scancel: each agent gets SIGTERM, then SIGKILL after KillWait (scancel(1))
            slurm_actions.cancel_steps(self.job_id, machine.AGENT_STEP, self.env)
            slurm_actions.stop_step(self.agents, self.job_id, machine.OWN_STEPS, self.env,
                                    self.policy.watch.end_grace_s, cancel_others=False)
            self.agents = None
        self.journal.add(Kind.STEP_END, status=effect.status, cause=effect.cause,
                         training_start_t=effect.training_start_t, last_checkpoint_t=effect.last_checkpoint_t,
                         **({"detection": effect.detection.value} if effect.detection else {}))

    def _journal(self, effect: machine.Journal) -> None:
        self.journal.add(effect.kind, **effect.fields)

    def _start_sentinel(self, effect: machine.StartSentinel | None = None) -> None:
        slurm_actions.start_step(machine.sentinel_argv(self.plan, self.gate_dir), self.env)

    # ------------------------------------------------------------ a successor around bad nodes

    def _retry(self, effect: machine.Retry) -> machine.Event:
        _, on_argv = split_sbatch_options(self.plan.sbatch_options)
        try:
            rec = retry_around_bad_nodes(self.gate_dir, effect.phase, effect.status, list(effect.nodes),
                                                  effect.budget, self.script_path,
                                                  tuple(option.argv for option in on_argv), self.env,
                                                  (self.plan.nodes, self.plan.spare), effect.condemned,
                                                  self.plan.sbatch_options)
        except (OSError, TrainctlError) as exc:  # the job still ends with the status of what failed
            say(f"trainctl: warning: could not decide on a retry: {exc}", err=True)
            self.journal.add(Kind.RETRY, retry=False, reason=f"could not decide: {exc}")
            return machine.RetryHandled()
        say("trainctl: " + summary_line(rec))
        self.journal.add(Kind.RETRY, retry=rec.retry, reason=rec.reason, successor=rec.successor,
                         bad_nodes=sorted(rec.bad_nodes), exclude=list(rec.exclude))
        return machine.RetryHandled(successor=bool(rec.successor))


def steps_counted(site_auto_steps: bool, env: Mapping[str, str]) -> bool:
    """Whether each Python rank's optimizer steps count as steps without the program's help: the
    site's watch.auto_steps, unless the job turned it off (TRAINCTL_AUTO_STEPS, as rank-exec reads it)."""
    choice = env.get(AUTO_STEPS_ENV, "").strip().lower()
    return choice not in OFF_WORDS if choice else site_auto_steps


def allocation_end(env: Mapping[str, str]) -> float | None:
    """The allocation's end as Slurm exports it (SLURM_JOB_END_TIME, Unix seconds); None where it
    is not set, not a number, or more than a year after the job's start (no time limit)."""
    end, begun = env.get("SLURM_JOB_END_TIME", ""), env.get("SLURM_JOB_START_TIME", "")
    if not end.isdigit() or int(end) <= 0:
        return None
    if begun.isdigit() and int(end) - int(begun) > YEAR_S:
        return None
    return float(end)


def job_facts(plan: JobPlan, policy: GatePolicy, allocated: tuple[str, ...], batch_host: str,
              binds_tasks: bool = True, env: Mapping[str, str] | None = None) -> machine.JobFacts:
    """What the machine decides with: the plan's choices, and the site's `[watch]` settings where
    the plan watches. The plan's choice (submit --watch/--no-watch, else the site's watch.enabled
    when it was submitted) wins over the site's enabled now: a job keeps what it was submitted with."""
    watch = policy.watch
    watched = watch.enabled if plan.watch is None else plan.watch
    env = env or {}
    limits = replace(policy.watch_limits, startup_s=policy.startup_s(plan.nodes),
                     steps_expected=steps_counted(watch.auto_steps, env))
    watching = machine.WatchFacts(limits, machine.checkpoint_signal(plan.signal), watch.checkpoint_wait_s,
                                  watch.dump_wait_s, watch.end_grace_s, watch.pay_factor, watch.restart_cost_s,
                                  allocation_end(env)) if watched else None
    return machine.JobFacts(allocated, batch_host, plan.release_unused, plan.retries,
                            watch.max_restarts if watched else 0, watch.hold_spares if watched else 0,
                            plan.min_nodes, watch.max_successors if watched else 0, watching, binds_tasks,
                            alerts=bool(plan.alert_command))


def healthy_unused(decision: Decision | None, chosen: tuple[str, ...]) -> tuple[str, ...]:
    """Nodes the gate passed but did not choose (decision.json), in Slurm's order: the spares."""
    if decision is None:
        return ()
    excluded = {item.host for item in decision.excluded}
    return tuple(node for node in decision.allocated if node not in chosen and node not in excluded)


def run_job(plan: JobPlan, script_path: str, env: dict[str, str]) -> int:
    missing = [name for name in ("SLURM_JOB_ID", "SLURM_SUBMIT_DIR", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES")
               if not env.get(name)]
    if missing:
        raise UsageError(f"job run runs as a Slurm batch script: {', '.join(missing)} not set")

    ignore_checkpoint_signals()
    return JobDriver(plan, script_path, env).run()
