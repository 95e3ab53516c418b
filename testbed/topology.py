"""Leaf-spine topologies of network namespaces, described as data (TOML).

A topology file names hosts, leaf routers and spine routers, the leaf each host
hangs off, and link properties (MTU; link rate and buffer size are recorded for
the switch profile, not applied here)::

    name = "leaf_spine_4h"
    mtu = 1500
    link_rate_mbit = 1000
    buffer_packets = 100
    leaves = ["leaf1", "leaf2"]
    spines = ["spine1", "spine2"]

    [hosts]
    h1 = { leaf = "leaf1" }

:func:`build` turns a :class:`Topology` into namespaces ``<prefix><node>``
joined by veth pairs: every host to its leaf, every leaf to every spine. In each
namespace the interface towards a neighbour is named after that neighbour
(``ip -n <prefix>leaf1 link show spine2``), so interface names stay short and
readable; node names are therefore limited to 15 characters.

Addressing (private ranges that exist only inside these namespaces):

* host ``i`` (0-based, file order): link ``10.215.<i>.0/24``, host ``.2``,
  leaf ``.1``; the host's address is ``10.215.<i>.2`` and its default route
  points at the leaf;
* leaf ``l``, spine ``s``: link ``10.214.<l * n_spines + s>.0/24``, leaf ``.1``,
  spine ``.2``.

Leaves route every remote host prefix over all spines (ECMP multipath), the next
hop chosen by a hash of the 5-tuple (:data:`ECMP_HASH`), so flows with different
source ports spread over the spines, each on its own route for its whole life, as
a switch hashes them.
Spines route each host prefix to its leaf. Hosts turn segmentation offloads
off (TCP's TSO and GSO, and UDP's) so that packets on the wire are real
MTU-sized packets for every transport: with TSO on, a TCP sender's 64 KB
segments would cross the fabric whole -- shaped by bytes, but forwarded, queued
and dropped as one packet each (:func:`host_offloads_off`). Hosts also give TCP
the minimum retransmission timeout DLCP's control connections set on their own
sockets (``control_rto_min``, 5 ms by default, through the namespace's
``net.ipv4.tcp_rto_min_us`` where the kernel has it), so that Gloo's TCP does not
wait Linux's 200 ms for a lost segment while DLCP's control messages wait 5 ms
(:func:`~testbed.netns.tcp_timers_like_dlcp`).

Everything is removed by name on exit, on error and on Ctrl-C; namespaces with
the same names left behind by a crashed run are removed before building.
Readiness is checked (routes present, every host pings every other host).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlcp.errors import UsageError
from dlcp.switch.policy import PolicyError, SwitchPolicy

from .netns import (
    NetnsError,
    _cleanup,
    _run,
    prefix_lock,
    require_segmentation_off,
    require_tools,
    run_prefix,
    tcp_timers_like_dlcp,
)

__all__ = [
    "DEFAULT_TOPOLOGY",
    "HostSpec",
    "LinkSpec",
    "Network",
    "Topology",
    "TopologyError",
    "build",
    "route_commands",
]

DEFAULT_TOPOLOGY = Path(__file__).resolve().parent / "topologies" / "leaf_spine_4h.toml"

_IFNAMSIZ = 15  # Linux interface names: at most 15 characters
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_RESERVED = frozenset({"lo", "all", "default"})
_HOST_NET = "10.215"
_FABRIC_NET = "10.214"
_KEYS = frozenset(
    {"name", "mtu", "link_rate_mbit", "buffer_packets", "leaves", "spines", "hosts", "links"}
)
_LINK_KEYS = frozenset({"between", "link_rate_mbit", "buffer_packets"})


class TopologyError(UsageError):
    """A topology description is invalid; the message names the bad field."""


@dataclass(frozen=True)
class HostSpec:
    """One host and the leaf router it hangs off."""

    name: str
    leaf: str


@dataclass(frozen=True)
class LinkSpec:
    """What one link (both directions) has instead of the topology's rate and
    buffer: ``between`` names its two nodes (a host and its leaf, or a leaf and a
    spine); None keeps the topology-wide value."""

    between: tuple[str, str]
    link_rate_mbit: float | None = None
    buffer_packets: int | None = None


@dataclass(frozen=True)
class Topology:
    """A leaf-spine topology: hosts on leaves, every leaf linked to every spine."""

    name: str
    hosts: tuple[HostSpec, ...]
    leaves: tuple[str, ...]
    spines: tuple[str, ...]
    mtu: int = 1500
    link_rate_mbit: float = 1000.0
    buffer_packets: int = 100
    #: per-link overrides of link_rate_mbit / buffer_packets
    link_specs: tuple[LinkSpec, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    def link_spec(self, a: str, b: str) -> LinkSpec | None:
        """The overrides of link ``a``--``b`` (either order), if it has any."""
        for spec in self.link_specs:
            if set(spec.between) == {a, b}:
                return spec
        return None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Topology:
        """Read and validate a TOML topology file."""
        p = Path(path)
        try:
            with p.open("rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise TopologyError(f"{p}: cannot read topology file: {e}") from e
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise TopologyError(f"{p}: not valid TOML (UTF-8): {e}") from e
        try:
            return cls.from_dict(data)
        except TopologyError as e:
            raise TopologyError(f"{p}: {e}") from e

    @classmethod
    def default(cls) -> Topology:
        """The default topology: 4 hosts, 2 leaves, 2 spines."""
        return cls.load(DEFAULT_TOPOLOGY)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Build from parsed TOML data (as :meth:`load` does), validating it."""
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise TopologyError(f"{unknown[0]}: unknown field (known: {', '.join(sorted(_KEYS))})")
        name = data.get("name", "topology")
        if not isinstance(name, str):
            raise TopologyError("name: must be a string")
        leaves = _name_list(data, "leaves")
        spines = _name_list(data, "spines")
        raw_hosts = data.get("hosts")
        if not isinstance(raw_hosts, Mapping) or not raw_hosts:
            raise TopologyError('hosts: must be a non-empty table, e.g. h1 = { leaf = "leaf1" }')
        hosts = []
        for host, spec in raw_hosts.items():
            if isinstance(spec, str):  # shorthand: h1 = "leaf1"
                spec = {"leaf": spec}
            if not isinstance(spec, Mapping):
                raise TopologyError(f'hosts.{host}: must be a table like {{ leaf = "leaf1" }}')
            extra = sorted(set(spec) - {"leaf"})
            if extra:
                raise TopologyError(f"hosts.{host}.{extra[0]}: unknown field (known: leaf)")
            leaf = spec.get("leaf")
            if leaf is None or leaf == "":
                raise TopologyError(f"hosts.{host}.leaf: host {host!r} is on no leaf")
            if not isinstance(leaf, str):
                raise TopologyError(f"hosts.{host}.leaf: must be a string")
            hosts.append(HostSpec(str(host), leaf))
        raw_links = data.get("links", [])
        if not isinstance(raw_links, list) or not all(isinstance(x, Mapping) for x in raw_links):
            raise TopologyError(
                'links: must be an array of tables, e.g. [[links]] between = ["leaf1", "spine1"]'
            )
        specs = []
        for i, raw in enumerate(raw_links):
            where = f"links[{i}]"
            extra = sorted(set(raw) - _LINK_KEYS)
            if extra:
                known = ", ".join(sorted(_LINK_KEYS))
                raise TopologyError(f"{where}.{extra[0]}: unknown field (known: {known})")
            between = raw.get("between")
            if (
                not isinstance(between, list)
                or len(between) != 2
                or not all(isinstance(n, str) for n in between)
            ):
                raise TopologyError(f"{where}.between: must be a list of two node names")
            rate = raw.get("link_rate_mbit")
            buf = raw.get("buffer_packets")
            specs.append(
                LinkSpec(
                    (between[0], between[1]),
                    None if rate is None else float(_number(raw, "link_rate_mbit", 0, float)),
                    None if buf is None else _number(raw, "buffer_packets", 0, int),
                )
            )
        return cls(
            name=name,
            hosts=tuple(hosts),
            leaves=leaves,
            spines=spines,
            mtu=_number(data, "mtu", 1500, int),
            link_rate_mbit=float(_number(data, "link_rate_mbit", 1000.0, float)),
            buffer_packets=_number(data, "buffer_packets", 100, int),
            link_specs=tuple(specs),
        )

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node: hosts, then leaves, then spines."""
        return (*self.host_names, *self.leaves, *self.spines)

    def leaf_of(self, host: str) -> str:
        for h in self.hosts:
            if h.name == host:
                return h.leaf
        raise KeyError(f"no host {host!r} in topology {self.name!r}")

    def hosts_on(self, leaf: str) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts if h.leaf == leaf)

    def host_index(self, host: str) -> int:
        return self.host_names.index(host)

    def host_addr(self, host: str) -> str:
        return f"{_HOST_NET}.{self.host_index(host)}.2"

    def links(self) -> list[tuple[str, str, str, str, str]]:
        """Every link as ``(lower, upper, lower_addr, upper_addr, subnet /24)``:
        host-leaf links first (in host order), then leaf-spine links."""
        out = []
        for i, h in enumerate(self.hosts):
            net = f"{_HOST_NET}.{i}"
            out.append((h.name, h.leaf, f"{net}.2", f"{net}.1", f"{net}.0/24"))
        for li, leaf in enumerate(self.leaves):
            for si, spine in enumerate(self.spines):
                net = f"{_FABRIC_NET}.{li * len(self.spines) + si}"
                out.append((leaf, spine, f"{net}.1", f"{net}.2", f"{net}.0/24"))
        return out


def _name_list(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TopologyError(f"{key}: must be a list of names")
    return tuple(value)


def _number(data: Mapping[str, Any], key: str, default: Any, kind: type) -> Any:
    value = data.get(key, default)
    ok = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok):
        raise TopologyError(f"{key}: must be {'a number' if kind is float else 'an integer'}")
    return value


def _validate(t: Topology) -> None:
    if not t.spines:
        raise TopologyError("spines: at least one spine is needed (spine count 0)")
    if not t.leaves:
        raise TopologyError("leaves: at least one leaf is needed")
    if not t.hosts:
        raise TopologyError("hosts: at least one host is needed")
    seen: dict[str, str] = {}
    for kind, names in (
        ("hosts", t.host_names),
        ("leaves", t.leaves),
        ("spines", t.spines),
    ):
        for n in names:
            if len(n) > _IFNAMSIZ:
                raise TopologyError(
                    f"{kind}.{n}: name too long ({len(n)} > {_IFNAMSIZ} characters; "
                    "node names become interface names)"
                )
            if not _NAME_RE.match(n) or n in _RESERVED:
                raise TopologyError(
                    f"{kind}.{n}: invalid name (letters, digits, '_' and '-', starting "
                    f"with a letter; not {', '.join(sorted(_RESERVED))})"
                )
            if n in seen:
                raise TopologyError(f"{kind}.{n}: duplicate name (also in {seen[n]})")
            seen[n] = kind
    for h in t.hosts:
        if not h.leaf:
            raise TopologyError(f"hosts.{h.name}.leaf: host {h.name!r} is on no leaf")
        if h.leaf not in t.leaves:
            raise TopologyError(
                f"hosts.{h.name}.leaf: unknown leaf {h.leaf!r} (leaves: {', '.join(t.leaves)})"
            )
    if len(t.hosts) > 254:
        raise TopologyError(f"hosts: at most 254 hosts (got {len(t.hosts)})")
    if len(t.leaves) * len(t.spines) > 254:
        raise TopologyError("leaves/spines: at most 254 leaf-spine links")
    if not 68 <= t.mtu <= 65535:
        raise TopologyError(f"mtu: must be within 68..65535 (got {t.mtu})")
    _check_link("", t.link_rate_mbit, t.buffer_packets)
    pairs = {frozenset((h.name, h.leaf)) for h in t.hosts}
    pairs |= {frozenset((leaf, spine)) for leaf in t.leaves for spine in t.spines}
    seen_links: set[frozenset[str]] = set()
    for i, spec in enumerate(t.link_specs):
        a, b = spec.between
        where = f"links[{i}]"
        for n in (a, b):
            if n not in seen:
                raise TopologyError(f"{where}.between: unknown node {n!r}")
        pair = frozenset((a, b))
        if pair not in pairs:
            raise TopologyError(f"{where}.between: {a} and {b} share no link")
        if pair in seen_links:
            raise TopologyError(f"{where}.between: link {a}--{b} is given twice")
        seen_links.add(pair)
        _check_link(
            f"{where}.",
            t.link_rate_mbit if spec.link_rate_mbit is None else spec.link_rate_mbit,
            t.buffer_packets if spec.buffer_packets is None else spec.buffer_packets,
        )


def _check_link(where: str, rate: float, buffer: int) -> None:
    """A link's rate and buffer, as the switch profile will need them (``where``:
    the table the values come from, ``""`` for the topology's own)."""
    if not math.isfinite(rate) or not 0.001 <= rate < 1e9:
        raise TopologyError(
            f"{where}link_rate_mbit: must be a number from 0.001 (1 kbit/s) to 1e9, got {rate}"
        )
    if buffer < 2:
        raise TopologyError(
            f"{where}buffer_packets: must be at least 2 (drop-eligible packets are dropped "
            f"below the full buffer), got {buffer}"
        )
    try:
        SwitchPolicy.for_link(rate, buffer)
    except PolicyError as e:
        raise TopologyError(f"{where}buffer_packets: {e}") from None


@dataclass
class Network:
    """A built topology: namespace ``<prefix><node>`` per node.

    ``ifaces[node]`` maps each neighbour of ``node`` to the interface name in
    ``node``'s namespace that leads to it (the neighbour's name).
    """

    topology: Topology
    prefix: str
    namespaces: list[str] = field(default_factory=list)
    ifaces: dict[str, dict[str, str]] = field(default_factory=dict)

    def ns(self, node: str) -> str:
        """Namespace name of ``node`` (a namespace name is returned unchanged)."""
        if node in self.topology.nodes:
            return f"{self.prefix}{node}"
        if node in self.namespaces:
            return node
        raise KeyError(f"no node or namespace {node!r} in this network")

    def host_addr(self, name: str) -> str:
        """IPv4 address of host ``name``."""
        return self.topology.host_addr(name)

    def exec_argv(self, ns_name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace of node (or namespace) ``ns_name``."""
        return ["ip", "netns", "exec", self.ns(ns_name), *argv]

    def run(
        self, ns_name: str, argv: Sequence[str], *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run(self.exec_argv(ns_name, argv), check=check)

    def link_counters(self, router: str, iface: str) -> tuple[int, int]:
        """``(tx_packets, tx_bytes)`` of interface ``iface`` in node ``router``
        (from ``ip -s -j link``)."""
        out = _run(["ip", "-n", self.ns(router), "-s", "-j", "link", "show", "dev", iface])
        info = json.loads(out.stdout)
        tx = info[0]["stats64"]["tx"]
        return int(tx["packets"]), int(tx["bytes"])

    def routes(self, node: str) -> list[dict[str, Any]]:
        """IPv4 routes of ``node`` (``ip -j route``)."""
        out = _run(["ip", "-n", self.ns(node), "-j", "-4", "route", "show"])
        routes: list[dict[str, Any]] = json.loads(out.stdout or "[]")
        return routes


def checked_prefix(prefix: str | None) -> str:
    """``prefix`` (default: a fresh one) if it can start namespace names."""
    if prefix is None:
        return run_prefix()
    if not _PREFIX_RE.match(prefix):
        raise NetnsError(f"prefix {prefix!r}: letters, digits, '_' and '-' only")
    return prefix


#: the routers' ECMP hash: the 5-tuple, as a switch hashes the headers (policy 3,
#: custom fields: source and destination address, protocol, source and destination
#: port). Policy 1 hashes the 5-tuple too, but takes a packet's own L4 hash where it
#: has one, and a packet that comes over a veth pair keeps the hash its socket gave
#: it: a connected socket's random ``sk_txhash``, which TCP draws anew at each
#: retransmission timeout (``net.core.txrehash``). Under policy 1 a TCP flow took a
#: random spine and moved to the other after a timeout, off a lossy link as no IPv4
#: switch would move it (docs/results/2026-12-01/route_probes/, "hash_check.py").
ECMP_HASH = ("net.ipv4.fib_multipath_hash_policy=3", "net.ipv4.fib_multipath_hash_fields=0x0037")


def prepare_nodes(net: Network) -> None:
    """Every node: IPv4 only (no stray IPv6 in the counters), loopback up; hosts
    give TCP DLCP's minimum retransmission timeout; routers also forward, hash
    ECMP on the 5-tuple (:data:`ECMP_HASH`; a kernel older than 5.12 has no
    such hash: NetnsError), and accept asymmetric return paths."""
    t = net.topology
    for node in t.nodes:
        net.ifaces[node] = {}
        _sysctl(
            net, node, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"
        )
        net.run(node, ["ip", "link", "set", "lo", "up"])
    for host in t.host_names:
        tcp_timers_like_dlcp(functools.partial(net.run, host, check=False))
    for node in (*t.leaves, *t.spines):
        _sysctl(
            net,
            node,
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        )
        if net.run(node, ["sysctl", "-qw", *ECMP_HASH], check=False).returncode != 0:
            raise NetnsError(
                f"{node}: the kernel refused {' '.join(ECMP_HASH)} (a custom ECMP hash "
                "needs Linux 5.12 or later)"
            )


def _sysctl(net: Network, node: str, *settings: str) -> None:
    net.run(node, ["sysctl", "-qw", *settings])


def host_offloads_off(net: Network, host: str, dev: str) -> None:
    """Segmentation offloads of a host's interface off: TCP and UDP leave the host
    as MTU-sized packets (module docstring)."""
    for features in (("tso", "off", "gso", "off"), ("tx-udp-segmentation", "off")):
        # separately: a kernel without UDP segmentation offload rejects the whole
        # command if it names the feature; what it does not expose stays as it is
        net.run(host, ["ethtool", "-K", dev, *features], check=False)
    require_segmentation_off(lambda argv: net.run(host, argv), dev, net.ns(host))


def _check_ready(net: Network) -> None:
    t = net.topology
    for leaf in t.leaves:
        have = {r.get("dst") for r in net.routes(leaf)}
        for h in t.hosts:
            want = f"{_HOST_NET}.{t.host_index(h.name)}.0/24"
            if want not in have:
                raise NetnsError(f"readiness: leaf {leaf} has no route to {want} ({h.name})")
    for a in t.host_names:
        for b in t.host_names:
            if a == b:
                continue
            # -w: one probe a second until a reply or the deadline (one lost probe,
            # e.g. while neighbours are resolved, must not fail the build)
            ping = ["ping", "-c", "1", "-w", "5", "-q", net.host_addr(b)]
            if net.run(a, ping, check=False).returncode != 0:
                raise NetnsError(f"readiness: {a} cannot reach {b} ({net.host_addr(b)})")


def route_commands(t: Topology) -> list[tuple[str, list[str]]]:
    """Every static route of ``t`` as ``(node, ["ip", "route", "add", ...])``, in
    the order :func:`build` installs them: host default routes via their leaf,
    leaf routes to remote host prefixes over all spines (ECMP ``nexthop`` list
    when there is more than one spine), spine routes to each host prefix via its
    leaf. Shared by every backend, so addressing and routing are identical."""
    out: list[tuple[str, list[str]]] = []
    links = t.links()
    host_links = {lo: (la, ua, sn) for lo, _u, la, ua, sn in links[: len(t.hosts)]}
    fabric = {(lo, up): (la, ua) for lo, up, la, ua, _s in links[len(t.hosts) :]}
    for h in t.hosts:
        _h_addr, leaf_addr, _sn = host_links[h.name]
        out.append((h.name, ["ip", "route", "add", "default", "via", leaf_addr]))
    for leaf in t.leaves:
        hops = [fabric[(leaf, s)][1] for s in t.spines]
        for h in t.hosts:
            if h.leaf == leaf:
                continue  # connected route
            dst = host_links[h.name][2]
            if len(hops) == 1:
                via = ["via", hops[0]]
            else:
                via = [w for hop in hops for w in ("nexthop", "via", hop)]
            out.append((leaf, ["ip", "route", "add", dst, *via]))
    for spine in t.spines:
        for h in t.hosts:
            leaf_addr_on_link = fabric[(h.leaf, spine)][0]
            out.append(
                (spine, ["ip", "route", "add", host_links[h.name][2], "via", leaf_addr_on_link])
            )
    return out


@contextmanager
def build(topology: Topology, *, prefix: str | None = None) -> Iterator[Network]:
    """Create ``topology`` as namespaces ``<prefix><node>``; remove them on exit."""
    require_tools("a namespace topology", offloads=True)
    prefix = checked_prefix(prefix)
    t = topology
    net = Network(t, prefix)
    names = [f"{prefix}{n}" for n in t.nodes]
    with prefix_lock(prefix), _built(net, names):
        yield net


@contextmanager
def _built(net: Network, names: list[str]) -> Iterator[None]:
    """``net``'s namespaces (``names``), built and checked; removed on exit."""
    t = net.topology
    try:
        _cleanup(names)  # leftovers of a crashed run with the same names
        for ns in names:
            _run(["ip", "netns", "add", ns])
            net.namespaces.append(ns)
        prepare_nodes(net)
        mtu = str(t.mtu)
        for lower, upper, addr_l, addr_u, _subnet in t.links():
            # created inside the lower node's namespace, peer moved to the upper's:
            # interface names need only be unique per namespace
            _run(
                [
                    "ip", "-n", net.ns(lower), "link", "add", "name", upper, "mtu", mtu,
                    "type", "veth", "peer", "name", lower, "netns", net.ns(upper), "mtu", mtu,
                ]
            )  # fmt: skip
            net.ifaces[lower][upper] = upper
            net.ifaces[upper][lower] = lower
            for node, dev, addr in ((lower, upper, addr_l), (upper, lower, addr_u)):
                _run(["ip", "-n", net.ns(node), "addr", "add", f"{addr}/24", "dev", dev])
                _run(["ip", "-n", net.ns(node), "link", "set", "dev", dev, "up"])
        for node, argv in route_commands(t):
            net.run(node, argv)
        for h in t.hosts:
            host_offloads_off(net, h.name, h.leaf)
        _check_ready(net)
        yield
    finally:
        _cleanup(names)
