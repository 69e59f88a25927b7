"""Drain and resume plans: trainctl drains only reason-less nodes and resumes only its own, unchanged drains."""

from trainctl.slurm import REASON_MAX_BYTES, NodeState, fit_reason, parse_sinfo_states
from trainctl.sweep.drain import (DRAIN, RECHECK, RELEASE, RESUME, SKIP, Action, decide_resumes, drain_reason,
                                  plan_drains, plan_resumes)
from trainctl.sweep.model import CHECKED, ERROR, TIMEOUT, CheckRow, DrainRow, NodeOutcome, NodeRow, ResultRow

DOWN_PORT = ResultRow(7, "node2", "ib.ports", "fail", "mlx5_11/1 Down (Disabled)", {})
OUR_REASON = "trainctl: ib.ports: mlx5_11/1 Down (Disabled)"
WHEN = "2026-11-22T01:00:00"


def state(name, label="idle", reason="", user="", when=""):
    base = label.rstrip("*")
    return NodeState(name, "10.0.0.1", base, label[len(base):], reason, user, when)


def node(host, status="fail", outcome=CHECKED):
    return NodeRow(7, host, outcome, status if outcome == CHECKED else None, "idle", "", 0.0)


def drain_row(host="node2", reason=OUR_REASON, when=WHEN):
    return DrainRow(1, host, reason, when, 7, "ib.ports", 0.0, None, "")


def by_host(actions):
    return {a.host: a for a in actions}


def test_sinfo_states_parse_reason_last_and_suffixes():
    text = ("node1|10.77.0.1|idle|Unknown|Unknown|none\n"
            f"node2|10.77.0.2|drained*|root|{WHEN}|bad DIMM | see ticket 42\n"
            f"node2|10.77.0.2|drained*|root|{WHEN}|bad DIMM | see ticket 42\n")
    states = parse_sinfo_states(text)
    assert states["node1"].idle and states["node1"].reason == ""
    assert states["node2"].state == "drained" and states["node2"].flags == "*" and states["node2"].drained
    assert states["node2"].reason == "bad DIMM | see ticket 42" and not states["node2"].idle


def test_trainctls_reason_left_on_a_node_back_in_service_is_no_claim():
    """Slurm 23.11-25.11 without slurmdbd keep a resumed node's reason; 22.05 clears it."""
    text = (f"node1|10.77.0.1|idle|root|{WHEN}|{OUR_REASON}\n"
            f"node2|10.77.0.2|mixed*|root|{WHEN}|{OUR_REASON}\n"
            f"node3|10.77.0.3|idle|root|{WHEN}|bad DIMM\n"          # an admin's note stays a claim
            f"node4|10.77.0.4|draining|root|{WHEN}|{OUR_REASON}\n")  # still trainctl's drain
    states = parse_sinfo_states(text)
    assert (states["node1"].reason, states["node1"].reason_user, states["node1"].reason_time) == ("", "", "")
    assert states["node2"].reason == ""
    assert states["node3"].reason == "bad DIMM"
    assert states["node4"].reason == OUR_REASON and states["node4"].reason_time == WHEN


def test_reason_has_the_tag_the_check_and_fits_slurm():
    assert drain_reason([DOWN_PORT]) == ("ib.ports", OUR_REASON)
    long = ResultRow(7, "node2", "gpu.xid", "fail", "Xid 79 fell off the bus\n" + "é" * 400, {})
    check, reason = drain_reason([DOWN_PORT, long])
    assert check == "gpu.xid" and reason.startswith("trainctl: gpu.xid: Xid 79 fell off the bus é")
    assert reason.endswith("... [+ib.ports]")          # the reason is cut, not the list of other checks
    assert len(reason.encode()) <= REASON_MAX_BYTES and "\n" not in reason
    assert fit_reason("a\tb\n c") == "a b c"


def test_drains_only_failing_nodes_without_any_reason():
    nodes = [node("node1", "ok"), node("node2"), node("node3"), node("node4"), node("node5", "unknown"),
             node("node6", outcome=TIMEOUT), node("node7", outcome=ERROR), node("node8")]
    results = [DOWN_PORT] + [ResultRow(7, h, "ib.ports", "fail", "mlx5_0/1 Down", {}) for h in
                             ("node3", "node4", "node8")]
    states = {"node1": state("node1"), "node2": state("node2"),
              "node3": state("node3", "drained", "bad DIMM", "alice", WHEN),
              "node4": state("node4", "down*", "Not responding", "slurm", WHEN),
              "node5": state("node5"), "node6": state("node6"), "node7": state("node7")}
    actions = by_host(plan_drains(nodes, results, states, open_drains=[]))
    assert actions["node2"].action == DRAIN and actions["node2"].text == OUR_REASON
    assert actions["node3"].action == SKIP and "bad DIMM" in actions["node3"].text   # an admin's drain
    assert actions["node4"].action == SKIP and "Not responding" in actions["node4"].text
    assert actions["node8"].action == SKIP and "not known to Slurm" in actions["node8"].text
    assert actions["node6"].action == SKIP and "timeout" in actions["node6"].text   # no verdict, no drain
    assert actions["node7"].action == SKIP and actions["node5"].action == SKIP
    assert "node1" not in actions


def test_a_node_trainctl_already_holds_is_not_drained_twice():
    states = {"node2": state("node2", "drained", OUR_REASON, "root", WHEN)}
    (action,) = plan_drains([node("node2")], [DOWN_PORT], states, open_drains=[drain_row()])
    assert action.action == SKIP and "already drained by trainctl" in action.text


def test_resume_considers_only_drains_still_exactly_trainctls():
    drains = [drain_row("node2"), drain_row("node3"), drain_row("node4"), drain_row("node5"), drain_row("node6")]
    states = {
        "node2": state("node2", "drained", OUR_REASON, "root", WHEN),                   # still ours
        "node3": state("node3", "drained", "bad DIMM", "alice", "2026-11-22T02:00:00"),  # admin changed it
        "node4": state("node4", "idle"),                                                 # someone resumed it
        "node5": state("node5", "drained", OUR_REASON, "bob", "2026-11-22T03:00:00"),    # re-drained, same text
    }
    actions = by_host(plan_resumes(drains, states))
    assert actions["node2"].action == RECHECK
    assert actions["node3"].action == RELEASE and "bad DIMM" in actions["node3"].text
    assert actions["node4"].action == RELEASE and "resumed outside trainctl" in actions["node4"].text
    assert actions["node5"].action == RELEASE and "drained again by bob" in actions["node5"].text
    assert actions["node6"].action == RELEASE and "no longer known" in actions["node6"].text


def test_a_candidate_is_resumed_only_if_it_passes_now():
    candidates = [Action(h, RECHECK, "", "ib.ports", i) for i, h in enumerate(["n1", "n2", "n3", "n4", "n5"])]
    rechecked = {
        "n1": NodeOutcome("n1", CHECKED, status="ok"),
        "n2": NodeOutcome("n2", CHECKED, status="warn"),
        "n3": NodeOutcome("n3", CHECKED, status="fail", checks=(CheckRow("ib.ports", "fail", "mlx5_11/1 Down"),)),
        "n4": NodeOutcome("n4", TIMEOUT, detail="no answer within 90 s"),
    }
    actions = by_host(decide_resumes(candidates, rechecked))
    assert [h for h, a in actions.items() if a.action == RESUME] == ["n1", "n2"]
    assert "still fail: ib.ports: mlx5_11/1 Down" in actions["n3"].text
    assert "no verdict" in actions["n4"].text and "not re-checked" in actions["n5"].text


def test_a_trainctl_reason_this_history_did_not_record_is_named_as_such_and_left_alone():
    hook = "trainctl: nvlink.links: GPU 3: NVLink 3, 5 inactive"
    states = {"node2": state("node2", "drained", hook, "root", WHEN)}
    (action,) = plan_drains([node("node2")], [DOWN_PORT], states, open_drains=[])
    assert action.action == SKIP and action.text.startswith("drained by trainctl outside this history")
