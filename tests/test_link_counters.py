"""A node's link counters (health/parse/link_counters.py) from real recordings: `tc -s -j qdisc show`
on the dev cluster's nodes, InfiniBand sysfs from node_exporter's and procfs's fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainctl.errors import ParseError
from trainctl.health.parse.link_counters import LinkCounters, parse_ib_xmit_counters, parse_qdisc_stats
from trainctl.health.parse.sysfs import parse_ttar

FIXTURES = Path(__file__).resolve().parent / "fixtures"
QDISC = FIXTURES / "recorded" / "devcluster-qdisc-2026-12-04"
IB_SYSFS = FIXTURES / "library" / "infiniband" / "sysfs"


def test_a_nodes_root_qdiscs_are_its_links_and_loopback_is_not():
    # the node whose eth0 was cut to 30mbit (tbf), mid-run: 5712 times held back, nothing dropped
    text = (QDISC / "tc-s-j-qdisc-show-tbf-30mbit.json").read_text()
    assert parse_qdisc_stats(text) == (LinkCounters("eth0", "qdisc", 105624843, 5712),)
    assert parse_qdisc_stats((QDISC / "tc-s-j-qdisc-show-tbf-100mbit.json").read_text()) == (
        LinkCounters("eth0", "qdisc", 29798376, 1605),)
    # read while its queue held 126328 bytes: the queue is no count, the counts are read as ever
    queued = (QDISC / "tc-s-j-qdisc-show-tbf-30mbit-backlog.json").read_text()
    assert parse_qdisc_stats(queued) == (LinkCounters("eth0", "qdisc", 89659995, 5112),)


def test_a_child_qdisc_is_counted_in_its_root_and_a_broken_output_is_an_error():
    text = (QDISC / "tc-s-j-qdisc-show-tbf-30mbit.json").read_text()
    child = text.replace('"dev":"eth0","root":true', '"dev":"eth0","parent":"8129:1"')
    assert parse_qdisc_stats(child) == ()
    for bad in ("", "{}", text.replace('"overlimits":5712', '"overlimits":"5712"'),
                text.replace('"bytes":105624843', '"bytes":-1'), text.replace('"dev":"eth0",', "")):
        with pytest.raises(ParseError):
            parse_qdisc_stats(bad)


def test_infiniband_ports_wait_and_data_counters_and_a_port_without_a_pma_is_left_out():
    files = parse_ttar((IB_SYSFS / "procfs-hfi1-mlx4-mlx5-class-infiniband.ttar").read_text())
    ports = {port.link: port for port in parse_ib_xmit_counters(files)}
    assert ports["hfi1_0:1"] == LinkCounters("hfi1_0:1", "ib", 273558326543 * 4, 0)
    assert ports["mlx4_0:1"].sent_bytes == 26509113295 * 4 and all(p.source == "ib" for p in ports.values())
    # the recording ends cut after its last file's contents (as tests/test_gray_across_nodes.py reads it)
    no_pma = parse_ttar((IB_SYSFS / "node-exporter-i40iw-no-pma-and-mlx4-class-infiniband.ttar").read_text()
                        + "Mode: 644\n")
    ports = {port.link: port for port in parse_ib_xmit_counters(no_pma)}
    assert "i40iw0:1" not in ports
    # a 32-bit port_xmit_wait stops at its largest value: read as it is, it then stays flat
    assert ports["mlx4_0:1"].wait == 4294967295
    with pytest.raises(ParseError):
        parse_ib_xmit_counters({"sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_wait": "many\n"})
