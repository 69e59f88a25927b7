"""The breaker on trainctl's automatic drains: a fault that breaks a probe everywhere must not drain a partition.

Every automatic drain (the gate's and the watch's `[gate] drain_on`, `trainctl drain`, `trainctl
drain --lemons`) asks the breaker first, in one SQLite write transaction on the site's sweep
history, so every job and every sweep of the site counts against the same budget:

- at most `[breaker] max_drains` drains per sliding `window_s`, counted from the history's drain rows;
- at most `max_share` of a partition's nodes held drained by trainctl at once (at least one node),
  counted from the history's open drains and from Slurm's own record (reasons tagged `trainctl:`);
- past either cap the breaker trips: the drain is not made, one line says so in the job's or
  sweep's output and in the history (a sweep row of kind "breaker"), and it stays open, draining
  nothing for any rule, until an admin runs `trainctl breaker reset` (a row of kind "breaker-reset").

NVSentinel halts its cordons past a threshold in a sliding window until a manual reset, and GCM
Sentinel allows 3 actions an hour; the defaults follow them. A rule in `[breaker] shadow` records
what it would drain (a drain row closed at once) and drains nothing.

`admit` is the pure verdict; `claim` reads the history, asks it and writes the claims in one
transaction (the Slurm calls come after, in `trainctl.sweep.drain.drain_within`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainctl.sweep.db import BREAKER_RESET, BREAKER_TRIP, SHADOW_CLOSE, History


@dataclass(frozen=True)
class Breaker:
    max_drains: int
    window_s: float
    max_share: float
    shadow: tuple[str, ...]

    @classmethod
    def from_site(cls, config) -> Breaker:
        """The site's `[breaker]` (`config`: a loaded SiteConfig; None: the defaults)."""
        from trainctl.site import BreakerConfig

        breaker = config.breaker if config is not None else BreakerConfig()
        return cls(breaker.max_drains, breaker.window_s, breaker.max_share, tuple(breaker.shadow))

    def partition_cap(self, size: int) -> int:
        return max(1, math.floor(self.max_share * size))


@dataclass(frozen=True)
class Count:
    """What the history and Slurm say right now, for one verdict."""

    window_drains: int                          # drains made in the window (since a reset, if later)
    open_since: str                             # the line of the first trip since the last reset ("" if closed)
    held: frozenset[str]                        # nodes trainctl holds drained now
    partitions: Mapping[str, frozenset[str]]    # partition -> its nodes


def admit(breaker: Breaker, count: Count, hosts: Iterable[str]) -> tuple[list[str], str]:
    """(the hosts that may be drained, in order; the breaker's line when it held any back, else "")."""
    hosts = list(hosts)
    if count.open_since:
        return [], (f"trainctl: breaker open, not drained: {', '.join(hosts)} ({count.open_since}); "
                    "an admin closes it with `trainctl breaker reset`")
    granted: list[str] = []
    held = set(count.held)
    for index, host in enumerate(hosts):
        why = ""
        if count.window_drains + len(granted) >= breaker.max_drains:
            why = (f"{count.window_drains + len(granted)} drains in the last {breaker.window_s:g} s reach "
                   f"[breaker] max_drains = {breaker.max_drains}")
        for name, nodes in sorted(count.partitions.items()):
            if not why and host in nodes and len(held & nodes) + 1 > breaker.partition_cap(len(nodes)):
                why = (f"trainctl holds {len(held & nodes)} of the {len(nodes)} nodes of partition {name} drained, "
                       f"[breaker] max_share = {breaker.max_share:g} allows {breaker.partition_cap(len(nodes))}")
        if why:
            return granted, (f"trainctl: breaker tripped, not drained: {', '.join(hosts[index:])} ({why}); "
                             "no automatic drain until an admin runs `trainctl breaker reset`")
        granted.append(host)
        held.add(host)
    return granted, ""


def claim(history: History, breaker: Breaker, *, rule: str, site: str, target: str, sweep_id: int,
          planned: list[tuple[str, str, str]], slurm_held: Iterable[str], partitions: Mapping[str, frozenset[str]],
          now: float) -> tuple[dict[str, int], str]:
    """Ask the breaker about `planned` drains ((host, reason, check), in order) and claim the admitted ones
    as drain rows (reason_time "" until Slurm's is read back), all in one write transaction: two jobs
    deciding at once take turns, and the second counts the first one's claims.

    Returns ({host: its drain row id}, the breaker's line or "")."""
    with history.transaction():
        reset_at = history.breaker_reset_at()
        trips = history.breaker_trips(since=reset_at)
        open_drains = history.drains(open_only=True)
        count = Count(window_drains=history.drains_made(since=max(now - breaker.window_s, reset_at)),
                      open_since=trips[0].error if trips else "",
                      held=frozenset(slurm_held) | {d.host for d in open_drains},
                      partitions=partitions)
        hosts, line = admit(breaker, count, [host for host, _, _ in planned])
        admitted = set(hosts)
        ids = {host: history.record_drain(host=host, reason=reason, reason_time="", sweep_id=sweep_id, check=check,
                                          drained_at=now)
               for host, reason, check in planned if host in admitted}
        if line:
            history.record_breaker(BREAKER_TRIP, at=now, site=site, rule=rule, target=target, line=line)
    return ids, line


def shadow(history: History, *, rule: str, sweep_id: int, planned: list[tuple[str, str, str]], now: float) -> str:
    """Record what a shadow rule would drain (drain rows closed at once) and return its one line."""
    with history.transaction():
        for host, reason, check in planned:
            drain_id = history.record_drain(host=host, reason=reason, reason_time="", sweep_id=sweep_id, check=check,
                                            drained_at=now)
            history.close_drain(drain_id, now, SHADOW_CLOSE)
    return (f"trainctl: shadow mode ([breaker] shadow has {rule}): would drain {', '.join(h for h, _, _ in planned)}; "
            "drained nothing")


def reset(history: History, *, site: str, by: str, now: float) -> None:
    """Close the breaker: the window counts drains from now on, and no trip holds drains back."""
    history.record_breaker(BREAKER_RESET, at=now, site=site, rule="admin", target=by, line="")


@dataclass(frozen=True)
class Status:
    open_since: str        # the trip line, "" when closed
    tripped_at: float      # when it tripped (0.0 when closed)
    window_drains: int
    reset_at: float        # 0.0: never reset

    def lines(self, breaker: Breaker) -> list[str]:
        import datetime

        when = datetime.datetime.fromtimestamp(self.tripped_at, datetime.timezone.utc).isoformat(timespec="seconds")
        state = f"open since {when}: {self.open_since}" if self.open_since else "closed"
        return [f"breaker {state}",
                f"drains in the last {breaker.window_s:g} s: {self.window_drains} of [breaker] max_drains = "
                f"{breaker.max_drains}",
                f"share of a partition trainctl may hold drained: {breaker.max_share:g} (at least one node)",
                f"shadow rules: {', '.join(breaker.shadow) or 'none'}"]


def status(history: History, breaker: Breaker, now: float) -> Status:
    reset_at = history.breaker_reset_at()
    trips = history.breaker_trips(since=reset_at)
    return Status(trips[0].error if trips else "", trips[0].started_at if trips else 0.0,
                  history.drains_made(since=max(now - breaker.window_s, reset_at)), reset_at)
