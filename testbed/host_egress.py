"""The hosts' own egress, serialised at their link's rate as a NIC does.

Only the routers' egress carries the switch profile (:mod:`.impairments`); without
more, a host's veth takes whatever its sockets write at memory speed, so a burst
reaches the first router faster than a real link could carry it, and queues (or is
dropped) there. A real host's NIC puts its packets on the wire at line rate: what
its sockets write faster waits in the host (in the qdisc in front of the NIC, then
in the sockets' send buffers), and the switch sees at most link-rate arrivals.

:func:`shape_hosts` gives every host's interface towards its leaf that behaviour:
one HTB class at the host link's rate (the topology's ``link_rate_mbit``, or the
host--leaf link's own from a ``[[links]]`` table) over a FIFO of
:data:`HOST_QUEUE_PACKETS` packets, the same HTB rendering and byte accounting as
the routers' FIFO baseline (:class:`~.switch_profile.FifoPolicy`), so a host
sends at the rate its leaf forwards. Segmentation happens after the qdisc (the
hosts turn their segmentation offloads off), so one queued packet may be a UDP or
TCP GSO batch of up to 64 KB; HTB charges it every segment's bytes.

Backpressure: a packet queued in the qdisc is charged to its socket's send
buffer until it leaves the host, so a sender faster than the link blocks in
``sendmmsg``/``send`` once its send buffer is full (DLCP's data sockets are
blocking; TCP's TSQ keeps about a millisecond of a flow's data in the qdisc and
waits for it to leave before queueing more). The FIFO drops only when it holds
:data:`HOST_QUEUE_PACKETS` packets; a UDP socket without ``IP_RECVERR`` (DLCP's
data sockets) is not told (the kernel counts ``SndbufErrors``), so such a drop is a
lost packet as one in the network would be. :func:`host_counters` reads what
each host's queue sent and dropped, so a run shows whether that happened.

:func:`unshape_hosts` removes the hosts' root qdiscs (the kernel default again,
``noqueue`` on a veth). :func:`hosts_egress` is what a backend uses: the hosts
shaped for the ``with`` block and unshaped on its way out, or unshaped throughout
(``--host-egress unshaped``; a root qdisc another builder put there, such as
Mininet's TCLink's, is removed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dlcp.errors import UsageError

from . import switch_profile
from .switch_profile import FifoPolicy
from .topology import Network

__all__ = [
    "HOST_EGRESS_MODES",
    "HOST_QUEUE_PACKETS",
    "check_host_egress",
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

#: packets the host's egress FIFO holds: the ``txqueuelen`` Linux gives an
#: Ethernet device, the queue a host keeps in front of its NIC's ring
HOST_QUEUE_PACKETS = 1000


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


def shape_hosts(net: Network) -> None:
    """Every host's egress towards its leaf: HTB at the link's rate over a FIFO of
    :data:`HOST_QUEUE_PACKETS` packets (replacing any root qdisc there, such as
    Mininet's TCLink's)."""
    t = net.topology
    for host in t.host_names:
        policy = FifoPolicy(
            link_rate_mbit=host_link_rate(net, host), queue_packets=HOST_QUEUE_PACKETS
        )
        switch_profile.apply(_runner(net, host), net.ifaces[host][t.leaf_of(host)], policy)


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


def host_counters(net: Network) -> dict[str, dict[str, int]]:
    """``{host: {"packets", "bytes", "drops", "backlog"}}`` of each host's egress
    FIFO (packets are what the qdisc saw: a GSO batch counts once); empty for a
    host whose egress is not shaped."""
    t = net.topology
    out: dict[str, dict[str, int]] = {}
    for host in t.host_names:
        dev = net.ifaces[host][t.leaf_of(host)]
        queues = switch_profile.class_counters(_runner(net, host), dev)
        if "best-effort" in queues:
            out[host] = queues["best-effort"]
    return out
