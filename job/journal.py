"""The timeline of a chain of attempts, from their journals (written and read by
`trainctl.job.jobdir`: `Journal`, `read_journal`); their goodput: `trainctl.job.goodput`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Set

from trainctl.job.jobdir import KINDS, Kind
from trainctl.job.watch import link_line
from trainctl.journal_events import JOURNAL_LINE_MAX_BYTES, event_entry, typed_event

SHOW_KEPT_MAX = 20_000                  # events of the kinds goodput reads, kept in all; past it, no goodput
EACH_END = 500                          # events of a timeline shown at each end, and kept at each end of a journal


def kind_name(kind: str) -> str:
    """What a summary calls events of `kind`: one name for all that this trainctl does not know."""
    return KINDS[kind].description if kind in KINDS else "of kinds this trainctl does not know"


class ChainEvents:
    """The events of a chain's journals that `job show` keeps, within bounds: every event of the
    kinds in `kept` (goodput's, up to SHOW_KEPT_MAX in all), and of the others the first and the
    last EACH_END of each journal; the rest counted by kind. A journal's text is gone through a line
    at a time (`journal_lines`)."""

    def __init__(self, kept: Set[str], budget: int):
        self.kept, self.budget = kept, budget   # budget: the bytes of journals read at most, in all
        self.journals: dict[str, tuple[dict, ...]] = {}
        self.read = 0                           # events read
        self.left_out: Counter[str] = Counter()  # events read and not kept, by kind
        self.kept_count = 0
        self.kept_full = False                  # more of the kept kinds than SHOW_KEPT_MAX
        self.cut: list[str] = []                # journals read only in part (SHOW_JOURNAL_BYTES)
        self.unread: list[str] = []             # journals not read at all

    def add(self, job_id: str, text: str) -> None:
        head: list[tuple[int, dict]] = []
        tail: deque[tuple[int, dict]] = deque(maxlen=EACH_END)
        kept: list[tuple[int, dict]] = []
        others = 0
        for index, line in enumerate(journal_lines(text)):
            entry = event_entry(line) if line is not None else None
            if entry is None:
                continue
            self.read += 1
            if entry["event"] in self.kept and self.kept_count < SHOW_KEPT_MAX:
                self.kept_count += 1
                kept.append((index, entry))
                continue
            self.kept_full = self.kept_full or entry["event"] in self.kept
            others += 1
            if len(head) < EACH_END:
                head.append((index, entry))
                continue
            if len(tail) == EACH_END:
                self.left_out[kind_name(tail[0][1]["event"])] += 1
            tail.append((index, entry))
        events = (typed_event(entry) for _, entry in sorted([*kept, *head, *tail], key=lambda item: item[0]))
        self.journals[job_id] = tuple(event for event in events if event is not None)

    def summary(self, shown: int, cut_kinds: Counter[str]) -> str | None:
        """One line: what the timeline does not show, and why; None when it shows every event."""
        missing = self.left_out + cut_kinds
        count = sum(missing.values())
        if not count and not self.cut and not self.unread:
            return None
        parts = []
        if count:
            kinds = ", ".join(f"{number:,} {kind}" for kind, number in missing.most_common())
            parts.append(f"{shown:,} of {self.read:,} events shown, the first and the last; {count:,} between "
                         f"not shown ({kinds})")
        for what, jobs in (("read in part", self.cut), ("not read", self.unread)):
            if jobs:
                plural = "s" if len(jobs) > 1 else ""
                parts.append(f"{what}: the journal{plural} of job{plural} {', '.join(jobs)}")
        return f"timeline: {'; '.join(parts)} (job show reads {self.budget >> 20} MiB of journals at most)"

    @property
    def goodput_unknown(self) -> str | None:
        """Why the journals read cannot give the chain's goodput, or None when they can."""
        if self.unread or self.cut:
            return "not every journal of the chain was read whole"
        if self.kept_full:
            return f"the journals hold more than {SHOW_KEPT_MAX:,} events that it counts"
        return None


def journal_lines(text: str) -> Iterator[str | None]:
    """Each line of a journal's text, one at a time (None for one longer than JOURNAL_LINE_MAX_BYTES,
    never copied): no list of them all, and no copy of the text."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end] if end - start <= JOURNAL_LINE_MAX_BYTES else None
        start = end + 1


def timeline_events(attempts: list[tuple[str, list[dict]]]) -> tuple[list[tuple[float, str, dict]], Counter[str]]:
    """Each event as (when, job id, event), in time order; of more than 2 x EACH_END, the first and
    the last EACH_END, and the kinds of those left out between them. A submit is placed when Slurm
    took the job, not when the job journaled it."""
    timed = []
    for job_id, events in attempts:
        for event in events:
            when = event.get("submitted_t") if event["event"] == Kind.SUBMITTED else event["t"]
            if isinstance(when, (int, float)):
                timed.append((when, job_id, event))
    timed.sort(key=lambda item: item[0])
    if len(timed) <= 2 * EACH_END:
        return timed, Counter()
    return timed[:EACH_END] + timed[-EACH_END:], Counter(kind_name(event["event"]) for _, _, event in timed[EACH_END:-EACH_END])


def timeline_lines(attempts: list[tuple[str, list[dict]]], start: float) -> list[str]:
    """One line per event (`timeline_events`), at its offset from the chain's first submit (or first
    event); "..." where events are left out."""
    timed, left_out = timeline_events(attempts)
    lines = []
    for number, (when, job_id, event) in enumerate(timed):
        if left_out and number == EACH_END:
            lines.append("  ...")
        lines += event_lines(f"  +{hms(when - start)}", job_id, event)
    return lines


def event_lines(stamp: str, job_id: str, event: dict) -> list[str]:
    """One event of job `job_id` at `stamp` (its offset, or its time of day): its line, and a
    slowdown's evidence per rank and per link under it."""
    lines = [f"{stamp} job {job_id}: {describe(event)}"]
    if event["event"] in (Kind.DETECTION, Kind.WEIGHED):
        lines += [f"      {line}" for line in own_time_lines(event) + link_lines(event)]
    return lines


def describe(event: dict) -> str:
    kind = event["event"]
    if kind == Kind.NODE_VERDICT:
        reasons = "; ".join(event.get("reasons") or [])
        return f"{event.get('node')} {event.get('verdict')}" + (f": {reasons}" if reasons else "")
    if kind == Kind.SUBMITTED:
        return Kind.SUBMITTED.description
    if kind == Kind.DETECTION:
        suspects = ",".join(event.get("suspects") or []) or "no node named yet"
        return f"watch: {event.get('kind')} ({suspects}): {event.get('evidence')}"
    if kind == Kind.WEIGHED:
        return weighed_line(event)
    if kind == Kind.CONFIRMATION:
        named = event.get("named") or {}
        if not named:
            return f"watch: the gate names no node: {event.get('note', 'nobody named')}; same nodes again"
        return "watch: left out " + "; ".join(f"{node}: {why}" for node, why in named.items())
    # job_start's job and site are for the fleet history (trainctl.sweep.fleet): the timeline names the job already
    hidden = ("t", "at", "event", "job", "site") if kind == "job_start" else ("t", "at", "event")
    detail = {key: value for key, value in event.items() if key not in hidden and not key.endswith("_t")}
    text = KINDS[kind].description if kind in KINDS else str(kind)
    if detail:
        text += ": " + ", ".join(f"{key} {_value(value)}" for key, value in detail.items())
    return text


def weighed_line(event: dict) -> str:
    """A slowdown nobody was named for, and why the watch stopped for the gate, waits, or let training go on."""
    def seconds(key: str) -> str:
        value = event.get(key)
        return f"{value:.0f} s" if isinstance(value, (int, float)) else "?"
    action = event.get("action")
    if action == "passed":
        return (f"watch: the slowdown nobody was named for passed {event.get('evidence', '')}, "
                "less than a restart's price: training goes on")
    factor = event.get("pay_factor")
    factor = f"{factor:g}" if isinstance(factor, (int, float)) else "?"
    head = f"watch: {event.get('kind', 'slow')}, no node named: {event.get('evidence', '')}; "
    price = (f"price {seconds('price_s')} (restart {seconds('restart_s')}, {event.get('restart_basis', '?')}; "
             f"{seconds('lost_work_s')} of work since the last checkpoint)")
    gain = f"gain {seconds('gain_s')} over {seconds('left_s')} left ({event.get('left_basis', '?')})"
    if action == "gate":
        return (f"{head}stopped for the gate: {gain} > {factor} x {price}, and the slowdown has cost "
                f"{seconds('paid_s')} of training, at least the price")
    if action == "wait":
        return (f"{head}training goes on for now: {gain} > {factor} x {price}; the watch stops for the gate "
                "only once the slowdown has cost the price itself (a phase that passes costs less)")
    return f"{head}training goes on: {gain} not > {factor} x {price}"


def own_time_lines(event: dict) -> list[str]:
    """A slowdown's evidence per rank (`trainctl.job.watch.OwnTime.fields`), a line each, for under the event."""
    details = event.get("details")
    ranks = details.get("own") if isinstance(details, dict) else None
    lines = []
    for item in ranks if isinstance(ranks, list) else ():
        try:
            (cpu_before, cpu_now), (runq_before, runq_now) = item["cpu_s"], item["runq_s"]
            lines.append(f"rank {int(item['rank'])} on {item['node']}: own time a step "
                         f"{cpu_now + runq_now:.3g} s (on a CPU {cpu_now:.3g} + waiting for one {runq_now:.3g}), "
                         f"{cpu_before + runq_before:.3g} s before ({cpu_before:.3g} + {runq_before:.3g})")
        except (KeyError, TypeError, ValueError):
            continue   # a journal line from another version: the evidence line above still says it
    return lines


def link_lines(event: dict) -> list[str]:
    """A slowdown's evidence per link (`trainctl.job.watch.LinkWait.fields`), a line each, for under the event."""
    details = event.get("details")
    links = details.get("links") if isinstance(details, dict) else None
    lines = []
    for item in links if isinstance(links, list) else ():
        try:
            lines.append(link_line(item))
        except (KeyError, TypeError, ValueError):
            continue   # a journal line from another version: the evidence line above still says it
    return lines


def _value(value) -> str:
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "none"
    return str(value)


def hms(seconds: float) -> str:
    """3725 -> '1:02:05'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
