"""`trainctl job show --html FILE`: a job's chain on one self-contained page (inline CSS and SVG,
nothing fetched; the sweep report's page, `trainctl.html_page`).

- a timeline: a row per job of the chain, its time in the queue, the gate, training, stopping
  after a detection and restarting, each detection and checkpoint marked;
- the step time over the run: for each training step, every node's mean step time over it (the
  median node's as a line, the fastest to the slowest as a band, the slowest named), and what each
  detection measured (the job's step time and its baseline), marked with the node it named. The
  journal keeps no step time between detections: each node's agent file holds its ranks' totals
  for the training step, kept in `rounds/<n>/watch/` when the gate runs again;
- where the goodput went: productive time and the time lost, by cause, and the watch's account.

Collect (`collect_rounds`: the node files of each training step, through the job directory's
readers) -> pure (`training_rounds`, `job_spans`, `chain_page`).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from trainctl.files import inside
from trainctl.html_page import escape, legend, page_head
from trainctl.job import jobdir
from trainctl.job.follow import mean_step_s
from trainctl.job.goodput import LOST_KINDS, goodput_lines, watch_lines
from trainctl.job.jobdir import JobPaths, Kind
from trainctl.job.journal import describe, hms
from trainctl.job.show import JobView, attempt_dir, chain_goodput, chain_start

PHASE_COLOURS = {"queue": "#cfd8dc", "gate": "#90caf9", "training": "#4caf50", "stopping": "#ffb300",
                 "restart": "#ff7043"}
LOST_COLOURS = {"productive": "#4caf50", "queue": "#cfd8dc", "gate": "#90caf9", "restart": "#ff7043",
                "lost_work": "#d32f2f"}
DETECTION_COLOUR, CHECKPOINT_COLOUR = "#d32f2f", "#263238"
ROUND_FOLDER = re.compile(r"rounds/[0-9]+")   # where a gate round's files were moved (journal: gate_start's evidence)
WIDTH, LEFT, RIGHT = 960, 90, 20              # the plots' size and margins, in pixels


@dataclass(frozen=True)
class Round:
    """One training step of one job: when it ran, and each node's mean step time over it."""

    job_id: str
    start: float
    end: float | None               # None: still running
    step_s: dict[str, float]        # node -> its ranks' mean step time (nodes whose agent reported steps)


# ---------------------------------------------------------------- pure

def training_rounds(events: list[dict]) -> list[tuple[float, float | None, tuple[str, ...], str]]:
    """Each training step of a job's journal: (start, end, its nodes, the folder of its node files,
    relative to the job directory): `watch` for the last, the round folder the next gate moved
    them to for the others ("" where the journal does not say one)."""
    rounds: list[list] = []
    chosen: tuple[str, ...] = ()
    for event in events:
        kind = event["event"]
        if kind == Kind.GATE_END and event.get("status", 0) == 0:
            chosen = tuple(event.get("chosen") or ())
        elif kind == Kind.TRAINING_START:
            rounds.append([event["t"], None, chosen, jobdir.WATCH])
        elif kind == Kind.STEP_END and rounds and rounds[-1][1] is None:
            rounds[-1][1] = event["t"]
        elif kind == Kind.GATE_START and rounds and rounds[-1][3] == jobdir.WATCH:
            evidence = event.get("evidence", "")
            rounds[-1][3] = f"{evidence}/{jobdir.WATCH}" if ROUND_FOLDER.fullmatch(evidence) else ""
    return [tuple(item) for item in rounds]


def job_spans(events: list[dict], end: float) -> list[tuple[float, float, str]]:
    """A job's time by phase: (from, to, phase), one of PHASE_COLOURS."""
    marks: list[tuple[float, str]] = []
    for event in events:
        kind, t = event["event"], event["t"]
        if kind == Kind.SUBMITTED and isinstance(event.get("submitted_t"), (int, float)):
            marks.append((event["submitted_t"], "queue"))
        elif kind in (Kind.JOB_START, Kind.GATE_START):
            marks.append((t, "gate"))
        elif kind == Kind.TRAINING_START:
            marks.append((t, "training"))
        elif (kind == Kind.DETECTION and not event.get("note")) or (kind == Kind.WEIGHED and event.get("action") == "gate"):
            marks.append((t, "stopping"))
        elif kind == Kind.STEP_END:
            marks.append((t, "restart" if event.get("status", 0) else ""))
        elif kind == Kind.JOB_END:
            marks.append((t, ""))
    marks.sort(key=lambda mark: mark[0])
    spans: list[tuple[float, float, str]] = []
    for (t, phase), until in zip(marks, [t for t, _ in marks[1:]] + [end]):
        if spans and spans[-1][2] == phase:       # the gate again at once, training after a first step
            spans[-1] = (spans[-1][0], until, phase)
        elif phase and until > t:
            spans.append((t, until, phase))
    return spans


class Axis:
    """Seconds since the chain's first submit, as x pixels."""

    def __init__(self, start: float, end: float):
        self.start, self.span = start, max(end - start, 1.0)

    def x(self, t: float) -> float:
        return LEFT + (t - self.start) / self.span * (WIDTH - LEFT - RIGHT)

    def ticks(self, y: float) -> list[str]:
        out = []
        for index in range(6):
            t = self.start + self.span * index / 5
            anchor = "end" if index == 5 else "middle"
            out.append(f'<text x="{self.x(t):.1f}" y="{y}" text-anchor="{anchor}">+{hms(t - self.start)}</text>')
        return out


def _title(t: float, job_id: str, event: dict) -> str:
    return f"<title>{escape(datetime.fromtimestamp(t).strftime('%Y-%m-%d %H:%M:%S'))} job {escape(job_id)}: " \
           f"{escape(describe(event))}</title>"


def timeline_svg(journals: tuple[tuple[str, tuple[dict, ...]], ...], axis: Axis, end: float) -> str:
    row = 30
    height = row * len(journals) + 36
    out = [f'<svg class="chain-timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           'role="img" aria-label="the chain\'s timeline" font-family="monospace" font-size="11">']
    for index, (job_id, events) in enumerate(journals):
        y = 14 + index * row
        out.append(f'<text x="0" y="{y + 14}">job {escape(job_id)}</text>')
        for start, until, phase in job_spans(list(events), end):
            out.append(f'<rect class="phase" data-phase="{phase}" x="{axis.x(start):.1f}" y="{y}" '
                       f'width="{max(axis.x(until) - axis.x(start), 1.0):.1f}" height="18" '
                       f'fill="{PHASE_COLOURS[phase]}"><title>job {escape(job_id)}: {phase} '
                       f"{hms(until - start)}</title></rect>")
        for event in events:
            x = axis.x(event["t"])
            if event["event"] == Kind.DETECTION:
                out.append(f'<path class="detection" d="M{x:.1f},{y - 4} l-5,-6 h10 z" fill="{DETECTION_COLOUR}">'
                           f"{_title(event['t'], job_id, event)}</path>")
            elif event["event"] == Kind.CHECKPOINT:
                out.append(f'<line class="checkpoint" x1="{x:.1f}" y1="{y + 18}" x2="{x:.1f}" y2="{y + 24}" '
                           f'stroke="{CHECKPOINT_COLOUR}">{_title(event["t"], job_id, event)}</line>')
    out += axis.ticks(height - 4)
    out.append("</svg>")
    return "".join(out)


def detections(journals: tuple[tuple[str, tuple[dict, ...]], ...]) -> list[tuple[str, dict]]:
    return [(job_id, event) for job_id, events in journals for event in events
            if event["event"] in (Kind.DETECTION, Kind.WEIGHED)]


def step_time_svg(rounds: list[Round], found: list[tuple[str, dict]], axis: Axis, now: float) -> str:
    measured = [value for _, event in found for value in (_details(event, "step_s"), _details(event, "baseline_s"))
                if value is not None]
    values = [s for r in rounds for s in r.step_s.values()] + measured
    if not values:
        return "<p>No step time: no node's agent reported steps (the watch off, or a program that reports none).</p>"
    top = max(values) * 1.15
    height, bottom = 260, 230

    def y(seconds: float) -> float:
        return bottom - seconds / top * (bottom - 10)

    out = [f'<svg class="step-time" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
           'aria-label="step time over the run" font-family="monospace" font-size="11">',
           f'<line x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" stroke="#999"/>',
           f'<text x="0" y="{y(top / 1.15):.1f}">{top / 1.15:.3g} s</text><text x="0" y="{bottom}">0 s</text>']
    for r in rounds:
        if not r.step_s:
            continue
        x1, x2 = axis.x(r.start), axis.x(r.end if r.end is not None else now)
        ordered = sorted(r.step_s.items(), key=lambda item: item[1])
        (fast_node, fast), (slow_node, slow) = ordered[0], ordered[-1]
        median = statistics.median(r.step_s.values())
        out.append(f'<rect class="band" x="{x1:.1f}" y="{y(slow):.1f}" width="{max(x2 - x1, 1.0):.1f}" '
                   f'height="{max(y(fast) - y(slow), 1.0):.1f}" fill="#c8e6c9"><title>job {escape(r.job_id)}: '
                   f"{len(ordered)} nodes, {fast:.3g} s ({escape(fast_node)}) to {slow:.3g} s ({escape(slow_node)}) "
                   "a step</title></rect>")
        out.append(f'<line class="median" x1="{x1:.1f}" y1="{y(median):.1f}" x2="{x2:.1f}" y2="{y(median):.1f}" '
                   f'stroke="#2e7d32" stroke-width="2"><title>job {escape(r.job_id)}: the median node '
                   f"{median:.3g} s a step</title></line>")
        out.append(f'<text class="slowest" x="{x1 + 2:.1f}" y="{y(slow) - 3:.1f}">{escape(slow_node)} '
                   f"{slow:.3g} s</text>")
    for job_id, event in found:
        x = axis.x(event["t"])
        named = ", ".join(event.get("suspects") or []) or "no node named"
        out.append(f'<line class="detection" x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{bottom}" '
                   f'stroke="{DETECTION_COLOUR}" stroke-dasharray="4 3">{_title(event["t"], job_id, event)}</line>')
        out.append(f'<text class="named" x="{x + 3:.1f}" y="20" fill="{DETECTION_COLOUR}">'
                   f"{escape(event.get('kind', 'slow'))}: {escape(named)}</text>")
        for key, colour in (("step_s", DETECTION_COLOUR), ("baseline_s", "#555")):
            value = _details(event, key)
            if value is not None:
                out.append(f'<circle class="{key}" cx="{x:.1f}" cy="{y(value):.1f}" r="4" fill="{colour}">'
                           f"<title>{'the job' if key == 'step_s' else 'its baseline'}: {value:.3g} s a step"
                           "</title></circle>")
    out += axis.ticks(height - 4)
    out.append("</svg>")
    return "".join(out)


def _details(event: dict, key: str) -> float | None:
    """A detection's measured step time or baseline (its details; a weighed slowdown's own fields)."""
    details = event.get("details") if isinstance(event.get("details"), dict) else {}
    value = details.get(key, event.get(key))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def goodput_html(view: JobView, now: float) -> list[str]:
    result, account = chain_goodput(view, now)
    if result is None or not result.wall_s:
        return ["<p>No goodput: the journal holds no time yet.</p>"]
    parts = {"productive": result.productive_s, **{kind: result.lost_s.get(kind, 0.0) for kind in LOST_KINDS}}
    bar = [f'<svg class="goodput" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="28" role="img" '
           'aria-label="where the time went">']
    x = 0.0
    for kind, seconds in parts.items():
        width = seconds / result.wall_s * WIDTH
        bar.append(f'<rect data-kind="{kind}" x="{x:.1f}" y="2" width="{width:.1f}" height="22" '
                   f'fill="{LOST_COLOURS[kind]}"><title>{kind.replace("_", " ")}: {hms(seconds)} '
                   f"({seconds / result.wall_s:.1%})</title></rect>")
        x += width
    bar.append("</svg>")
    rows = "".join(f'<tr data-kind="{kind}"><td>{kind.replace("_", " ")}</td><td>{hms(seconds)}</td>'
                   f"<td>{seconds / result.wall_s:.1%}</td></tr>" for kind, seconds in parts.items())
    lines = goodput_lines(result)[:1] + (watch_lines(account) if account else [])
    return ["".join(bar), legend({kind.replace("_", " "): colour for kind, colour in LOST_COLOURS.items()}),
            f'<table class="goodput"><tr><th>time</th><th>h:mm:ss</th><th>of the wall time</th></tr>{rows}</table>',
            '<ul class="account">' + "".join(f"<li>{escape(line.strip())}</li>" for line in lines) + "</ul>"]


def chain_page(view: JobView, rounds: list[Round], now: float) -> str:
    """The page: the chain's timeline, its step time with the detections, where the goodput went."""
    start = chain_start(view.journals)
    jobs = " > ".join(job for job, _ in view.journals) or view.job_id
    parts = [*page_head(f"trainctl: the chain of job {view.job_id}"), f"<h1>The chain of job {escape(view.job_id)}</h1>",
             f'<p class="meta">Jobs {escape(jobs)}; gate directory <code>{escape(view.gate_dir)}</code>; drawn '
             f"{escape(datetime.fromtimestamp(now).strftime('%Y-%m-%d %H:%M'))}.</p>"]
    if start is None:
        return "\n".join(parts + [f"<p>No {jobdir.JOURNAL}: the job has not started.</p></body></html>"]) + "\n"
    ended = all(jobdir.job_ended(events) for _, events in view.journals)
    end = max(event["t"] for _, events in view.journals for event in events) if ended else now
    axis = Axis(start, end)
    found = detections(view.journals)
    parts += ["<h2>Timeline</h2>", "<p>Each job of the chain, from the first submit; a triangle is a detection, "
              "a tick under a row a checkpoint seen (hover for the journal's line).</p>",
              timeline_svg(view.journals, axis, end), legend(PHASE_COLOURS),
              "<h2>Step time</h2>", "<p>For each training step, the median node's mean step time (the line) and "
              "the fastest to the slowest node's (the band), the slowest named; each detection dashed, with the node "
              "it named, the job's step time it measured (red) and its baseline (grey).</p>",
              step_time_svg(rounds, found, axis, now),
              "<h2>Where the goodput went</h2>", *goodput_html(view, now),
              "<h2>Detections</h2>"]
    parts += ['<table class="detections"><tr><th>when</th><th>job</th><th>what</th></tr>'
              + "".join(f"<tr><td>+{hms(event['t'] - start)}</td><td>{escape(job_id)}</td>"
                        f"<td>{escape(describe(event))}</td></tr>" for job_id, event in found) + "</table>"
              if found else "<p>None.</p>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- collect

def collect_rounds(view: JobView) -> list[Round]:
    """Each training step's node files, read through the job directory's readers: the current
    step's in `watch/`, earlier ones' where the gate after them moved them."""
    rounds = []
    for job_id, events in view.journals:
        root = Path(attempt_dir(view.gate_dir, view.job_id, job_id))
        for start, end, nodes, folder in training_rounds(list(events)):
            place = (root / folder).parent if folder else None
            readings = (jobdir.read_node_files(JobPaths(place), nodes)
                        if place is not None and inside(place, root) else {})
            step_s = {node: mean_step_s(reading.ranks) if reading else None for node, reading in readings.items()}
            rounds.append(Round(job_id, start, end, {node: s for node, s in step_s.items() if s is not None}))
    return rounds

