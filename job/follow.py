"""`trainctl job show --follow`: a job's chain as it runs, from its job directories alone.

Three parts:

- `follow_view` (pure): the chain's jobs, each job's journal folded so far (`JobSoFar`), the training nodes' agent
  files now and at the last redraw, and the clock, in; a `FollowView` out: the phase, each
  node's agent and step time against the job's own baseline, the last checkpoint's age and the
  goodput so far.
- `view_lines`, `event_line_list`, `end_line` (pure): a view as the lines a terminal redraws in
  place; one event as the line printed for it when the output is no terminal; the chain's end.
- `Follower` (the thin loop): reads the journals (only the lines added since the last read),
  the chain's links (attempt.json, retry.json) and the node files through their owners'
  readers (regular files only, never blocking, capped; a node file only where it changed since
  the last redraw), draws, and waits the site's `watch.poll_s`. It writes nothing and signals
  nothing: Ctrl-C leaves the job alone.

The job's own baseline step time is the median, over its training nodes, of each node's mean
step time since the training step started; a node's step time now is its ranks' mean over the
steps they finished since the last redraw.
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

from trainctl.errors import EXIT_UNKNOWN, ExternalCommandError, TrainctlError
from trainctl.job import jobdir
from trainctl.job.goodput import COUNTED_KINDS, LOST_KINDS, Goodput, goodput
from trainctl.job.jobdir import JobPaths, Kind, NodeReading
from trainctl.job.journal import SHOW_KEPT_MAX, event_lines, hms
from trainctl.job.show import LocalFiles, attempt_paths, collect_chain
from trainctl.site import WatchConfig, load_site
from trainctl.slurm import fold_hostlist
from trainctl.text import printable

NODE_ROWS = 12          # nodes drawn on a terminal: the odd ones out first; the rest are counted
RECENT_EVENTS = 8       # the chain's latest events drawn on a terminal
READ_CHUNK_BYTES = 4 << 20   # of a journal, parsed at a time: what a redraw holds of it at once
QUEUED = ("queued", "waits in Slurm's queue")
HTML_COMMAND = "trainctl job show --html chain-{job}.html {job}"


@dataclass(frozen=True)
class NodeView:
    node: str
    agent: str                       # "ok", "no file yet", "silent 75 s", "sick: gpu.xid"
    steps: int | None                # its furthest rank's steps (None: no file)
    step_s: float | None             # its ranks' mean step time since the last redraw (the first: since the start)
    steps_per_s: float | None        # steps since the last redraw, over the time between the agent's two writes
    ratio: float | None              # step_s over the job's baseline

    @property
    def odd(self) -> bool:
        return self.agent != "ok"


@dataclass(frozen=True)
class FollowView:
    jobs: tuple[str, ...]            # the chain so far, first to last
    phase: str                       # queued, gate, training, stopping, restarting, successor, ended
    detail: str                      # what the phase is about: "restart 1", "job 13 waits in Slurm's queue"
    nodes: tuple[NodeView, ...]      # the training nodes, while the job trains
    baseline_s: float | None
    step_s: float | None             # the job's step time since the last redraw: the median node's
    checkpoint_age_s: float | None   # since the newest checkpoint seen (None: none seen)
    goodput: Goodput | None
    recent: tuple[str, ...]          # the latest events' lines
    now: float
    status: int | None = None        # the chain's end: the last job's exit status
    goodput_unknown: str | None = None   # why goodput is not told (the journals hold too many events)

    @property
    def ended(self) -> bool:
        return self.phase == "ended"


# ---------------------------------------------------------------- pure: events and files -> a view

def next_phase(phase: tuple[str, str], event: dict) -> tuple[str, str]:
    """A job's phase and what it is about, after one more event of its journal."""
    kind = event["event"]
    if kind in (Kind.JOB_START, Kind.GATE_START):
        return "gate", "checking the nodes" + (" again after a detection" if event.get("evidence") else "")
    if kind == Kind.GATE_END and event.get("status", 0) != 0:
        return "gate", f"refused the nodes: {event.get('why', 'status ' + str(event.get('status')))}"
    if kind == Kind.TRAINING_START:
        return "training", f"restart {event['restart']}" if event.get("restart") else ""
    if kind == Kind.DETECTION and not event.get("note"):
        suspects = ", ".join(event.get("suspects") or []) or "no node named yet"
        return "stopping", f"after a detection: {event.get('kind')} ({suspects})"
    if kind == Kind.WEIGHED and event.get("action") == "gate":
        return "stopping", "for the gate: a slowdown no node is named for"
    if kind == Kind.STEP_END:
        return ("restarting", f"the training step ended with status {event.get('status')}") \
            if event.get("status", 0) else ("ending", "the training step ended well")
    if kind == Kind.RETRY and event.get("successor"):
        return "successor", f"job {event['successor']} submitted"
    if kind == Kind.JOB_END:
        return phase if phase[0] == "successor" else ("ended", f"status {event.get('status')}")
    return phase


def job_phase(events: Iterable[dict]) -> tuple[str, str]:
    """A job's phase and what it is about, from its journal's events in order."""
    return functools.reduce(next_phase, events, QUEUED)


@dataclass
class JobSoFar:
    """What the view needs of one job's journal, folded in one event at a time, so that a journal
    of any length costs the same memory: the phase, the nodes it trains on, the newest
    checkpoint, its end, the lines of its latest events, and the events goodput counts (those
    only while the chain's stay within SHOW_KEPT_MAX, as `job show` keeps them)."""

    job_id: str
    phase: tuple[str, str] = QUEUED
    chosen: tuple[str, ...] = ()        # the last gate's choice
    training: bool = False              # a training step runs
    saved_t: float | None = None        # the newest checkpoint the journal names
    status: object = None               # its job_end's status
    counted: list[dict] = field(default_factory=list)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))   # each a list of lines

    def add(self, event: dict, count: bool) -> list[str]:
        """Fold one event in (into `counted` too where `count`); the lines printed for it."""
        kind = event["event"]
        self.phase = next_phase(self.phase, event)
        if kind == Kind.GATE_END and event.get("status", 0) == 0:
            self.chosen = tuple(event.get("chosen") or ())
        if kind == Kind.TRAINING_START:
            self.training = True
        elif kind in (Kind.STEP_END, Kind.GATE_START, Kind.JOB_END):
            self.training = False
        if kind == Kind.CHECKPOINT and isinstance(event.get("checkpoint_t"), (int, float)):
            self.saved_t = max(event["checkpoint_t"], self.saved_t or event["checkpoint_t"])
        if kind == Kind.JOB_END:
            self.status = event.get("status")
        if count and kind in COUNTED_KINDS:
            self.counted.append(event)
        lines = event_line_list(self.job_id, event)
        if lines:
            self.recent.append(lines)
        return lines

    @property
    def training_nodes(self) -> tuple[str, ...]:
        """The nodes the job trains on now (the last gate's choice), while a training step runs."""
        return self.chosen if self.training else ()

    @classmethod
    def of(cls, job_id: str, events: Iterable[dict]) -> JobSoFar:
        so_far = cls(job_id)
        for event in events:
            so_far.add(event, True)
        return so_far


def mean_step_s(ranks, before: Mapping[int, tuple[int, float]] | None = None) -> float | None:
    """The ranks' mean step time over the steps they finished since `before` (each rank's steps and
    step seconds then), else since the training step started."""
    steps = seconds = 0.0
    for rank in ranks:
        done, spent = (before or {}).get(rank.rank, (0, 0.0))
        if rank.steps > done and rank.step_seconds >= spent:
            steps, seconds = steps + rank.steps - done, seconds + rank.step_seconds - spent
    return seconds / steps if steps else None


def node_view(node: str, reading: NodeReading | None, before: NodeReading | None, baseline_s: float | None,
              now: float, silence_s: float) -> NodeView:
    if reading is None:
        return NodeView(node, "no file yet", None, None, None, None)
    if reading.failed_checks:
        agent = "sick: " + ", ".join(dict.fromkeys(check for check, _ in reading.failed_checks))
    elif now - reading.written_t >= silence_s:
        agent = f"silent {now - reading.written_t:.0f} s"
    else:
        agent = "ok"
    steps = max((rank.steps for rank in reading.ranks), default=0)
    recent, rate = None, None
    if before is not None and reading.written_t > before.written_t:
        recent = mean_step_s(reading.ranks, {rank.rank: (rank.steps, rank.step_seconds) for rank in before.ranks})
        earlier = max((rank.steps for rank in before.ranks), default=0)
        rate = max(0, steps - earlier) / (reading.written_t - before.written_t) if steps >= earlier else None
    step_s = recent if recent is not None else mean_step_s(reading.ranks)
    ratio = step_s / baseline_s if step_s is not None and baseline_s else None
    return NodeView(node, agent, steps, step_s, rate, ratio)


def newest_checkpoint(so_far: JobSoFar, readings: Mapping[str, NodeReading | None]) -> float | None:
    """The newest save the journal or the ranks' files name (a time), or None."""
    times = [save.t for save in jobdir.rank_saves(readings.values())]
    if so_far.saved_t is not None:
        times.append(so_far.saved_t)
    return max(times, default=None)


def follow_view(jobs: tuple[str, ...], so_far: Mapping[str, JobSoFar], readings: Mapping[str, NodeReading | None],
                previous: Mapping[str, NodeReading | None], now: float, watch: WatchConfig,
                goodput_unknown: str | None = None) -> FollowView:
    """The chain now: `so_far` holds each job's journal folded so far, `readings` the current
    job's training nodes' agent files, `previous` those of the last redraw (none on the first);
    `goodput_unknown`: why goodput cannot be told from what was kept (None: it can)."""
    current = so_far.get(jobs[-1]) or JobSoFar(jobs[-1])
    phase, detail = current.phase
    if (phase, detail) == QUEUED and len(jobs) > 1:
        phase, detail = "successor", f"job {jobs[-1]} waits in Slurm's queue"
    means = [mean for reading in readings.values() if reading and (mean := mean_step_s(reading.ranks)) is not None]
    baseline = statistics.median(means) if means else None
    nodes = tuple(node_view(node, reading, previous.get(node), baseline, now, watch.agent_silence_s)
                  for node, reading in readings.items())
    steps_now = [node.step_s for node in nodes if node.step_s is not None]
    saved = newest_checkpoint(current, readings)
    attempts = [so_far[job].counted if job in so_far else [] for job in jobs]
    recent: list[str] = []
    for job in reversed(jobs):               # from the newest event back, as far as is shown
        for lines in reversed(so_far[job].recent if job in so_far else ()):
            if len(recent) >= RECENT_EVENTS:
                break
            recent[:0] = lines
    counted = goodput(attempts, now) if goodput_unknown is None and any(attempts) else None
    return FollowView(jobs, phase, detail, nodes, baseline, statistics.median(steps_now) if steps_now else None,
                      None if saved is None else max(0.0, now - saved), counted,
                      tuple(recent[-RECENT_EVENTS:]), now,
                      current.status if phase == "ended" else None, goodput_unknown)


# ---------------------------------------------------------------- pure: a view -> lines

def clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


def event_line_list(job_id: str, event: dict) -> list[str]:
    """An event as it is printed when it happens: its time of day, the job, what happened. Lists of
    nodes are folded (`node[1-4096]`), and a node the gate chose says nothing of its own: the
    gate's end names them all."""
    if event["event"] == Kind.NODE_VERDICT and event.get("verdict") == "chosen":
        return []
    when = event.get("submitted_t") if event["event"] == Kind.SUBMITTED else event["t"]
    folded = {key: [folded_hostlist(tuple(value)) if all(isinstance(name, str) for name in value)
                    else fold_hostlist(value)]
              for key, value in event.items() if key in ("nodes", "chosen") and isinstance(value, list) and value}
    return event_lines(clock(when if isinstance(when, (int, float)) else event["t"]), job_id, {**event, **folded})


@functools.lru_cache(maxsize=16)
def folded_hostlist(nodes: tuple[str, ...]) -> str:
    """`fold_hostlist`, kept: each redraw draws the same gate's and training's lists again (4,096
    names take tens of ms to fold)."""
    return fold_hostlist(list(nodes))


def _seconds(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def goodput_line(result: Goodput | None, unknown: str | None = None) -> str:
    if unknown is not None:
        return f"goodput: not computed: {unknown}"
    if result is None or result.ratio is None:
        return "goodput: not yet (no time since the first submit)"
    lost = ", ".join(f"{kind.replace('_', ' ')} {hms(result.lost_s.get(kind, 0.0))}" for kind in LOST_KINDS)
    return (f"goodput so far {result.ratio:.1%}: {hms(result.productive_s)} productive of {hms(result.wall_s)}; "
            f"lost: {lost}")


def view_lines(view: FollowView, rows: int = NODE_ROWS) -> list[str]:
    """What a terminal shows, redrawn at each poll."""
    chain = f" (chain {' > '.join(view.jobs)})" if len(view.jobs) > 1 else ""
    lines = [f"job {view.jobs[-1]}{chain}: {view.phase}{': ' + view.detail if view.detail else ''}  "
             f"[{clock(view.now)}]", goodput_line(view.goodput, view.goodput_unknown)]
    age = "none seen" if view.checkpoint_age_s is None else f"{hms(view.checkpoint_age_s)} ago"
    lines.append(f"last checkpoint: {age}; step time {_seconds(view.step_s)} s, the job's baseline "
                 f"{_seconds(view.baseline_s)} s")
    if view.nodes:
        lines += node_lines(view.nodes, rows)
    lines.append("events:" if view.recent else "events: none yet")
    lines += [f"  {line}" for line in view.recent]
    return lines


def node_lines(nodes: tuple[NodeView, ...], rows: int) -> list[str]:
    """The agents' states, then the odd ones out (agent not ok, then the slowest) a row each."""
    states: dict[str, list[str]] = {}
    for node in nodes:
        states.setdefault(node.agent.split(" ")[0].rstrip(":"), []).append(node.node)
    agents = "; ".join(f"{len(names)} {state} ({fold_hostlist(names)})" if state != "ok" else f"{len(names)} ok"
                       for state, names in states.items())
    lines = [f"nodes: {len(nodes)} training; agents: {agents}",
             f"  {'node':<16} {'agent':<16} {'steps':>8} {'steps/s':>8} {'step s':>8} {'x baseline':>10}"]
    shown = sorted(nodes, key=lambda n: (not n.odd, -(n.ratio or 0.0), n.node))[:rows]
    for node in shown:
        lines.append(f"  {node.node:<16} {node.agent:<16} {'-' if node.steps is None else node.steps:>8} "
                     f"{'-' if node.steps_per_s is None else f'{node.steps_per_s:.2f}':>8} {_seconds(node.step_s):>8} "
                     f"{'-' if node.ratio is None else f'{node.ratio:.2f}x':>10}")
    if len(nodes) > len(shown):
        drawn = {id(node) for node in shown}
        rest = [n.ratio for n in nodes if id(n) not in drawn and n.ratio is not None]
        spread = f", {min(rest):.2f}x to {max(rest):.2f}x the baseline" if rest else ""
        lines.append(f"  {len(nodes) - len(shown)} more nodes{spread}")
    return lines


def end_line(view: FollowView) -> str:
    ratio = view.goodput.ratio if view.goodput else None
    return (f"job {view.jobs[-1]} ended with status {view.status}"
            + (f"; goodput {ratio:.1%}" if ratio is not None else "")
            + f"; the chain drawn: {HTML_COMMAND.format(job=view.jobs[-1])}")


def exit_status(view: FollowView) -> int:
    """What `--follow` exits with at the chain's end: the job's own status."""
    return view.status if isinstance(view.status, int) and 0 <= view.status <= 255 else EXIT_UNKNOWN


# ---------------------------------------------------------------- the loop

class Follower:
    """Reads the chain's files at each redraw: the journals' new lines only (folded into each
    job's `JobSoFar` a chunk at a time, so that neither a long journal nor a long follow grows
    its memory), the chain's links, and the current job's node files while it trains."""

    def __init__(self, gate_dir: str, job_id: str, load_watch: Callable[[str], WatchConfig]):
        self.gate_dir, self.job_id, self.load_watch = gate_dir, job_id, load_watch
        self.files = LocalFiles()
        self.so_far: dict[str, JobSoFar] = {}
        self.offsets: dict[str, int] = {}
        self.counted = 0                                    # goodput's events kept, the chain's in all
        self.previous: dict[str, NodeReading | None] = {}
        self.node_files: jobdir.NodeFiles | None = None     # the current job's, kept between redraws
        self.watch: WatchConfig | None = None
        self.site: str | None = None

    def paths(self, job: str) -> JobPaths:
        return attempt_paths(self.gate_dir, self.job_id, job)

    def read(self, now: float, on_lines: Callable[[list[str]], None] = lambda lines: None) -> FollowView:
        """The chain now; `on_lines` gets each new event's lines, in the journal's order."""
        jobs = tuple(link["job_id"] for link in collect_chain(self.files, self.gate_dir, self.job_id))
        for job in jobs:
            self._read_journal(job, on_lines, first=job == jobs[0])
        watch = self.watch_config(jobs)
        nodes = self.so_far[jobs[-1]].training_nodes
        paths = self.paths(jobs[-1])
        if self.node_files is None or self.node_files.paths != paths:
            self.node_files = jobdir.NodeFiles(paths)
        readings = self._read_node_files(nodes)
        unknown = (f"the journals hold more than {SHOW_KEPT_MAX:,} events that it counts"
                   if self.counted > SHOW_KEPT_MAX else None)
        view = follow_view(jobs, self.so_far, readings, self.previous, now, watch, unknown)
        self.previous = readings
        return view

    def _read_journal(self, job: str, on_lines: Callable[[list[str]], None], first: bool) -> None:
        """The journal's lines added since the last read, READ_CHUNK_BYTES at a time (the chain's
        first journal names the site)."""
        paths = self.paths(job)
        so_far = self.so_far.setdefault(job, JobSoFar(job))
        while True:
            offset = self.offsets.get(job, 0)
            try:
                new, after = jobdir.read_journal_since(paths.journal, offset, paths.root, cap=READ_CHUNK_BYTES)
            except OSError as exc:
                raise ExternalCommandError(f"cannot read {paths.journal}: {exc.strerror or exc}") from None
            if after < offset:   # replaced: read again from its start
                self.counted -= len(so_far.counted)
                so_far = self.so_far[job] = JobSoFar(job)
            self.offsets[job] = after
            for event in new:
                counting = event["event"] in COUNTED_KINDS and self.counted <= SHOW_KEPT_MAX
                if counting:
                    self.counted += 1
                    if self.counted > SHOW_KEPT_MAX:   # goodput cannot be told: what was kept for it goes
                        for each in self.so_far.values():
                            each.counted.clear()
                        counting = False
                if first and self.site is None and event["event"] == Kind.JOB_START:
                    self.site = event.get("site") or ""
                lines = so_far.add(event, counting)
                if lines:
                    on_lines(lines)
            if after - offset < READ_CHUNK_BYTES // 2:   # caught up (a full chunk ends within a line of it)
                return

    def _read_node_files(self, nodes: tuple[str, ...]) -> dict[str, NodeReading | None]:
        """The training nodes' files, with Python's cyclic garbage collector paused: parsing 4,096
        of them makes about 10^5 objects, none in a cycle (refcounting frees them), and each
        collection they would set off walks the view's whole heap for nothing (15 % of the read)."""
        if not nodes:
            return {}
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self.node_files.read(nodes)
        finally:
            if collecting:
                gc.enable()

    def watch_config(self, jobs: tuple[str, ...]) -> WatchConfig:
        """The site's `[watch]`, as the first job's journal names the site (the model's defaults
        until it starts, or where that site cannot be read here)."""
        if self.watch is None:
            if self.site is None:
                return WatchConfig()
            self.watch = self.load_watch(self.site)
        return self.watch


def site_watch(site: str) -> WatchConfig:
    try:
        return load_site(site).config.watch if site else WatchConfig()
    except TrainctlError:
        return WatchConfig()


class Screen:
    """Draws on a terminal in place: the cursor goes back up over the last drawing, which is cleared."""

    def __init__(self, out: TextIO, size: Callable[[], os.terminal_size] = shutil.get_terminal_size):
        self.out, self.size, self.drawn = out, size, 0

    def draw(self, lines: list[str]) -> None:
        columns, height = self.size()
        lines = [printable(line)[:max(columns - 1, 20)] for line in lines][:max(height - 1, 5)]
        back = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.out.write(back + "\x1b[J" + "".join(line + "\n" for line in lines))
        self.out.flush()
        self.drawn = len(lines)


def follow(follower: Follower, out: TextIO, *, tty: bool, clock_now: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Redraw (a terminal) or print each new event (anything else) until the chain ends; its status."""
    screen = Screen(out) if tty else None

    def print_lines(lines: list[str]) -> None:
        out.write("".join(printable(line) + "\n" for line in lines))

    while True:
        view = follower.read(clock_now(), on_lines=print_lines if screen is None else lambda lines: None)
        if screen is not None:
            screen.draw(view_lines(view))
        else:
            out.flush()
        if view.ended:
            out.write(printable(end_line(view)) + "\n")
            out.flush()
            return exit_status(view)
        sleep(follower.watch_config(view.jobs).poll_s)
