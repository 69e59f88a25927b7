"""Fleet memory: every job's verdicts on its nodes, folded from the jobs' journals into the
sweep history, and the lemon rule that reads them back.

A job never touches the shared history: its supervisor writes its own journal (and, where the
site names `fleet.journal_dir`, copies it there when the job ends). The nightly sweep and
`trainctl history ingest` fold the journals in: each event becomes a `job_events` row per node
it names, keyed by (job id, journal line, node), so a journal folded twice, or two copies of
it, add nothing. A journal that is damaged, from another site, from the future, or shorter
than when it was folded in is refused with one line and changes nothing.

Slurm vouches for every journal before it adds anything (`vouch`): its job ran, its file is the
job's user's, it names only nodes the job held, at times the job ran, by Slurm's accounting (sacct,
asked in batches). A journal it does not vouch for adds nothing and is refused with one line.

A journal is read by the journal's own readers (`trainctl.journal_events`): its bytes by
`read_journal_bytes` (a regular file only, never blocking, capped; in the directory it was found
in, never through a link out of it: the drop directory is everyone's), its lines split by
`journal_lines` and each read by `parse_event`.
Where `job show` skips a bad line and shows the rest, folding refuses the whole journal
(`parse_journal_bytes`): its rows are keyed by line number and count what the events say, so a
journal with a line the supervisor never writes is damaged, and nothing of it is counted.

Each strike's failure families are found as its event is folded in, from the event's typed
fields (`trainctl.sweep.families`), and kept in its row; the lemon rule counts the strikes by
them: a node is a lemon when one family recurs, and a family's strikes stop counting once the
node has served enough jobs since its last strike of that family. A family recurs only when the
jobs of `lemon_min_users` distinct users struck the node, or a failed sweep of it agrees: a user
can fail their own jobs on a node (a bug in their program) or, having run on it, write a journal
Slurm vouches for, but cannot on their own make the fleet shun the node for everyone; sweeps run
as root and no user writes them.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import glob
import itertools
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from trainctl.detections import DetectionKind
from trainctl.gate_reasons import Reason
from trainctl.jobdir_names import DIR_PREFIX, JobPaths
from trainctl.sweep.families import detection_families, exclusion_families, failed_check_families
from trainctl.sweep.model import JobEventRow, JobRow, SweepFailure
from trainctl.text import printable
from trainctl.validate import JOB_ID, MAX_NODES

if TYPE_CHECKING:
    from trainctl.slurm import AccountedJob

JOURNAL_SUFFIX = ".jsonl"
LEMONS_FILE_MAX_BYTES = 64 << 20  # a host and its jobs a lemon: far below for any fleet
FUTURE_SLACK_S = 300.0            # clocks of the batch hosts and the sweep host may differ this much
FOLD_BATCH_JOBS = 500             # jobs per transaction: the write lock is held for milliseconds
WHAT_MAX, DETAIL_MAX = 200, 1000  # characters kept of an exclusion's checks and reasons, a detection's evidence
# What a journal's steps may name in all, each distinct hostlist counted once: a job's steps run on
# its allocation (at most MAX_NODES, Slurm's host range limit), again after each restart
# ([watch] max_restarts, 3 by default) on what is left of it.
STEP_NAMES_MAX = 4 * MAX_NODES
EXCLUSION, DETECTION, SERVED, SWEEP_FAILED = "exclusion", "detection", "served", "sweep"


class JournalRefused(Exception):
    """A journal that is not folded in; the message is the one line that says why."""


@dataclass(frozen=True)
class ParsedJournal:
    job_id: str
    site: str                          # "" where the journal does not say (trainctl before fleet memory)
    started_at: float
    ended_at: float | None
    status: int | None
    lines: int                         # complete lines
    size: int                          # their bytes
    events: tuple[JobEventRow, ...]
    foreign: str = ""                  # the first node named outside the nodes it may name: read no further


# ------------------------------------------------------------------ parse (pure)

def job_id_from_path(path: str) -> str:
    """`<drop dir>/<id>.jsonl` or `trainctl-gate-<id>/journal.jsonl` -> id (empty if neither)."""
    p = Path(path)
    in_job_dir = JobPaths(p.parent)
    if in_job_dir.job_id is not None and p == in_job_dir.journal:
        return in_job_dir.job_id
    return p.name[:-len(JOURNAL_SUFFIX)] if p.name.endswith(JOURNAL_SUFFIX) else ""


def parse_journal_bytes(data: bytes, *, named_job: str, site: str, now: float,
                        nodes: AbstractSet[str] | None = None) -> ParsedJournal:
    """The verdicts of one journal; JournalRefused for anything trainctl's supervisor never writes.

    Each line is read by the journal's typed reader (`journal_events.parse_event`, strict: a field
    of another type than its kind's refuses the journal rather than losing the field), one at a
    time: only the rows are kept, and they are bounded by the nodes the journal names (`_Verdicts`).
    `nodes`, where given, are the only nodes it may name (its job's allocation): reading stops at
    the first other one, which `ParsedJournal.foreign` names. Only complete lines count: a last
    line without its newline is being written (or was cut) and is left for the next fold."""
    from trainctl.errors import UsageError
    from trainctl.journal_events import Kind

    end = data.rfind(b"\n") + 1
    events = _events(data, now)
    first = next(events, None)
    if first is None:
        raise JournalRefused("no complete event yet")
    if first[1]["event"] != Kind.JOB_START:
        raise JournalRefused("does not begin with job_start: cut at its head, or not a job's journal")
    job_id = first[1].get("job", named_job)     # a journal from before job_start named its job: its file's name
    if not job_id or (named_job and job_id != named_job):
        raise JournalRefused(f"names job {printable(repr(job_id[:40]))}, but its file is job "
                             f"{printable(repr(named_job[:40]))}'s")
    if not JOB_ID.fullmatch(job_id):    # the id reaches the history, drain reasons and terminals
        raise JournalRefused(f"names job {printable(repr(job_id[:40]))}, which is no Slurm job id")
    from_site = first[1].get("site") or ""
    if from_site and site and from_site != site:
        raise JournalRefused(f"from site {from_site[:60]!r}, not {site!r}")
    verdicts = _Verdicts(job_id, nodes)
    line, last = first
    try:
        for line, last in itertools.chain([first], events):
            if not verdicts.add(line, last):
                break
        rows = verdicts.rows()
    except UsageError as exc:
        raise JournalRefused(f"damaged: {exc}") from None
    ended = last["event"] == Kind.JOB_END
    return ParsedJournal(job_id, from_site, first[1]["t"], last["t"] if ended else None,
                         last.get("status") if ended else None, line, end, rows, verdicts.foreign)


def _events(data: bytes, now: float) -> Iterator[tuple[int, dict]]:
    """(line number, event) of each complete line, read as they are asked for (a last line without
    its newline is left out); JournalRefused at the first that is no journal event, or is from the future."""
    from trainctl.journal_events import journal_lines, parse_event

    # split by the journal's one rule (at b"\n" alone, as the supervisor ends its lines), complete
    # lines only: the line numbers are the rows' keys
    complete = data.count(b"\n")
    for number, raw in enumerate(journal_lines(data), start=1):
        if number > complete:
            return
        event = parse_event(raw, strict=True) if raw is not None else None
        if event is None or event["t"] < 0:
            raise JournalRefused(f"line {number} is not a journal event: damaged")
        if event["t"] > now + FUTURE_SLACK_S:
            raise JournalRefused(f"line {number} is from the future ({_iso(event['t'])}; now {_iso(now)})")
        yield number, event


class _Verdicts:
    """One journal's rows as its events are read: exclusions, detections, and the nodes that served
    a training step that ended well, one that completed or one the watch ended (every node it did
    not name trained fine until then). A step that failed on its own names nobody: the program may
    be at fault. The events' fields are of their kinds' types (`journal_events.EVENT_FIELDS`), or
    absent; each is read by its typed reader, never from the text other fields say it in.

    What a journal adds grows with the nodes it names, never with their product with its events:
    a node's strikes are kept once per kind and failure family (the first; the lemon rule counts a
    job's strike once per kind and family, `judge_nodes`), and its service once, at the last step
    that served it (all the rule reads of it). A step's hostlist is expanded once however many
    steps name it, and the distinct hostlists of a journal together name at most STEP_NAMES_MAX
    nodes, counted from their brackets before any is expanded."""

    def __init__(self, job_id: str, nodes: AbstractSet[str] | None):
        self.job_id, self.nodes = job_id, nodes
        self.foreign = ""                          # the first node named outside `nodes`
        self.named: set[str] = set()               # every node named, each checked once
        self.strikes: list[JobEventRow] = []
        self.struck: dict[tuple[str, str], set[str]] = defaultdict(set)   # (node, kind) -> families kept
        self.hostlists: dict[str, list[str]] = {}
        self.expanded = 0                          # names the distinct hostlists count
        self.steps: list[tuple[str, frozenset[str], int, float]] = []   # hostlist, suspects, line, when
        self.step_hostlist = ""
        self.suspects: set[str] = set()
        self.stopped = False                       # a detection in this step that the watch acted on

    def add(self, line: int, event: dict) -> bool:
        """Fold one event in; False once it names a node outside `nodes` (nothing more is read)."""
        from trainctl.errors import UsageError
        from trainctl.journal_events import Kind, Verdict

        kind, when = event["event"], event["t"]
        if kind == Kind.NODE_VERDICT and event.get("verdict") == Verdict.EXCLUDED:
            if not event.get("node"):
                raise UsageError(f"line {line}: an exclusion names no node")
            texts = event.get("reasons") or []
            reasons = [Reason.read(text) for text in texts]
            checks = ", ".join(sorted({reason.cause for reason in reasons}) or ["excluded by the gate"])
            families = exclusion_families(reasons)
            return self._strike(JobEventRow(self.job_id, line, event["node"], EXCLUSION, when, checks[:WHAT_MAX],
                                            "; ".join(texts)[:DETAIL_MAX], ()), [event["node"]],
                                lambda node: families)
        if kind == Kind.DETECTION:
            named = list(dict.fromkeys(event.get("suspects") or []))
            self.suspects.update(named)
            # a detection with a note was only recorded (trainctl.job.machine): the step went on
            self.stopped = self.stopped or not event.get("note")
            return self._strike(JobEventRow(self.job_id, line, "", DETECTION, when, (event.get("kind") or "")[:WHAT_MAX],
                                            (event.get("evidence") or "")[:DETAIL_MAX], ()), named,
                                detection_families(event.get("kind"), event.get("details"), tuple(named)))
        if kind == Kind.TRAINING_START:
            self.step_hostlist, self.suspects, self.stopped = event.get("nodes") or "", set(), False
            return self._count(line, self.step_hostlist)
        if kind == Kind.STEP_END and self.step_hostlist:
            # the step's end names the detection that ended it; a journal from before that field: the
            # detection the watch acted on in this step
            by_watch = (DetectionKind.read(event["detection"]) is not None if "detection" in event else self.stopped)
            if event.get("status") == 0 or by_watch:
                if self.steps and self.steps[-1][:2] == (self.step_hostlist, frozenset()) and not self.suspects:
                    self.steps.pop()       # the same nodes served again, all of them: only the last counts
                self.steps.append((self.step_hostlist, frozenset(self.suspects), line, when))
            self.step_hostlist = ""
        return True

    def _named(self, node: str) -> bool:
        if node not in self.named:
            from trainctl.validate import check_node_name

            check_node_name(node, "node")
            if self.nodes is not None and node not in self.nodes:
                self.foreign = node
                return False
            self.named.add(node)
        return True

    def _strike(self, row: JobEventRow, nodes: list[str], families_of: Callable[[str], tuple[str, ...]]) -> bool:
        """`row` for each of `nodes` that it strikes in a kind and family not kept for it yet, with the
        node's families (an Xid that strikes nobody counts as a family of its own: the row says the
        gate left the node out)."""
        for node in nodes:
            if not self._named(node):
                return False
            kept = self.struck[node, row.kind]
            families = families_of(node)
            new = families or ("",)
            if not kept.issuperset(new):
                kept.update(new)
                self.strikes.append(dataclasses.replace(row, host=node, families=families))
        return True

    def _count(self, line: int, hostlist: str) -> bool:
        from trainctl.slurm import count_hostlist

        if hostlist and hostlist not in self.hostlists:
            self.expanded += count_hostlist(hostlist)
            if self.expanded > STEP_NAMES_MAX:
                raise JournalRefused(f"line {line}: its steps name more than {STEP_NAMES_MAX} nodes in all, more "
                                     "than any job's steps can: not a journal trainctl wrote")
            self.hostlists[hostlist] = []
        return True

    def rows(self) -> tuple[JobEventRow, ...]:
        """The strikes, and each node's service at the last step that served it, in line order.

        The steps are walked from the last back, and each hostlist keeps the names no later step
        has placed yet: every name leaves it once, and a name stays only while it is a suspect, so
        the walk costs the hostlists' names and the suspects, not steps times nodes."""
        from trainctl.slurm import expand_hostlist

        if self.foreign:
            return tuple(self.strikes)     # refused: nothing more to place
        served: dict[str, JobEventRow] = {}
        unplaced: dict[str, set[str]] = {}
        for hostlist, suspects, line, when in reversed(self.steps):
            if hostlist not in unplaced:
                names = expand_hostlist(hostlist, source="training_start")
                if not all(self._named(node) for node in names):
                    break
                unplaced[hostlist] = set(names) - served.keys()
            waiting = unplaced[hostlist]
            for node in [node for node in waiting if node in served or node not in suspects]:
                waiting.discard(node)
                served.setdefault(node, JobEventRow(self.job_id, line, node, SERVED, when, "", "", ()))
        return tuple(sorted(self.strikes + list(served.values()), key=lambda row: (row.line, row.kind != SERVED)))


def _iso(when: float) -> str:
    try:
        return datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return f"{when:.0f} s after 1970"


# ------------------------------------------------------------------ collect (I/O)

def journal_paths(journal_dir: str, extra: Iterable[str] = ()) -> list[str]:
    """The site's drop directory's `*.jsonl`, and each extra path: a journal, or a directory
    holding journals (`*.jsonl`) or job directories (`trainctl-gate-*/journal.jsonl`)."""
    found: list[str] = []
    for place in ([journal_dir] if journal_dir else []) + list(extra):
        place = os.path.expanduser(place)
        if os.path.isdir(place):
            found += sorted(glob.glob(os.path.join(glob.escape(place), "*" + JOURNAL_SUFFIX)))
            found += [str(JobPaths(Path(job_dir)).journal)
                      for job_dir in sorted(glob.glob(os.path.join(glob.escape(place), DIR_PREFIX + "*")))
                      if os.path.lexists(JobPaths(Path(job_dir)).journal)]
        else:
            found.append(place)
    return found


# ------------------------------------------------------------------ Slurm vouches (pure)

# Before a journal adds anything, Slurm's own record of its job must agree with it (`vouch`): the job
# ran, the journal's file belongs to the job's user (or root), every node it names was in one of the
# job's allocations, and every event falls inside the job's run. The record comes from Slurm's
# accounting (`trainctl.slurm.accounted_jobs`: sacct, in batches); a site without one decides with
# [fleet] unverified_journals whether a journal Slurm cannot vouch for is folded in on weaker checks.
ROOT_UID = 0


@dataclass(frozen=True)
class SlurmRecords:
    """What Slurm's accounting said of one batch of jobs, or why it could not say (`unavailable`)."""
    jobs: dict[str, AccountedJob]
    unavailable: str = ""


def vouch(parsed: ParsedJournal, owner: int, record: AccountedJob | None, *, now: float) -> None:
    """JournalRefused, naming why, unless Slurm's record of the job agrees with its journal."""
    if record is None or record.start is None:
        raise JournalRefused(f"job {parsed.job_id} never ran, by Slurm's accounting (sacct has "
                             f"{'no such job' if record is None else 'no start for it'}): not verified")
    if owner not in (ROOT_UID, record.uid):
        raise JournalRefused(f"the file is uid {owner}'s, but job {parsed.job_id} was uid {record.uid}'s: "
                             "not verified")
    foreign = sorted({event.host for event in parsed.events} - record.nodes | ({parsed.foreign} - {""}))
    if foreign:
        from trainctl.slurm import fold_hostlist

        raise JournalRefused(f"names {fold_hostlist(foreign)}, never allocated to job {parsed.job_id} (it held "
                             f"{fold_hostlist(sorted(record.nodes)) if record.nodes else 'no node'}): not verified")
    first, last = record.start - FUTURE_SLACK_S, (now if record.end is None else record.end) + FUTURE_SLACK_S
    outside = [when for when in (parsed.started_at, *(event.at for event in parsed.events))
               if not first <= when <= last]
    if outside:
        ran = f"{_iso(record.start)} to {'now' if record.end is None else _iso(record.end)}"
        raise JournalRefused(f"an event at {_iso(outside[0])}, outside job {parsed.job_id}'s run ({ran}): "
                             "not verified")


def vouch_unverified(parsed: ParsedJournal, owner: int, earlier_owner: int | None, known_hosts: set[str]) -> None:
    """Where Slurm keeps no accounting: the file's owner is that of the file the job was folded from
    before (if any, and still there), and every node it names is one the history knows."""
    if earlier_owner is not None and owner not in (ROOT_UID, earlier_owner):
        raise JournalRefused(f"the file is uid {owner}'s, but job {parsed.job_id} was folded in before from "
                             f"uid {earlier_owner}'s")
    unknown = sorted({event.host for event in parsed.events} - known_hosts | ({parsed.foreign} - {""}))
    if unknown:
        from trainctl.slurm import fold_hostlist

        raise JournalRefused(f"names {fold_hostlist(unknown)}, which no sweep or earlier job of the history "
                             "names (no accounting to ask)")


def ask_slurm(job_ids: list[str], env: dict[str, str] | None = None) -> SlurmRecords:
    """Slurm's accounting records of `job_ids` (sacct, in batches), or why there are none."""
    from trainctl.errors import ExternalCommandError
    from trainctl.slurm import accounted_jobs

    try:
        return SlurmRecords(accounted_jobs(job_ids, env=env))
    except ExternalCommandError as exc:
        return SlurmRecords({}, str(exc).splitlines()[0])


# ------------------------------------------------------------------ fold

@dataclass
class FoldResult:
    folded: int = 0                 # journals this fold added something of
    events: int = 0                 # event rows it added (those already there, from a fold before or beside it, not)
    unchanged: int = 0              # journals folded in before, nothing new since
    refused: list[str] = field(default_factory=list)   # one line each
    unverified: int = 0             # folded in without Slurm's accounting ([fleet] unverified_journals)
    uncounted: int = 0              # left unread: no accounting, and [fleet] unverified_journals = false
    no_accounting: str = ""         # why sacct did not answer, when it did not


def fold_journals(history, paths: Iterable[str], *, site: str, now: float, keep_after: float = 0.0,
                  say: Callable[[str], None] = lambda line: None,
                  ask: Callable[[list[str]], SlurmRecords] = ask_slurm,
                  unverified_journals: bool = False) -> FoldResult:
    """Fold `paths` into `history` (open for writing), each journal once Slurm vouched for it: `ask`
    is asked, once per batch of up to FOLD_BATCH_JOBS new journals, of the jobs their names say,
    before any is read, so each is read knowing the nodes it may name. Where it cannot answer,
    `unverified_journals` folds them in on weaker checks (`vouch_unverified`), else leaves them
    unread (`uncounted`). Each refused journal costs one `say` line."""
    known = history.folded_jobs()
    result = FoldResult()
    pending: list[tuple[str, str]] = []
    known_hosts: list[set[str]] = []       # read once, where the fold needs them

    def refuse(path: str, why: str) -> None:
        line = f"journal {printable(path)}: {why}; skipped"
        result.refused.append(line)
        say(line)

    def fold(batch: list[tuple[str, str]]) -> None:
        records = ask(sorted({named for _, named in batch if JOB_ID.fullmatch(named)}))
        if records.unavailable:
            result.no_accounting = records.unavailable
            if not unverified_journals:
                result.uncounted += len(batch)
                return
            known_hosts[:] = known_hosts or [history.known_hosts()]
        _fold_batch(history, batch, records, known_hosts[0] if known_hosts else None, known, result, refuse,
                    now=now, site=site, keep_after=keep_after)

    for path in paths:
        named = job_id_from_path(path)
        before = known.get(named)
        try:
            # The usual night: a journal folded in before, its size unchanged, is not even read.
            if before is not None and before.source == path and os.stat(path).st_size == before.size:
                result.unchanged += 1
                continue
        except OSError as exc:
            refuse(path, f"cannot read: {exc.strerror or exc}")
            continue
        pending.append((path, named))
        if len(pending) >= FOLD_BATCH_JOBS:
            fold(pending)
            pending = []
    if pending:
        fold(pending)
    return result


def _fold_batch(history, batch: list[tuple[str, str]], records: SlurmRecords, known_hosts: set[str] | None,
                known: dict[str, JobRow], result: FoldResult, refuse: Callable[[str, str], None], *,
                now: float, site: str, keep_after: float) -> None:
    """Read, check and record one batch; `known_hosts` where Slurm could not answer, else None."""
    from trainctl.journal_events import JournalUnreadable, read_journal_file

    rows: list[tuple[JobRow, list[JobEventRow]]] = []
    for path, named in batch:
        record = None if records.unavailable else records.jobs.get(named)
        try:
            # the journal's reader: regular, non-blocking, capped, no link out of where it was found
            data, owner = read_journal_file(path, os.path.dirname(os.path.abspath(path)))
            scope = known_hosts if records.unavailable else record.nodes if record else frozenset()
            parsed = parse_journal_bytes(data, named_job=named, site=site, now=now, nodes=scope)
            del data
            if parsed.started_at < keep_after:
                continue   # older than the history keeps: pruned, never folded in again
            before = known.get(parsed.job_id)
            if known_hosts is None:
                vouch(parsed, owner, record, now=now)
            else:
                vouch_unverified(parsed, owner, _owner(before.source) if before else None, known_hosts)
            if before is not None:
                if abs(before.started_at - parsed.started_at) > 0.001:
                    raise JournalRefused(f"job {parsed.job_id} was folded in from another journal ({before.source}, "
                                         f"started {_iso(before.started_at)}): a different job with the same id")
                if parsed.lines < before.lines:
                    raise JournalRefused(f"{parsed.lines} lines, fewer than the {before.lines} folded in from "
                                         f"{before.source}: cut or replaced; nothing changed")
                if parsed.lines == before.lines:
                    result.unchanged += 1
                    continue
        except (JournalRefused, JournalUnreadable) as exc:
            refuse(path, str(exc))
            continue
        except OSError as exc:
            refuse(path, f"cannot read: {exc.strerror or exc}")
            continue
        # the job's user: Slurm's word for it; without accounting, the owner of the file folded in
        row = JobRow(parsed.job_id, parsed.site or site, parsed.started_at, parsed.ended_at, parsed.status, path,
                     parsed.lines, parsed.size, now, owner if record is None else record.uid)
        known[parsed.job_id] = row
        rows.append((row, list(parsed.events)))
    if rows:
        recorded = history.record_jobs(rows)
        result.folded += len(recorded.jobs)
        result.events += recorded.events
        result.unverified += len(recorded.jobs) if known_hosts is not None else 0
        result.unchanged += len(rows) - len(recorded.jobs)   # another fold beside this one recorded them first


def _owner(path: str) -> int | None:
    """The uid owning `path`; None where it is gone."""
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


# ------------------------------------------------------------------ the lemon rule (pure)

@dataclass(frozen=True)
class LemonRule:
    strikes: float
    days: float
    exclusion: float
    detection: float
    sweep: float
    forgive_after_jobs: int
    min_users: int           # distinct users whose jobs must strike a family, unless a failed sweep agrees

    @classmethod
    def from_site(cls, fleet) -> LemonRule:
        return cls(fleet.lemon_strikes, fleet.lemon_days, fleet.exclusion_strike, fleet.detection_strike,
                   fleet.sweep_strike, fleet.forgive_after_jobs, fleet.lemon_min_users)

    def weight(self, kind: str) -> float:
        return {EXCLUSION: self.exclusion, DETECTION: self.detection, SWEEP_FAILED: self.sweep}[kind]

    def describe(self) -> str:
        forgiven = (f"; a family's strikes stop counting once the node has served {self.forgive_after_jobs} jobs "
                    "since its last strike of it" if self.forgive_after_jobs else "")
        users = (f"; job strikes count once the jobs of {self.min_users} users struck the family, or a failed sweep "
                 "of it agrees" if self.min_users > 1 else "")
        return (f"{self.strikes:g} strikes of one failure family in {self.days:g} days (a job's gate exclusion "
                f"{self.exclusion:g}, a job's watch detection {self.detection:g}, a failed sweep {self.sweep:g})"
                + users + forgiven)


@dataclass(frozen=True)
class Strike:
    host: str
    at: float
    kind: str            # exclusion, detection, sweep
    source: str          # "job 1234", "sweep #56"
    what: str
    detail: str
    weight: float
    families: tuple[str, ...]   # the failure families its event names (it counts in each, once per job)
    user: int | None = None     # a job's user (None: a sweep's, or a job folded in before users were kept)


@dataclass(frozen=True)
class FamilyStrikes:
    """One node's strikes of one failure family in the rule's window, and its service since."""
    family: str
    evidence: tuple[Strike, ...]      # oldest first
    served_since: int                 # jobs the node served after the family's last strike
    forgiven: bool                    # served enough since: these strikes no longer count

    @property
    def strikes(self) -> float:
        return sum(strike.weight for strike in self.evidence)

    @property
    def users(self) -> int:
        """Distinct users whose jobs struck (the jobs whose user is unknown count as one)."""
        return len({strike.user for strike in self.evidence if strike.kind != SWEEP_FAILED})

    @property
    def swept(self) -> bool:
        """A failed sweep is among the strikes: root's own check agrees with the jobs."""
        return any(strike.kind == SWEEP_FAILED for strike in self.evidence)

    def enough(self, rule: LemonRule) -> bool:
        """As many strikes as the rule asks for, served since or not, from enough users or not."""
        return self.strikes >= rule.strikes and self.strikes > 0

    def vouched(self, rule: LemonRule) -> bool:
        """The jobs of enough distinct users struck, or a failed sweep agrees."""
        return self.swept or self.users >= rule.min_users


@dataclass(frozen=True)
class Standing:
    """One node's strikes in the rule's window, by family (the most strikes first)."""
    host: str
    families: tuple[FamilyStrikes, ...]

    def recurring(self, rule: LemonRule) -> tuple[FamilyStrikes, ...]:
        """The families that make it a lemon: enough strikes, not forgiven, from enough users or a sweep."""
        return tuple(family for family in self.families
                     if family.enough(rule) and not family.forgiven and family.vouched(rule))

    def cleared(self, rule: LemonRule) -> tuple[FamilyStrikes, ...]:
        """The families that would make it a lemon but for the jobs it served since their last strike."""
        return tuple(family for family in self.families if family.enough(rule) and family.forgiven)

    def too_few_users(self, rule: LemonRule) -> tuple[FamilyStrikes, ...]:
        """The families that would make it a lemon but that fewer than `rule.min_users` users' jobs
        struck them, and no failed sweep agrees."""
        return tuple(family for family in self.families
                     if family.enough(rule) and not family.forgiven and not family.vouched(rule))


@dataclass(frozen=True)
class Lemon:
    host: str
    families: tuple[FamilyStrikes, ...]   # the families that recur, the most strikes first

    @property
    def strikes(self) -> float:
        """The strikes of its worst family."""
        return self.families[0].strikes

    @property
    def evidence(self) -> tuple[Strike, ...]:
        """Every strike of the families that recur, oldest first (one that counts in two, once)."""
        return tuple(sorted(dict.fromkeys(s for family in self.families for s in family.evidence), key=lambda s: s.at))

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(sorted({s.source for s in self.evidence if s.kind != SWEEP_FAILED}))

    @property
    def users(self) -> int:
        """Distinct users whose jobs struck it (those whose user is unknown count as one)."""
        return len({s.user for s in self.evidence if s.kind != SWEEP_FAILED})


def judge_nodes(rule: LemonRule, job_events: Iterable[JobEventRow], sweep_failures: Iterable[SweepFailure],
                served: Iterable[tuple[str, str, float]], users: Mapping[str, int | None]) -> list[Standing]:
    """Every struck node's standing in the rule's window (the rows given are that window's).

    A job strikes a node once per kind and family, however often it says so (a gate run again
    after a detection, a detection repeated after a restart); each failed sweep strikes once per
    family. `served` is (host, job, when it last served it): a family's strikes are forgiven once
    the node served `rule.forgive_after_jobs` jobs after the family's last strike. `users` is each
    job's user (a job not in it, or None: unknown, and all unknown ones count as one user)."""
    strikes: dict[str, dict[str, list[Strike]]] = defaultdict(lambda: defaultdict(list))
    seen: set[tuple[str, str, str, str]] = set()
    for event in sorted(job_events, key=lambda e: (e.at, e.job_id, e.line)):
        if event.kind not in (EXCLUSION, DETECTION):
            continue
        strike = Strike(event.host, event.at, event.kind, f"job {event.job_id}", event.what, event.detail,
                        rule.weight(event.kind), event.families, users.get(event.job_id))
        for family in event.families:
            if (event.host, event.job_id, event.kind, family) not in seen:
                seen.add((event.host, event.job_id, event.kind, family))
                strikes[event.host][family].append(strike)
    for failure in sorted(sweep_failures, key=lambda failure: failure.at):
        families = failed_check_families(failure.failed)
        strike = Strike(failure.host, failure.at, SWEEP_FAILED, f"sweep #{failure.sweep_id}", "sweep", failure.text,
                        rule.sweep, families)
        for family in families:
            strikes[failure.host][family].append(strike)
    last_served: dict[str, dict[str, float]] = defaultdict(dict)
    for host, job, at in served:
        if host in strikes:
            last_served[host][job] = max(at, last_served[host].get(job, at))
    standings = []
    for host, by_family in strikes.items():
        served_at = sorted(last_served[host].values())
        families = []
        for family, evidence in by_family.items():
            since = len(served_at) - bisect.bisect_right(served_at, evidence[-1].at)
            families.append(FamilyStrikes(family, tuple(evidence), since,
                                          0 < rule.forgive_after_jobs <= since))
        standings.append(Standing(host, tuple(sorted(families, key=lambda f: (-f.strikes, f.family)))))
    return standings


def lemons_of(rule: LemonRule, standings: Iterable[Standing]) -> list[Lemon]:
    """The nodes with a family that recurs: at least `rule.strikes` of it, not forgiven; the most first."""
    lemons = [Lemon(standing.host, recurring) for standing in standings
              for recurring in (standing.recurring(rule),) if recurring]
    return sorted(lemons, key=lambda lemon: (-lemon.strikes, lemon.host))


def find_lemons(rule: LemonRule, job_events: Iterable[JobEventRow], sweep_failures: Iterable[SweepFailure],
                served: Iterable[tuple[str, str, float]], users: Mapping[str, int | None]) -> list[Lemon]:
    return lemons_of(rule, judge_nodes(rule, job_events, sweep_failures, served, users))


def current_lemons(history, rule: LemonRule, now: float) -> list[Lemon]:
    """The lemons by the rule, now, from the history: the rule window's strikes, their jobs' users,
    and the jobs the struck nodes served in it."""
    since = now - rule.days * 86400
    events, failures = history.job_events(since, (EXCLUSION, DETECTION)), history.sweep_failures(since)
    struck = {event.host for event in events} | {failure.host for failure in failures}
    served = history.served_jobs(since, struck) if struck and rule.forgive_after_jobs else []
    users = history.job_users({event.job_id for event in events}) if events and rule.min_users > 1 else {}
    return find_lemons(rule, events, failures, served, users)


LEMONS_FORMAT = "trainctl-lemons-1"


def lemons_document(site: str, rule: LemonRule, lemons: list[Lemon], now: float) -> str:
    """The lemons file: what submit needs (hosts), and why, for a human who opens it."""
    import json

    return json.dumps({"format": LEMONS_FORMAT, "site": site, "generated_at": now, "rule": rule.describe(),
                       "lemons": [{"host": lemon.host, "strikes": lemon.strikes, "jobs": list(lemon.jobs),
                                   "families": {f.family: f.strikes for f in lemon.families}}
                                  for lemon in lemons]}, indent=1) + "\n"


def publish_lemons(history, config, now: float) -> int:
    """Rewrite the site's fleet.lemons_file (atomically) from the history; the number of lemons. As
    root, only where its directory is root's alone (`write_in_root_directory`): UsageError, else."""
    from trainctl.files import write_atomically, write_in_root_directory

    rule = LemonRule.from_site(config.fleet)
    lemons = current_lemons(history, rule, now)
    write = write_in_root_directory if os.geteuid() == 0 else write_atomically
    write(os.path.expanduser(config.fleet.lemons_file), lemons_document(config.name, rule, lemons, now))
    return len(lemons)


def read_lemons_file(path: str, site: str, now: float, max_age_s: float) -> list[str]:
    """The hosts of a lemons file; UsageError (one line) for anything `lemons_document` never wrote,
    another site's, or one older than `max_age_s` (no sweep or ingest has rewritten it)."""
    import json

    from trainctl.errors import UsageError
    from trainctl.files import read_bytes
    from trainctl.validate import check_node_name

    try:
        data = read_bytes(path, LEMONS_FILE_MAX_BYTES + 1)   # a regular file only, never blocking
    except OSError as exc:
        raise UsageError(f"lemons file {path}: cannot read: {exc.strerror or exc}") from None
    if data is None:
        raise UsageError(f"lemons file {path}: " + ("not a regular file" if os.path.lexists(path) else
                                                     f"cannot read: {os.strerror(errno.ENOENT)}"))
    if len(data) > LEMONS_FILE_MAX_BYTES:
        raise UsageError(f"lemons file {path}: more than a lemons file's {LEMONS_FILE_MAX_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
        hosts = [check_node_name(item["host"], f"lemons file {path}") for item in document["lemons"]]
        made, from_site = float(document["generated_at"]), document["site"]
        assert document["format"] == LEMONS_FORMAT
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError, RecursionError):
        raise UsageError(f"lemons file {path}: not a trainctl lemons file ({LEMONS_FORMAT})") from None
    if from_site != site:
        raise UsageError(f"lemons file {path}: of site {str(from_site)[:60]!r}, not {site!r}")
    if not now - max_age_s <= made <= now + FUTURE_SLACK_S:
        raise UsageError(f"lemons file {path}: written {_iso(made)}, not within the rule's {max_age_s / 86400:g} days")
    return hosts


def site_lemon_hosts(config, now: float) -> list[str]:
    """The site's lemons now: from fleet.lemons_file where the site names one (JSON: no SQLite on a login
    node), else from its [sweep] db (read-only). UsageError if neither can be read."""
    if config.fleet.lemons_file:
        return read_lemons_file(os.path.expanduser(config.fleet.lemons_file), config.name, now,
                                config.fleet.lemon_days * 86400)
    from trainctl.sweep.db import History

    with History.open(Path(config.sweep.db).expanduser(), write=False) as history:
        return [lemon.host for lemon in current_lemons(history, LemonRule.from_site(config.fleet), now)]
