"""The same leaf-spine topology under Mininet (``dlcp testbed up --backend mininet``).

Open vSwitch does not work on these machines, so there are no Mininet switches and
no controller: every node -- hosts, leaves and spines -- is a plain Mininet
:class:`~mininet.node.Host` (its own network namespace, started by Debian's
``mnexec``), and leaves and spines are routers (``ip_forward=1``, the 5-tuple
ECMP hash of :data:`.topology.ECMP_HASH`). Links are :class:`~mininet.link.TCLink`
veth pairs shaped to the topology's ``link_rate_mbit`` (Mininet accepts at most 1000 Mbit/s;
above that the links are left unshaped); the backend then gives the hosts' own
ends the testbed's host egress (:mod:`.host_egress`: a NIC-like token bucket in
place of TCLink's HTB, or none with ``--host-egress unshaped``), as on plain
namespaces. Mininet's delay/loss link options do
nothing here (no netem), so none are passed: use :mod:`.impairments` instead.

Addressing, interface names and routes are exactly those of
:func:`.topology.build` (shared :meth:`.Topology.links` and
:func:`.topology.route_commands`): the interface towards a neighbour is named after
it (``h1`` has ``leaf1``, not ``h1-eth0``). Each node's namespace is also given the
name ``<prefix><node>`` (``ip netns attach``), so the returned object is a
:class:`.topology.Network` and everything written for the namespace backend
(``net.run``, ``ip -n``, the switch profile, impairments) works unchanged, while
the Mininet CLI (``h1 ping h4``) works on the same nodes.

Lifecycle: readiness is checked (routes present on every leaf, every host pings
every other host); on exit, error or Ctrl-C ``net.stop()`` stops the links and node
shells and the namespace names are removed. Everything this module creates lives
inside the node namespaces (veth pairs are created inside them, never in the root
namespace), so removing the names of a crashed run (done before building) removes
all its leftovers; ``mn -c`` is never run, because it would kill unrelated Mininet
and OVS state. Mininet's ``fixLimits`` (raising system-wide sysctls) is skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from .backend import NamespacesBackend
from .netns import NetnsError, _cleanup, _run, prefix_lock
from .topology import (
    Network,
    Topology,
    _check_ready,
    checked_prefix,
    host_offloads_off,
    prepare_nodes,
    route_commands,
)

__all__ = ["MininetBackend", "MininetNetwork", "build_mininet", "mininet_missing"]

_MAX_TCLINK_MBIT = 1000.0  # TCIntf.bwParamMax


def mininet_missing() -> list[str]:
    """What is missing to run the Mininet backend here (empty: all is there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        missing.append("the mininet Python package (pip install 'dlcp[testbed]')")
    for tool, pkg in (("mnexec", "Debian package mininet"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            missing.append(f"{tool} ({pkg})")
    if shutil.which("ethtool") is None:
        missing.append("ethtool")
    return missing


@dataclass
class MininetNetwork(Network):
    """A :class:`.topology.Network` whose nodes are Mininet hosts.

    ``mininet`` is the :class:`mininet.net.Mininet` object (``net.mininet["h1"]``
    is a node with ``cmd``, ``popen``, ``IP``).
    """

    mininet: Any = None

    def cli(self) -> None:
        """Open Mininet's interactive CLI on this network (blocks until ``exit``)."""
        from mininet.cli import CLI
        from mininet.log import setLogLevel

        setLogLevel("output")  # the CLI prints through Mininet's log at this level
        CLI(self.mininet)


def _mininet_class() -> Any:
    from mininet.net import Mininet

    class _Net(Mininet):  # type: ignore[misc]
        # Mininet.init() would run fixLimits(), raising system-wide sysctls and
        # rlimits of the whole machine; nothing here needs that.
        inited = True

    return _Net


def _check_shaped(net: MininetNetwork, links: list[tuple[str, str]]) -> None:
    """TCLink's HTB (root handle 5:) is on both ends of every shaped link: Mininet
    only logs tc errors."""
    for a, b in links:
        for node, dev in ((a, net.ifaces[a][b]), (b, net.ifaces[b][a])):
            out = net.run(node, ["tc", "qdisc", "show", "dev", dev, "root"]).stdout
            if "htb 5:" not in out:
                raise NetnsError(f"TCLink shaping missing on {node}:{dev}: {out.strip()!r}")


@contextmanager
def build_mininet(
    topology: Topology, *, prefix: str | None = None, cli: bool = False
) -> Iterator[MininetNetwork]:
    """Create ``topology`` in Mininet (hosts and routers as plain nodes, TCLinks,
    no switches, no controller); stop it on exit.

    With ``cli=True`` Mininet's CLI opens when the ``with`` body has finished
    normally, before the network is stopped (``exit`` or Ctrl-D ends it).
    """
    missing = mininet_missing()
    if missing:
        raise NetnsError(f"the Mininet backend needs {', '.join(missing)}")
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.node import Host

    prefix = checked_prefix(prefix)
    setLogLevel("warning")
    t = topology
    names = [f"{prefix}{n}" for n in t.nodes]
    mn = _mininet_class()(
        topo=None, controller=None, host=Host, link=TCLink, build=False, cleanup=False
    )
    net = MininetNetwork(t, prefix, mininet=mn)
    shaped: list[tuple[str, str]] = []  # links TCLink shapes (up to its maximum rate)
    with prefix_lock(prefix):  # (see netns.prefix_lock)
        try:
            _cleanup(names)  # names left behind by a crashed run (their namespaces with them)
            for node, ns in zip(t.nodes, names, strict=True):
                # ip=None: no address from Mininet's ipBase; ours are set below
                h = mn.addHost(node, ip=None, inNamespace=True)
                _run(["ip", "netns", "attach", ns, str(h.pid)])
                net.namespaces.append(ns)
            prepare_nodes(net)
            mtu = str(t.mtu)
            for lower, upper, addr_l, addr_u, _subnet in t.links():
                # the veth pair is created inside lower's namespace with its peer in
                # upper's (mininet.util.makeIntfPair), so names need only be unique per node
                spec = t.link_spec(lower, upper)  # a link's own rate wins
                rate = spec.link_rate_mbit if spec and spec.link_rate_mbit else t.link_rate_mbit
                opts: dict[str, Any] = {"bw": rate} if rate <= _MAX_TCLINK_MBIT else {}
                if opts:
                    shaped.append((lower, upper))
                setLogLevel("critical")  # tc's "quantum of class is big" warnings, as errors
                try:
                    link = mn.addLink(
                        mn[lower], mn[upper], intfName1=upper, intfName2=lower, **opts
                    )
                finally:
                    setLogLevel("warning")
                net.ifaces[lower][upper] = upper
                net.ifaces[upper][lower] = lower
                for node, intf, addr in ((lower, link.intf1, addr_l), (upper, link.intf2, addr_u)):
                    dev = intf.name
                    _run(["ip", "-n", net.ns(node), "link", "set", "dev", dev, "mtu", mtu])
                    _run(["ip", "-n", net.ns(node), "addr", "add", f"{addr}/24", "dev", dev])
                    _run(["ip", "-n", net.ns(node), "link", "set", "dev", dev, "up"])
                    intf.ip, intf.prefixLen = addr, 24  # so node.IP() and the CLI know it
            _check_shaped(net, shaped)
            for node, argv in route_commands(t):
                net.run(node, argv)
            for h in t.hosts:
                host_offloads_off(net, h.name, h.leaf)
            _check_ready(net)
            yield net
            if cli:
                net.cli()
        finally:
            try:
                mn.stop()
            finally:
                _cleanup(names)


class MininetBackend(NamespacesBackend):
    """:class:`.backend.NamespacesBackend` with the nodes built by Mininet
    (:func:`build_mininet`): the same Linux routers, profile, impairments and
    counters, since a Mininet node's namespace carries the testbed's name."""

    def _build(self) -> AbstractContextManager[Network]:
        return self._with_queues(build_mininet(self.topology, prefix=self.prefix))

    def open_cli(self) -> None:
        net = self.net
        assert isinstance(net, MininetNetwork)  # what build_mininet yields
        net.cli()
