"""The MTU an endpoint's datagrams can use: the MTU of the interface it binds to.

``DLCP_MTU=auto`` (``EndpointConfig(mtu_from_interface=True)``) sizes the
protocol's datagrams from the interface that holds the endpoint's address
instead of the fixed 1500 bytes of ``ProtocolConfig.mtu``: 9000 on a jumbo-frame
network, 1500 on an ordinary Ethernet, 1450 on a VXLAN overlay, where a fixed
1500 would make the kernel fragment every datagram. Fewer, larger datagrams
cost less per byte in the kernel and in the receive path (docs/benchmarks.md).

The interface is found by address with ``SIOCGIFCONF`` (every IPv4 address of
every interface that is up, aliases included) and its MTU read with
``SIOCGIFMTU``. The result is capped at :data:`MAX_AUTO_MTU`: the loopback
interface's 64 KiB would leave one datagram per UDP GSO message and one per
read slot of the receive loop's small-datagram path (``MMSG_SMALL`` in
``_recv_runs.h``), and a lost datagram would take 16 K values with it.

The peers' interfaces are not asked: a receiver takes each message's geometry
from its datagrams' headers, so two ranks whose interfaces differ still talk
(each sends datagrams of its own size). A hop between them with a smaller MTU
than both ends is left to the kernel's path-MTU discovery, as for any UDP
sender: it fragments what does not fit.
"""

from __future__ import annotations

import array
import dataclasses
import fcntl
import ipaddress
import socket
import struct

from ..errors import ConfigError
from ..proto.config import MIN_MTU
from .config import EndpointConfig

__all__ = [
    "MAX_AUTO_MTU",
    "interface_mtu",
    "interface_of",
    "mtu_for_host",
    "sized_for_interface",
]

#: the largest MTU ``auto`` picks (a jumbo frame; see the module docstring)
MAX_AUTO_MTU = 9000

_SIOCGIFCONF = 0x8912
_SIOCGIFMTU = 0x8921
#: struct ifreq on Linux: a 16-byte name and a 24-byte union (sockaddr_in first)
_IFREQ = 40
_IFNAMSIZ = 16


def _ifreqs() -> list[tuple[str, str]]:
    """(interface name, IPv4 address) of every configured address (SIOCGIFCONF)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        size = 64 * _IFREQ
        while True:
            buf = array.array("B", bytes(size))
            addr, _ = buf.buffer_info()
            ifconf = struct.pack("iL", size, addr)
            used = struct.unpack("iL", fcntl.ioctl(s.fileno(), _SIOCGIFCONF, ifconf))[0]
            if used < size:  # (a full buffer may have cut the list short: ask again)
                break
            size *= 2
    raw = buf.tobytes()
    found = []
    for at in range(0, used, _IFREQ):
        name = raw[at : at + _IFNAMSIZ].split(b"\0", 1)[0].decode(errors="replace")
        # sockaddr_in: family (2), port (2), address (4)
        address = socket.inet_ntoa(raw[at + _IFNAMSIZ + 4 : at + _IFNAMSIZ + 8])
        found.append((name, address))
    return found


def interface_of(host: str) -> str | None:
    """The interface that holds IPv4 address ``host`` (an alias as its device's
    name), or None where no interface that is up holds it. Every address of
    127.0.0.0/8 is the loopback interface's, though it lists only 127.0.0.1."""
    loopback = ipaddress.IPv4Address(host).is_loopback
    for name, address in _ifreqs():
        if address == host or (loopback and ipaddress.IPv4Address(address).is_loopback):
            return name.split(":", 1)[0]
    return None


def interface_mtu(name: str) -> int:
    """The MTU of interface ``name`` (SIOCGIFMTU)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack(f"{_IFNAMSIZ}s{_IFREQ - _IFNAMSIZ}x", name.encode())
        answer = fcntl.ioctl(s.fileno(), _SIOCGIFMTU, ifreq)
    return int(struct.unpack_from("i", answer, _IFNAMSIZ)[0])


def mtu_for_host(host: str) -> int:
    """The MTU ``auto`` gives an endpoint bound to ``host``: its interface's MTU,
    at most :data:`MAX_AUTO_MTU`. A ConfigError names the address when no
    interface holds it, or one whose MTU is below the protocol's minimum."""
    name = interface_of(host)
    if name is None:
        raise ConfigError(
            f"DLCP_MTU=auto: no network interface that is up has the address {host} "
            "(the endpoint's host), so its MTU is unknown; set DLCP_MTU to a number"
        )
    mtu = interface_mtu(name)
    if mtu < MIN_MTU:
        raise ConfigError(
            f"DLCP_MTU=auto: interface {name} (address {host}) has MTU {mtu}, "
            f"below the {MIN_MTU} bytes DLCP's datagrams need"
        )
    return min(mtu, MAX_AUTO_MTU)


def sized_for_interface(config: EndpointConfig) -> EndpointConfig:
    """``config`` with ``protocol.mtu`` taken from its host's interface where
    ``mtu_from_interface`` asks for it (:func:`mtu_for_host`); as it is otherwise."""
    if not config.mtu_from_interface:
        return config
    protocol = dataclasses.replace(config.protocol, mtu=mtu_for_host(config.host))
    return dataclasses.replace(config, protocol=protocol)
