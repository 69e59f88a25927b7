"""Strikes by failure family, and service against strikes: a node is a lemon when one family recurs,
and a family's strikes stop counting once the node has served `forgive_after_jobs` jobs since its
last strike of it; job strikes count once the jobs of `lemon_min_users` users struck, or a failed
sweep of the family agrees. Histories are written through the history's own writers (`History.record_jobs`,
the sweeps' `night`), and read back as the report and `drain --lemons` read them."""

from __future__ import annotations

import json
import time

import pytest

from support.sweeps import DAY, night
from trainctl.health.check_names import CHECK_NAMES
from trainctl.health.status import Status
from trainctl.gate_reasons import Reason
from trainctl.health.xid_catalog import XID_CATALOG, xid_issue
from trainctl.site import FleetConfig
from trainctl.sweep import render
from trainctl.sweep.db import History
from trainctl.sweep.drain import lemon_reason
from trainctl.sweep.families import (COMPUTE, FABRIC, FAMILIES, HANG, LINK, OTHER, detection_families,
                                     exclusion_families, failed_check_families)
from trainctl.sweep.fleet import DETECTION, EXCLUSION, SERVED, LemonRule, current_lemons
from trainctl.sweep.model import JobEventRow, JobRow
from trainctl.sweep.report import build_report, load_report_data

NOW = time.time()
RULE = LemonRule.from_site(FleetConfig())
ECC = "gpu.ecc: GPU 2 (PCI 0000:3b:00.0): 4 uncorrectable (double-bit) ECC errors, volatile"


def xid_reason(*numbers: int) -> str:
    """gpu.xid's exclusion reason as the check words it (trainctl.health.checks.kernel)."""
    return "gpu.xid: " + "; ".join(xid_issue(n, "GPU 3 (PCI 0000:9b:00.0)", 1, f"NVRM: Xid (PCI:0000:9b:00): {n}")
                                   for n in numbers)


class Jobs:
    """Jobs written into a history as folding writes them: one `jobs` row each, with its events; each
    job another user's (uid 1000 + its number), unless `user` names one."""

    def __init__(self, history: History):
        self.history, self.count = history, 0

    def add(self, at: float, *events: tuple[str, str, str, str], user: int | None = None) -> str:
        """A job at `at` with (host, kind, what, detail) events, each with the families the fold finds
        for it (an exclusion's from its one reason, `detail`; a detection's from its kind, no details);
        returns its id."""
        self.count += 1
        job = str(1000 + self.count)
        families = {EXCLUSION: lambda host, what, detail: exclusion_families([Reason.read(detail)]),
                    DETECTION: lambda host, what, detail: detection_families(what, {}, (host,))(host),
                    SERVED: lambda host, what, detail: ()}
        rows = [JobEventRow(job, line, host, kind, at + line, what, detail, families[kind](host, what, detail))
                for line, (host, kind, what, detail) in enumerate(events, start=2)]
        self.history.record_jobs([(JobRow(job, "test", at, at + 60, 0, f"/drop/{job}.jsonl", len(rows) + 1, 100,
                                          NOW, 1000 + self.count if user is None else user), rows)])
        return job

    def exclude(self, at: float, host: str, reason: str, user: int | None = None) -> str:
        return self.add(at, (host, EXCLUSION, reason.split(": ", 1)[0], reason), user=user)

    def serve(self, at: float, *hosts: str) -> str:
        return self.add(at, *((host, SERVED, "", "") for host in hosts))


@pytest.fixture
def history(tmp_path):
    with History.open(tmp_path / "h.db", write=True) as opened:
        yield opened


def standing(history: History, rule: LemonRule = RULE):
    report = build_report(load_report_data(history, NOW - 7 * DAY, rule, NOW), NOW, NOW - 7 * DAY)
    return report, {lemon.host: lemon for lemon in current_lemons(history, rule, NOW)}


# ---------------------------------------------------------------- service against strikes

def test_a_repaired_node_stops_being_a_lemon_once_it_has_served_enough_jobs_and_a_new_strike_counts_all_again(
        history):
    jobs = Jobs(history)
    for day in (6, 5, 4):
        jobs.exclude(NOW - day * DAY, "n5", ECC)
    _, lemons = standing(history)
    assert [(f.family, f.strikes, f.served_since) for f in lemons["n5"].families] == [("gpu-memory", 3.0, 0)]

    for hour in range(RULE.forgive_after_jobs - 1):        # repaired: it trains fine, one job short of the rule
        jobs.serve(NOW - 3 * DAY + hour * 3600, "n5", "n6")
    _, lemons = standing(history)
    assert lemons["n5"].families[0].served_since == RULE.forgive_after_jobs - 1

    jobs.serve(NOW - 2 * DAY, "n5")
    report, lemons = standing(history)
    assert "n5" not in lemons
    assert [(s.host, [(f.family, f.served_since) for f in s.cleared(RULE)]) for s in report.fleet.cleared] == \
        [("n5", [("gpu-memory", RULE.forgive_after_jobs)])]
    assert "CLEARED BY SERVICE" in render.to_text(report)

    jobs.exclude(NOW - DAY, "n5", xid_reason(48))          # it comes back: every strike of the family counts again
    _, lemons = standing(history)
    assert [(f.family, f.strikes, f.served_since) for f in lemons["n5"].families] == [("gpu-memory", 4.0, 0)]


def test_service_counts_jobs_not_steps_and_only_after_the_familys_last_strike(history):
    jobs = Jobs(history)
    for day in (6, 5, 4):
        jobs.exclude(NOW - day * DAY, "n7", "lost during the gate: fabric test: left after 12 s")
    restarts = [("n7", SERVED, "", "")] * 3                # one job, three steps that ended well: one job served
    for hour in range(RULE.forgive_after_jobs):
        jobs.add(NOW - 3 * DAY + hour * 3600, *restarts)
    jobs.exclude(NOW - 3 * DAY + 12 * 3600, "n7", "ib.ports: mlx5_2/1 Down")   # another family, after the service
    _, lemons = standing(history)
    assert "n7" not in lemons
    _, lemons = standing(history, LemonRule(3, 7, 1, 1, 1, RULE.forgive_after_jobs + 1, 2))
    assert [(f.family, f.served_since) for f in lemons["n7"].families] == [(HANG, RULE.forgive_after_jobs)]
    _, lemons = standing(history, LemonRule(3, 7, 1, 1, 1, 0, 2))   # 0: service never forgives
    assert lemons["n7"].families[0].family == HANG


def test_one_strike_in_each_of_three_families_makes_no_lemon_and_the_report_says_which_family_recurs(history):
    jobs = Jobs(history)
    jobs.exclude(NOW - 3 * DAY, "n1", ECC)
    jobs.exclude(NOW - 2 * DAY, "n1", "ib.ports: mlx5_2/1 Down")
    jobs.add(NOW - DAY, ("n1", DETECTION, "hung", "the ranks of n1 are behind"))
    for day in (3, 2):
        jobs.exclude(NOW - day * DAY, "n2", xid_reason(79))
    night(history, NOW - DAY / 2, {"n2": {"gpu.smi": ("fail", "nvidia-smi -q -x exited 15")}, "n1": "ok"})
    report, lemons = standing(history)
    assert list(lemons) == ["n2"] and [(f.family, f.strikes) for f in lemons["n2"].families] == [("gpu-reset", 3.0)]
    nodes = {n.host: n for n in report.fleet.nodes}
    assert sorted((f.family, f.strikes) for f in nodes["n1"].families) == [("gpu-memory", 1), ("hang", 1), ("link", 1)]
    text = render.to_text(report)
    assert "n2  3 gpu-reset strikes, 2 jobs" in text and "[gpu-reset] sweep #1 failed: gpu.smi" in text
    document = json.loads(render.to_json(report))["fleet"]
    assert document["lemons"][0]["families"] == [{"family": "gpu-reset", "strikes": 3.0, "served_since": 0,
                                                  "forgiven": False, "users": 2, "swept": True}]
    assert lemon_reason(lemons["n2"], RULE).startswith("trainctl: fleet.lemon: 3 gpu-reset strikes in 7 days: job ")
    prom = render.to_prometheus([], [], [], None, report.fleet)
    assert 'trainctl_node_family_strikes{node="n1",family="link"} 1' in prom
    assert 'trainctl_node_family_strikes{node="n2",family="gpu-reset"} 3' in prom


# ---------------------------------------------------------------- one user's jobs

def test_one_users_many_strikes_make_no_lemon_until_another_users_job_or_a_failed_sweep_agrees(history):
    jobs = Jobs(history)
    for day in (6, 5, 4, 3):
        jobs.exclude(NOW - day * DAY, "n5", ECC, user=1500)        # one user, four jobs on n5: none counts alone
        jobs.exclude(NOW - day * DAY, "n6", ECC, user=1500)
    report, lemons = standing(history)
    assert lemons == {} and report.fleet.lemons == ()
    assert [(s.host, [(f.family, f.strikes, f.users) for f in s.too_few_users(RULE)])
            for s in report.fleet.too_few_users] == [("n5", [("gpu-memory", 4.0, 1)]), ("n6", [("gpu-memory", 4.0, 1)])]
    assert "NOT LEMONS: TOO FEW USERS (enough strikes of a family, but from fewer than 2 users' jobs" in \
        render.to_text(report)
    assert "job strikes count once the jobs of 2 users struck the family" in RULE.describe()

    _, lemons = standing(history, LemonRule.from_site(FleetConfig(lemon_min_users=1)))   # a single-team site
    assert sorted(lemons) == ["n5", "n6"] and lemons["n5"].users == 1

    jobs.exclude(NOW - 2 * DAY, "n5", xid_reason(48), user=1501)   # another user's job agrees
    night(history, NOW - DAY, {"n6": {"gpu.ecc": ("fail", ECC)}})   # and on n6, root's own sweep
    report, lemons = standing(history)
    assert sorted(lemons) == ["n5", "n6"] and report.fleet.too_few_users == ()
    assert [(f.family, f.strikes, f.users, f.swept) for f in lemons["n5"].families] == [("gpu-memory", 5.0, 2, False)]
    assert [(f.family, f.strikes, f.users, f.swept) for f in lemons["n6"].families] == [("gpu-memory", 5.0, 1, True)]


def test_a_failed_sweep_agrees_only_with_strikes_of_its_own_family(history):
    jobs = Jobs(history)
    for day in (3, 2, 1):
        jobs.exclude(NOW - day * DAY, "n7", "lost during the gate: fabric test: left after 12 s", user=1500)
    night(history, NOW - DAY / 2, {"n7": {"ib.ports": ("fail", "mlx5_2/1 Down")}})
    report, lemons = standing(history)
    assert lemons == {}
    assert [[(f.family, f.users, f.swept) for f in s.too_few_users(RULE)] for s in report.fleet.too_few_users] == \
        [[(HANG, 1, False)]]
    assert [(f.family, f.strikes) for f in report.fleet.nodes[0].families] == [(HANG, 3.0), (LINK, 1.0)]


# ---------------------------------------------------------------- families (pure)

def excluded_for(*reasons: str) -> tuple[str, ...]:
    """An exclusion's families, from its reasons as the journal holds them."""
    return exclusion_families([Reason.read(reason) for reason in reasons])


def test_xids_strike_in_the_catalogues_families_and_the_applications_strike_nobody():
    def families(*numbers):
        return excluded_for(xid_reason(*numbers))

    assert families(48) == families(63, 64) == families(92, 94, 95, 140) == ("gpu-memory",)
    assert families(79) == families(119, 120) == families(154) == ("gpu-reset",)
    assert families(74) == families(144, 150) == ("nvlink",)
    assert families(79, 48, 13) == ("gpu-memory", "gpu-reset")
    assert families(13, 31, 43) == ()                       # the application's: no strike
    assert excluded_for("gpu.xid: cut") == ("gpu",)         # an Xid the gate failed on, its numbers cut off


def test_every_xid_that_fails_a_node_has_a_family_and_no_other_does():
    for number, info in XID_CATALOG.items():
        assert (info.family is not None) == (info.status is Status.FAIL), number
        assert info.family is None or info.family in FAMILIES


def test_every_check_and_every_gate_cause_has_a_family_of_its_own():
    from trainctl.job.decision import LOST

    for check in CHECK_NAMES - {"gpu.xid"}:
        assert excluded_for(f"{check}: failed") != (OTHER,), check
    assert excluded_for(f"{LOST}: fabric test: left") == excluded_for("no health report") == (HANG,)
    assert excluded_for("fabric: straggler: best busbw 61 GB/s") == (FABRIC,)
    assert excluded_for("compute fail-slow: GPU 5 0.6x") == (COMPUTE,)
    assert excluded_for() == (OTHER,)                       # excluded by the gate, no reason given
    assert excluded_for(f"{LOST}: fabric test: left", ECC) == ("gpu-memory", HANG)   # one strike in both


def test_a_slow_detection_strikes_by_the_rule_that_named_the_node_whatever_its_evidence_says():
    from trainctl.job.watch import LinkWait, OwnTime, link_wait_verdict, own_time_verdict

    own = [OwnTime("n1", 0, (0.1, 0.0), (0.9, 0.0))] + [OwnTime(f"n{i}", 0, (0.1, 0.0), (0.1, 0.0)) for i in (2, 3)]
    named, _, own_fields = own_time_verdict(own, 0.8)
    assert named == ("n1",) and detection_families("slow", {"named_by": "own-time"}, named)("n1") == (COMPUTE,)
    links = [LinkWait("n1", "ib0", "ib", (1.0, 900.0), (1e9, 1e9))] + \
        [LinkWait(f"n{i}", "ib0", "ib", (1.0, 2.0), (1e9, 1e9)) for i in (2, 3)]
    named, _, link_fields = link_wait_verdict(links, ("n1", "n2", "n3"))
    assert named == ("n1",) and detection_families("slow", {"named_by": "link-wait"}, named)("n1") == (LINK,)
    # a journal from before `named_by`: the rule is the one whose fields it holds
    assert detection_families("slow", {"links": list(link_fields)}, named)("n1") == (LINK,)
    assert detection_families("slow", {"own": list(own_fields)}, named)("n1") == (COMPUTE,)
    assert detection_families("slow", {}, ("n2",))("n2") == (OTHER,)     # no rule named it
    assert detection_families("a-kind-of-a-later-trainctl", {}, ("n2",))("n2") == (OTHER,)


def test_a_sick_detection_and_a_failed_sweep_strike_by_their_own_checks():
    failed = [{"node": "n1", "check": "gpu.xid", "reason": xid_reason(79)[len("gpu.xid: "):]},
              {"node": "n2", "check": "ib.ports", "reason": "mlx5_2/1 Down"},
              {"node": "n1", "check": "host.memory", "reason": "2 GiB available"}]
    sick = detection_families("sick", {"failed": failed}, ("n1", "n2", "n3"))
    assert (sick("n1"), sick("n2"), sick("n3")) == (("gpu-reset", "host"), (LINK,), (OTHER,))
    checks = [("gpu.xid", xid_reason(95, 13)[len("gpu.xid: "):]), ("nvlink.links", "GPU 3 link 5 inactive")]
    assert failed_check_families(checks) == ("gpu-memory", "nvlink")
    assert failed_check_families([]) == (OTHER,)


def test_the_admin_guides_family_table_names_each_xid_in_its_catalogue_family():
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "admin.md").read_text(encoding="utf-8")
    text = guide[guide.index("**Failure families.**"):guide.index("The Xid families follow")]
    documented = {}
    for family, xids in re.findall(r"^\| `([\w-]+)` \| Xid ([^;|]*)", text, re.MULTILINE):
        for first, last in re.findall(r"\b(\d+)(?:-(\d+))?\b(?![^(]*\))", xids):
            for number in range(int(first), int(last or first) + 1):
                documented[number] = family
    assert documented == {n: info.family for n, info in XID_CATALOG.items() if info.family}
    assert set(re.findall(r"^\| `([\w-]+)` \|", text, re.MULTILINE)) == set(FAMILIES)
