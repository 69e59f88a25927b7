"""The watch's detection kinds: one type (`DetectionKind`), each kind's details as a dataclass the
journal carries, and each kind's rules (`RULES`), the one table every consumer reads: the
machine (what evidence to ask for, whether a detection naming nobody is weighed first), the
confirmation after the gate, the drains, goodput, and the fleet history. No consumer compares
a kind with a string or takes a default for one: `tests/test_detections.py` walks every member
through each of them. Kept below job/ and sweep/ (the fleet reads journals too), beside the
journal's own types (`trainctl.journal_events`).

A new kind is a member here, its details class, its row in `RULES`, and the detector in
`trainctl.job.watch` that finds it (docs/development.md, "A new detection kind").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Union


class DetectionKind(str, Enum):
    """What the watch found; its value is what the journal's `kind` field holds."""

    SLOW = "slow"      # the job's step time rose against its own baseline
    SICK = "sick"      # a node's check that passed at the start fails now
    HUNG = "hung"      # no rank finished a step, nor moved, for the hang timeout

    def __str__(self) -> str:
        return self.value

    @classmethod
    def read(cls, value: Any) -> DetectionKind | None:
        """The kind a journal's field names; None for anything else (another trainctl's kind)."""
        try:
            return cls(value)
        except ValueError:
            return None


def _number(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _items(value: Any) -> tuple[dict, ...]:
    return tuple(item for item in value if isinstance(item, dict)) if isinstance(value, list) else ()


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


# The rules the slow detection names its nodes by (trainctl.job.watch: own_time_verdict, link_wait_verdict)
OWN_TIME, LINK_WAIT = "own-time", "link-wait"
NamedBy = Literal["own-time", "link-wait", ""]


@dataclass(frozen=True)
class SlowDetails:
    step_s: float                        # the median step over the slow window
    baseline_s: float                    # the job's own step time it is judged against
    samples: int = 0                     # polls in the slow window
    named_by: NamedBy = ""               # the rule whose evidence named the suspects ("": none named)
    own: tuple[dict, ...] = ()           # each node's own time (trainctl.job.watch.OwnTime.fields)
    links: tuple[dict, ...] = ()         # each link's wait per MB (trainctl.job.watch.LinkWait.fields)
    compute_ratio: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        data: dict[str, Any] = {"step_s": self.step_s, "baseline_s": self.baseline_s, "samples": self.samples}
        if self.named_by:
            data["named_by"] = self.named_by
        if self.own:
            data["own"] = list(self.own)
        if self.links:
            data["links"] = list(self.links)
        if self.compute_ratio:
            data["compute_ratio"] = dict(self.compute_ratio)
        return data

    @classmethod
    def from_json(cls, data: Mapping, suspects: tuple[str, ...]) -> SlowDetails:
        own, links = _items(data.get("own")), _items(data.get("links"))
        named_by = data.get("named_by")
        if named_by not in (OWN_TIME, LINK_WAIT):
            # a journal from before `named_by`: the links are looked at only where the ranks' own
            # time named nobody, and then their verdict is the detection's
            named_by = "" if not suspects else LINK_WAIT if links else OWN_TIME if own else ""
        ratios = data.get("compute_ratio")
        return cls(_number(data.get("step_s")), _number(data.get("baseline_s")), int(_number(data.get("samples"))),
                   named_by, own, links,
                   {k: _number(v) for k, v in ratios.items()} if isinstance(ratios, dict) else {})

    def causes(self, node: str, evidence: str) -> tuple[tuple[str, str], ...]:
        return ((f"watch.slow.{self.named_by}" if self.named_by else "watch.slow", evidence),)

    @property
    def accepted_step_s(self) -> float | None:
        return self.step_s

    @property
    def slowdown(self) -> float | None:
        """The slow step time over the baseline, as the detection measured them."""
        return self.step_s / self.baseline_s if self.step_s > 0 and self.baseline_s > 0 else None

    @property
    def at_startup(self) -> bool:
        return False


@dataclass(frozen=True)
class FailedCheck:
    node: str
    check: str
    reason: str


class _NotSlow:
    """What a detection other than a slowdown says of the step time: nothing."""

    @property
    def accepted_step_s(self) -> float | None:
        return None

    @property
    def slowdown(self) -> float | None:
        return None

    @property
    def at_startup(self) -> bool:
        return False


@dataclass(frozen=True)
class SickDetails(_NotSlow):
    failed: tuple[FailedCheck, ...] = ()

    def to_json(self) -> dict:
        return {"failed": [{"node": f.node, "check": f.check, "reason": f.reason} for f in self.failed]}

    @classmethod
    def from_json(cls, data: Mapping, suspects: tuple[str, ...]) -> SickDetails:
        return cls(tuple(FailedCheck(item["node"], item["check"], item["reason"]) for item in _items(data.get("failed"))
                         if all(isinstance(item.get(key), str) for key in ("node", "check", "reason"))))

    def causes(self, node: str, evidence: str) -> tuple[tuple[str, str], ...]:
        return tuple((f.check, f.reason) for f in self.failed if f.node == node) or (("watch.sick", evidence),)


@dataclass(frozen=True)
class HungDetails(_NotSlow):
    silent: tuple[str, ...] = ()         # the nodes whose agent fell silent
    steps: Mapping[str, int] = field(default_factory=dict)   # node -> its ranks' lowest step count
    startup_s: float | None = None       # before the first step: the start-up bound that passed
    waited_s: float | None = None

    def to_json(self) -> dict:
        data: dict[str, Any] = {}
        if self.startup_s is not None:
            return {"startup_s": self.startup_s, "waited_s": self.waited_s}
        if self.silent:
            data["silent"] = list(self.silent)
        else:
            data["steps"] = dict(self.steps)
        return data

    @classmethod
    def from_json(cls, data: Mapping, suspects: tuple[str, ...]) -> HungDetails:
        steps = data.get("steps")
        startup = data.get("startup_s")
        return cls(_strings(data.get("silent")),
                   {k: int(v) for k, v in steps.items() if isinstance(v, int) and not isinstance(v, bool)}
                   if isinstance(steps, dict) else {},
                   _number(startup) if startup is not None else None,
                   _number(data.get("waited_s")) if startup is not None else None)

    def causes(self, node: str, evidence: str) -> tuple[tuple[str, str], ...]:
        return (("watch.hung", evidence),)

    @property
    def at_startup(self) -> bool:
        return self.startup_s is not None


Details = Union[SlowDetails, SickDetails, HungDetails]


@dataclass(frozen=True)
class KindRules:
    """How each consumer treats one kind of detection."""

    details: type                        # its details' class
    # the machine: the evidence asked for before the step is stopped: a checkpoint (the job still
    # runs) or the ranks' stacks (it does not); and what a detection that names nobody does:
    # "weigh" (the gate's gain against a restart's price, trainctl.job.watch.weigh), or "gate"
    evidence: Literal["checkpoint", "stacks"]
    unnamed: Literal["weigh", "gate"]
    # the confirmation: why nobody is left out when the gate names nobody either
    unconfirmed: str
    # the drains: the `[gate] drain_on` status a node it names counts as
    drain_as: Literal["fail", "unknown"]
    # goodput: why the wall time without the watch cannot be told; None: from the slowdown measured
    not_estimated: str | None


NO_TIME_WITHOUT = ("the job would have waited for the collective timeout or its time limit, or crashed, "
                   "at a time the journal does not hold")
RULES: Mapping[DetectionKind, KindRules] = {
    DetectionKind.SLOW: KindRules(SlowDetails, evidence="checkpoint", unnamed="weigh",
                                  unconfirmed="slowdown not localised", drain_as="unknown", not_estimated=None),
    DetectionKind.SICK: KindRules(SickDetails, evidence="checkpoint", unnamed="gate", unconfirmed="nobody named",
                                  drain_as="fail", not_estimated=NO_TIME_WITHOUT),
    DetectionKind.HUNG: KindRules(HungDetails, evidence="stacks", unnamed="gate", unconfirmed="nobody named",
                                  drain_as="unknown", not_estimated=NO_TIME_WITHOUT),
}


def read_details(kind: DetectionKind, data: Any, suspects: tuple[str, ...] = ()) -> Details:
    """A journal's `details` of a `kind` detection, typed; what it lacks (a journal of an older
    trainctl, a field of another type) reads as the field's none."""
    return RULES[kind].details.from_json(data if isinstance(data, dict) else {}, suspects)
