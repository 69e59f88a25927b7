"""The job directory, `trainctl-gate-<jobid>/` in the submit directory: every name in it, and a
typed reader and writer for each file the job's own parts hand to each other.

Who writes what is `LAYOUT` (the docs' table of the directory is generated from it). The files
read back here come from programs, nodes and users that trainctl does not trust, so every
reader here:

- opens only regular files, and never blocks: a FIFO, a device or a directory in a file's place
  reads as missing (the file is looked at with stat first, opened with O_NONBLOCK, and checked
  again with fstat);
- follows no symlink that leads out of the job directory (a rank log linked to /etc/shadow, read
  by root running `job show` on a user's directory);
- reads a bounded number of bytes (the journal is streamed, up to JOURNAL_MAX_BYTES: a job of
  thousands of nodes writes megabytes of it, and its end says whether the job ended);
- turns bad content into None ("unknown") or a skipped line, never an exception: NaN, Infinity,
  numbers no clock or counter reaches, wrong types and deep nesting included.

Where each file is (`JobPaths`) and the journal's lines (their kinds, fields, writer and its
readers) are one floor below, `trainctl.jobdir_names` and `trainctl.journal_events`, so that the
fleet history finds and reads journals by the same names and rules; they are re-exported here
with the directory's other readers. `job show` reads over SSH too: it parses what it reads with
the readers' own functions (`json_object`, `journal_events.journal_lines`).
"""

from __future__ import annotations

import fnmatch
import glob
import heapq
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trainctl.jobdir_names import (ALERTS_LOG, ATTEMPT, CHECKPOINT_MARKER, COMPUTE, DECISION, FABRIC,  # noqa: F401
                                   FINAL_MARKER, GATE_STEP_STATUS, JOURNAL, NODE_REPORTS, REPORT, RETRY, ROUNDS,
                                   SNAPSHOTS, WATCH, JobPaths, dir_name, node_file_name, resize_script)
from trainctl.files import (inside, open_append_regular, open_regular, read_bytes,  # noqa: F401 (open_regular: re-exported)
                            read_fd, write_regular)
# The journal's lines are owned below job/ (the fleet history reads them too); re-exported here
# with the rest of the job directory's readers and writers.
from trainctl.journal_events import (KINDS, NUMBER_LIMIT, Journal, JournalUnreadable, Kind,  # noqa: F401
                                     all_strings, clean, integer, job_ended, loads, number, parse_event,
                                     parse_journal, read_journal, read_journal_bytes, read_journal_since,
                                     string_list)
from trainctl.errors import UsageError
from trainctl.job.decision import Decision
from trainctl.launcher.plan import FLIGHT_RECORDER_PREFIX
from trainctl.guest import wire as guest_wire
from trainctl.guest.wire import LISTENING_FILE, SAVE_APIS, SAVE_PATH_MAX, SIGNAL_REFUSED_FILE
from trainctl.text import printable
from trainctl.validate import JOB_ID

# ---------------------------------------------------------------- names

# Where each file is: `trainctl.jobdir_names` (below the job room: the fleet history finds journals
# by them too), re-exported here with what each file holds.
CHECKPOINT_ENV = guest_wire.CHECKPOINT_ENV
BATCH_HOST_BEAT = "batch-host.beat"
SENTINEL_LOG = "sentinel.log"
DUMP_REQUEST = "dump-request"           # in watch/: holds a token; each agent answers with dump-done-<node>
CHECKPOINT_REQUEST = "checkpoint-request"   # in watch/: the watch's last checkpoint request's token
CHECKPOINT_LISTENING = LISTENING_FILE   # in watch/: made by a rank that takes requests (trainctl.guest)
SIGNAL_REFUSED = SIGNAL_REFUSED_FILE    # in watch/: why the job's signal would not get a save (trainctl.guest)
SIGNAL_REFUSED_MAX_BYTES = 300
PROBE_PREFIX = "alive-"                 # the retry's probe step: alive-<node>.out
# what a gate round writes; moved to rounds/<n>/ before the gate runs again
GATE_ROUND_FILES = (NODE_REPORTS, SNAPSHOTS, COMPUTE, FABRIC, DECISION, REPORT, GATE_STEP_STATUS)


def stacks_file(node: str) -> str:
    return f"stacks-{node}.txt"


def dump_done_file(node: str) -> str:
    return f"dump-done-{node}"


def gate_log(node: str) -> str:
    return f"node-{node}.log"


def rank_log(node: str, rank: int | str) -> str:
    return f"rank-{node}-{rank}.out"


RANK_LOG_RE = re.compile(r"rank-(?P<node>.+)-(?P<rank>\d+)\.out")   # rank_log's names, read back
# srun --output patterns (%N: the node's name, srun(1) filename pattern)
GATE_LOG_PATTERN = gate_log("%N")
AGENT_LOG_PATTERN = f"{WATCH}/agent-%N.log"
SENTINEL_OUT = "sentinel.out"
RESIZE_SCRIPT_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Entry:
    name: str
    written_by: str
    what: str


LAYOUT = (
    Entry(f"{REPORT}, {DECISION}", "`gate decide`", "the decision: healthy and excluded nodes with reasons, "
          "fabric and compute figures, drains, the chosen nodes"),
    Entry(gate_log("<node>"), "the gate step", "each node's gate output"),
    Entry(f"{NODE_REPORTS}/<node>.json, {NODE_REPORTS}/<node>.final", "the gate step",
          "each node's checks; final once its counters were judged after the fabric test"),
    Entry(f"{SNAPSHOTS}/<node>/, {SNAPSHOTS}/<node>.after-fabric/", "the gate step",
          "each node's snapshot ([Snapshot layout](reference/snapshot.md))"),
    Entry(f"{FABRIC}, {COMPUTE}/<node>.json", "the gate step", "the fabric test's report, each node's compute figures"),
    Entry(f"{GATE_STEP_STATUS}, {BATCH_HOST_BEAT}, {SENTINEL_LOG}, {SENTINEL_OUT}",
          "the supervisor, the job script, the sentinel",
          "the gate step's exit, the batch host's heartbeat, the sentinel's log and output"),
    Entry(resize_script("<jobid>"), "`scontrol update`", "after the release: the job's new node list, "
          "read as words by the supervisor (never run)"),
    Entry(JOURNAL, "the supervisor", "every event of the job, one JSON object a line (`trainctl job show` "
          "reads its timeline and goodput from it)"),
    Entry(f"{WATCH}/<node>.json, {WATCH}/agent-<node>.log", "each node's agent", "its ranks' progress (steps, "
          "step and compute time, checkpoints reported with `trainctl.progress`) and its checks that newly "
          "fail; its output"),
    Entry(f"{WATCH}/{DUMP_REQUEST}, {WATCH}/{dump_done_file('<node>')}, {WATCH}/{stacks_file('<node>')}",
          "the supervisor, each node's agent", "after a hang: the request for every rank's stack, "
          "and each node's answer"),
    Entry(f"{WATCH}/{CHECKPOINT_REQUEST}, {WATCH}/{CHECKPOINT_LISTENING}, {WATCH}/{SIGNAL_REFUSED}",
          "the supervisor, a rank",
          "the watch's request for a checkpoint, relayed by each agent to its ranks; the mark of a rank "
          "that takes such requests, and why the job's signal would not get a save (with either, no "
          "signal is sent)"),
    Entry(ALERTS_LOG, "the supervisor", "each run of the alert command (the site's [alerts] command, submit "
          "--alert-command): the event, how it ended, its output (capped)"),
    Entry(f"{ROUNDS}/<n>/", "the supervisor", "an earlier gate round's files and the watch's evidence from "
          "the training after it, moved aside before the gate runs again"),
    Entry(CHECKPOINT_MARKER, "the program", f"written after each checkpoint, at ${CHECKPOINT_ENV}: "
          "its mtime is the save's time, its first line a note"),
    Entry(f"{rank_log('<node>', '<rank>')}, {FLIGHT_RECORDER_PREFIX}<rank>", "the training step",  # type: ignore[arg-type]
          "the training ranks' output and flight-recorder dumps"),
    Entry(f"{RETRY}, {ATTEMPT}, {PROBE_PREFIX}<node>.out", "the supervisor",
          "with `--retries` ([Submitting jobs](submit.md#requeue-around-bad-nodes))"),
)


def layout_table() -> str:
    """The Markdown table of the directory, for the docs."""
    rows = ["| file | written by | what |", "|---|---|---|"]
    rows += [f"| {', '.join(f'`{part}`' for part in entry.name.split(', '))} | {entry.written_by} | {entry.what} |"
             for entry in LAYOUT]
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- reading without trust

JSON_MAX_BYTES = 4 << 20                # decision.json of thousands of nodes, retry.json
NODE_FILE_MAX_BYTES = 1 << 20           # a node file with thousands of ranks is still far below


def _quietly(read, *args, **kwargs):
    """A reader for the job's own parts: an unreadable file is a missing one."""
    try:
        return read(*args, **kwargs)
    except OSError:
        return None


def read_token(path: str | os.PathLike, cap: int, *, root: str | os.PathLike) -> str | None:
    """A short token file of the job directory (a watch request, an answer, the batch host's beat):
    its first `cap` bytes, stripped;
    None: no such file, or one that cannot be read. A FIFO there never blocks the reader."""
    data = _quietly(read_bytes, path, cap, root=root)
    return None if data is None else data.decode(errors="replace").strip()


def read_signal_refusal(paths: JobPaths) -> str | None:
    """Why a rank said the job's --signal would not get it to save (one line: "rank R: why");
    None: no rank said so, or the file cannot be read."""
    text = read_token(paths.watch / SIGNAL_REFUSED, SIGNAL_REFUSED_MAX_BYTES, root=paths.watch)
    return printable(text.splitlines()[0]) if text else None


def read_json(path: str | os.PathLike, cap: int = JSON_MAX_BYTES, *, root=None) -> dict | None:
    """A JSON object from a file, or None: missing, not a regular file, unreadable, cut at `cap`,
    not JSON or not an object."""
    return read_json_file(path, cap, root=root)[0]


def read_json_file(path: str | os.PathLike, cap: int = JSON_MAX_BYTES, *, root=None,
                   limited: bool = True) -> tuple[dict | None, str | None]:
    """A JSON object from a file, and None; or None and why not in a few words (None too where
    there is no such file): not a regular file (a FIFO, a device, a directory, a link out of
    `root`), unreadable, over `cap` bytes, not JSON, not an object. NaN and Infinity read as null;
    `limited`: numbers past NUMBER_LIMIT too (`clean`), where the reader takes them for times or
    counts (a node's health report keeps a counter's raw value)."""
    document, problem = _json_document(path, cap, root)
    if problem is None and document is not None and not isinstance(document, dict):
        return None, "not a JSON object"
    return (clean(document) if limited and document is not None else document), problem


def _json_document(path: str | os.PathLike, cap: int, root) -> tuple[Any, str | None]:
    try:
        data = read_bytes(path, cap + 1, root=root)
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    if data is None:
        return None, "not a regular file" if os.path.lexists(path) else None
    return json_document(data, cap)


def json_document(data: bytes | str, cap: int) -> tuple[Any, str | None]:
    """The JSON value of a file's first `cap` + 1 bytes (read here, or over SSH by `job show`), and
    None; or None and why not: over `cap` bytes, not JSON (NaN and Infinity read as null)."""
    if len(data) > cap:
        return None, f"larger than {cap} bytes"
    try:
        return loads(data), None
    except ValueError:
        return None, "not JSON"


def json_object(data: bytes | str, cap: int = JSON_MAX_BYTES) -> dict | None:
    """`json_document`'s object, `clean`; None where it is none."""
    document, problem = json_document(data, cap)
    return clean(document) if problem is None and isinstance(document, dict) else None


def read_compute_order(paths: JobPaths) -> list[int] | None:
    """Node 0's order of the compute test's turns (ranks); None where there is none, or it is not one."""
    order, _ = _json_document(paths.compute_order, JSON_MAX_BYTES, paths.root)
    if not isinstance(order, list) or not all(integer(rank) is not None for rank in order):
        return None
    return order


def write_json(path: str | os.PathLike, data: Mapping | list) -> None:
    """Whole or not at all, as a regular file of the job's own (`write_regular`: UsageError where
    something else is in its place); strict JSON: a NaN or infinity in `data` is written as null."""
    try:
        text = json.dumps(data, indent=1, allow_nan=False)
    except ValueError:
        text = json.dumps(finite(data), indent=1, allow_nan=False)
    write_regular(path, text + "\n")


def finite(value: Any) -> Any:
    """`value` with each NaN and infinity as None (what a reader here makes of them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def write_report(paths: JobPaths, text: str, *, append: bool = False) -> str | None:
    """report.txt, the gate's and the retry's words for a human: written whole (or a line added,
    `append`) where it is a regular file or none yet; None, or why not in one line (a FIFO or
    a directory in its place is never opened for writing, never waited on)."""
    try:
        if not append:
            write_regular(paths.report, text)
            return None
        fd = open_append_regular(paths.report)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except UsageError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot write {paths.report}: {exc.strerror or exc}"
    return None


# ---------------------------------------------------------------- the decision

def read_decision(paths: JobPaths) -> Decision | None:
    """`gate decide`'s decision.json; None when there is none, or it is not one."""
    document = read_json(paths.decision, root=paths.root)
    return decision_from_json(document)


def decision_from_json(document: Any) -> Decision | None:
    try:
        return Decision.from_json(document)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


# ---------------------------------------------------------------- retry.json, attempt.json

@dataclass(frozen=True)
class RetryRecord:
    """What a failed attempt decided about its successor (retry.json)."""

    job_id: str
    attempt: int
    retries: int
    phase: str                               # "gate" or "step"
    status: int
    retry: bool
    reason: str
    bad_nodes: Mapping[str, str] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    successor: str | None = None
    error: str | None = None
    previous_job: str | None = None
    excluded_before: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "attempt": self.attempt, "retries": self.retries,
                "previous_job": self.previous_job, "excluded_before": list(self.excluded_before),
                "phase": self.phase, "status": self.status, "retry": self.retry, "reason": self.reason,
                "bad_nodes": dict(self.bad_nodes), "exclude": list(self.exclude), "successor": self.successor,
                "error": self.error}

    @classmethod
    def from_json(cls, data: Any) -> RetryRecord:
        """ValueError unless `data` is a retry record."""
        if not isinstance(data, dict):
            raise ValueError("not an object")
        attempt, retries, status = integer(data.get("attempt")), integer(data.get("retries")), integer(data.get("status"))
        bad = data.get("bad_nodes") or {}
        if (None in (attempt, retries, status) or not isinstance(data.get("retry"), bool)
                or not all_strings(data.get("job_id"), data.get("reason"), data.get("phase"))
                or not isinstance(bad, dict) or not all_strings(*bad, *bad.values())
                or not string_list(data.get("exclude") or []) or not string_list(data.get("excluded_before") or [])
                or not all(data.get(key) is None or isinstance(data.get(key), str)
                           for key in ("successor", "error", "previous_job"))):
            raise ValueError("not a retry record")
        return cls(data["job_id"], attempt, retries, data["phase"], status, data["retry"], data["reason"],
                   dict(bad), tuple(data.get("exclude") or ()), data.get("successor"), data.get("error"),
                   data.get("previous_job"), tuple(data.get("excluded_before") or ()))


@dataclass(frozen=True)
class AttemptRecord:
    """A successor's place in the chain (attempt.json, written by its predecessor)."""

    job_id: str
    attempt: int
    retries: int
    previous_job: str
    excluded: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "attempt": self.attempt, "retries": self.retries,
                "previous_job": self.previous_job, "excluded": list(self.excluded)}

    @classmethod
    def from_json(cls, data: Any) -> AttemptRecord:
        if (not isinstance(data, dict) or not all_strings(data.get("job_id"), data.get("previous_job"))
                or integer(data.get("attempt")) is None or integer(data.get("retries")) is None
                or not string_list(data.get("excluded") or [])):
            raise ValueError("not an attempt record")
        return cls(data["job_id"], data["attempt"], data["retries"], data["previous_job"],
                   tuple(data.get("excluded") or ()))


def read_retry(paths: JobPaths) -> RetryRecord | None:
    try:
        return RetryRecord.from_json(read_json(paths.retry, root=paths.root))
    except ValueError:
        return None


def read_attempt(paths: JobPaths) -> AttemptRecord | None:
    try:
        return AttemptRecord.from_json(read_json(paths.attempt, root=paths.root))
    except ValueError:
        return None


CHAIN_MAX_ATTEMPTS = 100               # a chain of successors is followed back this far at most


def earlier_attempts(paths: JobPaths) -> list[tuple[str, list[dict]]]:
    """The chain's attempts before this job, first first: each one's job id and journal, found
    through attempt.json (written by each predecessor into its successor's directory) in the
    sibling directories; [] for a chain's first job."""
    attempts: list[tuple[str, list[dict]]] = []
    seen = {paths.root.name}
    record = read_attempt(paths)
    while record is not None and len(attempts) < CHAIN_MAX_ATTEMPTS:
        earlier = paths.sibling(record.previous_job)
        if not JOB_ID.fullmatch(record.previous_job) or earlier.root.name in seen:
            break
        seen.add(earlier.root.name)
        try:
            events = read_journal(earlier.journal, earlier.root)
        except OSError:
            events = []
        attempts.insert(0, (record.previous_job, events))
        record = read_attempt(earlier)
    return attempts


# ---------------------------------------------------------------- the journal (its lines: trainctl.journal_events)

def drop_journal(path: str, directory: str, job_id: str) -> str:
    """Copy the journal at `path` to `directory`/<job_id>.jsonl (a partial copy is never seen
    under that name); returns "" or what went wrong, in a few words. The journal is read by its
    own reader (`read_journal_bytes`): a FIFO or device in its place is refused, never waited on."""
    target = os.path.join(os.path.expanduser(directory), f"{job_id}.jsonl")
    part = os.path.join(os.path.dirname(target), f".{job_id}.part-{os.getpid()}")
    try:
        data = read_journal_bytes(path, os.path.dirname(os.path.abspath(path)))   # no link out of the job directory
    except JournalUnreadable as exc:
        return f"{path}: {exc}"
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(part, target)
    except OSError as exc:
        try:
            os.unlink(part)
        except OSError:
            pass
        return f"{exc.filename or target}: {exc.strerror or exc}"
    return ""


# ---------------------------------------------------------------- node files (watch/<node>.json)

NODE_FILE_FORMAT = 1


class RankProgress(NamedTuple):      # a tuple: one per rank per poll, built by the ten thousand
    """One rank's running totals, as its node's agent folds its reports and the node file holds them."""

    rank: int
    steps: int = 0
    step_seconds: float = 0.0           # summed durations of those steps, as the rank measured them
    last_step_t: float = 0.0            # wall time the last step ended (0: none yet)
    pid: int = 0
    compute_seconds: float = 0.0        # summed time inside progress.compute()
    checkpoint_step: int | None = None  # the step of its last progress.checkpoint()
    checkpoint_t: float = 0.0           # when the agent got that report (0: none)
    activity: int = 0                   # looks that found its main thread somewhere new (steps or not)
    # its main thread's time on a CPU and waiting for one, read by the agent with `steps`
    # (health/parse/schedstat.py); None: not read (no such thread, no schedstat in the kernel)
    cpu_seconds: float | None = None
    runq_seconds: float | None = None
    step_seconds_sq: float = 0.0        # summed squares of the steps' durations (`trainctl.job.agent.squares`)
    # its program's last save seen with no code (`trainctl.guest.save_hooks`): when it completed,
    # which API made it (`trainctl.guest.wire.SAVE_APIS`) and the path it wrote ("": none)
    save_t: float = 0.0
    save_api: str = ""
    save_path: str = ""


class LinkReading(NamedTuple):
    """One of the node's links as its agent last read it (health/parse/link_counters.py): cumulative
    counts since the kernel made them."""

    link: str                           # "eth0" (its root qdisc) or "mlx5_0:1" (an InfiniBand port)
    source: str                         # "qdisc" or "ib"
    sent_bytes: int
    wait: int                           # the times the link held its sender back or dropped (qdisc), or
                                        # its ticks waiting for credit to send (ib)


LINK_SOURCES = ("qdisc", "ib")
LINK_COUNT_LIMIT = 1 << 66              # a kernel's 64-bit counter, of 4-byte words (InfiniBand's data)


@dataclass(frozen=True)
class NodeReading:
    """One node agent's file: what its ranks reported, which of its checks newly fail, and its links."""

    node: str
    written_t: float
    ranks: tuple[RankProgress, ...] = ()
    failed_checks: tuple[tuple[str, str], ...] = ()     # (check, reason)
    unknown_checks: tuple[tuple[str, str], ...] = ()
    started_t: float = 0.0
    checks_t: float | None = None                       # the last check run's end
    check_runs: int = 0
    links: tuple[LinkReading, ...] = ()
    links_t: float | None = None                        # when they were read (None: not read)


def node_file_json(reading: NodeReading) -> dict[str, Any]:
    """The node file the agent writes:

        {"format": 1, "node": "node2", "t": <written>, "started_t": <agent start>,
         "ranks": {"0": {"pid": 123, "steps": 57, "step_seconds": 14.3, "compute_seconds": 3.1,
                         "last_step_t": 1764236000.5, "checkpoint_step": 50, "checkpoint_t": ...,
                         "activity": 812, "cpu_seconds": 9.8, "runq_seconds": 0.4, "step_seconds_sq": 3.6,
                         "save": {"t": ..., "api": "torch.save", "path": "/ckpt/step_50.pt"}}},
         "checks": {"t": <last run's end or null>, "runs": 3,
                    "failed": [{"check": "gpu.xid", "reason": "..."}], "unknown": [...]},
         "links": {"t": <read>, "ports": {"eth0": {"source": "qdisc", "sent_bytes": 9e8, "wait": 4711}}}}

    "links" is absent where the agent read none (and in files of agents before it read them);
    a rank's "save" where its program has made none seen.
    """
    return {
        "format": NODE_FILE_FORMAT, "node": reading.node, "t": reading.written_t, "started_t": reading.started_t,
        "ranks": {str(p.rank): {"pid": p.pid, "steps": p.steps, "step_seconds": p.step_seconds,
                                "compute_seconds": p.compute_seconds, "last_step_t": p.last_step_t or None,
                                "checkpoint_step": p.checkpoint_step, "checkpoint_t": p.checkpoint_t or None,
                                "activity": p.activity, "cpu_seconds": p.cpu_seconds,
                                "runq_seconds": p.runq_seconds, "step_seconds_sq": p.step_seconds_sq,
                                **({"save": {"t": p.save_t, "api": p.save_api, "path": p.save_path}}
                                   if p.save_path else {})}
                  for p in sorted(reading.ranks)},
        "checks": {"t": reading.checks_t, "runs": reading.check_runs,
                   "failed": [{"check": check, "reason": reason} for check, reason in reading.failed_checks],
                   "unknown": [{"check": check, "reason": reason} for check, reason in reading.unknown_checks]},
        **({"links": {"t": reading.links_t, "ports": {link.link: {"source": link.source, "sent_bytes": link.sent_bytes,
                                                                  "wait": link.wait}
                                                      for link in reading.links}}}
           if reading.links_t is not None else {}),
    }


def parse_node_file(text: str | bytes) -> NodeReading | None:
    """A node agent's file; None when it is not one (torn, foreign, another format, values no
    agent writes: non-finite or huge numbers, wrong types, deep nesting)."""
    try:
        data = loads(text, strict=True)
        if not isinstance(data, dict) or data.get("format") != NODE_FILE_FORMAT or not isinstance(data.get("node"), str):
            return None
        ranks = tuple(sorted(_rank(rank, r) for rank, r in _object(data.get("ranks")).items()))
        checks = _object(data.get("checks"))
        written = _time(data.get("t"), required=True)
        links = _object(data.get("links"))
        return NodeReading(data["node"], written, ranks, _problems(checks.get("failed")),
                           _problems(checks.get("unknown")), _time(data.get("started_t")),
                           _time(checks.get("t")) or None, int(_count(checks.get("runs"))),
                           tuple(_link(name, port) for name, port in sorted(_object(links.get("ports")).items())),
                           _time(links["t"], required=True) if links else None)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None


def _object(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def _time(value: Any, *, required: bool = False) -> float:
    if value is None and not required:
        return 0.0
    if number(value) is None:
        raise ValueError(f"not a time: {value!r}")
    return float(value)


def _count(value: Any) -> int:
    if value is None:
        return 0
    if integer(value) is None or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


_COUNT, _NUMBER = (int,), (int, float)


def _rank(rank: str, r: Any) -> RankProgress:
    """One rank's entry; the checks inline (this runs once per rank per poll, ten thousands of them)."""
    if type(r) is not dict:
        raise ValueError("not an object")
    get = r.get
    checkpoint = get("checkpoint_step")
    progress = RankProgress(int(rank), r["steps"], r["step_seconds"], get("last_step_t") or 0.0, get("pid") or 0,
                            get("compute_seconds") or 0.0, checkpoint, get("checkpoint_t") or 0.0,
                            get("activity") or 0, get("cpu_seconds"), get("runq_seconds"),
                            get("step_seconds_sq") or 0.0, *_save(get("save")))
    for value, kinds in zip(progress, (_COUNT, _COUNT, _NUMBER, _NUMBER, _COUNT, _NUMBER)):
        if type(value) not in kinds or not 0 <= value <= NUMBER_LIMIT:
            raise ValueError(f"not a count or time: {value!r}")
    if checkpoint is not None and (type(checkpoint) is not int or not 0 <= checkpoint <= NUMBER_LIMIT):
        raise ValueError(f"not a step: {checkpoint!r}")
    if type(progress.checkpoint_t) not in _NUMBER or not 0 <= progress.checkpoint_t <= NUMBER_LIMIT:
        raise ValueError("not a time")
    if type(progress.activity) not in _COUNT or not 0 <= progress.activity <= NUMBER_LIMIT:
        raise ValueError("not a count")
    for value in (progress.cpu_seconds, progress.runq_seconds):
        if value is not None and (type(value) not in _NUMBER or not 0 <= value <= NUMBER_LIMIT):
            raise ValueError("not a time")
    if type(progress.step_seconds_sq) not in _NUMBER or not 0 <= progress.step_seconds_sq <= NUMBER_LIMIT:
        raise ValueError("not a sum of squares")
    return progress


def _save(save: Any) -> tuple[float, str, str]:
    if save is None:
        return 0.0, "", ""
    if type(save) is not dict or save.get("api") not in SAVE_APIS or type(save.get("path")) is not str \
            or not 0 < len(save["path"]) <= SAVE_PATH_MAX:
        raise ValueError("not a save")
    return _time(save.get("t"), required=True), save["api"], save["path"]


def _link(name: str, port: Any) -> LinkReading:
    port = _object(port)
    if port.get("source") not in LINK_SOURCES:
        raise ValueError(f"not a link source: {port.get('source')!r}")
    counts = (port["sent_bytes"], port["wait"])
    if not all(type(count) is int and 0 <= count <= LINK_COUNT_LIMIT for count in counts):
        raise ValueError("not a count")
    return LinkReading(name, port["source"], *counts)


def _problems(items: Any) -> tuple[tuple[str, str], ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ValueError("not a list")
    return tuple((str(_object(item)["check"]), str(item.get("reason", ""))) for item in items)


def read_node_files(paths: JobPaths, nodes: Iterable[str]) -> dict[str, NodeReading | None]:
    """Each node's agent file (None: none yet, or not one of that node's); nothing when watch/
    leads out of the job directory."""
    if not inside(paths.watch, paths.root):
        return {node: None for node in nodes}
    return {node: read_node_file(paths, node) for node in nodes}


def read_node_file(paths: JobPaths, node: str) -> NodeReading | None:
    watch = str(paths.watch)
    data = _quietly(read_bytes, os.path.join(watch, node_file_name(node)), NODE_FILE_MAX_BYTES + 1, root=watch)
    return _node_reading(data, node)


def _node_reading(data: bytes | None, node: str) -> NodeReading | None:
    if data is None or len(data) > NODE_FILE_MAX_BYTES:
        return None
    reading = parse_node_file(data)
    return reading if reading is not None and reading.node == node else None


FileKey = tuple[int, int, int, int]     # a file's device, inode, size and mtime_ns


class NodeFiles:
    """One job directory's node files, each read and parsed again only where it changed: a reading
    is kept with its file's (device, inode, size, mtime_ns), and a file that still has the same four
    is not read again. An agent writes a new file and renames it over the old one, so each of its
    writes is a new inode. The readers' rules hold: a regular file only (`open_regular`: never a
    FIFO, a symlink only inside watch/), opened non-blocking, read up to the cap."""

    def __init__(self, paths: JobPaths):
        self.paths = paths
        self.kept: dict[str, tuple[FileKey, NodeReading | None]] = {}

    def read(self, nodes: Iterable[str]) -> dict[str, NodeReading | None]:
        """Each node's agent file, as `read_node_files` reads it."""
        if not inside(self.paths.watch, self.paths.root):
            self.kept = {}
            return {node: None for node in nodes}
        watch = str(self.paths.watch)
        kept: dict[str, tuple[FileKey, NodeReading | None]] = {}
        for node in nodes:
            try:
                fd = open_regular(os.path.join(watch, node_file_name(node)), watch)
            except OSError:
                continue
            if fd is None:
                continue
            try:
                info = os.fstat(fd)
                key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
                before = self.kept.get(node)
                kept[node] = before if before is not None and before[0] == key else \
                    (key, _node_reading(read_fd(fd, NODE_FILE_MAX_BYTES + 1), node))
            except OSError:
                pass
            finally:
                os.close(fd)
        self.kept = kept
        return {node: kept[node][1] if node in kept else None for node in nodes}


def write_node_file(paths: JobPaths, reading: NodeReading) -> None:
    """Whole or not at all (UsageError where it cannot be written)."""

    write_regular(paths.node_file(reading.node), json.dumps(node_file_json(reading), allow_nan=False) + "\n")


# ---------------------------------------------------------------- checkpoints seen

MARKER_NOTE_BYTES = 200
# A poll spends at most this long on the patterns (and one step more), then goes on from there at
# the next poll: under half of the watch's share of its 1 s poll (driver.WATCH_SHARE), and counted in it.
CHECKPOINT_SLICE_S = 0.02
MAX_WALKED_DIRECTORIES = 64             # the newest matched directories (by their own mtime) looked into
MAX_WALK_ENTRIES = 10_000               # entries inside a pattern's matched directories looked at each pass
MAX_WALK_DEPTH = 8                      # levels below a matched directory (Megatron: iter_N/mp_rank_00/...)
# A directory's newest time must hold this long to be a finished save: one of the watch's polls
# (watch.poll_s, 1 s), five of the 0.2 s ones while the supervisor waits for a save it asked for.
DIRECTORY_QUIET_S = 1.0


class Save(NamedTuple):
    t: float            # when it was written
    source: str         # what said so: the marker, a file the site or submit named, a rank's report
    note: str = ""


def checkpoint_seen(last: float | None, since: float, saves: Iterable[Save]) -> Save | None:
    """The newest save after `since` (the training step's start) and after `last` (the last one
    seen), from any source; None when there is none new. The one rule for every source."""
    newest = max((save for save in saves if save.t > since and (last is None or save.t > last)),
                 key=lambda save: save.t, default=None)
    return newest


class Written(NamedTuple):
    """A matched directory's newest time, and when (the poller's clock) it was first seen so."""

    newest: float
    seen_at: float


def file_saves(patterns: Iterable[str], base: str | os.PathLike, directories_before: Mapping[str, Written] | None = None,
               now: float = 0.0) -> tuple[list[Save], dict[str, Written]]:
    """One whole pass of `save_steps` at `now`, however long it takes."""
    return finish(save_steps(patterns, base, directories_before or {}, lambda: now))


Steps = Generator[None, None, Any]


def finish(steps: Steps) -> Any:
    """What `steps` returns, once every step of it is taken."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def save_steps(patterns: Iterable[str], base: str | os.PathLike, directories_before: Mapping[str, Written],
               clock: Callable[[], float]) -> Steps:
    """A pass over the patterns, one step (a yield) for each name looked at, so that a caller may
    stop between any two and go on later; it returns the newest save matching each pattern (a path
    or a glob, relative to `base` unless absolute), and each looked-into directory's newest time at
    `clock()`, for the next pass. Every name a pattern matches is looked at, however many.

    A regular file is a save at its mtime. A directory (Transformers' checkpoint-N/, Accelerate's
    save_state folder, torch.distributed.checkpoint, Megatron's iter_N/) is one once its writing
    has ended: it holds a regular file, and its newest time (`walk_steps`) is the one the previous
    pass saw (`directories_before`), DIRECTORY_QUIET_S or more before. The MAX_WALKED_DIRECTORIES
    newest directories (by their own mtime) are looked into, newest first, MAX_WALK_ENTRIES
    entries in all a pattern. stat never blocks and no file is opened; directories are only listed."""
    saves, directories = [], {}
    for pattern in patterns:
        newest: tuple[float, str] | None = None
        matched_directories: list[tuple[float, str]] = []     # a heap: the oldest kept is dropped first
        top = "/" if os.path.isabs(pattern) else os.fspath(base)
        for name in glob_steps(top, pattern.strip("/").split("/")):
            yield
            if name is None:
                continue
            try:
                found = os.stat(name)
            except OSError:
                continue
            if stat.S_ISREG(found.st_mode) and (newest is None or found.st_mtime > newest[0]):
                newest = (found.st_mtime, name)
            elif stat.S_ISDIR(found.st_mode):
                push = heapq.heappush if len(matched_directories) < MAX_WALKED_DIRECTORIES else heapq.heappushpop
                push(matched_directories, (found.st_mtime, name))
        budget = MAX_WALK_ENTRIES
        for _, name in sorted(matched_directories, reverse=True):
            if budget <= 0:
                break
            written, looked = yield from walk_steps(name, budget)
            budget -= looked
            if written is None:
                continue
            seen, now = directories_before.get(name), clock()
            held = seen is not None and seen.newest == written
            directories[name] = seen if held else Written(written, now)
            if held and now - seen.seen_at >= DIRECTORY_QUIET_S and (newest is None or written > newest[0]):
                newest = (written, name)
        if newest is not None:
            saves.append(Save(newest[0], pattern, os.path.relpath(newest[1], base)))
    return saves, directories


def glob_steps(directory: str, parts: list[str]) -> Iterator[str | None]:
    """The names under `directory` that match the pattern `parts` (its levels), by glob's rules
    (a level that starts with no '.' matches no hidden name; '**' is '*'), and a None for each
    other entry looked at: a step each, so that a walk of a large tree can be spread over polls.
    A directory on the way may be a link to one, as with glob."""
    part, rest = parts[0], parts[1:]
    if not glob.has_magic(part):
        path = os.path.join(directory, part)
        if rest:
            yield from glob_steps(path, rest)
        else:
            yield path if os.path.lexists(path) else None
        return
    hidden = part.startswith(".")
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                matches = fnmatch.fnmatchcase(entry.name, part) and (hidden or not entry.name.startswith("."))
                yield entry.path if matches and not rest else None
                if matches and rest and entry.is_dir():
                    yield from glob_steps(entry.path, rest)
    except OSError:     # not a directory, gone, or not ours to list
        yield None


def newest_inside(directory: str, budget: int) -> tuple[float | None, int]:
    """All of `walk_steps` at once."""
    return finish(walk_steps(directory, budget))


def walk_steps(directory: str, budget: int) -> Steps:
    """The newest mtime under `directory`: of its regular files, and of the directories on the way
    (a file renamed into place changes only its directory's), with how many entries were looked
    at; a step for each. None when no regular file was seen: an empty directory is no save. At
    most `budget` entries and MAX_WALK_DEPTH levels; no symlink inside is followed (a loop cannot
    hold it), and nothing but a directory is opened, to list it (a FIFO or a device is only lstat'ed)."""
    try:
        newest = os.stat(directory).st_mtime
    except OSError:
        return None, 0
    saw_file, looked = False, 0
    folders = [(directory, 0)]
    while folders and looked < budget:
        folder, depth = folders.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    looked += 1
                    if looked > budget:
                        break
                    yield
                    try:
                        found = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISREG(found.st_mode):
                        saw_file, newest = True, max(newest, found.st_mtime)
                    elif stat.S_ISDIR(found.st_mode):
                        newest = max(newest, found.st_mtime)
                        if depth + 1 < MAX_WALK_DEPTH:
                            folders.append((entry.path, depth + 1))
        except OSError:          # gone, or no longer a directory, since it was listed
            continue
    return (newest if saw_file else None), min(looked, budget)


def marker_save(paths: JobPaths) -> Save | None:
    """The program's CHECKPOINT_MARKER: its mtime, and the start of what it wrote as the note."""
    if not inside(paths.checkpoint_marker, paths.root):
        return None
    try:
        found = os.stat(paths.checkpoint_marker)
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    note = _quietly(read_bytes, paths.checkpoint_marker, MARKER_NOTE_BYTES, root=paths.root) or b""
    return Save(found.st_mtime, CHECKPOINT_MARKER, " ".join(note.decode(errors="replace").split()))


def rank_saves(readings: Iterable[NodeReading | None]) -> list[Save]:
    """progress.checkpoint() of any rank, and the last save each rank's program made (seen with no
    code: torch.save to a path, torch.distributed.checkpoint, safetensors, Lightning), as the node
    agents' files report them."""
    return [save for reading in readings if reading for rank in reading.ranks for save in (
        *([Save(rank.checkpoint_t, "progress.checkpoint()", f"step {rank.checkpoint_step}")]
          if rank.checkpoint_t > 0 else []),
        *([Save(rank.save_t, rank.save_api, rank.save_path)] if rank.save_path else []))]


class Checkpoints:
    """The program's saves during one training step, from every source it has: the marker at
    $TRAINCTL_CHECKPOINT_FILE, the files and directories the site's `launch.checkpoints` or
    submit's `--checkpoints` name (a directory once its newest time held DIRECTORY_QUIET_S), and
    progress.checkpoint() through the node files.

    The patterns are looked at `slice_s` a poll (and one step more), the next poll going on where
    this one stopped; a save they name counts once a whole pass has looked at every name, so the
    newest is never missed, however many there are. `cost_s`: the last poll's time."""

    def __init__(self, paths: JobPaths, patterns: Iterable[str], base: str | os.PathLike, since: float,
                 clock: Callable[[], float] = time.monotonic, slice_s: float = CHECKPOINT_SLICE_S):
        self.paths, self.patterns, self.base = paths, tuple(pattern for pattern in patterns if pattern), base
        self.since, self.clock, self.slice_s = since, clock, slice_s
        self.last: float | None = None
        self.files: list[Save] = []                 # what the last whole pass over the patterns found
        self.directories: dict[str, Written] = {}   # each matched directory's newest time, since when
        self.passing: Steps | None = None           # the pass under way
        self.cost_s = 0.0

    def poll(self, readings: Iterable[NodeReading | None] = ()) -> Save | None:
        """The newest save since the last one this returned, from every source (None: none new);
        the job's machine journals it (`trainctl.job.machine`, the events that carry it)."""
        began = time.monotonic()
        self._step_patterns(began + self.slice_s)
        marker = marker_save(self.paths)
        saves = [*([marker] if marker else []), *self.files, *rank_saves(readings)]
        seen = checkpoint_seen(self.last, self.since, saves)
        if seen is not None:
            self.last = seen.t
        self.cost_s = time.monotonic() - began
        return seen

    def _step_patterns(self, until: float) -> None:
        if self.passing is None:
            self.passing = save_steps(self.patterns, self.base, self.directories, self.clock)
        try:
            next(self.passing)
            while time.monotonic() < until:
                next(self.passing)
        except StopIteration as done:
            self.files, self.directories = done.value
            self.passing = None
