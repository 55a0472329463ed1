"""Network settings of multi-host jobs: the rendezvous port range and the interface
a rank's process group binds to.

On a multi-homed host (a cluster network, a management network, a docker
bridge...) gloo binds to the address the host *name* resolves to and NCCL to
the first interface it likes: often not the one the other hosts can reach.
Unless a job sets them, every rank sets ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` to the interface it uses to reach rank 0's address
(``MASTER_ADDR``, which is rank 0's worker address).

>>> parse_ports("29400-29499")
(29400, 29499)
>>> parse_ports(None) is None
True
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from .errors import SpecError

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def parse_ports(value: Any) -> tuple[int, int] | None:
    """A port range from ``"LO-HI"``, ``(LO, HI)``, ``[LO, HI]`` or one port; None: any port."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, str):
            parts = [int(p) for p in value.replace(":", "-").split("-")]
        elif isinstance(value, int) and not isinstance(value, bool):
            parts = [value]
        else:
            parts = [int(p) for p in value]
    except (TypeError, ValueError):
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not 1 <= parts[0] <= parts[1] <= 65535:
        raise SpecError(
            f"a port range must look like '29400-29499' (1-65535, low first), got {value!r}"
        )
    return parts[0], parts[1]


def format_ports(ports: tuple[int, int] | None) -> str:
    if ports is None:
        return "any free port"
    return str(ports[0]) if ports[0] == ports[1] else f"{ports[0]}-{ports[1]}"


def rendezvous_ports() -> tuple[int, int] | None:
    """This process's ``clustersdk.rendezvous-ports`` setting (``DASK_CLUSTERSDK__RENDEZVOUS_PORTS``)."""
    from . import config

    return parse_ports(config.get("rendezvous-ports"))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_address_towards(host: str) -> str | None:
    """The local address this machine's packets to ``host`` leave from (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, target in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(target)  # UDP: picks the route and the source address only
                return probe.getsockname()[0]
        except OSError:
            continue
    return None


def interface_of(address: str) -> str | None:
    """The name of the local interface that holds ``address``."""
    import psutil  # a dependency of distributed

    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.address.split("%", 1)[0] == address:
                return name
    return None


def interface_towards(host: str) -> str | None:
    """The interface whose address this machine uses to reach ``host``, or None."""
    local = local_address_towards(host)
    return interface_of(local) if local else None
