"""The dev cluster's network and node namespaces: a bridge, one network namespace per node on a
veth pair (its own address and MTU, optional tc tbf shaping), persistent UTS and mount
namespaces (own hostname, own sysfs), and their removal. With rails, every node has one more
interface per rail (eth1, eth2, ...), each on a bridge and subnet of that rail's own."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Mapping

from trainctl.devcluster.processes import CMD_TIMEOUT_S
from trainctl.devcluster.spec import (ROOT_SIDE_MTU, ClusterSpec, Layout, StateFile, check_mtu,
                                      check_rate)
from trainctl.proc import ProcResult, run, run_checked

TBF_BURST = "256kb"         # must exceed the device MTU, or tbf silently drops jumbo frames
TBF_LATENCY = "400ms"


def _ip(*args: object) -> ProcResult:
    return run_checked(["ip", *map(str, args)], timeout=CMD_TIMEOUT_S)


# ---------------------------------------------------------------- build

def create_network(spec: ClusterSpec, state: StateFile) -> None:
    """Bridge with the controller address, and per node a netns whose eth0 is on the bridge."""
    state.set("bridge", spec.bridge)  # recorded before creating, so a crash leaves no orphan
    _ip("link", "add", spec.bridge, "type", "bridge")
    _ip("addr", "add", f"{spec.controller_address}/24", "dev", spec.bridge)
    for node in spec.node_names:
        netns, veth = spec.netns(node), spec.veth(node)
        state.add("netns", netns)
        state.add("veths", veth)
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "mtu", ROOT_SIDE_MTU, "type", "veth",
            "peer", "name", "eth0", "mtu", spec.mtu(node), "netns", netns)
        _ip("link", "set", veth, "master", spec.bridge, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "addr", "add", f"{spec.address(node)}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
    # A bridge takes the smallest port MTU until told otherwise.
    _ip("link", "set", spec.bridge, "mtu", ROOT_SIDE_MTU, "up")
    add_rails(spec, state, range(1, spec.rails))
    for node, rate in spec.rates.items():
        set_rate(spec, node, rate)


def add_rails(spec: ClusterSpec, state: StateFile, rails: range) -> None:
    """Per rail a bridge with no address in the root namespace (the rail's subnet lives only
    inside our namespaces), and per node a veth whose end eth<rail> has the node's rail address."""
    for rail in rails:
        bridge = spec.rail_bridge(rail)
        state.add("rail_bridges", bridge)
        _ip("link", "add", bridge, "type", "bridge")
        interface = spec.rail_interface(rail)
        for node in spec.node_names:
            netns, veth = spec.netns(node), spec.veth(node, rail)
            state.add("veths", veth)
            _ip("link", "add", veth, "mtu", ROOT_SIDE_MTU, "type", "veth",
                "peer", "name", interface, "mtu", spec.mtu(node), "netns", netns)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", netns, "addr", "add", f"{spec.address(node, rail)}/24", "dev", interface)
            _ip("-n", netns, "link", "set", interface, "up")
        _ip("link", "set", bridge, "mtu", ROOT_SIDE_MTU, "up")


def remove_rails(spec: ClusterSpec, rails: range) -> None:
    """Undo `add_rails` for `rails` (deleting a root-side veth removes its pair at once)."""
    for rail in rails:
        for node in spec.node_names:
            if os.path.exists(f"/sys/class/net/{spec.veth(node, rail)}"):
                _ip("link", "del", spec.veth(node, rail))
        if os.path.exists(f"/sys/class/net/{spec.rail_bridge(rail)}"):
            _ip("link", "del", spec.rail_bridge(rail))


def create_node_namespaces(layout: Layout) -> None:
    """Per node: persistent UTS (hostname) and mount namespaces with a sysfs of its own."""
    ns_dir = str(layout.ns_dir)
    # `unshare --mount=FILE` refuses a FILE on a shared mount (systemd makes / shared):
    # give the namespace files a private mount of their own.
    run_checked(["mount", "--bind", ns_dir, ns_dir], timeout=CMD_TIMEOUT_S)
    run_checked(["mount", "--make-private", ns_dir], timeout=CMD_TIMEOUT_S)
    for node in layout.spec.node_names:
        layout.uts_file(node).touch()
        layout.mnt_file(node).touch()
        run_checked(["nsenter", f"--net=/run/netns/{layout.spec.netns(node)}",
                     "unshare", f"--uts={layout.uts_file(node)}", f"--mount={layout.mnt_file(node)}",
                     "--propagation=slave", "hostname", layout.spec.hostname(node)],
                    timeout=CMD_TIMEOUT_S)
        # sysfs shows the interfaces of the namespace that mounted it, so the node needs
        # its own, mounted from inside its netns, for /sys/class/net to be the node's.
        # slurmd refuses to start without /sys/fs/cgroup: carry the host's tree over.
        cgroup_aside = layout.ns_dir / f"{node}.cgroup"
        cgroup_aside.mkdir()
        for argv in (["mount", "--rbind", "/sys/fs/cgroup", str(cgroup_aside)],
                     ["mount", "-t", "sysfs", f"sysfs-{node}", "/sys"],
                     ["mount", "--move", str(cgroup_aside), "/sys/fs/cgroup"]):
            run_checked(layout.exec_argv(node, argv), timeout=CMD_TIMEOUT_S)


# ---------------------------------------------------------------- live changes

def set_rate(spec: ClusterSpec, node: str, rate: str | None, rail: int = 0) -> None:
    """Limit `node`'s traffic on `rail` in both directions to `rate` (tc tbf), or remove the limit."""
    if rate is not None:
        check_rate(node, rate)
    _shape(["tc", "-n", spec.netns(node)], spec.rail_interface(rail), rate)   # node -> others
    _shape(["tc"], spec.veth(node, rail), rate)                               # others -> node


def _shape(tc: list[str], device: str, rate: str | None) -> None:
    current = parse_tbf_rate_bits(
        run_checked([*tc, "-j", "qdisc", "show", "dev", device], timeout=CMD_TIMEOUT_S).stdout)
    if rate is not None:
        run_checked([*tc, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
                     "burst", TBF_BURST, "latency", TBF_LATENCY], timeout=CMD_TIMEOUT_S)
    elif current is not None:
        run_checked([*tc, "qdisc", "del", "dev", device, "root"], timeout=CMD_TIMEOUT_S)


def set_mtu(spec: ClusterSpec, node: str, mtu: int) -> None:
    check_mtu(node, mtu)
    _ip("-n", spec.netns(node), "link", "set", "eth0", "mtu", mtu)


def link_status(spec: ClusterSpec, node: str) -> tuple[int | None, int | None]:
    """(MTU, tbf rate in bit/s) of `node`'s eth0 read back from the kernel; None where unknown."""
    netns = spec.netns(node)
    link = run(["ip", "-j", "-n", netns, "link", "show", "dev", "eth0"], timeout=CMD_TIMEOUT_S)
    qdisc = run(["tc", "-n", netns, "-j", "qdisc", "show", "dev", "eth0"], timeout=CMD_TIMEOUT_S)
    return (parse_link_mtu(link.stdout) if link.ok else None,
            parse_tbf_rate_bits(qdisc.stdout) if qdisc.ok else None)


# ---------------------------------------------------------------- teardown

def existing_netns(spec: ClusterSpec, state: Mapping) -> list[str]:
    """Our network namespaces that exist now: the recorded ones and any with our name pattern."""
    pattern = re.compile(rf"{spec.prefix}n[0-9]+")
    try:
        present = set(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []
    names = set(state.get("netns", [])) | {n for n in present if pattern.fullmatch(n)}
    return sorted(names & present)


def existing_links(spec: ClusterSpec, state: Mapping, *, bridge: bool) -> list[str]:
    """Our veths (and the bridges where `bridge`) that exist now."""
    name_pattern = rf"{spec.prefix}veth[0-9]+(r[0-9]+)?" + (rf"|{spec.prefix}br[0-9]+" if bridge else "")
    pattern = re.compile(name_pattern)
    present = set(os.listdir("/sys/class/net"))
    names = set(state.get("veths", [])) | {n for n in present if pattern.fullmatch(n)}
    return sorted(names & present)


def netns_pids(netns: str) -> list[int]:
    """Every process inside network namespace `netns`."""
    result = run(["ip", "netns", "pids", netns], timeout=CMD_TIMEOUT_S)
    return [int(p) for p in result.stdout.split() if p.isdigit()] if result.ok else []


def remove_network(spec: ClusterSpec, state: Mapping, base: Path) -> list[str]:
    """Unmount our mounts, delete veths, namespaces and the bridge; returns what was removed."""
    removed = []
    for point in mounts_under(Path("/proc/self/mountinfo").read_text(), str(base)):
        run(["umount", point], timeout=CMD_TIMEOUT_S)
        removed.append(f"mount {point}")
    # Deleting the root-side veth removes the pair at once; `ip netns del` alone frees
    # the peer asynchronously, which would race a quick `up`.
    for veth in existing_links(spec, state, bridge=False):
        run(["ip", "link", "del", veth], timeout=CMD_TIMEOUT_S)
        removed.append(f"veth {veth}")
    for netns in existing_netns(spec, state):
        run(["ip", "netns", "del", netns], timeout=CMD_TIMEOUT_S)
        removed.append(f"netns {netns}")
    for bridge in existing_links(spec, state, bridge=True):  # the veths are gone: only bridges are left
        run(["ip", "link", "del", bridge], timeout=CMD_TIMEOUT_S)
        removed.append(f"bridge {bridge}")
    return removed


def network_leftovers(spec: ClusterSpec, state: Mapping, base: Path) -> list[str]:
    left = [f"netns {n}" for n in existing_netns(spec, state)]
    left += [f"link {n}" for n in existing_links(spec, state, bridge=True)]
    left += [f"mount {p}" for p in mounts_under(Path("/proc/self/mountinfo").read_text(), str(base))]
    return left


# ---------------------------------------------------------------- pure parsing

def parse_link_mtu(ip_json: str) -> int | None:
    """`ip -j link show dev X` -> its MTU."""
    links = json.loads(ip_json or "[]")
    return int(links[0]["mtu"]) if links else None


def parse_tbf_rate_bits(tc_json: str) -> int | None:
    """`tc -j qdisc show dev X` -> rate of its root tbf in bit/s (tc reports bytes/s), else None."""
    for qdisc in json.loads(tc_json or "[]"):
        if qdisc.get("root") and qdisc.get("kind") == "tbf":
            return int(qdisc["options"]["rate"]) * 8
    return None


def mounts_under(mountinfo_text: str, base: str) -> list[str]:
    """Mount points at or below `base` in /proc/self/mountinfo text, deepest first."""
    def unescape(field_text: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_text)

    base = base.rstrip("/")
    points = []
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = unescape(fields[4])
            if point == base or point.startswith(base + "/"):
                points.append(point)
    return sorted(points, key=lambda p: p.count("/"), reverse=True)
