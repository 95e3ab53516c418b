"""What a training experiment needs from a testbed network, whatever builds it.

A :class:`TestbedBackend` builds one leaf-spine :class:`~.topology.Topology` with
its routers' queueing installed, runs the experiments' impairments on it (loss on a
link, a link down), reads the routers' counters and turns two readings into the
traffic the routers carried, and removes everything on exit. The experiment
(:func:`.experiments.run_experiment`) is written against this interface only; it
starts its ranks and its cross traffic through the built :class:`~.topology.Network`
(``exec_argv``, ``host_addr``), which every backend's network is.

The backends:

* :class:`NamespacesBackend` (here): one network namespace per node, Linux routers
  (:func:`.topology.build`), queueing by the tc switch profile
  (:func:`.impairments.apply_profile`), loss by nftables rules, counters from tc;
  by default every host's egress serialised at its link's rate, as a NIC would
  (:mod:`.host_egress`; ``host_egress="unshaped"`` leaves it at memory speed);
* :class:`~.mininet_backend.MininetBackend`: the same Linux routers as Mininet
  nodes;
* :class:`~.bmv2_backend.Bmv2Backend`: the routers are BMv2 switches running the DLCP
  P4 program; queueing, loss and counters are the program's.

Each backend object builds one network (``with backend.build() as net:``); the other
methods act on that network while it is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dlcp.errors import UsageError, UsageStateError

from .host_egress import (
    HOST_EGRESS_MODES,
    check_host_egress,
    host_counters,
    hosts_egress,
)
from .impairments import (
    apply_profile,
    link_down,
    link_dropped,
    link_loss,
    profile_counters,
)
from .results import class_totals, per_link_drops, per_link_packets
from .switch_profile import FifoPolicy, SwitchPolicy
from .topology import Network, Topology, build

__all__ = [
    "Counters",
    "NamespacesBackend",
    "RouterTraffic",
    "TestbedBackend",
    "backend_class",
]

#: one reading of every router's counters (its shape is the backend's own)
Counters = Mapping[str, Any]


@dataclass(frozen=True)
class RouterTraffic:
    """What the routers did between two counter readings."""

    #: per class or queue: ``{"packets": sent, "drops": dropped}``, summed over the
    #: routers (plus rows for the injected loss and what was otherwise lost)
    classes: dict[str, dict[str, int]]
    #: ``{router: {egress interface: {class: packets sent}}}``
    links: dict[str, dict[str, dict[str, int]]]
    #: packets the injected loss dropped, by where it acted (None: no loss injected)
    loss_drops: dict[str, int] | None
    #: ``{router: {egress interface: {class: packets dropped}}}``, only where a queue
    #: dropped (empty where the backend does not count drops per interface: BMv2)
    link_drops: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)


class TestbedBackend(ABC):
    """A way to build the testbed and act on it; see the module doc."""

    #: what the results call the routers: ``"linux"`` or ``"bmv2"``
    switch: ClassVar[str]
    #: whether the links are shaped to the topology's ``link_rate_mbit``
    links_shaped: ClassVar[bool]
    #: a note every result of this backend carries (None: none)
    note: ClassVar[str | None] = None
    #: what ``host_egress`` may be here, the default first (:mod:`.host_egress`)
    host_egress_modes: ClassVar[tuple[str, ...]] = ("unshaped",)

    def __init__(
        self,
        topology: Topology,
        queues: SwitchPolicy | FifoPolicy | None,
        *,
        prefix: str | None = None,
        loss_injection: bool = False,
        host_egress: str | None = None,
    ) -> None:
        """``queues``: the routers' queueing (None: the backend's default, e.g. none
        on Linux); ``loss_injection``: :meth:`inject_loss` will be called on this
        network (a backend whose loss needs preparing prepares it at build);
        ``host_egress``: the hosts' own egress, ``shaped`` to their link's rate or
        ``unshaped`` (None: the backend's default, the first of
        :attr:`host_egress_modes`)."""
        self.topology = topology
        self.queues = queues
        self.prefix = prefix
        self.loss_injection = loss_injection
        if host_egress is None:
            host_egress = self.host_egress_modes[0]
        check_host_egress(host_egress)
        if host_egress not in self.host_egress_modes:
            raise UsageError(
                f"--host-egress {host_egress}: not available with {self.switch} switches "
                f"(available: {', '.join(self.host_egress_modes)})"
            )
        self.host_egress = host_egress
        self._net: Network | None = None

    @property
    def net(self) -> Network:
        """The network while :meth:`build`'s ``with`` block runs."""
        if self._net is None:
            raise UsageStateError(f"{type(self).__name__}: the network is not built")
        return self._net

    def build(self) -> AbstractContextManager[Network]:
        """Build the network, queueing installed and checked; remove it on exit."""
        return self._holding(self._build())

    @contextmanager
    def _holding(self, built: AbstractContextManager[Network]) -> Iterator[Network]:
        with built as net:
            self._net = net
            try:
                yield net
            finally:
                self._net = None

    @abstractmethod
    def _build(self) -> AbstractContextManager[Network]:
        """The backend's own build: a context manager yielding the built network."""

    @abstractmethod
    def inject_loss(self, a: str, b: str, percent: float) -> None:
        """Drop ``percent`` % of the packets crossing link ``a``--``b``, each way."""

    @abstractmethod
    def take_link_down(self, a: str, b: str) -> None:
        """Fail link ``a``--``b``; return once traffic is routed around it."""

    @abstractmethod
    def counters(self) -> Counters:
        """A reading of every router's counters."""

    @abstractmethod
    def traffic(
        self, before: Counters, after: Counters, *, lossy_link: tuple[str, str] | None = None
    ) -> RouterTraffic:
        """The traffic between two :meth:`counters` readings; ``lossy_link``: the
        link :meth:`inject_loss` acted on, if any."""

    def host_counters(self) -> dict[str, dict[str, int]]:
        """What each host's egress queue sent and dropped so far
        (:func:`.host_egress.host_counters`); empty where hosts are not shaped."""
        return {}

    def describe_links(self, link_rate_mbit: float) -> str:
        """The links, as a run's log line says them."""
        return f"links {link_rate_mbit:g} Mbit/s"

    def open_cli(self) -> None:
        """An interactive shell on the built network, where the backend has one."""
        raise UsageError(f"{type(self).__name__} has no interactive CLI (Mininet has)")


def backend_class(switch: str, network: str) -> type[TestbedBackend]:
    """The backend of routers ``switch`` (``linux`` or ``bmv2``) built as ``network``
    (``namespaces`` or ``mininet``; BMv2 switches run in plain namespaces)."""
    if switch == "bmv2":
        if network != "namespaces":
            raise UsageError(f"--switch bmv2 runs in plain namespaces, not {network}")
        from .bmv2_backend import Bmv2Backend

        return Bmv2Backend
    if switch != "linux":
        raise UsageError(f"unknown switch {switch!r} (known: linux, bmv2)")
    if network == "mininet":
        from .mininet_backend import MininetBackend

        return MininetBackend
    if network != "namespaces":
        raise UsageError(f"unknown backend {network!r} (known: namespaces, mininet)")
    return NamespacesBackend


class NamespacesBackend(TestbedBackend):
    """Linux routers in plain network namespaces (:func:`.topology.build`)."""

    switch = "linux"
    links_shaped = True
    host_egress_modes = HOST_EGRESS_MODES

    def _build(self) -> AbstractContextManager[Network]:
        return self._with_queues(build(self.topology, prefix=self.prefix))

    @contextmanager
    def _with_queues(self, built: AbstractContextManager[Network]) -> Iterator[Network]:
        """``built`` with the tc profile on every router egress (if there is one),
        and the hosts' egress shaped or left at memory speed (``host_egress``; a
        root qdisc another builder put there, such as Mininet's TCLink, is
        replaced or removed); shaped hosts are unshaped again on exit."""
        with built as net:
            if self.queues is not None:
                apply_profile(net, self.queues)
            with hosts_egress(net, self.host_egress):
                yield net

    def host_counters(self) -> dict[str, dict[str, int]]:
        return host_counters(self.net)

    def describe_links(self, link_rate_mbit: float) -> str:
        hosts = "hosts shaped" if self.host_egress == "shaped" else "hosts unshaped"
        return f"links {link_rate_mbit:g} Mbit/s, {hosts}"

    def inject_loss(self, a: str, b: str, percent: float) -> None:
        link_loss(self.net, a, b, percent)

    def take_link_down(self, a: str, b: str) -> None:
        link_down(self.net, a, b)

    def counters(self) -> Counters:
        return profile_counters(self.net)

    def traffic(
        self, before: Counters, after: Counters, *, lossy_link: tuple[str, str] | None = None
    ) -> RouterTraffic:
        classes = class_totals(before, after)
        loss_drops = link_dropped(self.net, *lossy_link) if lossy_link else None
        if loss_drops:  # the nftables rules' drops, which tc's counters do not see
            classes["loss-rule"] = {"packets": 0, "drops": sum(loss_drops.values())}
        return RouterTraffic(
            classes, per_link_packets(before, after), loss_drops, per_link_drops(before, after)
        )
