"""Alerts: the job's alert command (the site's `[alerts] command`, or submit --alert-command),
run on each detection, restart, successor and end, with the event as one JSON object on stdin.

The machine decides when (its `Alert` effects, `trainctl.job.machine`); the supervisor hands the
journal's event to `AlertSender`, whose one thread runs the command, in order, each run killed
after the site's `[alerts] timeout_s`: the job never waits for it, except at its end for the
alerts still to run. Each run's event and output (capped) go into the job directory's
alerts.log; a failure is one warning line on the job's output, once, and never changes the job.

The event is the journal's (`trainctl.journal_events`: "t", "at", "event" and its fields), with
"summary" first (one line, the timeline's words for it), and the job's id, chain, name, user
and the `trainctl job show` command that shows it.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

from trainctl.files import open_append_regular
from trainctl.job.journal import describe
from trainctl.job.metrics import JobIdentity
from trainctl.journal_events import clean
from trainctl.proc import ProcResult, run
from trainctl.signals import stop_deferred
from trainctl.text import printable

SUMMARY_MAX_CHARS = 1000                # PagerDuty's payload.summary holds 1024
OUTPUT_MAX_BYTES = 16 << 10             # of one run's stdout, and of its stderr, kept in alerts.log
LOG_MAX_BYTES = 1 << 20                 # alerts.log stops growing here (the job's directory is the user's quota)


def alert_event(entry: Mapping, identity: JobIdentity, gate_dir: str) -> dict:
    """What the alert command gets on stdin for the journal's `entry`."""
    summary = printable(f"trainctl: job {identity.job_id} ({identity.job_name}, {identity.user}): "
                        f"{describe(dict(entry))}")
    if len(summary) > SUMMARY_MAX_CHARS:
        summary = summary[:SUMMARY_MAX_CHARS - 3] + "..."
    return {"summary": summary, **clean(dict(entry)), "event": str(entry["event"]),
            "job_id": identity.job_id, "chain": identity.chain, "job_name": identity.job_name,
            "user": identity.user, "show": shlex.join(["trainctl", "job", "show", identity.job_id, "--dir", gate_dir])}


def event_line(event: Mapping) -> str:
    """One line of JSON (no NaN; any character as an escape, so the line is ASCII)."""
    return json.dumps(event, default=str, allow_nan=False) + "\n"


class AlertSender:
    """Runs the alert command on each event given, one at a time, in a thread of its own."""

    def __init__(self, argv: Sequence[str], timeout_s: float, log_path: str, env: Mapping[str, str],
                 warn: Callable[[str], None]):
        self.argv, self.timeout_s, self.log_path, self.env, self.warn = tuple(argv), timeout_s, log_path, env, warn
        self.queue: queue.Queue[dict | None] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="trainctl-alerts", daemon=True)
        self.warned = False
        self.log_full = False

    def send(self, event: dict) -> None:
        """Queue `event`; returns at once."""
        with stop_deferred():
            if not self.thread.is_alive() and self.thread.ident is None:
                self.thread.start()
            self.queue.put(event)

    def close(self) -> None:
        """At the job's end: the alerts still queued run, each within the time limit, then the thread ends."""
        with stop_deferred():
            if self.thread.ident is None:
                return
            waiting = self.queue.qsize() + 1
            self.queue.put(None)
            self.thread.join(waiting * (self.timeout_s + 2.0))

    def _work(self) -> None:
        while (event := self.queue.get()) is not None:
            line = event_line(event)
            result = run(self.argv, timeout=self.timeout_s, input_text=line, env=dict(self.env),
                         output_cap=OUTPUT_MAX_BYTES)
            self._log(event, line, result)
            if not result.ok and not self.warned:
                self.warned = True
                self.warn(f"trainctl: warning: the alert command failed on the {event['event']} event: "
                          f"{printable(result.describe_failure())} (the job goes on; every run is in "
                          f"{self.log_path})")

    def _log(self, event: Mapping, line: str, result: ProcResult) -> None:
        """One run in alerts.log: what it was given, how it ended, what it said (each capped)."""
        if self.log_full:
            return
        ended = "ok" if result.ok else printable(result.describe_failure())
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        text = f"== {now} {event['event']}: {ended} ({result.duration_s:.1f} s)\nstdin: {line}"
        for name, output in (("stdout", result.stdout), ("stderr", result.stderr)):
            data = output.encode(errors="replace")
            if data:
                cut = f" (its last {OUTPUT_MAX_BYTES} bytes)" if len(data) > OUTPUT_MAX_BYTES else ""
                text += f"{name}{cut}:\n{data[-OUTPUT_MAX_BYTES:].decode(errors='replace').rstrip()}\n"
        try:
            fd = open_append_regular(self.log_path)   # a FIFO in its place is refused, never waited on
            try:
                if os.fstat(fd).st_size + len(text) > LOG_MAX_BYTES:
                    self.log_full = True
                    text = f"== alerts.log is full ({LOG_MAX_BYTES} bytes): later runs are not logged\n"
                os.write(fd, text.encode(errors="replace"))
            finally:
                os.close(fd)
        except OSError:
            pass   # the log is the evidence, never a reason to stop the job or to warn twice
