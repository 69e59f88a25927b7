"""Network fabric records shared by the parsers of ibstat, sysfs and `ip -j link`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IbPort:
    device: str                 # HCA name, "mlx5_0"
    port: int
    state: str                  # logical state: "Active", "Down", "Initializing", "Armed", ...
    phys_state: str             # "LinkUp", "Disabled", "Polling", ...
    rate_gbps: float | None
    link_layer: str | None      # "InfiniBand" or "Ethernet" (RoCE)
    kind: str | None = None     # adapter model (ibstat "CA type", sysfs hca_type), "MT4129"
    netdev: str | None = None   # the port's network interface, where sysfs shows it
    netdev_operstate: str | None = None
    netdev_mtu: int | None = None   # that interface's MTU: a RoCE port's active MTU follows it

    @property
    def name(self) -> str:
        return f"{self.device} port {self.port}"


@dataclass(frozen=True)
class IbInventory:
    ports: tuple[IbPort, ...]
    errors: tuple[str, ...] = ()    # what the tool itself reported as failed (ibstat's ibpanic)


@dataclass(frozen=True)
class NetDev:
    name: str
    mtu: int | None
    operstate: str | None           # lower case: "up", "down", "unknown", ...
    admin_up: bool | None = None    # the UP flag: the interface was brought up
    carrier: bool | None = None     # LOWER_UP flag: a link partner is there
    link_type: str | None = None    # "ether", "infiniband", "loopback", ...
    master: str | None = None       # the bond or bridge it is enslaved to
    speed_mbps: int | None = None


def hca_port_key(name: str) -> tuple[str, int]:
    """A site's port name, "mlx5_0" (port 1) or "mlx5_0:2", -> (hca, port)."""
    hca, _, port = name.partition(":")
    return hca, int(port) if port.isascii() and port.isdigit() else 1
