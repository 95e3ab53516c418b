"""``dlcp testbed up --switch bmv2``: the leaf-spine testbed with a BMv2 switch
running the DLCP P4 program in every router namespace, configured by the
P4Runtime controller (:mod:`dlcp.switch.controller`).

The namespaces, links, addresses and host routes are those of
:func:`~testbed.topology.build` (the kernel routers first prove the fabric
works: every host pings every other). Then each router hands forwarding to BMv2:

* kernel forwarding off (``ip_forward=0``): the kernel still answers ARP and pings
  for the router's own addresses, but only the switch moves packets;
* checksum and segmentation offloads off on every interface, so the switch sees
  complete checksums and real MTU-sized frames;
* ``simple_switch_grpc --no-p4`` on the router's interfaces, port numbers as
  :func:`dlcp.switch.controller.switch_ports` assigns them, serving P4Runtime on a
  unix socket (reachable from the controller in this namespace) and thrift inside
  the router namespace;
* the controller pushes the pipeline (P4Info + BMv2 JSON from ``p4/bmv2/build``)
  and the entries of :func:`~dlcp.switch.controller.fabric_config` with the
  interfaces' real MAC addresses; queue depths of the policy are set through the
  thrift CLI (``set_queue_depth``: not a P4Runtime entity);
* readiness: every host pings every other host again, now through the switches.

While it runs (for the training scenarios of :mod:`.experiments`):

* :func:`bmv2_link_down` fails a link: the switches take the port out of service
  (thrift ``port_remove``, what a port driver does on loss of carrier: BMv2 stops
  forwarding on *every* port while one of its interfaces is down, measured), both
  veth ends go down and, since a P4 switch does not see link state, the controller
  recomputes every switch's routes without the link and writes the difference over
  P4Runtime (what a fabric's control plane does on a link failure: the dead member
  leaves the leaves' ECMP groups, the spine withdraws the hosts behind the link);
* :func:`bmv2_set_loss` sets the loss-injection probability of one switch (needs
  ``loss_injection=True``: the ``-DDLCP_LOSS_INJECTION`` build on every switch,
  probability 0 until set);
* :func:`bmv2_counters` reads the program's counters over P4Runtime.

:class:`Bmv2Backend` is this testbed behind :class:`.backend.TestbedBackend`.

BMv2 is a functional model: numbers measured over it are functional, not
performance. On exit the switches are terminated (each process this module
started) before the namespaces are removed; the switch logs and sockets live in a
temporary directory removed at the end.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcp.errors import UsageError
from dlcp.switch.policy import SwitchPolicy

from .backend import Counters, RouterTraffic, TestbedBackend
from .bmv2 import Bmv2Error, Bmv2Switch, bmv2_switch, missing_bmv2, program_paths
from .netns import NetnsError, _run
from .results import FUNCTIONAL_NOTE, bmv2_class_totals, bmv2_link_packets
from .switch_profile import FifoPolicy
from .topology import Network, Topology, build

__all__ = [
    "Bmv2Backend",
    "Bmv2Network",
    "bmv2_counters",
    "bmv2_link_down",
    "bmv2_set_loss",
    "build_bmv2",
]

THRIFT_PORT = 9090


@dataclass
class Bmv2Network(Network):
    """A built topology whose routers are BMv2 switches (``switches[router]``)."""

    switches: dict[str, Bmv2Switch] = field(default_factory=dict)
    log_dir: Path | None = None
    policy: SwitchPolicy | None = None
    p4info_path: Path | None = None
    loss_injection: bool = False
    #: ``(node, neighbour) -> MAC`` of the interfaces, as the controller uses them
    macs: dict[tuple[str, str], str] = field(default_factory=dict)
    #: table entries installed now, per switch
    entries: dict[str, list[Any]] = field(default_factory=dict)
    #: links taken down by :func:`bmv2_link_down`
    down: set[tuple[str, str]] = field(default_factory=set)


def _macs(net: Network) -> dict[tuple[str, str], str]:
    """``(node, neighbour) -> MAC`` of node's interface towards neighbour."""
    out: dict[tuple[str, str], str] = {}
    for node, ifaces in net.ifaces.items():
        links = json.loads(_run(["ip", "-n", net.ns(node), "-j", "link", "show"]).stdout)
        by_name = {link["ifname"]: link.get("address", "") for link in links}
        for neighbour, dev in ifaces.items():
            out[(node, neighbour)] = by_name[dev]
    return out


def _offloads_off(net: Network, node: str) -> None:
    for dev in net.ifaces[node].values():
        net.run(
            node,
            ["ethtool", "-K", dev, "tx", "off", "tso", "off", "gso", "off", "gro", "off"],
            check=False,  # a feature this kernel does not expose stays as it is
        )
        net.run(node, ["ethtool", "-K", dev, "tx-udp-segmentation", "off"], check=False)


def _ping_all(net: Network) -> None:
    t = net.topology
    for a in t.host_names:
        for b in t.host_names:
            if a != b:
                proc = net.run(
                    a, ["ping", "-c", "1", "-w", "5", "-q", net.host_addr(b)], check=False
                )
                if proc.returncode != 0:
                    raise NetnsError(
                        f"readiness: {a} cannot reach {b} ({net.host_addr(b)}) through the "
                        "BMv2 switches"
                    )


@contextmanager
def build_bmv2(
    topology: Topology,
    policy: SwitchPolicy,
    *,
    prefix: str | None = None,
    loss_injection: bool = False,
    timeout: float = 60.0,
) -> Iterator[Bmv2Network]:
    """Build ``topology`` with a BMv2 switch per router (see the module doc)."""
    missing = missing_bmv2(grpc=True)
    if missing:
        raise Bmv2Error(f"--switch bmv2 needs {', '.join(missing)} (see p4/README.md)")
    try:
        from dlcp.switch.controller import configure_switch, fabric_config
        from dlcp.switch.p4proto import load as load_protos
        from dlcp.switch.p4runtime import P4RuntimeError

        load_protos()
    except ImportError as e:
        raise Bmv2Error(
            f"--switch bmv2 needs the P4Runtime controller's packages ({e}); "
            "install the switch extra: pip install 'dlcp[switch]'"
        ) from e
    json_path, p4info_path = program_paths(loss_injection=loss_injection)
    t = topology
    log_dir = Path(tempfile.mkdtemp(prefix="dlcp-bmv2-"))
    ready = False
    try:
        with build(t, prefix=prefix) as base, ExitStack() as stack:
            net = Bmv2Network(
                t,
                base.prefix,
                base.namespaces,
                base.ifaces,
                switches={},
                log_dir=log_dir,
                policy=policy,
                p4info_path=p4info_path,
                loss_injection=loss_injection,
            )
            for node in t.nodes:
                _offloads_off(net, node)
            net.macs = _macs(net)
            configs = fabric_config(t, policy, net.macs)
            for device_id, (router, cfg) in enumerate(configs.items(), start=1):
                net.run(router, ["sysctl", "-qw", "net.ipv4.ip_forward=0"])
                ports = {port: net.ifaces[router][nb] for nb, port in cfg.ports.items()}
                addr = f"unix:{log_dir / f'{router}.grpc.sock'}"
                sw = stack.enter_context(
                    bmv2_switch(
                        ports,
                        log_dir=log_dir,
                        name=router,
                        ns=net.ns(router),
                        grpc_addr=addr,
                        thrift_port=THRIFT_PORT,
                        device_id=device_id,
                        timeout=timeout,
                    )
                )
                net.switches[router] = sw
                net.entries[router] = list(cfg.entries)
                try:
                    configure_switch(
                        addr, device_id, p4info_path, json_path, cfg.entries, timeout=timeout
                    )
                except P4RuntimeError as e:
                    raise Bmv2Error(
                        f"configuring {router} over P4Runtime ({addr}): {e}; "
                        f"switch log {sw.log_path}:\n{sw.log_tail()}"
                    ) from e
                sw.cli(
                    *(
                        f"set_queue_depth {depth} {port} {queue}"
                        for port in sorted(ports)
                        for queue, depth in sorted(cfg.queue_depths.items())
                    )
                )
            _ping_all(net)
            ready = True
            yield net
    finally:
        # a failed setup keeps its switch logs (the error names them), if any
        if ready or not any(log_dir.iterdir()):
            shutil.rmtree(log_dir, ignore_errors=True)


def _switch(net: Bmv2Network, name: str) -> Bmv2Switch:
    try:
        return net.switches[name]
    except KeyError:
        raise UsageError(
            f"{name!r} is not a BMv2 switch of this testbed ({', '.join(net.switches)})"
        ) from None


def bmv2_link_down(net: Bmv2Network, a: str, b: str, *, timeout: float = 30.0) -> None:
    """Fail link ``a``--``b``: the switch ports out of service, both interfaces
    down, then the controller routes every switch around it (module doc).
    Readiness: every pair of hosts that still has a path pings through the
    switches."""
    from dlcp.switch.controller import entry_changes, fabric_config, switch_ports, update_switch

    from .impairments import _check_reachable, _iface

    _iface(net, a, b)
    assert net.policy is not None and net.p4info_path is not None
    for node, peer in ((a, b), (b, a)):
        if node in net.switches:
            net.switches[node].cli(f"port_remove {switch_ports(net.topology, node)[peer]}")
        net.run(node, ["ip", "link", "set", "dev", net.ifaces[node][peer], "down"])
    net.down.add((a, b))
    configs = fabric_config(net.topology, net.policy, net.macs, down=net.down)
    for name, sw in net.switches.items():
        changes = entry_changes(net.entries[name], configs[name].entries)
        assert sw.grpc_addr is not None
        update_switch(sw.grpc_addr, sw.device_id, net.p4info_path, changes, timeout=timeout)
        net.entries[name] = list(configs[name].entries)
    _check_reachable(net)


def bmv2_set_loss(net: Bmv2Network, switch: str, percent: float) -> int:
    """Drop ``percent`` % of the packets ``switch`` forwards (its loss-injection
    register, in 1/65536 units; the value written is returned). Written through
    the switch's thrift CLI and read back: BMv2's P4Runtime server answers register
    writes with UNIMPLEMENTED ("Register writes are not supported yet")."""
    from dlcp.switch.p4entries import P4Names

    sw = _switch(net, switch)
    if not net.loss_injection:
        raise Bmv2Error(
            "loss injection needs the -DDLCP_LOSS_INJECTION build on the switches "
            "(build_bmv2(..., loss_injection=True))"
        )
    if not 0 <= percent <= 100:
        raise UsageError(f"loss percent must be in [0, 100], got {percent!r}")
    value = min(0xFFFF, round(percent / 100 * 65536))
    sw.cli(f"register_write {P4Names.LOSS_PROBABILITY} 0 {value}")
    got = sw.register(P4Names.LOSS_PROBABILITY, 0)
    if got != value:
        raise Bmv2Error(f"switch {switch}: loss register reads {got} after writing {value}")
    return value


def bmv2_counters(net: Bmv2Network, *, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """The program's counters of every switch, read over P4Runtime:
    ``{switch: {"forwarded": {queue: packets}, "dropped": {queue: packets},
    "egress": {iface: packets}, "ingress": {iface: packets}, "injected": packets}}``
    (``dropped``: selective drops; ``injected``: loss injection, 0 without it)."""
    from dlcp.switch.controller import read_counters
    from dlcp.switch.p4entries import P4Names

    assert net.p4info_path is not None
    names = [P4Names.FORWARDED, P4Names.DROPPED_SELECTIVE, P4Names.EGRESS_PORT,
             P4Names.INGRESS_PORT]  # fmt: skip
    if net.loss_injection:
        names.append(P4Names.LOSS_INJECTED)
    out: dict[str, dict[str, Any]] = {}
    for name, sw in net.switches.items():
        assert sw.grpc_addr is not None
        c = read_counters(sw.grpc_addr, sw.device_id, net.p4info_path, names, timeout=timeout)
        out[name] = {
            "forwarded": {q: v[0] for q, v in c[P4Names.FORWARDED].items()},
            "dropped": {q: v[0] for q, v in c[P4Names.DROPPED_SELECTIVE].items()},
            "egress": {dev: c[P4Names.EGRESS_PORT][p][0] for p, dev in sw.ports.items()},
            "ingress": {dev: c[P4Names.INGRESS_PORT][p][0] for p, dev in sw.ports.items()},
            "injected": c[P4Names.LOSS_INJECTED][0][0] if net.loss_injection else 0,
        }
    return out


class Bmv2Backend(TestbedBackend):
    """The routers are BMv2 switches running the DLCP P4 program (:func:`build_bmv2`):
    the queueing is the program's, configured from a :class:`SwitchPolicy`; loss is
    the program's loss injection, set on the spine end of a link (every packet
    crossing the link crosses that switch once, each way); links are not shaped."""

    switch = "bmv2"
    links_shaped = False
    note = FUNCTIONAL_NOTE

    def __init__(
        self,
        topology: Topology,
        queues: SwitchPolicy | FifoPolicy | None,
        *,
        prefix: str | None = None,
        loss_injection: bool = False,
        host_egress: str | None = None,
    ) -> None:
        if not isinstance(queues, SwitchPolicy):
            raise UsageError(
                "BMv2 runs the DLCP policy in its P4 program: it needs a SwitchPolicy, "
                f"not {type(queues).__name__}"
            )
        super().__init__(
            topology, queues, prefix=prefix, loss_injection=loss_injection, host_egress=host_egress
        )
        self.policy = queues

    def _build(self) -> AbstractContextManager[Network]:
        return build_bmv2(
            self.topology, self.policy, prefix=self.prefix, loss_injection=self.loss_injection
        )

    @property
    def bmv2(self) -> Bmv2Network:
        net = self.net
        assert isinstance(net, Bmv2Network)  # what _build yields
        return net

    def _spine_of(self, a: str, b: str) -> str:
        spines = [n for n in (a, b) if n in self.topology.spines]
        if len(spines) != 1:
            raise UsageError(f"{a}--{b}: BMv2 injects loss on a leaf--spine link only")
        return spines[0]

    def inject_loss(self, a: str, b: str, percent: float) -> None:
        bmv2_set_loss(self.bmv2, self._spine_of(a, b), percent)

    def take_link_down(self, a: str, b: str) -> None:
        bmv2_link_down(self.bmv2, a, b)

    def counters(self) -> Counters:
        return bmv2_counters(self.bmv2)

    def traffic(
        self, before: Counters, after: Counters, *, lossy_link: tuple[str, str] | None = None
    ) -> RouterTraffic:
        # (the program counts the injected loss itself: a "loss-injected" class row)
        loss_drops = (
            {sw: after[sw]["injected"] - before[sw]["injected"] for sw in after}
            if lossy_link
            else None
        )
        return RouterTraffic(
            bmv2_class_totals(before, after), bmv2_link_packets(before, after), loss_drops
        )

    def describe_links(self, link_rate_mbit: float) -> str:
        return "BMv2 switches (P4Runtime), links not shaped"
