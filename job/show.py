"""`trainctl job show JOBID`: the chain's timeline and goodput (from the journals), the gate's decision,
Slurm's record of the job, and the end of each rank's log.

A hung job's ranks usually all stop at the same line but one: the rank that did not reach
the collective everyone else waits in. So each rank's last lines are compared and folded:
ranks whose tails are identical are shown once, the odd ones out first, each with when its
file was last written (a hung rank stops writing first).

Collect (`collect_job`, through a `Files` that reads here or over SSH: SFTP and one
`scontrol` call) -> pure (`fold_tails`, `summarize`) -> text (`format_job`).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import stat
from dataclasses import dataclass
from typing import Protocol

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.job import jobdir
from trainctl.job.decision import Decision
from trainctl.job.goodput import (COUNTED_KINDS, Goodput, WatchAccount, goodput, goodput_lines, watch_account,
                                  watch_lines)
from trainctl.job.journal import ChainEvents, timeline_events, timeline_lines
from trainctl.job.retry import summary_line
from trainctl.journal_events import JOURNAL_MAX_BYTES, without_lone_surrogates
from trainctl.launcher.plan import FLIGHT_RECORDER_PREFIX
from trainctl.proc import run
from trainctl.slurm import SCONTROL_TIMEOUT_S, fold_hostlist, parse_scontrol_oneliner
from trainctl.text import printable
from trainctl.validate import JOB_ID as JOB_ID_RE   # the one owner of what a Slurm job id is

TAIL_BYTES = 64 * 1024          # enough for the last lines of any sane log
MAX_ATTEMPTS = 100              # a chain of --retries jobs is followed this far at most
SHOW_JOURNAL_BYTES = JOURNAL_MAX_BYTES   # of a chain's journals, read this much at most in all
# slurmstepd's own notices in a task's output (`*** STEP 12.1 ON node1 CANCELLED AT ... ***`): Slurm's
# words, not the program's, and written to some ranks' files only, so kept out of the tails.
SLURMSTEPD_RE = re.compile(r"slurmstepd(-[\w.-]+)?: error: \*\*\* .*")


class Files(Protocol):
    """Where the job's files and Slurm are: this machine, or the login node over SSH."""

    def scontrol_job(self, job_id: str) -> str | None: ...
    def listdir(self, path: str) -> list[tuple[str, float]] | None: ...   # (name, mtime); None: no dir
    # at most max_bytes (None: all) of a regular file that stays inside its own directory; None: none such
    def read(self, path: str, max_bytes: int | None, *, tail: bool = False) -> str | None: ...


@dataclass(frozen=True)
class RankLog:
    rank: int
    node: str
    tail: tuple[str, ...]
    mtime: float
    slurm_notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TailGroup:
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    tail: tuple[str, ...]
    newest: float                 # the group's most recent write
    oldest: float                 # its earliest last write

    @property
    def rank_list(self) -> str:
        return fold_numbers(self.ranks)


@dataclass(frozen=True)
class JobView:
    job_id: str
    gate_dir: str
    slurm: dict[str, str]          # `scontrol show job` fields; empty once Slurm forgot the job
    decision: Decision | None      # None: none, or not one
    ranks: tuple[RankLog, ...]
    flight_dumps: tuple[str, ...]  # file names of the flight recorder's per-rank dumps
    chain: tuple[dict, ...] = ()   # submit --retries: each attempt's job id and RetryRecord, first to last
    journals: tuple[tuple[str, tuple[dict, ...]], ...] = ()   # (job id, its journal's events kept), first to last
    read: ChainEvents | None = None   # how the journals were read: what was left out of them


# ---------------------------------------------------------------- pure

def fold_numbers(numbers: tuple[int, ...] | list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def last_lines(text: str, count: int) -> tuple[str, ...]:
    """The program's last `count` non-empty lines (a progress bar drawn with \\r keeps its last state)."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]  # splitlines would split at \r
    return tuple(line for line in lines if line and not SLURMSTEPD_RE.fullmatch(line))[-count:]


def slurm_notes(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.split("\n") if SLURMSTEPD_RE.fullmatch(line.strip()))


def fold_tails(logs: list[RankLog]) -> list[TailGroup]:
    """Ranks with identical tails in one group; the smallest groups (the odd ones out) first."""
    by_tail: dict[tuple[str, ...], list[RankLog]] = {}
    for log in sorted(logs, key=lambda log: log.rank):
        by_tail.setdefault(log.tail, []).append(log)
    groups = [TailGroup(tuple(log.rank for log in members), tuple(dict.fromkeys(log.node for log in members)),
                        tail, max(log.mtime for log in members), min(log.mtime for log in members))
              for tail, members in by_tail.items()]
    return sorted(groups, key=lambda g: (len(g.ranks), g.newest, g.ranks))


def gate_summary(decision: Decision | None) -> list[str]:
    if decision is None:
        return [f"gate: no {jobdir.DECISION} that reads as one: the gate did not get to decide "
                "(or this is not a trainctl job)"]
    chosen = list(decision.chosen)
    verdict = "ok" if decision.ok else "FAILED"
    lines = [f"gate: {verdict}: {len(decision.healthy)} of {len(decision.allocated)} allocated nodes healthy, "
             f"need {decision.minimum}; ran on {fold_hostlist(chosen) if chosen else 'nothing'}"]
    lines += [f"  excluded {item.host}: {'; '.join(map(str, item.reasons))}" for item in decision.excluded]
    lines += [f"  warning: {warning}" for warning in decision.warnings]
    return lines


def attempt_lines(slurm: dict[str, str]) -> list[str]:
    if not slurm:
        return ["slurm: no record (Slurm forgets a finished job after MinJobAge seconds; "
                "or no scontrol here)"]
    restarts = slurm.get("Restarts", "0")
    line = (f"slurm: {slurm.get('JobState', '?')}, exit {slurm.get('ExitCode', '?')}, "
            f"ran {slurm.get('RunTime', '?')} on {slurm.get('NodeList', '?')}")
    if slurm.get("Reason", "None") not in ("None", ""):
        line += f" (reason: {slurm['Reason']})"
    count = int(restarts) + 1 if restarts.isdigit() else "?"
    return [line, f"attempts: {count} (Slurm requeued it {restarts} times; "
                  "a requeued attempt reuses the job id and the gate dir)"]


def chain_lines(chain: tuple[dict, ...], job_id: str) -> list[str]:
    """Each attempt of a job submitted with --retries: what it ended with and which job followed."""
    if len(chain) < 2 and not any(link.get("retry") for link in chain):
        return []
    jobs = f"{len(chain)} job{'s' if len(chain) > 1 else ''}"
    lines = [f"submit --retries: {jobs}, one per attempt, linked by job id:"]
    for number, link in enumerate(chain, 1):
        here = " (this job)" if link["job_id"] == job_id else ""
        if link.get("retry"):
            lines.append(f"  job {link['job_id']}{here}: {summary_line(link['retry'])}")
        else:
            lines.append(f"  job {link['job_id']}{here}: attempt {number}: no retry recorded "
                         "(still running, or it ended without one)")
    return lines


def chain_start(journals: tuple[tuple[str, tuple[dict, ...]], ...]) -> float | None:
    """The first submit of the chain (else its first event): where its wall time starts."""
    times = [event.get("submitted_t") if event["event"] == jobdir.Kind.SUBMITTED else event["t"]
             for _, events in journals for event in events]
    times = [t for t in times if isinstance(t, (int, float))]
    return min(times) if times else None


def chain_goodput(view: JobView, now: float) -> tuple[Goodput | None, WatchAccount | None]:
    """The chain's goodput, and the watch's account where it detected something; neither where
    the journals could not be read whole (`ChainEvents.goodput_unknown`)."""
    if view.read is not None and view.read.goodput_unknown:
        return None, None
    attempts = [list(events) for _, events in view.journals]
    result = goodput(attempts, now)
    return result, watch_account(attempts, result, now) if result else None


def timeline_and_goodput(view: JobView, now: float) -> list[str]:
    start = chain_start(view.journals)
    if start is None:
        return [f"timeline: no {jobdir.JOURNAL} (a job script from an older trainctl, or the job has not started)"]
    result, account = chain_goodput(view, now)
    lines = ["timeline (from the first submit):"]
    attempts = [(job, list(events)) for job, events in view.journals]
    lines += [summary] if (summary := left_out_line(view, attempts)) else []
    lines += timeline_lines(attempts, start)
    if view.read is not None and view.read.goodput_unknown:
        lines.append(f"goodput: not computed: {view.read.goodput_unknown}")
    lines += goodput_lines(result) if result else []
    return lines + (watch_lines(account) if account else [])


def left_out_line(view: JobView, attempts: list[tuple[str, list[dict]]]) -> str | None:
    shown, cut = timeline_events(attempts)
    return view.read.summary(len(shown), cut) if view.read is not None else None


def format_job(view: JobView, line_count: int, now: float) -> str:
    name = view.slurm.get("JobName", "")
    lines = [f"job {view.job_id}{f' ({name})' if name else ''}: gate directory {view.gate_dir}"]
    lines += attempt_lines(view.slurm)
    lines += chain_lines(view.chain, view.job_id)
    lines += gate_summary(view.decision)
    lines += timeline_and_goodput(view, now)
    if not view.ranks:
        lines.append(f"ranks: no {jobdir.rank_log('<node>', '<rank>')} files (the job step did not start, or the site "
                     "sets launch.rank_output = false: see slurm-<id>.out)")
    else:
        groups = fold_tails(list(view.ranks))
        newest = max(g.newest for g in groups)
        lines.append(f"ranks: {len(view.ranks)} logs, last {line_count} lines each, identical ones folded"
                     f"{'; the odd ones out first' if len(groups) > 1 else ''}:")
        for group in groups:
            age = newest - group.newest
            when = "the newest write" if age < 1 else f"last written {age:.0f} s before the newest"
            who = "rank" if len(group.ranks) == 1 else "ranks"
            lines.append(f"  {who} {group.rank_list} on {fold_hostlist(list(group.nodes))} ({when}):")
            lines += [f"    | {line}" for line in group.tail] or ["    (empty)"]
    notes = list(dict.fromkeys(note for log in view.ranks for note in log.slurm_notes))
    lines += [f"slurm in the rank logs: {note}" for note in notes]
    if view.flight_dumps:
        lines.append(f"NCCL flight recorder dumps: {', '.join(view.flight_dumps)} "
                     f"(read with PyTorch's "
                     f"`torchfrtrace {view.gate_dir} --prefix {FLIGHT_RECORDER_PREFIX}`)")
    # what the program, Slurm and the nodes wrote (job names, notes, logs) never moves the terminal
    return "".join(printable(line) + "\n" for line in lines)


def to_json(view: JobView, line_count: int, now: float) -> dict:
    result, account = chain_goodput(view, now)
    attempts = [(job, list(events)) for job, events in view.journals]
    shown, cut = timeline_events(attempts)
    shown_ids = {id(event) for _, _, event in shown} if cut else None
    return {"job_id": view.job_id, "gate_dir": view.gate_dir, "slurm": view.slurm,
            "decision": view.decision.to_json() if view.decision else None,
            "timeline": [{"job_id": job, "events": [event for event in events if shown_ids is None or id(event) in shown_ids]}
                         for job, events in attempts],
            "timeline_left_out": left_out_line(view, attempts),
            "goodput_unknown": view.read.goodput_unknown if view.read is not None else None,
            "goodput": result.to_json() if result else None,
            "watch": account.to_json() if account else None,
            "lines": line_count, "flight_recorder_dumps": list(view.flight_dumps),
            "attempts": [{"job_id": link["job_id"], "retry": link["retry"].to_json() if link.get("retry") else None}
                         for link in view.chain],
            "groups": [{"ranks": list(g.ranks), "nodes": list(g.nodes), "tail": list(g.tail),
                        "newest": g.newest} for g in fold_tails(list(view.ranks))]}


def json_text(document: dict) -> str:
    """`job show --json`'s output, strict JSON (RFC 8259) for any parser: no NaN, and a lone
    surrogate (from a journal's "\\ud800", or a file name that is not UTF-8) as U+FFFD."""
    return json.dumps(_without_lone_surrogates(document), indent=1, allow_nan=False) + "\n"


def _without_lone_surrogates(value):
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, dict):
        return {without_lone_surrogates(str(key)): _without_lone_surrogates(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_lone_surrogates(item) for item in value]
    return value


# ---------------------------------------------------------------- collect

def find_job(files: Files, job_id: str, gate_dir: str | None) -> tuple[str, dict[str, str], list[tuple[str, float]]]:
    """The job's gate directory (--dir, else the one in the working directory Slurm reports),
    Slurm's record of the job, and the directory's files; UsageError where there is none."""
    if not JOB_ID_RE.fullmatch(job_id):
        raise UsageError(f"job id {job_id!r}: expected a number such as 1234")
    record = files.scontrol_job(job_id)
    slurm: dict[str, str] = {}
    for part in parse_scontrol_oneliner(record or ""):
        slurm.update(part)
    if gate_dir is None:
        if not slurm.get("WorkDir"):
            raise UsageError(f"Slurm has no record of job {job_id} any more: "
                             "give its gate directory with --dir")
        gate_dir = posixpath.join(slurm["WorkDir"], jobdir.dir_name(job_id))
    entries = files.listdir(gate_dir)
    if entries is None:
        raise UsageError(f"{gate_dir}: no such directory (not a trainctl job, or another --dir)")
    return gate_dir, slurm, entries


def collect_job(files: Files, job_id: str, gate_dir: str | None, line_count: int) -> JobView:
    gate_dir, slurm, entries = find_job(files, job_id, gate_dir)
    decision = jobdir.decision_from_json(read_json(files, posixpath.join(gate_dir, jobdir.DECISION)))
    ranks = []
    for name, mtime in entries:
        match = jobdir.RANK_LOG_RE.fullmatch(name)
        if match:
            text = files.read(posixpath.join(gate_dir, name), TAIL_BYTES, tail=True) or ""
            ranks.append(RankLog(int(match["rank"]), match["node"], last_lines(text, line_count), mtime,
                                 slurm_notes(text)))
    dumps = tuple(sorted(name for name, _ in entries if name.startswith(FLIGHT_RECORDER_PREFIX)))
    chain = collect_chain(files, gate_dir, job_id)
    read = read_journals(files, gate_dir, job_id, [link["job_id"] for link in chain])
    journals = tuple((link["job_id"], read.journals.get(link["job_id"], ())) for link in chain)
    return JobView(job_id, gate_dir, slurm, decision, tuple(sorted(ranks, key=lambda r: r.rank)), dumps,
                   chain, journals, read)


def read_journals(files: Files, gate_dir: str, job_id: str, jobs: list[str]) -> ChainEvents:
    """The chain's journals, SHOW_JOURNAL_BYTES of them in all: this job's first, then the others
    from the newest back; each kept within ChainEvents' bounds, and what is not, said."""
    read = ChainEvents(COUNTED_KINDS, SHOW_JOURNAL_BYTES)
    left = SHOW_JOURNAL_BYTES
    for job in sorted(jobs, key=lambda job: (job != job_id, -jobs.index(job))):
        if left <= 0:
            read.unread.append(job)
            continue
        text = files.read(posixpath.join(attempt_dir(gate_dir, job_id, job), jobdir.JOURNAL), left + 1) or ""
        size = len(text) if text.isascii() else len(text.encode())   # a journal of trainctl's is ASCII
        if size > left:
            read.cut.append(job)
        left -= size
        read.add(job, text)
    read.unread.sort(key=jobs.index)
    return read


def attempt_dir(gate_dir: str, job_id: str, attempt_job: str) -> str:
    """Where an attempt's files are: the directory given for this job itself (--dir), its
    siblings in the same submit directory for the others."""
    if attempt_job == job_id:
        return gate_dir
    return posixpath.join(posixpath.dirname(gate_dir.rstrip("/")), jobdir.dir_name(attempt_job))


def read_json(files: Files, path: str) -> dict | None:
    text = files.read(path, jobdir.JSON_MAX_BYTES + 1)
    if not text or len(text) > jobdir.JSON_MAX_BYTES:
        return None
    try:
        data = jobdir.loads(text)
    except ValueError:
        return None
    return jobdir.clean(data) if isinstance(data, dict) else None


def collect_chain(files: Files, gate_dir: str, job_id: str) -> tuple[dict, ...]:
    """Follow attempt.json back (the predecessor) and retry.json forward (the successor) through
    the sibling gate directories: every attempt of one --retries job runs in the same submit dir."""

    def retry(job: str) -> jobdir.RetryRecord | None:
        try:
            return jobdir.RetryRecord.from_json(read_json(files, posixpath.join(attempt_dir(gate_dir, job_id, job),
                                                                                 jobdir.RETRY)))
        except ValueError:
            return None

    def previous(job: str) -> str | None:
        try:
            return jobdir.AttemptRecord.from_json(read_json(files, posixpath.join(
                attempt_dir(gate_dir, job_id, job), jobdir.ATTEMPT))).previous_job
        except ValueError:
            return None

    jobs = [job_id]
    while len(jobs) < MAX_ATTEMPTS and (earlier := previous(jobs[0])):
        if not JOB_ID_RE.fullmatch(earlier) or earlier in jobs:
            break
        jobs.insert(0, earlier)
    while len(jobs) < MAX_ATTEMPTS and (later := getattr(retry(jobs[-1]), "successor", None)):
        if not JOB_ID_RE.fullmatch(later) or later in jobs:
            break
        jobs.append(later)
    return tuple({"job_id": job, "retry": retry(job)} for job in jobs)


class LocalFiles:
    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def scontrol_job(self, job_id: str) -> str | None:
        result = run(["scontrol", "show", "job", "-o", job_id], timeout=SCONTROL_TIMEOUT_S, env=self.env)
        if result.missing:
            return None  # no Slurm client here: --dir tells where the files are
        if result.timed_out:   # Slurm did not say: not the same as "no record"
            raise ExternalCommandError(f"scontrol show job {job_id}: {result.describe_failure()}")
        return result.stdout if result.ok else None

    def listdir(self, path: str) -> list[tuple[str, float]] | None:
        try:
            with os.scandir(path) as entries:
                return [(e.name, e.stat().st_mtime) for e in entries
                        if e.is_file() and (not e.is_symlink() or jobdir.inside(e.path, path))]
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # another user's job directory
            raise ExternalCommandError(f"cannot list {path}: {exc.strerror or exc}") from exc

    def read(self, path: str, max_bytes: int | None, *, tail: bool = False) -> str | None:
        root = os.path.dirname(path)
        try:
            if max_bytes is None:
                fd = jobdir.open_regular(path, root)
                if fd is None:
                    return None
                with os.fdopen(fd, "rb") as handle:
                    return handle.read().decode(errors="replace")
            data = jobdir.read_bytes(path, max_bytes, root=root, tail=tail)
            return None if data is None else data.decode(errors="replace")
        except OSError as exc:
            raise ExternalCommandError(f"cannot read {path}: {exc.strerror or exc}") from exc


class RemoteFiles:
    """The same over one SSH connection: `scontrol` on the login node, files over SFTP."""

    def __init__(self, client):
        self.client = client
        self.sftp = client.open_sftp()

    def scontrol_job(self, job_id: str) -> str | None:
        from trainctl.launcher.submit import exec_remote   # here: a local `job show` loads no SSH code

        status, out, _ = exec_remote(self.client, shlex.join(["scontrol", "show", "job", "-o", job_id]), "",
                               SCONTROL_TIMEOUT_S)
        return out if status == 0 else None

    def listdir(self, path: str) -> list[tuple[str, float]] | None:
        import paramiko   # here: only `job show` over SSH pays for paramiko

        try:
            return [(a.filename, float(a.st_mtime or 0)) for a in self.sftp.listdir_attr(path)
                    if a.st_mode is not None and stat.S_ISREG(a.st_mode)]
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException) as exc:
            raise ExternalCommandError(f"SFTP: cannot list {path}: {exc}") from exc

    def read(self, path: str, max_bytes: int | None, *, tail: bool = False) -> str | None:
        import paramiko   # here: only `job show` over SSH pays for paramiko

        try:   # a regular file whose real path stays in its directory (SFTP's realpath), never a FIFO
            real, root = self.sftp.normalize(path), self.sftp.normalize(posixpath.dirname(path))
            if not real.startswith(root.rstrip("/") + "/") or not stat.S_ISREG(self.sftp.stat(real).st_mode or 0):
                return None
            with self.sftp.open(real, "rb") as handle:
                if tail and max_bytes is not None:
                    size = handle.stat().st_size or 0
                    handle.seek(max(0, size - max_bytes))
                return (handle.read() if max_bytes is None else handle.read(max_bytes)).decode(errors="replace")
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException) as exc:
            raise ExternalCommandError(f"SFTP: cannot read {path}: {exc}") from exc

    def close(self) -> None:
        self.sftp.close()
        self.client.close()
