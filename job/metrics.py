"""A running job's state as Prometheus metrics: the chain's journals and the machine's state in,
samples out (`job_samples`, pure), then Prometheus's text format (`render`, pure); the supervisor
writes the text into node_exporter's textfile collector directory (`publish`, `unpublish`).

Delivery is node_exporter's textfile collector (https://github.com/prometheus/node_exporter#textfile-collector):
a file `<name>.prom` in the directory node_exporter reads, written whole to a temporary file in
that directory and renamed over the old one, so a scrape sees the old file or the new one. The
supervisor runs on the batch host, where a site runs node_exporter already; it opens no port and
needs no Pushgateway (docs: Site administration, Job metrics).

Names follow https://prometheus.io/docs/practices/naming/ and the sweeps' `trainctl_` names: units
as suffixes (`_seconds`, `_ratio`), `_total` for counters, `_timestamp_seconds` for a time. A time
is exported as the Unix time it happened, not as an age: the file is rewritten at each event and
watch poll, and not at all while the gate runs, so an age would stand still between writes, while
`time() - trainctl_job_last_checkpoint_timestamp_seconds` is right at every scrape. Every sample
carries the job's labels: `job_id`, `chain` (the chain's first job id), `user`, `job_name`
(not `job`: Prometheus gives every scraped series its own `job` label).

Counters count over the chain so far, so that a successor's series carries on from its
predecessor's (theirs end with them): restarts and detections by the detection's kind. Goodput
and badput by cause are `trainctl.job.goodput`'s, over the chain.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import NamedTuple

from trainctl.errors import UsageError
from trainctl.files import write_regular
from trainctl.job.goodput import LOST_KINDS, goodput
from trainctl.job.jobdir import Kind
from trainctl.job.machine import JobState
from trainctl.detections import DetectionKind
from trainctl.job.watch import step_median
from trainctl.text import prometheus_label

PREFIX = "trainctl_job_"
PHASES = ("gate", "training", "stopping", "restarting", "successor", "ended")
# each of the machine's phases (`trainctl.job.machine.Phase`) as the metrics show it: asking for a
# checkpoint and awaiting the save are part of stopping the step
METRIC_PHASE = {"start": "gate", "gate": "gate", "release": "gate", "train": "training", "asking": "stopping",
                "awaiting": "stopping", "stopping": "stopping", "retry": "successor", "end": "ended"}
DETECTION_KINDS = tuple(kind.value for kind in DetectionKind)

# name (after PREFIX) -> (type, help); rendered in this order
FAMILIES: dict[str, tuple[str, str]] = {
    "phase": ("gauge", "1 for the job's phase now (gate, training, stopping, restarting, successor, ended), "
                       "0 for the others."),
    "attempt": ("gauge", "The job's place in its chain: 1 for the first job, 2 for its first successor."),
    "training_nodes": ("gauge", "Nodes the training step runs on (or last ran on)."),
    "step_seconds": ("gauge", "The training step's median step time over the watch's recent window "
                              "(watch.slow_window_s)."),
    "steps_per_second": ("gauge", "1 / trainctl_job_step_seconds."),
    "steps_total": ("counter", "Steps of the training step now, the most any rank has reported "
                               "(from 0 again after a restart)."),
    "goodput_ratio": ("gauge", "Productive training time over the wall time since the chain's first submit."),
    "productive_seconds": ("gauge", "Productive training time of the chain so far."),
    "wall_seconds": ("gauge", "Wall time since the chain's first submit."),
    "badput_seconds": ("gauge", "Wall time of the chain that did not train, by cause: queue, gate, restart, "
                                "lost_work (work after the last checkpoint of a failed step)."),
    "restarts_total": ("counter", "Restarts inside the allocation over the chain, by the kind of the detection "
                                  "that stopped the training."),
    "detections_total": ("counter", "The watch's detections over the chain, by kind (slow, sick, hung)."),
    "last_checkpoint_timestamp_seconds": ("gauge", "When the chain's last checkpoint seen was written "
                                                   "(Unix time)."),
    "gate_duration_seconds": ("gauge", "How long the job's latest finished gate round took."),
    "gate_rounds_total": ("counter", "Gate rounds the job started (one more after each detection)."),
    "gate_excluded_nodes": ("gauge", "Nodes the job's latest gate round left out."),
    "gate_excluded": ("gauge", "1 for each node the job's latest gate round left out."),
}


@dataclass(frozen=True)
class JobIdentity:
    """Who the job is, for its metrics' labels and its alerts."""

    job_id: str
    chain: str                     # the chain's first job id (this job's, for a chain's first job)
    user: str
    job_name: str

    def labels(self) -> str:
        return (f'job_id="{prometheus_label(self.job_id)}",chain="{prometheus_label(self.chain)}",'
                f'user="{prometheus_label(self.user)}",job_name="{prometheus_label(self.job_name)}"')


@dataclass(frozen=True)
class Live:
    """What the machine knows now and the journal does not hold."""

    phase: str                     # one of PHASES
    training_nodes: int
    step_s: float | None = None    # None: no step time yet (or the watch is off)
    steps: int | None = None       # None: no rank reported a step in this training step


class Sample(NamedTuple):
    family: str                    # a FAMILIES key
    value: float
    labels: tuple[tuple[str, str], ...] = ()


def live_state(state: JobState, window_s: float, now: float) -> Live:
    """The machine's state as the metrics show it; `window_s`: the watch's slow_window_s."""
    phase = METRIC_PHASE[state.phase]
    if phase == "gate" and state.restarts:
        phase = "restarting"
    watch = state.watch
    if watch is None:
        return Live(phase, len(state.chosen))
    recent = [sample for sample in watch.samples if sample.t >= now - window_s]
    return Live(phase, len(state.chosen), step_median(recent) if recent else None,
                watch.progress_steps if watch.progress_steps >= 0 else None)


def job_samples(attempts: list[list[dict]], live: Live, now: float) -> list[Sample]:
    """The job's samples from the chain's journals (each attempt's events, this job's last) and
    what the machine knows now."""
    samples = [Sample("phase", float(phase == live.phase), (("phase", phase),)) for phase in PHASES]
    samples += [Sample("attempt", len(attempts)), Sample("training_nodes", live.training_nodes)]
    if live.step_s:
        samples += [Sample("step_seconds", live.step_s), Sample("steps_per_second", 1.0 / live.step_s)]
    if live.steps is not None:
        samples.append(Sample("steps_total", live.steps))
    result = goodput(attempts, now)
    if result is not None:
        if result.ratio is not None:
            samples.append(Sample("goodput_ratio", result.ratio))
        samples += [Sample("productive_seconds", result.productive_s), Sample("wall_seconds", result.wall_s)]
        samples += [Sample("badput_seconds", result.lost_s.get(cause, 0.0), (("cause", cause),))
                    for cause in LOST_KINDS]
    samples += _chain_counts(attempts)
    samples += _gate(attempts[-1] if attempts else [])
    return samples


def _chain_counts(attempts: list[list[dict]]) -> list[Sample]:
    detections = dict.fromkeys(DETECTION_KINDS, 0)
    restarts = dict.fromkeys(DETECTION_KINDS, 0)
    saved: float | None = None
    for events in attempts:
        stopped_by = None   # the kind of the last detection that stopped the training (one with a note did not)
        for event in events:
            kind = event["event"]
            if kind == Kind.DETECTION and event.get("kind") in detections:
                detections[event["kind"]] += 1
                if not event.get("note"):
                    stopped_by = event["kind"]
            elif kind == Kind.TRAINING_START and event.get("restart") and stopped_by is not None:
                restarts[stopped_by] += 1
                stopped_by = None
            elif kind == Kind.CHECKPOINT:
                when = event.get("checkpoint_t", event["t"])
                saved = when if saved is None else max(saved, when)
    samples = [Sample("restarts_total", count, (("kind", kind),)) for kind, count in restarts.items()]
    samples += [Sample("detections_total", count, (("kind", kind),)) for kind, count in detections.items()]
    if saved is not None:
        samples.append(Sample("last_checkpoint_timestamp_seconds", saved))
    return samples


def _gate(events: list[dict]) -> list[Sample]:
    """This job's gate: its rounds, the latest finished one's duration and the nodes it left out."""
    rounds, started, duration, excluded = 0, None, None, []
    for event in events:
        kind = event["event"]
        if kind == Kind.GATE_START:
            rounds, started, excluded = rounds + 1, event["t"], []
        elif kind == Kind.NODE_VERDICT and event.get("verdict") == "excluded" and isinstance(event.get("node"), str):
            excluded.append(event["node"])
        elif kind == Kind.GATE_END and started is not None:
            duration = event["t"] - started
    samples = [Sample("gate_rounds_total", rounds)]
    if duration is not None:
        samples.append(Sample("gate_duration_seconds", max(0.0, duration)))
    if rounds:
        samples.append(Sample("gate_excluded_nodes", len(excluded)))
        samples += [Sample("gate_excluded", 1, (("node", node),)) for node in sorted(set(excluded))]
    return samples


def render(identity: JobIdentity, samples: list[Sample]) -> str:
    """Prometheus's text format (version 0.0.4): each family's HELP and TYPE, then its samples."""
    labels = identity.labels()
    by_family: dict[str, list[Sample]] = {}
    for sample in samples:
        if math.isfinite(sample.value):
            by_family.setdefault(sample.family, []).append(sample)
    lines = []
    for family, (kind, help_text) in FAMILIES.items():
        if family not in by_family:
            continue
        name = PREFIX + family
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for sample in by_family[family]:
            extra = "".join(f',{key}="{prometheus_label(value)}"' for key, value in sample.labels)
            lines.append(f"{name}{{{labels}{extra}}} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def textfile_path(directory: str, job_id: str) -> str:
    """The job's file in node_exporter's textfile directory (the collector reads only `*.prom`)."""
    return os.path.join(directory, f"trainctl-job-{job_id}.prom")


def publish(directory: str, job_id: str, text: str) -> None:
    """Write the job's file whole (`write_regular`: a temporary file beside it, mode 0644 so that
    node_exporter's user reads it, renamed over it). The directory is shared with other users'
    jobs: a FIFO, symlink or directory someone placed at the job's name is refused, never waited
    on or written through. UsageError, one line, where it cannot be (the directory missing:
    node_exporter is not set up on this host)."""
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: no such directory")
    write_regular(textfile_path(directory, job_id), text)


def unpublish(directory: str, job_id: str) -> None:
    """Remove the job's file: its series end (Prometheus marks them stale at the next scrape)."""
    try:
        os.unlink(textfile_path(directory, job_id))
    except OSError:
        pass
