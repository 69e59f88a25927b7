"""`this_node_name()`: a node's Slurm name (NodeName), which need not be its host name."""

from pathlib import Path

import pytest

from trainctl import slurm
from trainctl.proc import ProcResult
from trainctl.slurm import node_for_hostname, parse_scontrol_oneliner, this_node_name

# Real `scontrol show node -o 'node[1-2]'` from Slurm 22.05.8, NodeHostName=nodeN.cluster.test.
FQDN_NODES = (Path(__file__).parent / "fixtures/recorded/devcluster-slurm-22.05.8"
              / "scontrol-show-node-o-fqdn-nodehostname.txt").read_text()


def scontrol_answers(monkeypatch, stdout: str | None) -> list[list[str]]:
    """Make `scontrol` print `stdout` (None: fail the test if it is called); returns the calls."""
    calls: list[list[str]] = []

    def fake_run(argv, *, timeout, **kwargs):
        assert stdout is not None, f"scontrol should not be needed here: {argv}"
        calls.append(list(argv))
        return ProcResult(argv=tuple(argv), returncode=0, stdout=stdout, stderr="", duration_s=0.01)

    monkeypatch.setattr(slurm, "run", fake_run)
    return calls


def test_slurmd_nodename_wins_over_any_host_name(monkeypatch):
    scontrol_answers(monkeypatch, None)
    environ = {"SLURMD_NODENAME": "gpu07", "SLURM_JOB_NODELIST": "gpu[01-08]"}
    assert this_node_name(environ, hostname="gpu07.cluster.example") == "gpu07"
    assert this_node_name(environ, hostname="something-else") == "gpu07"


def test_outside_slurm_it_is_the_host_name_as_it_is(monkeypatch):
    scontrol_answers(monkeypatch, None)
    assert this_node_name({}, hostname="gpu07.cluster.example") == "gpu07.cluster.example"
    assert this_node_name({"SLURMD_NODENAME": ""}, hostname="gpu07") == "gpu07"


@pytest.mark.parametrize("hostname, nodelist, expected", [
    ("gpu07.cluster.example", "gpu[01-08]", "gpu07"),            # FQDN host, short NodeName
    ("gpu07", "gpu[01-08]", "gpu07"),
    ("gpu07.cluster.example", "gpu07.cluster.example,gpu08.cluster.example",
     "gpu07.cluster.example"),                                   # NodeName is the FQDN itself
])
def test_in_a_job_without_slurmd_nodename_the_host_is_found_in_the_node_list(monkeypatch, hostname,
                                                                              nodelist, expected):
    scontrol_answers(monkeypatch, None)
    assert this_node_name({"SLURM_JOB_NODELIST": nodelist}, hostname=hostname) == expected


def test_a_host_name_unlike_its_node_name_is_found_through_nodehostname(monkeypatch):
    calls = scontrol_answers(monkeypatch, FQDN_NODES)
    # the host calls itself node2.cluster.test; the job's list names no such host
    environ = {"SLURM_JOB_NODELIST": "node[1-2]"}
    assert this_node_name(environ, hostname="node2.cluster.test") == "node2"
    assert calls == []  # the short form node2 is in the list: no scontrol needed
    renamed = FQDN_NODES.replace("NodeName=node2 ", "NodeName=dgx-b ").replace(
        "NodeName=node1 ", "NodeName=dgx-a ")
    calls = scontrol_answers(monkeypatch, renamed)
    environ = {"SLURM_JOB_NODELIST": "dgx-a,dgx-b"}
    assert this_node_name(environ, hostname="node2.cluster.test") == "dgx-b"
    assert calls == [["scontrol", "show", "node", "-o", "dgx-a,dgx-b"]]


def test_no_match_anywhere_falls_back_to_the_host_name(monkeypatch):
    scontrol_answers(monkeypatch, FQDN_NODES)
    assert this_node_name({"SLURM_JOB_NODELIST": "node[1-2]"}, hostname="login3.example") == "login3.example"


def test_node_for_hostname_reads_nodehostname_records():
    records = parse_scontrol_oneliner(FQDN_NODES)
    assert [(r["NodeName"], r["NodeHostName"]) for r in records] == [
        ("node1", "node1.cluster.test"), ("node2", "node2.cluster.test")]
    assert node_for_hostname(records, ("node1.cluster.test", "node1")) == "node1"
    assert node_for_hostname(records, ("node9.cluster.test", "node9")) is None


def test_scontrol_failing_falls_back_to_the_host_name(monkeypatch):
    def missing(argv, *, timeout, **kwargs):
        return ProcResult(argv=tuple(argv), returncode=None, stdout="", stderr="", duration_s=0.0,
                          missing=True)

    monkeypatch.setattr(slurm, "run", missing)
    assert this_node_name({"SLURM_JOB_NODELIST": "gpu[01-02]"}, hostname="h7.example") == "h7.example"
