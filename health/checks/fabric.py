"""InfiniBand / RoCE port checks, IB MTU and the data interfaces' MTU and link state."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.fabric import IbInventory, IbPort, NetDev, hca_port_key
from trainctl.health.parse.ibv_devinfo import IbvDevice
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("ib.ports", "Every (expected) HCA port is Active and LinkUp, at the expected rate or "
       "that of its peers, with the expected link layer", needs=("ib",), hardware="ib")
def ib_ports(inventory: IbInventory, expected: NodeExpectations) -> Finding:
    issues = [(Status.FAIL, f"ibstat failed: {error}") for error in inventory.errors]
    ports = inventory.ports
    # A site that runs nodes short of a port (hca_port_down = "drop-port") is warned, not failed.
    down, dropped = ((Status.WARN, " (left out of this node's NCCL_IB_HCA: hca_port_down = drop-port)")
                     if expected.ib_ports is not None and expected.ib_ports_may_drop else (Status.FAIL, ""))
    if expected.ib_ports is not None:
        wanted = {hca_port_key(name) for name in expected.ib_ports}
        present = {(p.device, p.port) for p in ports}
        issues += [(down, f"{hca} port {port} not found{dropped}") for hca, port in sorted(wanted - present)]
        ports = tuple(p for p in ports if (p.device, p.port) in wanted)
    for port in ports:
        if not port_is_up(port):
            issues.append((down, f"{port.name} is {port.state}/{port.phys_state}{dropped}"))
        if expected.ib_link_layer and port.link_layer != expected.ib_link_layer:
            issues.append((Status.FAIL, f"{port.name} link layer {port.link_layer}, the site "
                                        f"expects {expected.ib_link_layer}"))
    if down is Status.WARN and expected.ib_ports and not any(port_is_up(p) for p in ports):
        issues.append((Status.FAIL, "none of the site's HCA ports is up: no port left for NCCL"))
    issues += _rate_issues([p for p in ports if p.state == "Active"], expected.ib_rate_gbps)
    details = {"ports": [{"port": p.name, "state": p.state, "phys_state": p.phys_state,
                          "rate_gbps": p.rate_gbps, "link_layer": p.link_layer, "kind": p.kind}
                         for p in ports]}
    rates = sorted({f"{p.rate_gbps:g} Gb/s {p.link_layer}" for p in ports if p.rate_gbps})
    return summarize(issues, f"{len(ports)} port(s) Active/LinkUp: {', '.join(rates) or 'none'}",
                     details)


def port_is_up(port: IbPort) -> bool:
    """Active and LinkUp: the state in which NCCL opens a port (it skips any other at init)."""
    return port.state == "Active" and port.phys_state == "LinkUp"


def _rate_issues(active: list[IbPort], expected_gbps: float | None) -> list[tuple[Status, str]]:
    if expected_gbps is not None:
        return [(Status.FAIL, f"{p.name} at {p.rate_gbps:g} Gb/s, the site expects "
                              f"{expected_gbps:g} Gb/s") for p in active
                if p.rate_gbps is not None and p.rate_gbps < expected_gbps]
    # No expectation: a port slower than the node's other ports of the same adapter model
    # and link layer has trained down (a bad cable or a degraded switch port).
    peers: dict[tuple, list[IbPort]] = {}
    for port in active:
        if port.rate_gbps is not None:
            peers.setdefault((port.kind, port.link_layer), []).append(port)
    issues = []
    for group in peers.values():
        top = max(p.rate_gbps for p in group)
        issues += [(Status.FAIL, f"{p.name} at {p.rate_gbps:g} Gb/s while its peers run "
                                 f"{top:g} Gb/s") for p in group if p.rate_gbps < top]
    return issues


@check("ib.netdev", "The network interface of each Active HCA port is up", needs=("ib_sysfs",),
       hardware="ib")
def ib_netdev(inventory: IbInventory, expected: NodeExpectations) -> Finding:
    attached = [p for p in inventory.ports if p.netdev is not None]
    issues = [(Status.FAIL, f"{p.name} is Active but its interface {p.netdev} is "
                            f"{p.netdev_operstate}")
              for p in attached if p.state == "Active" and p.netdev_operstate != "up"]
    details = {"ports": [{"port": p.name, "netdev": p.netdev, "operstate": p.netdev_operstate}
                         for p in attached]}
    ok = (f"{len(attached)} HCA interface(s) up" if attached
          else "no interface attached to the HCA ports in the snapshot")
    return summarize(issues, ok, details)


@check("ib.mtu", "Active MTU of each Active IB or RoCE port is the site's (or the port's max); "
       "a RoCE port's interface has the site's MTU", needs=("ibv_devinfo",),
       uses=("ib_sysfs",), hardware="ib")
def ib_mtu(devices: tuple[IbvDevice, ...], inventory: IbInventory | None,
           expected: NodeExpectations) -> Finding:
    # RoCE carries IB packets in Ethernet frames: its active MTU is the largest IB MTU that fits
    # the interface's MTU (1024 behind a 1500-byte interface, 4096 behind jumbo frames).
    netdevs = {(p.device, p.port): p for p in inventory.ports} if inventory is not None else {}
    issues = []
    for device in devices:
        for port in device.ports:
            if port.state != "ACTIVE" or port.link_layer not in (None, "InfiniBand", "Ethernet"):
                continue
            roce = port.link_layer == "Ethernet"
            name = f"{device.hca_id} port {port.port}" + (" (RoCE)" if roce else "")
            attached = netdevs.get((device.hca_id, port.port))
            behind = (f" (its interface {attached.netdev} has MTU {attached.netdev_mtu})"
                      if roce and attached is not None and attached.netdev_mtu is not None else "")
            if expected.ib_mtu is not None and port.active_mtu < expected.ib_mtu:
                issues.append((Status.FAIL, f"{name}: active MTU {port.active_mtu}, the site "
                                            f"expects {expected.ib_mtu}{behind}"))
            elif port.active_mtu < port.max_mtu:
                issues.append((Status.WARN, f"{name}: active MTU {port.active_mtu} below the "
                                            f"port's {port.max_mtu}{behind}"))
            if (roce and expected.netdev_mtu is not None and attached is not None
                    and attached.netdev_mtu is not None and attached.netdev_mtu < expected.netdev_mtu):
                issues.append((Status.FAIL, f"{name}: its interface {attached.netdev} has MTU "
                                            f"{attached.netdev_mtu}, the site expects {expected.netdev_mtu}"))
    details = {"ports": [{"port": f"{d.hca_id} port {p.port}", "state": p.state, "link_layer": p.link_layer,
                          "active_mtu": p.active_mtu, "max_mtu": p.max_mtu,
                          "netdev": getattr(netdevs.get((d.hca_id, p.port)), "netdev", None),
                          "netdev_mtu": getattr(netdevs.get((d.hca_id, p.port)), "netdev_mtu", None)}
                         for d in devices for p in d.ports]}
    return summarize(issues, "HCA port MTUs as expected", details)


@check("net.mtu", "Data interfaces have the site's MTU (jumbo frames); bond members match "
       "their bond", needs=("netdevs",))
def net_mtu(netdevs: tuple[NetDev, ...], expected: NodeExpectations) -> Finding:
    issues = []
    if expected.netdev_mtu is not None:
        issues += [(Status.FAIL, f"{dev.name}: MTU {dev.mtu}, the site expects {expected.netdev_mtu}")
                   for dev in _data_interfaces(netdevs, expected)
                   if dev.mtu is not None and dev.mtu < expected.netdev_mtu]
    by_name = {dev.name: dev for dev in netdevs}
    for dev in netdevs:
        bond = by_name.get(dev.master) if dev.master else None
        if bond is not None and bond.mtu != dev.mtu:
            issues.append((Status.FAIL, f"{dev.name}: MTU {dev.mtu} differs from its bond "
                                        f"{bond.name}'s {bond.mtu}"))
    details = {"interfaces": [{"name": d.name, "mtu": d.mtu, "link_type": d.link_type}
                              for d in netdevs], "expected": expected.netdev_mtu}
    return summarize(issues, "interface MTUs as expected", details)


@check("net.links", "Data interfaces and bond members are up; no interface is brought up "
       "without a link", needs=("netdevs",))
def net_links(netdevs: tuple[NetDev, ...], expected: NodeExpectations) -> Finding:
    data = expected.data_interfaces or ()
    names = {dev.name for dev in netdevs}
    issues = [(Status.FAIL, f"{name} not found") for name in data if name not in names]
    for dev in netdevs:
        if dev.operstate != "down" and dev.carrier is not False:
            continue
        if dev.name in data or dev.master:
            issues.append((Status.FAIL, f"{dev.name} is down"
                                        + (f" (a member of {dev.master})" if dev.master else "")))
        elif dev.admin_up:
            issues.append((Status.WARN, f"{dev.name} is brought up but has no link"))
    details = {"interfaces": [{"name": d.name, "operstate": d.operstate, "carrier": d.carrier,
                               "master": d.master} for d in netdevs]}
    return summarize(issues, f"{len(netdevs)} interface(s), none down that should be up", details)


def _data_interfaces(netdevs: tuple[NetDev, ...], expected: NodeExpectations) -> list[NetDev]:
    """The site's data interfaces; without a list, every Ethernet interface that is up."""
    if expected.data_interfaces is not None:
        return [d for d in netdevs if d.name in expected.data_interfaces]
    return [d for d in netdevs if d.operstate == "up" and d.link_type == "ether"]
