"""InfiniBand / RoCE port checks, IB MTU and the data interfaces' MTU and link state."""

from __future__ import annotations

from trainctl.health.expectations import NodeExpectations
from trainctl.health.parse.fabric import IbInventory, IbPort, NetDev
from trainctl.health.parse.ibv_devinfo import IbvDevice
from trainctl.health.registry import check
from trainctl.health.status import Finding, Status, summarize


@check("ib.ports", "Every (expected) HCA port is Active and LinkUp, at the expected rate or "
       "that of its peers, with the expected link layer", needs=("ib",), hardware="ib")
def ib_ports(inventory: IbInventory, expected: NodeExpectations) -> Finding:
    issues = [(Status.FAIL, f"ibstat failed: {error}") for error in inventory.errors]
    ports = inventory.ports
    if expected.ib_ports is not None:
        wanted = {_port_key(name) for name in expected.ib_ports}
        present = {(p.device, p.port) for p in ports}
        issues += [(Status.FAIL, f"{hca} port {port} not found") for hca, port in sorted(wanted - present)]
        ports = tuple(p for p in ports if (p.device, p.port) in wanted)
    for port in ports:
        if port.state != "Active" or port.phys_state != "LinkUp":
            issues.append((Status.FAIL, f"{port.name} is {port.state}/{port.phys_state}"))
        if expected.ib_link_layer and port.link_layer != expected.ib_link_layer:
            issues.append((Status.FAIL, f"{port.name} link layer {port.link_layer}, the site "
                                        f"expects {expected.ib_link_layer}"))
    issues += _rate_issues([p for p in ports if p.state == "Active"], expected.ib_rate_gbps)
    details = {"ports": [{"port": p.name, "state": p.state, "phys_state": p.phys_state,
                          "rate_gbps": p.rate_gbps, "link_layer": p.link_layer, "kind": p.kind}
                         for p in ports]}
    rates = sorted({f"{p.rate_gbps:g} Gb/s {p.link_layer}" for p in ports if p.rate_gbps})
    return summarize(issues, f"{len(ports)} port(s) Active/LinkUp: {', '.join(rates) or 'none'}",
                     details)


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


@check("ib.mtu", "The active MTU of each Active InfiniBand port is the site's (or the port's max)",
       needs=("ibv_devinfo",), hardware="ib")
def ib_mtu(devices: tuple[IbvDevice, ...], expected: NodeExpectations) -> Finding:
    issues = []
    for device in devices:
        for port in device.ports:
            if port.state != "ACTIVE" or port.link_layer not in (None, "InfiniBand"):
                continue
            name = f"{device.hca_id} port {port.port}"
            if expected.ib_mtu is not None and port.active_mtu < expected.ib_mtu:
                issues.append((Status.FAIL, f"{name}: active MTU {port.active_mtu}, the site "
                                            f"expects {expected.ib_mtu}"))
            elif port.active_mtu < port.max_mtu:
                issues.append((Status.WARN, f"{name}: active MTU {port.active_mtu} below the "
                                            f"port's {port.max_mtu}"))
    details = {"ports": [{"port": f"{d.hca_id} port {p.port}", "state": p.state,
                          "active_mtu": p.active_mtu, "max_mtu": p.max_mtu}
                         for d in devices for p in d.ports]}
    return summarize(issues, "IB MTUs as expected", details)


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


def _port_key(name: str) -> tuple[str, int]:
    """"mlx5_0" (port 1) or "mlx5_0:2" -> (hca, port)."""
    hca, _, port = name.partition(":")
    return hca, int(port) if port else 1
