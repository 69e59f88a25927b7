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
import posixpath
import re
import shlex
import stat
from dataclasses import dataclass
from typing import Protocol

from trainctl.errors import ExternalCommandError, UsageError
from trainctl.job.goodput import Goodput, WatchAccount, goodput, goodput_lines, watch_account, watch_lines
from trainctl.job.journal import JOURNAL_FILE, parse_journal, timeline_lines
from trainctl.launcher.plan import FLIGHT_RECORDER_PREFIX
from trainctl.slurm import SCONTROL_TIMEOUT_S, fold_hostlist, parse_scontrol_oneliner

TAIL_BYTES = 64 * 1024          # enough for the last lines of any sane log
JSON_MAX_BYTES = 4 * 1024 * 1024
RANK_FILE_RE = re.compile(r"rank-(?P<node>.+)-(?P<rank>\d+)\.out")
JOB_ID_RE = re.compile(r"\d+(_\d+)?")
MAX_ATTEMPTS = 100              # a chain of --retries jobs is followed this far at most
# slurmstepd's own notices in a task's output (`*** STEP 12.1 ON node1 CANCELLED AT ... ***`): Slurm's
# words, not the program's, and written to some ranks' files only, so kept out of the tails.
SLURMSTEPD_RE = re.compile(r"slurmstepd(-[\w.-]+)?: error: \*\*\* .*")


class Files(Protocol):
    """Where the job's files and Slurm are: this machine, or the login node over SSH."""

    def scontrol_job(self, job_id: str) -> str | None: ...
    def listdir(self, path: str) -> list[tuple[str, float]] | None: ...   # (name, mtime); None: no dir
    def read(self, path: str, max_bytes: int, *, tail: bool = False) -> str | None: ...


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
    decision: dict | None
    ranks: tuple[RankLog, ...]
    flight_dumps: tuple[str, ...]  # file names of the flight recorder's per-rank dumps
    chain: tuple[dict, ...] = ()   # submit --retries: each attempt's job id and retry.json, first to last
    journals: tuple[tuple[str, tuple[dict, ...]], ...] = ()   # (job id, its journal's events), first to last


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


def gate_summary(decision: dict | None) -> list[str]:
    if decision is None:
        return ["gate: no decision.json: the gate did not get to decide (or this is not a trainctl job)"]
    chosen, allocated = decision.get("chosen", []), decision.get("allocated", [])
    verdict = "ok" if decision.get("ok") else "FAILED"
    healthy = len(decision.get("healthy", []))
    lines = [f"gate: {verdict}: {healthy} of {len(allocated)} allocated nodes healthy, "
             f"need {decision.get('minimum')}; ran on {fold_hostlist(chosen) if chosen else 'nothing'}"]
    lines += [f"  excluded {item['host']}: {'; '.join(item['reasons'])}"
              for item in decision.get("excluded", [])]
    lines += [f"  warning: {warning}" for warning in decision.get("warnings", [])]
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
    from trainctl.job.retry import summary_line

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
    times = [event.get("submitted_t") if event["event"] == "submitted" else event["t"]
             for _, events in journals for event in events]
    times = [t for t in times if isinstance(t, (int, float))]
    return min(times) if times else None


def chain_goodput(view: JobView, now: float) -> tuple[Goodput | None, WatchAccount | None]:
    """The chain's goodput, and the watch's account where it detected something."""
    attempts = [list(events) for _, events in view.journals]
    result = goodput(attempts, now)
    return result, watch_account(attempts, result, now) if result else None


def timeline_and_goodput(view: JobView, now: float) -> list[str]:
    start = chain_start(view.journals)
    if start is None:
        return ["timeline: no journal.jsonl (a job script from an older trainctl, or the job has not started)"]
    result, account = chain_goodput(view, now)
    lines = ["timeline (from the first submit):"]
    lines += timeline_lines([(job, list(events)) for job, events in view.journals], start)
    lines += goodput_lines(result) if result else []
    return lines + (watch_lines(account) if account else [])


def format_job(view: JobView, line_count: int, now: float) -> str:
    name = view.slurm.get("JobName", "")
    lines = [f"job {view.job_id}{f' ({name})' if name else ''}: gate directory {view.gate_dir}"]
    lines += attempt_lines(view.slurm)
    lines += chain_lines(view.chain, view.job_id)
    lines += gate_summary(view.decision)
    lines += timeline_and_goodput(view, now)
    if not view.ranks:
        lines.append("ranks: no rank-<node>-<rank>.out files (the job step did not start, or the site "
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
    return "\n".join(lines) + "\n"


def to_json(view: JobView, line_count: int, now: float) -> dict:
    result, account = chain_goodput(view, now)
    return {"job_id": view.job_id, "gate_dir": view.gate_dir, "slurm": view.slurm, "decision": view.decision,
            "timeline": [{"job_id": job, "events": list(events)} for job, events in view.journals],
            "goodput": result.to_json() if result else None,
            "watch": account.to_json() if account else None,
            "lines": line_count, "flight_recorder_dumps": list(view.flight_dumps),
            "attempts": [{"job_id": link["job_id"], "retry": link.get("retry")} for link in view.chain],
            "groups": [{"ranks": list(g.ranks), "nodes": list(g.nodes), "tail": list(g.tail),
                        "newest": g.newest} for g in fold_tails(list(view.ranks))]}


# ---------------------------------------------------------------- collect

def collect_job(files: Files, job_id: str, gate_dir: str | None, line_count: int) -> JobView:
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
        gate_dir = posixpath.join(slurm["WorkDir"], f"trainctl-gate-{job_id}")
    entries = files.listdir(gate_dir)
    if entries is None:
        raise UsageError(f"{gate_dir}: no such directory (not a trainctl job, or another --dir)")
    decision_text = files.read(posixpath.join(gate_dir, "decision.json"), JSON_MAX_BYTES)
    try:
        decision = json.loads(decision_text) if decision_text else None
    except ValueError:
        decision = None
    ranks = []
    for name, mtime in entries:
        match = RANK_FILE_RE.fullmatch(name)
        if match:
            text = files.read(posixpath.join(gate_dir, name), TAIL_BYTES, tail=True) or ""
            ranks.append(RankLog(int(match["rank"]), match["node"], last_lines(text, line_count), mtime,
                                 slurm_notes(text)))
    dumps = tuple(sorted(name for name, _ in entries if name.startswith(FLIGHT_RECORDER_PREFIX)))
    chain = collect_chain(files, gate_dir, job_id)
    parent = posixpath.dirname(gate_dir.rstrip("/"))
    journals = tuple((link["job_id"], tuple(parse_journal(files.read(
        posixpath.join(parent, f"trainctl-gate-{link['job_id']}", JOURNAL_FILE), JSON_MAX_BYTES) or "")))
        for link in chain)
    return JobView(job_id, gate_dir, slurm, decision, tuple(sorted(ranks, key=lambda r: r.rank)), dumps,
                   chain, journals)


def collect_chain(files: Files, gate_dir: str, job_id: str) -> tuple[dict, ...]:
    """Follow attempt.json back (the predecessor) and retry.json forward (the successor) through
    the sibling gate directories: every attempt of one --retries job runs in the same submit dir."""
    from trainctl.job.retry import ATTEMPT_FILE, RETRY_FILE

    parent = posixpath.dirname(gate_dir.rstrip("/"))

    def read(job: str, name: str) -> dict | None:
        text = files.read(posixpath.join(parent, f"trainctl-gate-{job}", name), JSON_MAX_BYTES)
        try:
            data = json.loads(text) if text else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    jobs = [job_id]
    while len(jobs) < MAX_ATTEMPTS and (earlier := (read(jobs[0], ATTEMPT_FILE) or {}).get("previous_job")):
        if not JOB_ID_RE.fullmatch(str(earlier)) or str(earlier) in jobs:
            break
        jobs.insert(0, str(earlier))
    while len(jobs) < MAX_ATTEMPTS and (later := (read(jobs[-1], RETRY_FILE) or {}).get("successor")):
        if not JOB_ID_RE.fullmatch(str(later)) or str(later) in jobs:
            break
        jobs.append(str(later))
    return tuple({"job_id": job, "retry": read(job, RETRY_FILE)} for job in jobs)


class LocalFiles:
    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def scontrol_job(self, job_id: str) -> str | None:
        from trainctl.proc import run

        result = run(["scontrol", "show", "job", "-o", job_id], timeout=SCONTROL_TIMEOUT_S, env=self.env)
        if result.missing:
            return None  # no Slurm client here: --dir tells where the files are
        return result.stdout if result.ok else None

    def listdir(self, path: str) -> list[tuple[str, float]] | None:
        import os

        try:
            with os.scandir(path) as entries:
                return [(e.name, e.stat().st_mtime) for e in entries if e.is_file()]
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # another user's job directory
            raise ExternalCommandError(f"cannot list {path}: {exc.strerror or exc}") from exc

    def read(self, path: str, max_bytes: int, *, tail: bool = False) -> str | None:
        try:
            with open(path, "rb") as handle:
                if tail:
                    handle.seek(0, 2)
                    handle.seek(max(0, handle.tell() - max_bytes))
                return handle.read(max_bytes).decode(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ExternalCommandError(f"cannot read {path}: {exc.strerror or exc}") from exc


class RemoteFiles:
    """The same over one SSH connection: `scontrol` on the login node, files over SFTP."""

    def __init__(self, client):
        self.client = client
        self.sftp = client.open_sftp()

    def scontrol_job(self, job_id: str) -> str | None:
        from trainctl.launcher.submit import exec_remote

        status, out, _ = exec_remote(self.client, shlex.join(["scontrol", "show", "job", "-o", job_id]), "",
                               SCONTROL_TIMEOUT_S)
        return out if status == 0 else None

    def listdir(self, path: str) -> list[tuple[str, float]] | None:
        import paramiko

        try:
            return [(a.filename, float(a.st_mtime or 0)) for a in self.sftp.listdir_attr(path)
                    if a.st_mode is not None and stat.S_ISREG(a.st_mode)]
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException) as exc:
            raise ExternalCommandError(f"SFTP: cannot list {path}: {exc}") from exc

    def read(self, path: str, max_bytes: int, *, tail: bool = False) -> str | None:
        import paramiko

        try:
            with self.sftp.open(path, "rb") as handle:
                if tail:
                    size = handle.stat().st_size or 0
                    handle.seek(max(0, size - max_bytes))
                return handle.read(max_bytes).decode(errors="replace")
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException) as exc:
            raise ExternalCommandError(f"SFTP: cannot read {path}: {exc}") from exc

    def close(self) -> None:
        self.sftp.close()
        self.client.close()
