"""The hosts' own egress, serialised at their link's rate as a NIC does.

Only the routers' egress carries the switch profile (:mod:`.impairments`); without
more, a host's veth takes whatever its sockets write at memory speed, so a burst
reaches the first router faster than a real link could carry it, and queues (or is
dropped) there. A real host's NIC puts its packets on the wire at line rate: what
its sockets write faster waits in the host (in the qdisc in front of the NIC, then
in the sockets' send buffers), and the switch sees at most link-rate arrivals.

:func:`shape_hosts` gives every host's interface towards its leaf that behaviour:
a token bucket (``tbf``) at the host link's rate (the topology's
``link_rate_mbit``, or the host--leaf link's own from a ``[[links]]`` table) with
a bucket of two frames, so packets leave one or two at a time at line rate. The
hosts segment after the qdisc (their segmentation offloads are off), so what a
socket hands the qdisc may be a UDP or TCP GSO batch of up to 64 KB; ``tbf``
splits a batch larger than its bucket into its MTU-sized packets as it queues it
and sends those at the rate, as a NIC that segments (TSO, USO) puts them on the
wire. (An HTB class, the routers' FIFO baseline, lets a whole GSO batch go at
once and serialises only on average: the batch then reaches the leaf as up to 44
back-to-back packets, more than the switch profile's drop-eligible threshold of
40 on one uplink.) The rate counts bytes as HTB does on the routers (IP packet
plus Ethernet header), so a host sends at the rate its leaf forwards.

Backpressure: a packet queued in the qdisc, and each packet split from a GSO
batch, is charged to its socket's send buffer until it leaves the host, so a
sender faster than the link blocks in ``sendmmsg``/``send`` once its send buffer
is full (DLCP's data sockets are blocking; TCP's TSQ keeps about a millisecond of
a flow's data in the qdisc and waits for it to leave before queueing more). The
queue holds :data:`HOST_QUEUE_BYTES`, what a host's 1000-packet qdisc (the
``txqueuelen`` Linux gives an Ethernet device) holds in 64 KB GSO batches in
front of a segmenting NIC: about what the send buffers of DLCP's eight data
sockets can hold together (8 MiB each, charged with each packet's memory, which
is more than its bytes on the wire), so its sender is held back before the queue
is full. A drop there is reported to a UDP socket as ENOBUFS only
with ``IP_RECVERR``, which DLCP's data sockets do not set (the kernel counts
``SndbufErrors``), and DLCP's senders treat it as a lost packet either way
(``dlcp/io/_sendmmsg.h``). :func:`host_counters` reads what each host's queue
sent and dropped, so a run shows whether that happened.

:func:`exempt_source_port` lets one UDP flow of a host bypass the shaping: the
``background`` scenario's cross traffic, which stands for another machine's flow
into the leaf (:mod:`.impairments`), keeps its own pace and does not share the
rank's NIC.

:func:`unshape_hosts` removes the hosts' root qdiscs (the kernel default again,
``noqueue`` on a veth). :func:`hosts_egress` is what a backend uses: the hosts
shaped for the ``with`` block and unshaped on its way out, or unshaped throughout
(``--host-egress unshaped``; a root qdisc another builder put there, such as
Mininet's TCLink's, is removed).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dlcp.errors import UsageError

from . import switch_profile
from .topology import Network

__all__ = [
    "HOST_BURST_FRAMES",
    "HOST_EGRESS_MODES",
    "HOST_QUEUE_BYTES",
    "check_host_egress",
    "exempt_source_port",
    "host_counters",
    "host_link_rate",
    "hosts_egress",
    "shape_hosts",
    "unshape_hosts",
]

#: ``--host-egress``: every host serialises at its link's rate (``shaped``, the
#: Linux routers' default), or writes into its leaf at memory speed (``unshaped``,
#: the testbed before hosts were shaped)
HOST_EGRESS_MODES = ("shaped", "unshaped")

#: bytes a host's egress queue holds: 1000 packets (the ``txqueuelen`` Linux gives
#: an Ethernet device) of up to 64 KB each, GSO batches as a host's qdisc queues
#: them in front of a NIC that segments
HOST_QUEUE_BYTES = 1000 * 65536

#: frames (of the link's MTU plus the Ethernet header) that may leave back to back
HOST_BURST_FRAMES = 2

_ETHERNET_HEADER = 14
_ROOT = "1:"
_EXEMPT = "1:1"
_SHAPED = "1:2"
_BUCKET = "2:"
#: the root HTB's classes: a rate no link of the testbed reaches (HTB only sorts)
_UNLIMITED = "10gbit"
_QUANTUM = 65536  # bytes a class sends per round (a GSO batch)


def _runner(net: Network, host: str) -> Callable[[Sequence[str]], Any]:
    def run(argv: Sequence[str]) -> Any:
        return net.run(host, argv)

    return run


def check_host_egress(mode: str) -> str:
    """``mode`` if it is one of :data:`HOST_EGRESS_MODES`; else a UsageError in
    the words of the option."""
    if mode not in HOST_EGRESS_MODES:
        raise UsageError(f"--host-egress {mode!r}: unknown (known: {', '.join(HOST_EGRESS_MODES)})")
    return mode


def host_link_rate(net: Network, host: str) -> float:
    """The rate (Mbit/s) of ``host``'s link to its leaf: the link's own
    (``[[links]]``) or the topology's."""
    t = net.topology
    spec = t.link_spec(host, t.leaf_of(host))
    if spec is not None and spec.link_rate_mbit is not None:
        return spec.link_rate_mbit
    return t.link_rate_mbit


def host_tc_commands(dev: str, rate_mbit: float, mtu: int) -> list[list[str]]:
    """The ``tc`` argvs that shape ``dev`` as a host's NIC (replacing any root
    qdisc): a root HTB whose two classes are far faster than any link here
    (:data:`_UNLIMITED`: HTB only sorts, the first class before the second), the
    second the default, where a token bucket at ``rate_mbit`` holding
    :data:`HOST_BURST_FRAMES` frames of ``mtu`` serves a queue of
    :data:`HOST_QUEUE_BYTES`. The first class (a plain FIFO, unshaped) takes only
    what :func:`exempt_source_port` sends there. (The kernel here has no ``prio``
    qdisc; the token bucket waits on its own timer, which runs the root again.)"""
    burst = HOST_BURST_FRAMES * (mtu + _ETHERNET_HEADER)
    fast = ["htb", "rate", _UNLIMITED, "ceil", _UNLIMITED, "quantum", str(_QUANTUM)]
    return [
        ["tc", "qdisc", "replace", "dev", dev, "root", "handle", _ROOT, "htb", "default", "2"],
        ["tc", "class", "add", "dev", dev, "parent", _ROOT, "classid", _EXEMPT, *fast,
         "prio", "0"],
        ["tc", "class", "add", "dev", dev, "parent", _ROOT, "classid", _SHAPED, *fast,
         "prio", "1"],
        ["tc", "qdisc", "add", "dev", dev, "parent", _SHAPED, "handle", _BUCKET, "tbf",
         "rate", f"{round(rate_mbit * 1000)}kbit", "burst", str(burst),
         "limit", str(HOST_QUEUE_BYTES)],
    ]  # fmt: skip


def shape_hosts(net: Network) -> None:
    """Every host's egress towards its leaf shaped as a NIC at the link's rate
    (:func:`host_tc_commands`), replacing any root qdisc there (such as Mininet's
    TCLink's)."""
    t = net.topology
    for host in t.host_names:
        dev = net.ifaces[host][t.leaf_of(host)]
        for argv in host_tc_commands(dev, host_link_rate(net, host), t.mtu):
            net.run(host, argv)


def exempt_source_port(net: Network, host: str, sport: int) -> bool:
    """UDP packets that ``host`` sends from ``sport`` leave unshaped, before the
    shaped queue (the first class of :func:`host_tc_commands`): traffic the testbed
    makes as if another machine sent it into the host's leaf, such as the
    ``background`` scenario's cross traffic, whose pace is its own and which a real
    host's NIC would not carry. False (nothing done) where ``host`` is not shaped."""
    dev = net.ifaces[host][net.topology.leaf_of(host)]
    if _bucket(net, host, dev) is None:
        return False
    udp_from_sport = ["match", "ip", "protocol", "17", "0xff", "match", "ip", "sport",
                      str(sport), "0xffff"]  # fmt: skip
    net.run(host, ["tc", "filter", "add", "dev", dev, "parent", _ROOT, "protocol", "ip",
                   "prio", "1", "u32", *udp_from_sport, "flowid", _EXEMPT])  # fmt: skip
    return True


def unshape_hosts(net: Network) -> None:
    """Every host's root qdisc towards its leaf removed (the kernel's default)."""
    t = net.topology
    for host in t.host_names:
        switch_profile.remove(_runner(net, host), net.ifaces[host][t.leaf_of(host)])


@contextmanager
def hosts_egress(net: Network, mode: str) -> Iterator[None]:
    """The hosts of ``net`` with their egress ``shaped`` (:func:`shape_hosts`, and
    :func:`unshape_hosts` on exit) or ``unshaped`` (:func:`unshape_hosts`)."""
    check_host_egress(mode)
    if mode == "unshaped":
        unshape_hosts(net)
        yield
        return
    shape_hosts(net)
    try:
        yield
    finally:
        unshape_hosts(net)


def _bucket(net: Network, host: str, dev: str) -> dict[str, Any] | None:
    """``tc -s -j`` of the token bucket :func:`shape_hosts` put on ``dev`` (None:
    the host is not shaped)."""
    shown = net.run(host, ["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout
    for q in json.loads(shown or "[]"):
        if q.get("kind") == "tbf" and q.get("handle") == _BUCKET:
            found: dict[str, Any] = q
            return found
    return None


def host_counters(net: Network) -> dict[str, dict[str, int]]:
    """``{host: {"packets", "bytes", "drops", "backlog"}}`` of each shaped host's
    egress queue (``packets`` as the qdisc counts them: a GSO batch as its
    segments; ``backlog`` in packets; exempt traffic not counted); empty for a
    host whose egress is not shaped."""
    t = net.topology
    out: dict[str, dict[str, int]] = {}
    for host in t.host_names:
        q = _bucket(net, host, net.ifaces[host][t.leaf_of(host)])
        if q is not None:
            out[host] = {
                "packets": int(q.get("packets", 0)),
                "bytes": int(q.get("bytes", 0)),
                "drops": int(q.get("drops", 0)),
                "backlog": int(q.get("qlen", 0)),
            }
    return out
