"""The watch's detectors (trainctl.job.watch): pure, driven by synthetic node readings over a clock."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from trainctl.detections import DetectionKind, HungDetails, SlowDetails
from trainctl.job import jobdir
from trainctl.job import watch as w

LIMITS = w.WatchLimits(slow_factor=1.5, slow_window_s=15, baseline_window_s=120, warmup_s=10,
                       hang_floor_s=30, hang_steps=20, agent_silence_s=10)
NODES = ("node1", "node2", "node3", "node4")


class Job:
    """Four nodes, one rank each, stepping in lockstep at `step_s`; `poll` feeds the watcher once a second."""

    def __init__(self, step_s: float = 0.25):
        self.t = 1000.0
        self.step_s = step_s
        self.steps = 0.0
        self.frozen: set[str] = set()
        self.failed: dict[str, tuple[tuple[str, str], ...]] = {}
        self.state = w.start(self.t)
        self.written = {node: self.t for node in NODES}
        self.last_ranks: dict[str, tuple[w.RankProgress, ...]] = {}
        self.compute_s: dict[str, float] = {}           # node -> compute seconds per step (none: not timed)
        self.computed = dict.fromkeys(NODES, 0.0)
        # a phase without steps (evaluation, a save): no rank steps, the ranks of these nodes move
        self.moving: set[str] | None = None
        self.activity = dict.fromkeys(NODES, 0)
        self.paused_s = 0.0        # the phase's time, in the first step after it (as a rank measures it)
        # node -> its rank's main thread per step: (on a CPU, waiting for one); none: not read
        self.own: dict[str, tuple[float, float]] = {}
        self.sched = {node: [0.0, 0.0] for node in NODES}
        # node -> what its link holds back per MB it sends (qdisc overlimits); none: not read
        self.link: dict[str, float] = {}
        self.link_counts = {node: [0, 0.0] for node in NODES}   # sent bytes, held back so far

    def _links(self, node: str, seconds: float) -> tuple[tuple[w.LinkReading, ...], float | None]:
        if node not in self.link:
            return (), None
        counts = self.link_counts[node]
        sent = int(seconds * 0.25e6 / self.step_s)      # each step sends 0.25 MB
        counts[0] += sent
        counts[1] += sent / 1e6 * self.link[node]
        return (w.LinkReading("eth0", "qdisc", counts[0], int(counts[1])),), self.t

    def poll(self, seconds: float = 1.0) -> w.Observation:
        self.t += seconds
        if self.moving is not None:
            self.paused_s += seconds
            for node in self.moving:
                self.activity[node] += 1
        elif not self.frozen:
            self.steps += seconds / self.step_s
        readings = {}
        for index, node in enumerate(NODES):
            if node not in self.frozen:
                steps = int(self.steps)
                done = steps - (self.last_ranks[node][0].steps if node in self.last_ranks else 0)
                self.computed[node] += done * self.compute_s.get(node, 0.0)
                own = self.own.get(node)
                if own:
                    self.sched[node] = [self.sched[node][0] + done * own[0], self.sched[node][1] + done * own[1]]
                self.last_ranks[node] = (w.RankProgress(
                    index, steps, steps * self.step_s + self.paused_s, self.t, 100 + index, self.computed[node],
                    activity=self.activity[node], cpu_seconds=self.sched[node][0] if own else None,
                    runq_seconds=self.sched[node][1] if own else None),)
                self.written[node] = self.t
            links, links_t = self._links(node, seconds) if node not in self.frozen else ((), None)
            readings[node] = w.NodeReading(node, self.written[node], self.last_ranks.get(node, ()),
                                           self.failed.get(node, ()), links=links, links_t=links_t)
        observation = w.observe(LIMITS, self.state, self.t, readings)
        self.state = observation.state
        return observation

    def run(self, seconds: int) -> list[w.Detection]:
        return [o.detection for o in (self.poll() for _ in range(seconds)) if o.detection]


def test_a_steady_job_is_never_detected():
    assert Job().run(600) == []


def test_a_sustained_slowdown_is_detected_naming_nobody_and_a_spike_is_not():
    job = Job()
    assert job.run(60) == []
    job.step_s = 1.0                      # three seconds of slow steps: shorter than the window's half
    assert job.run(3) == []
    job.step_s = 0.25
    assert job.run(60) == []
    job.step_s = 0.8
    found = job.run(30)
    assert found and found[0].kind == "slow" and found[0].suspects == ()
    assert "3.20x" in found[0].evidence


def slowed(compute_before: dict[str, float], compute_after: dict[str, float], step_after: float = 0.8) -> w.Detection:
    job = Job()
    job.compute_s = compute_before
    assert job.run(60) == []
    job.step_s, job.compute_s = step_after, compute_after
    found = job.run(30)
    assert found and found[0].kind == "slow" and found[0].suspects == ()
    return found[0]


def test_compute_times_say_which_node_computes_slower_but_name_nobody():
    detection = slowed(dict.fromkeys(NODES, 0.1), {**dict.fromkeys(NODES, 0.1), "node2": 0.6})
    assert detection.details.compute_ratio["node2"] == 6.0
    assert {n: r for n, r in detection.details.compute_ratio.items() if n != "node2"} == dict.fromkeys(
        ("node1", "node3", "node4"), 1.0)
    assert "compute time per step rose on node2 (6x)" in detection.evidence


def test_compute_times_unchanged_point_at_waiting_and_risen_everywhere_at_the_program():
    waiting = slowed(dict.fromkeys(NODES, 0.1), dict.fromkeys(NODES, 0.1))
    assert "unchanged on every node" in waiting.evidence
    everywhere = slowed(dict.fromkeys(NODES, 0.1), dict.fromkeys(NODES, 0.6))
    assert "rose on every node alike" in everywhere.evidence


def test_a_node_is_singled_out_only_while_the_others_compute_as_before():
    uneven = slowed(dict.fromkeys(NODES, 0.1), {**dict.fromkeys(NODES, 0.135), "node2": 0.6})
    assert "rose unevenly" in uneven.evidence and "node2 6x" in uneven.evidence
    assert "rose on node2" not in uneven.evidence


def test_without_compute_times_the_slow_evidence_says_nothing_of_them():
    detection = slowed({}, {})
    assert not detection.details.compute_ratio and "compute" not in detection.evidence


def own_slowed(own_after: dict[str, tuple[float, float]], step_after: float = 0.8,
               own_before: tuple[float, float] = (0.2, 0.01)) -> w.Detection:
    """Every rank at `own_before` of its own a step, then the nodes in `own_after` at theirs."""
    job = Job()
    job.own = dict.fromkeys(NODES, own_before)
    assert job.run(60) == []
    job.step_s, job.own = step_after, {**job.own, **own_after}
    found = job.run(30)
    assert found and found[0].kind == "slow"
    return found[0]


def test_a_rank_whose_own_time_made_the_rise_names_its_node_with_the_numbers():
    # node3's main thread waits for a CPU 0.56 s a step more (a CFS quota): the step rose 0.55 s
    detection = own_slowed({"node3": (0.2, 0.57)})
    assert detection.suspects == ("node3",)
    assert "rank 2 on node3 0.77 s a step of its own (on a CPU 0.2, waiting for one 0.57), 0.21 s before" \
        in detection.evidence and "the other nodes' own time rose by at most 0 s" in detection.evidence
    assert "rule own-time" in detection.evidence
    per_rank = {item["node"]: item for item in detection.details.own}
    assert per_rank["node3"]["runq_s"] == [0.01, 0.57] and per_rank["node1"]["rise_s"] == 0.0


def test_a_slower_cpu_on_one_node_names_it_too():
    assert own_slowed({"node2": (0.75, 0.01)}).suspects == ("node2",)


def test_own_time_flat_everywhere_points_at_waiting_and_names_nobody():
    detection = own_slowed({})
    assert detection.suspects == () and "flat on every node: the time goes to waiting" in detection.evidence


def test_own_time_risen_on_most_ranks_is_the_program_and_names_nobody():
    detection = own_slowed({node: (0.75, 0.01) for node in NODES[:3]})
    assert detection.suspects == () and "rose on 3 of 4 nodes alike" in detection.evidence


def test_a_rise_too_small_to_explain_the_step_names_nobody():
    # node3 waits 0.2 s more a step for a CPU; the step rose 0.55 s: its own time did not make the rise
    assert own_slowed({"node3": (0.2, 0.21)}).suspects == ()


def test_a_peer_that_rose_part_of_the_way_too_leaves_no_node_standing_out():
    # a machine busy everywhere: node3's rank waits 0.45 s more a step, node2's 0.2 s more, of the
    # step's 0.55 s: node3 made most of the rise, but node2 is not flat, so nobody is named
    detection = own_slowed({"node3": (0.2, 0.46), "node2": (0.2, 0.21)})
    assert detection.suspects == ()
    assert "no node stands out" in detection.evidence and "on node3 by up to 0.45 s" in detection.evidence
    # and a peer just under a quarter of the rise is still flat enough: node3 is named
    assert own_slowed({"node3": (0.2, 0.46), "node2": (0.2, 0.14)}).suspects == ("node3",)


def test_the_recorded_slow_node_and_busy_machine_cases_are_told_apart():
    # own time (before, now) per node and the step's rise, as two journals of the dev cluster
    # recorded them: a node's CPU quota halved (named), and a healthy DDP tutorial job on a machine
    # loaded to 7 on 2 cores, where one node's rank was starved a little more than the other's
    quota = [w.OwnTime("node2", 0, (0.141, 0.147), (0.125, 0.375)), w.OwnTime("node3", 1, (0.141, 0.14), (0.177, 0.11))]
    assert w.own_time_verdict(quota, 0.575 - 0.303)[0] == ("node2",)
    busy = [w.OwnTime("node2", 0, (0.0025, 0.0006), (0.0039, 0.007)),
            w.OwnTime("node3", 1, (0.002, 0.0027), (0.0048, 0.0025))]
    assert w.own_time_verdict(busy, 0.0145 - 0.0076)[0] == ()


def test_ranks_whose_times_were_not_read_add_no_own_time_evidence():
    job = Job()
    assert job.run(60) == []
    job.step_s = 0.8
    found = job.run(30)
    assert found[0].suspects == () and not found[0].details.own and "own time" not in found[0].evidence


def test_a_rank_that_restarts_starts_its_own_time_again():
    job = Job()
    job.own = dict.fromkeys(NODES, (0.2, 0.01))
    assert job.run(40) == []
    job.sched["node2"] = [0.0, 0.0]       # a new process: its counts start again from zero
    assert job.run(60) == []
    assert all(s.cpu_s >= 0 and s.runq_s >= 0 for samples in job.state.own.values() for s in samples)


def test_own_samples_are_a_few_per_window_kept_only_as_far_back_as_the_windows_look():
    job = Job()
    job.own = dict.fromkeys(NODES, (0.2, 0.01))
    job.run(600)
    kept = job.state.own["node1"]
    every_s = LIMITS.slow_window_s / w.OWN_SAMPLES_PER_WINDOW
    assert job.t - kept[0].t <= LIMITS.slow_window_s + LIMITS.baseline_window_s + every_s
    # one sample at the first poll every_s after the last (polls are a second apart here)
    window = LIMITS.slow_window_s + LIMITS.baseline_window_s
    assert window // math.ceil(every_s) <= len(kept) <= window / every_s + 1


def test_a_step_longer_than_the_sampling_counts_its_whole_own_time():
    # 12 s steps, sampled every 2.5 s: each sample waits for a step to end and covers all of it
    job = Job(step_s=12.0)
    job.own = dict.fromkeys(NODES, (9.0, 1.0))
    job.run(300)
    assert {(round(s.cpu_s, 6), round(s.runq_s, 6)) for s in job.state.own["node1"][1:]} == {(9.0, 1.0)}


def test_confirm_leaves_out_the_detections_suspects_and_the_training_nodes_the_gate_names():
    hung = w.Detection(DetectionKind.HUNG, ("node3",), "no rank finished a step for 31 s", HungDetails(("node3",)))
    confirmed = w.confirm(hung, {"node1": "fabric: 0.3x the median", "node9": "not training"},
                          ("node1", "node2", "node3"), 0.4)
    assert confirmed.named == {"node3": "hung: no rank finished a step for 31 s", "node1": "fabric: 0.3x the median"}
    assert (confirmed.note, confirmed.accepted_step_s) == ("", 0.0)


def link_slowed(link_after: dict[str, float], own: tuple[float, float] | None = (0.2, 0.01),
                link_before: float = 55.0) -> w.Detection:
    """Every node's link holding back `link_before` per MB sent, then the nodes in `link_after` at
    theirs and the others at 20: waiting for a slow node, they send in short bursts that go out at once."""
    job = Job()
    job.own = dict.fromkeys(NODES, own) if own else {}
    job.link = dict.fromkeys(NODES, link_before)
    assert job.run(60) == []
    job.step_s, job.link = 0.8, {**dict.fromkeys(NODES, 20.0), **link_after}
    found = job.run(30)
    assert found and found[0].kind == "slow"
    return found[0]


def test_the_one_link_holding_back_as_before_while_the_others_hold_back_less_names_its_node_with_the_numbers():
    # the dev cluster's numbers: every link held back about 55 times per MB; now node2's 60, the others' 20
    detection = link_slowed({"node2": 60.0})
    assert detection.suspects == ("node2",)
    assert "rule link-wait" in detection.evidence and "own time per step is flat" in detection.evidence
    # (the counts are whole numbers: a fraction of one lost at each read)
    assert ("node2 eth0: held back (qdisc overlimits + requeues + drops) 59.7 per MB sent, 55 before; sent 0.312 MB/s, "
            "1 before; the other nodes' links at most 19.7 per MB") in detection.evidence
    per_node = {item["node"]: item for item in detection.details.links}
    assert set(per_node) == set(NODES) and per_node["node2"]["wait_per_mb"] == [55.0, 59.7]
    assert per_node["node1"]["wait_per_mb"] == [55.0, 19.7]
    assert per_node["node1"]["sent_bytes_per_s"] == [1000000, 312500]


def test_links_that_hold_back_alike_name_nobody_and_say_where_they_looked():
    alike = link_slowed({})
    assert alike.suspects == () and "no node's link holds back apart from the others'" in alike.evidence
    assert "looked at: node1 eth0, node2 eth0, node3 eth0, node4 eth0" in alike.evidence
    busy = link_slowed(dict.fromkeys(NODES, 55.0))
    assert busy.suspects == () and "nobody is named by the links" in busy.evidence


def test_a_link_holding_back_apart_only_a_little_or_hardly_at_all_names_nobody():
    assert link_slowed({"node2": 60.0, "node3": 45.0}).suspects == ()          # not 1.5x node3's
    assert link_slowed({"node2": 8.0}, link_before=4.0).suspects == ()          # under the floor


def test_a_link_that_always_held_back_most_is_no_new_fault():
    job = Job()
    job.link = {**dict.fromkeys(NODES, 20.0), "node2": 60.0}
    assert job.run(60) == []
    job.step_s = 0.8
    found = job.run(30)
    assert found and found[0].suspects == () and "nobody is named by the links" in found[0].evidence


def test_links_are_judged_without_own_times_and_not_where_a_ranks_own_time_named_its_node():
    named = link_slowed({"node2": 60.0}, own=None)
    assert named.suspects == ("node2",) and not named.details.own
    # node3's own time made the rise: the links are not looked at
    job = Job()
    job.own, job.link = dict.fromkeys(NODES, (0.2, 0.01)), dict.fromkeys(NODES, 55.0)
    assert job.run(60) == []
    job.step_s = 0.8
    job.own = {**job.own, "node3": (0.2, 0.57)}
    job.link = {**dict.fromkeys(NODES, 20.0), "node2": 60.0}
    found = job.run(30)
    assert found[0].suspects == ("node3",) and not found[0].details.links


def test_the_recorded_slow_link_and_stalled_job_cases_are_told_apart():
    # (wait per MB, bytes sent a second), before and over the window, as journals of the dev cluster
    # recorded them: node2's link cut to 30 Mbit/s (named), and a healthy job whose nodes were starved
    # of CPU, where node2 sent next to nothing (so held nothing back) and node4's agent gave no link
    # readings: a stall, not a wire, and no comparison of every node's link
    def link(node, wait, sent):
        return w.LinkWait(node, "eth0", "qdisc", wait, sent)

    cut = [link("node2", (57.2, 50.2), (5.656e6, 2.747e6)), link("node3", (60.3, 18.8), (5.654e6, 2.827e6)),
           link("node4", (57.1, 24.3), (5.656e6, 2.773e6))]
    assert w.link_wait_verdict(cut, ("node2", "node3", "node4"))[0] == ("node2",)
    stalled = [link("node2", (53.5, 0.0), (1.191e6, 95)), link("node3", (53.9, 39.2), (1.138e6, 221656))]
    named, note, _ = w.link_wait_verdict(stalled, ("node2", "node3", "node4"))
    assert named == () and "node4: no link readings" in note and "node2 eth0: sent 9.5e-05 MB/s" in note
    # every node read, but one barely sending: still nobody
    assert w.link_wait_verdict([*stalled, link("node4", (53.0, 20.0), (1.1e6, 0.9e6))], ("node2", "node3", "node4"))[0] == ()


def test_a_link_whose_counts_went_back_is_not_judged():
    job = Job()
    job.link = dict.fromkeys(NODES, 55.0)
    assert job.run(60) == []
    job.step_s, job.link = 0.8, {**dict.fromkeys(NODES, 20.0), "node2": 60.0}
    job.run(5)
    job.link_counts["node2"] = [0, 0.0]                  # its qdisc replaced: its counts start again
    found = job.run(25)
    assert found and "node2" not in {item["node"] for item in found[0].details.links}


def test_link_samples_are_few_per_window_and_kept_only_as_far_back_as_the_windows_look():
    job = Job()
    job.link = dict.fromkeys(NODES, 55.0)
    job.run(400)
    samples = job.state.links["node1"]
    assert min(s.t for s in samples) >= job.t - LIMITS.slow_window_s - LIMITS.baseline_window_s
    window = [s for s in samples if s.t > job.t - LIMITS.slow_window_s]
    assert len(window) <= w.LINK_SAMPLES_PER_WINDOW + 1


def test_confirm_makes_an_unexplained_slowdown_the_new_normal_and_keeps_it_after_an_unexplained_hang():
    slow = w.Detection(DetectionKind.SLOW, (), "step time 0.8 s", SlowDetails(0.8, 0.25))
    confirmed = w.confirm(slow, {}, ("node1", "node2"), 0.0)
    assert (confirmed.named, confirmed.note, confirmed.accepted_step_s) == ({}, "slowdown not localised", 0.8)
    hung = w.Detection(DetectionKind.HUNG, (), "every rank is at the same step", HungDetails())
    assert w.confirm(hung, {}, ("node1", "node2"), 0.8).accepted_step_s == 0.8


def test_a_slowdown_that_was_accepted_is_the_new_normal():
    job = Job(step_s=0.8)
    job.state = w.start(job.t, accepted_step_s=0.8)
    job.step_s = 0.25
    assert job.run(60) == []
    job.step_s = 0.8                      # back to the accepted rate: not a detection
    assert job.run(60) == []
    job.step_s = 1.6                      # 2x the accepted rate is
    assert [d.kind for d in job.run(30)][:1] == ["slow"]


def test_no_slowdown_is_judged_before_the_baseline_has_enough_samples():
    job = Job(step_s=0.25)
    job.run(12)
    job.step_s = 2.0
    assert job.run(5) == []


def test_a_frozen_node_is_named_hung_after_the_floor():
    job = Job()
    job.run(60)
    job.frozen.add("node3")
    frozen_t = job.t
    while not (detection := job.poll().detection):
        assert job.t - frozen_t < 60
    assert detection.kind == "hung" and detection.suspects == ("node3",)
    assert "fell silent" in detection.evidence
    assert 30 <= job.t - frozen_t <= 31


def test_a_silent_agent_while_training_goes_on_is_noted_once_not_detected():
    job = Job()
    job.run(30)
    stale = job.last_ranks["node2"]
    notes = []
    for _ in range(60):
        job.t += 1
        job.steps += 4
        readings = {n: w.NodeReading(n, job.t, (w.RankProgress(i, int(job.steps), job.steps * 0.25, job.t),))
                    for i, n in enumerate(NODES)}
        readings["node2"] = w.NodeReading("node2", job.t - 60 if job.t > 1031 else job.t, stale)
        observation = w.observe(LIMITS, job.state, job.t, readings)
        job.state = observation.state
        assert observation.detection is None
        notes += observation.silent_while_progressing
    assert notes == ["node2"]


def test_ranks_behind_are_named_when_every_agent_answers():
    job = Job()
    job.run(60)
    stuck = job.last_ranks["node4"][0]
    job.frozen = set(NODES)
    found = []
    for _ in range(40):
        job.t += 1
        readings = {n: w.NodeReading(n, job.t, job.last_ranks[n]) for n in NODES}
        readings["node4"] = w.NodeReading("node4", job.t, (w.RankProgress(3, stuck.steps - 1, 0.0, 0.0),))
        observation = w.observe(LIMITS, job.state, job.t, readings)
        job.state = observation.state
        if observation.detection:
            found.append(observation.detection)
    assert found[0].kind == "hung" and found[0].suspects == ("node4",)


def test_a_hang_with_every_rank_level_names_nobody():
    job = Job()
    job.run(60)
    for _ in range(40):
        job.t += 1
        readings = {n: w.NodeReading(n, job.t, job.last_ranks[n]) for n in NODES}
        observation = w.observe(LIMITS, job.state, job.t, readings)
        job.state = observation.state
        if observation.detection:
            assert observation.detection.kind == "hung" and observation.detection.suspects == ()
            return
    raise AssertionError("no hang detected")


def test_the_hang_timeout_grows_with_the_step_time():
    assert LIMITS.hang_timeout_s(0.25) == 30
    assert LIMITS.hang_timeout_s(3.0) == 60
    assert LIMITS.hang_timeout_s(None) == 30


def test_without_reported_steps_only_an_agent_silent_for_the_floor_is_a_hang():
    state = w.start(1000.0)               # a program without the API: no rank ever reports a step
    t = 1000.0
    for _ in range(100):                  # every agent writes: nothing to judge
        t += 1
        observation = w.observe(LIMITS, state, t, {n: w.NodeReading(n, t) for n in NODES})
        state = observation.state
        assert observation.detection is None
    frozen_t = t
    while True:
        t += 1
        observation = w.observe(LIMITS, state, t, {n: w.NodeReading(n, frozen_t if n == "node3" else t)
                                                   for n in NODES})
        state = observation.state
        if observation.detection or t - frozen_t > 60:
            break
    assert observation.detection.suspects == ("node3",) and 30 <= t - frozen_t <= 31


def test_an_agent_that_never_wrote_names_nobody():
    job = Job()
    notes = []
    for _ in range(120):
        job.t += 1
        job.steps += 4
        readings = {n: w.NodeReading(n, job.t, (w.RankProgress(i, int(job.steps), job.steps * 0.25, job.t),))
                    for i, n in enumerate(NODES[:3])}
        readings["node4"] = None
        observation = w.observe(LIMITS, job.state, job.t, readings)
        job.state = observation.state
        assert observation.detection is None
        notes += observation.silent_while_progressing
    assert notes == []



def test_a_node_whose_ranks_report_nothing_is_never_taken_for_hung_or_behind():
    """A node whose private directory was refused (trainctl.private_dir): its agent writes its file,
    with no ranks in it, while the other nodes' ranks step. It neither holds the job's progress
    back nor is named when the others hang; it is treated as a program without progress is."""
    job = Job()
    for _ in range(600):
        job.t += 1
        job.steps += 4
        readings = {n: w.NodeReading(n, job.t, (w.RankProgress(i, int(job.steps), job.steps * 0.25, job.t),))
                    for i, n in enumerate(NODES[:3])}
        readings["node4"] = w.NodeReading("node4", job.t)
        observation = w.observe(LIMITS, job.state, job.t, readings)
        job.state = observation.state
        assert observation.detection is None and observation.silent_while_progressing == ()
    stalled_t = job.t
    while True:   # the three others stop at the same step: a hang, naming nobody (node4 is not behind)
        job.t += 1
        readings = {n: w.NodeReading(n, job.t, (w.RankProgress(i, int(job.steps), job.steps * 0.25, stalled_t),))
                    for i, n in enumerate(NODES[:3])}
        readings["node4"] = w.NodeReading("node4", job.t)
        observation = w.observe(LIMITS, job.state, job.t, readings)
        job.state = observation.state
        if observation.detection or job.t - stalled_t > 60:
            break
    assert observation.detection.kind == "hung" and observation.detection.suspects == ()
    assert 30 <= job.t - stalled_t <= 31


# ---------------------------------------------------------------- phases without steps

def test_an_evaluation_much_longer_than_the_hang_timeout_is_no_hang_while_the_ranks_move():
    job = Job()
    assert job.run(60) == []
    job.moving = set(NODES)               # 200 s of evaluation: no steps, every rank's main thread moves
    assert job.run(200) == []
    job.moving = None
    assert job.run(120) == []             # training again: neither a hang nor a slowdown


def test_one_rank_evaluating_while_the_others_wait_is_no_hang():
    job = Job()
    assert job.run(60) == []
    job.moving = {"node1"}                # rank 0 evaluates; the others wait in a barrier
    assert job.run(200) == []


def test_a_phase_that_stops_moving_is_a_hang_after_the_timeout_from_its_last_move():
    job = Job()
    assert job.run(60) == []
    job.moving = set(NODES)
    assert job.run(100) == []
    job.moving = set()                    # every rank stuck in one call
    quiet = job.run(LIMITS.hang_floor_s - 2)
    assert quiet == []
    found = job.run(5)
    assert found and found[0].kind == "hung"


def test_the_steps_after_a_long_phase_add_no_sample_and_a_short_phase_is_outweighed():
    job = Job()
    assert job.run(60) == []
    samples = len(job.state.samples)
    job.moving = set(NODES)
    job.run(100)
    assert len(job.state.samples) == samples          # no steps, no samples
    job.moving = None
    job.poll()                                        # the steps that end the phase
    assert len(job.state.samples) == samples
    job.poll()
    assert len(job.state.samples) == samples + 1      # then training's own again
    job.moving = set(NODES)
    job.run(LIMITS.hang_floor_s // 2)                 # a phase shorter than the hang timeout
    job.moving = None
    assert job.run(120) == []


def test_a_slowdown_after_a_phase_without_steps_is_still_seen():
    job = Job()
    assert job.run(60) == []
    job.moving = set(NODES)
    assert job.run(100) == []
    job.moving = None
    assert job.run(60) == []
    job.step_s = 0.8
    found = job.run(30)
    assert found and found[0].kind == "slow"


def test_a_node_file_without_activity_reads_as_none():
    text = json.dumps({"format": 1, "node": "n", "t": 1.0,
                       "ranks": {"0": {"pid": 5, "steps": 2, "step_seconds": 1.0}}})
    assert jobdir.parse_node_file(text).ranks[0].activity == 0
    with_activity = json.dumps({"format": 1, "node": "n", "t": 1.0,
                                "ranks": {"0": {"pid": 5, "steps": 2, "step_seconds": 1.0, "activity": 7}}})
    assert jobdir.parse_node_file(with_activity).ranks[0].activity == 7


# ---------------------------------------------------------------- the start-up bound

def waiting(limits: w.WatchLimits, seconds: int, ranks=()) -> list[tuple[float, w.Detection]]:
    """A training step whose ranks never reach their first step; every agent writes on time, with
    `ranks` (what the ranks reported, no step) in node1's file."""
    state, t, found = w.start(1000.0), 1000.0, []
    for _ in range(seconds):
        t += 1
        readings = {n: w.NodeReading(n, t, tuple(ranks) if n == "node1" else ()) for n in NODES}
        observation = w.observe(limits, state, t, readings)
        state = observation.state
        if observation.detection:
            found.append((t - 1000.0, observation.detection))
    return found


def test_no_first_step_within_the_start_up_bound_is_a_hang_naming_nobody():
    limits = replace(LIMITS, startup_s=90.0, steps_expected=True)
    [(after, detection), *_] = waiting(limits, 120)
    assert after == 90.0 and detection.kind == "hung" and detection.suspects == ()
    assert detection.evidence == "no rank reached its first step in 90 s (start-up bound 90 s)"


def test_the_start_up_bound_judges_only_a_program_that_reports_steps():
    # steps are not counted for it (auto_steps off) and no rank reported anything: not knowable
    assert waiting(replace(LIMITS, startup_s=90.0, steps_expected=False), 300) == []
    # a rank reported something (a compute section, a checkpoint): it reports, so it is judged
    said = waiting(replace(LIMITS, startup_s=90.0, steps_expected=False), 120,
                   ranks=(w.RankProgress(0, 0, 0.0, 0.0, 100, activity=3),))
    assert said and said[0][0] == 90.0 and said[0][1].kind == "hung"
    # a site without the bound
    assert waiting(replace(LIMITS, startup_s=0.0, steps_expected=True), 300) == []


def test_a_first_step_within_the_bound_ends_the_start_up_watch():
    job = Job()
    job.state = w.start(job.t)
    limits_before = LIMITS
    try:
        globals()["LIMITS"] = replace(LIMITS, startup_s=5.0, steps_expected=True)
        assert job.run(600) == []
    finally:
        globals()["LIMITS"] = limits_before


def test_the_start_up_bound_grows_with_the_nodes_from_the_site_model():
    from trainctl.job.policy import load_gate_policy
    policy = load_gate_policy("local-demo", None)
    watch = policy.watch
    assert policy.startup_s(4) == watch.startup_s + 4 * watch.startup_per_node_s
    assert policy.startup_s(2048) >= policy.startup_s(4)


# ---------------------------------------------------------------- noise is not a slowdown

def default_limits() -> w.WatchLimits:
    from trainctl.site import WatchConfig
    c = WatchConfig()
    return w.WatchLimits(c.slow_factor, c.slow_window_s, c.baseline_window_s, c.warmup_s, c.hang_floor_s,
                         c.hang_steps, c.agent_silence_s)


def demo_limits() -> w.WatchLimits:
    from trainctl.job.policy import load_gate_policy
    return load_gate_policy("local-demo", None).watch_limits


def noisy(limits: w.WatchLimits, step_time, seconds: int, with_squares: bool = True) -> list[w.Detection]:
    """Four ranks in lockstep whose step k takes step_time(k) seconds, as each rank measures it (a
    phase between two steps counts in the step after it); the main threads move throughout (an
    evaluation, a save or a stall is not stuck). One poll a second. The agents fold the squares of
    the steps' durations, unless `with_squares` is off (as an agent that did not)."""
    state, t, found = w.start(0.0), 0.0, []
    steps, ended, squares = 0, 0.0, 0.0         # steps done, when the last one ended, their squares
    while t < seconds:
        t += 1
        while ended + step_time(steps) <= t:
            ended += step_time(steps)
            squares += step_time(steps) ** 2 if with_squares else 0.0
            steps += 1
        seconds_done = ended                    # every step's time, phases included
        readings = {n: w.NodeReading(n, t, (w.RankProgress(i, steps, seconds_done, ended, 100 + i,
                                                           activity=int(t), step_seconds_sq=squares),))
                    for i, n in enumerate(NODES)}
        observation = w.observe(limits, state, t, readings)
        state = observation.state
        if observation.detection:
            found.append(observation.detection)
    return found


NOISE = {
    # an evaluation every 50 steps, as long as 20 steps
    "evaluation every 50 steps": lambda base: lambda k: base * (21 if k % 50 == 49 else 1),
    # a save every 100 steps, as long as 40 steps
    "save every 100 steps": lambda base: lambda k: base * (41 if k % 100 == 99 else 1),
    # the input pipeline stalls 3 s every 40 steps
    "3 s data stall every 40 steps": lambda base: lambda k: base + (3.0 if k % 40 == 39 else 0.0),
    # a full garbage collection: 1.5 s every 500 steps, and one of 8 s
    "GC pauses": lambda base: lambda k: base + (8.0 if k == 2500 else 1.5 if k % 500 == 499 else 0.0),
    # the first epoch reads cold storage: its 1,500 steps take 1.6x as long
    "slower first epoch": lambda base: lambda k: base * (1.6 if k < 1500 else 1.0),
    # an evaluation of 5 s and an input stall of 3 s after the same step, every 200 steps: at
    # local-demo's 10 s window the pause fills most of it, with a few steps in the same poll
    "evaluation and stall at once": lambda base: lambda k: base + (8.0 if k % 200 == 199 else 0.0),
}


@pytest.mark.parametrize("base", [0.25, 2.0], ids=["0.25 s steps", "2 s steps"])
@pytest.mark.parametrize("noise", sorted(NOISE))
@pytest.mark.parametrize("limits", ["site defaults", "local-demo"])
def test_noise_is_not_a_slowdown(noise, base, limits):
    chosen = default_limits() if limits == "site defaults" else demo_limits()
    span = chosen.warmup_s + chosen.baseline_window_s + chosen.slow_window_s
    assert noisy(chosen, NOISE[noise](base), int(span + 1200)) == []


def test_the_squares_keep_a_pause_filling_most_of_the_window_one_step():
    # 0.8 s steps, a 7 s pause (an evaluation and an input stall) every 100: at local-demo's 10 s
    # window, the poll after the pause averages it with the step after it into two slow steps,
    # and a slowdown it is not. With the squares the long step stands apart and weighs one step
    pauses = lambda k: 0.8 + (7.0 if k % 100 == 99 else 0.0)     # noqa: E731
    assert noisy(demo_limits(), pauses, 900, with_squares=False)
    assert noisy(demo_limits(), pauses, 900) == []


@pytest.mark.parametrize("steps, seconds, squares, expected", [
    (2, 9.0, 8.5 ** 2 + 0.5 ** 2, (0.5, 8.5)),           # one long step among short ones
    (5, 2.5, 5 * 0.5 ** 2, (0.5, None)),                 # equal steps: nothing to split
    (1, 8.0, 64.0, (8.0, None)),                         # one step
    (4, 2.0, 0.0, (0.5, None)),                          # no squares reported
])
def test_split_longest(steps, seconds, squares, expected):
    rest, longest = w.split_longest(steps, seconds, squares)
    assert rest == pytest.approx(expected[0]) and (longest is None if expected[1] is None
                                                   else longest == pytest.approx(expected[1]))


def test_the_noise_harness_still_sees_a_real_slowdown():
    # the same harness, with the step time doubled for good after 1,000 s: detected, naming nobody
    limits = default_limits()
    found = noisy(limits, lambda k: 0.25 if k < 4000 else 0.5, 2000)
    assert found and found[0].kind == "slow" and found[0].suspects == ()
