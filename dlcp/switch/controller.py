"""Controller: the P4Runtime entries of every switch of a leaf-spine topology, and
pushing them to a device.

Topology: the testbed's :class:`~testbed.topology.Topology` (any object with
its ``hosts`` / ``leaves`` / ``spines`` / ``nodes`` / ``host_addr`` / ``links``), the
same addressing as the Linux backends (``route_commands``). Conventions shared with
the BMv2 testbed backend (``dlcp testbed up --switch bmv2``):

* **ports** (:func:`switch_ports`): a switch numbers its interfaces from 1 in
  neighbour order -- a leaf its hosts (file order) then the spines, a spine the
  leaves. The backend starts ``simple_switch_grpc -i <port>@<neighbour>`` with them
  (interfaces are named after the neighbour, as in the namespace testbed).
* **MACs** (:func:`iface_mac`): ``02:dc:NN:NN:MM:MM``, locally administered, from the
  node's index ``N`` in ``topology.nodes`` and the neighbour's index ``M``; the
  backend sets them on the interfaces, or passes the real ones as ``macs``.

Routes (:func:`switch_entries`): a leaf sends its own hosts' /32 to their port and
every remote host's /24 to the spines -- one ECMP group (id 1, one member per
spine; DLCP packets sprayed per packet, other traffic per flow by the P4 program)
or the one spine directly; a spine sends each host's /24 to the host's leaf. Every
switch gets the policy's priority map and drop thresholds
(:func:`~dlcp.switch.p4entries.policy_entries`).

Failed links (``down``): a P4 switch does not act on link state by itself, so the
controller does what a fabric's control plane does when a link fails -- it
recomputes every switch's routes from the links still up and pushes the
difference (:func:`entry_changes`, :func:`update_switch`). A leaf then uses, per
remote host, only the spines that still reach that host's leaf (a smaller ECMP
group, the one spine directly, or no route); a spine withdraws the hosts behind
its dead link. :func:`read_counters` reads the program's counters back.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .p4entries import Exact, Lpm, P4Names, TableEntry, policy_entries, queue_depths
from .policy import SwitchPolicy

__all__ = [
    "ECMP_GROUP",
    "SwitchConfig",
    "configure_switch",
    "entry_changes",
    "fabric_config",
    "iface_mac",
    "read_counters",
    "switch_entries",
    "switch_ports",
    "update_switch",
]

ECMP_GROUP = 1  # the uplink group of every leaf


class _Host(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def leaf(self) -> str: ...


class FabricTopology(Protocol):
    """What the controller needs of ``testbed.topology.Topology``."""

    @property
    def hosts(self) -> Sequence[_Host]: ...
    @property
    def leaves(self) -> Sequence[str]: ...
    @property
    def spines(self) -> Sequence[str]: ...
    @property
    def nodes(self) -> Sequence[str]: ...
    def host_addr(self, host: str) -> str: ...
    def links(self) -> list[tuple[str, str, str, str, str]]: ...


def _switches(t: FabricTopology) -> list[str]:
    return [*t.leaves, *t.spines]


def switch_ports(t: FabricTopology, node: str) -> dict[str, int]:
    """Neighbour -> port number (from 1) on switch ``node``."""
    if node in t.leaves:
        order = [h.name for h in t.hosts if h.leaf == node] + list(t.spines)
    elif node in t.spines:
        order = list(t.leaves)
    else:
        raise ValueError(
            f"{node!r} is not a switch (leaves: {', '.join(t.leaves)}; "
            f"spines: {', '.join(t.spines)})"
        )
    return {n: i + 1 for i, n in enumerate(order)}


def iface_mac(t: FabricTopology, node: str, neighbour: str) -> str:
    """The conventional MAC of ``node``'s interface towards ``neighbour``."""
    nodes = list(t.nodes)
    for n in (node, neighbour):
        if n not in nodes:
            raise ValueError(f"{n!r} is not a node of the topology")
    a, b = nodes.index(node), nodes.index(neighbour)
    octets = [0x02, 0xDC, a >> 8, a & 0xFF, b >> 8, b & 0xFF]
    return ":".join(f"{o:02x}" for o in octets)


MacMap = Mapping[tuple[str, str], str]
#: failed links, each as the pair of its ends (either order)
DownLinks = Collection[tuple[str, str]]


def _is_up(down: DownLinks, a: str, b: str) -> bool:
    return (a, b) not in down and (b, a) not in down


def _mac(t: FabricTopology, macs: MacMap | None, node: str, neighbour: str) -> str:
    if macs and (node, neighbour) in macs:
        return macs[(node, neighbour)]
    return iface_mac(t, node, neighbour)


def _host_subnets(t: FabricTopology) -> dict[str, tuple[str, int]]:
    """Host -> (network address, prefix length) of its host-leaf link."""
    out: dict[str, tuple[str, int]] = {}
    hosts = {h.name for h in t.hosts}
    for lower, _upper, _la, _ua, subnet in t.links():
        if lower in hosts:
            addr, plen = subnet.split("/")
            out[lower] = (addr, int(plen))
    return out


def switch_entries(
    t: FabricTopology,
    policy: SwitchPolicy,
    node: str,
    macs: MacMap | None = None,
    down: DownLinks = (),
) -> list[TableEntry]:
    """Every table entry of switch ``node``: routes, ECMP members, priority map,
    drop thresholds (in that order), routing around the links in ``down``."""
    n = P4Names
    ports = switch_ports(t, node)
    subnets = _host_subnets(t)
    out: list[TableEntry] = []

    def hop(neighbour: str) -> tuple[tuple[str, int | str], ...]:
        return (
            ("port", ports[neighbour]),
            ("smac", _mac(t, macs, node, neighbour)),
            ("dmac", _mac(t, macs, neighbour, node)),
        )

    if node in t.leaves:
        for h in t.hosts:
            if h.leaf == node:
                out.append(
                    TableEntry(
                        n.IPV4_LPM,
                        ((n.DST_ADDR, Lpm(t.host_addr(h.name), 32)),),
                        n.SET_NEXT_HOP,
                        hop(h.name),
                        note=f"host {h.name}",
                    )
                )
        remote = [h for h in t.hosts if h.leaf != node]
        groups: dict[tuple[str, ...], int] = {}  # spines of a group -> its id
        for h in remote:
            addr, plen = subnets[h.name]
            match = ((n.DST_ADDR, Lpm(addr, plen)),)
            note = f"host {h.name} on {h.leaf}"
            spines = tuple(s for s in t.spines if _is_up(down, node, s) and _is_up(down, h.leaf, s))
            if not spines:
                continue  # unreachable: no entry, the table's default drops
            if len(spines) == 1:
                out.append(
                    TableEntry(
                        n.IPV4_LPM,
                        match,
                        n.SET_NEXT_HOP,
                        hop(spines[0]),
                        note=f"{note}, via {spines[0]}",
                    )
                )
                continue
            if spines not in groups:  # every spine: group 1; fewer: 2, 3, ...
                full = spines == tuple(t.spines)
                groups[spines] = ECMP_GROUP if full else ECMP_GROUP + 1 + len(groups)
            out.append(
                TableEntry(
                    n.IPV4_LPM,
                    match,
                    n.SET_ECMP_GROUP,
                    (("group_id", groups[spines]), ("size", len(spines))),
                    note=f"{note}, over {len(spines)} spines",
                )
            )
        for spines, group in groups.items():
            for i, s in enumerate(spines):
                out.append(
                    TableEntry(
                        n.ECMP_MEMBER,
                        ((n.ECMP_GROUP_ID, Exact(group)), (n.ECMP_MEMBER_FIELD, Exact(i))),
                        n.SET_MEMBER_NEXT_HOP,
                        hop(s),
                        note=f"uplink {i}: {s}"
                        + (f" (group {group})" if group != ECMP_GROUP else ""),
                    )
                )
    else:
        for h in t.hosts:
            if not _is_up(down, node, h.leaf):
                continue  # withdrawn: the link to the host's leaf is down
            addr, plen = subnets[h.name]
            out.append(
                TableEntry(
                    n.IPV4_LPM,
                    ((n.DST_ADDR, Lpm(addr, plen)),),
                    n.SET_NEXT_HOP,
                    hop(h.leaf),
                    note=f"host {h.name} via {h.leaf}",
                )
            )
    out.extend(policy_entries(policy))
    return out


@dataclass(frozen=True)
class SwitchConfig:
    """What the controller installs on one switch (and what the backend needs to
    start it): ports by neighbour, table entries, BMv2 queue depths."""

    node: str
    ports: dict[str, int]
    entries: list[TableEntry]
    queue_depths: dict[int, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "ports": self.ports,
            "queue_depths": {str(q): d for q, d in self.queue_depths.items()},
            "entries": [e.to_json() for e in self.entries],
        }


def fabric_config(
    t: FabricTopology,
    policy: SwitchPolicy,
    macs: MacMap | None = None,
    down: DownLinks = (),
) -> dict[str, SwitchConfig]:
    """:class:`SwitchConfig` of every switch (leaves, then spines), routing around
    the links in ``down``."""
    return {
        node: SwitchConfig(
            node,
            switch_ports(t, node),
            switch_entries(t, policy, node, macs, down),
            dict(queue_depths(policy)),
        )
        for node in _switches(t)
    }


def configure_switch(
    address: str,
    device_id: int,
    p4info_path: str | os.PathLike[str],
    bmv2_json_path: str | os.PathLike[str],
    entries: Sequence[TableEntry],
    *,
    election_id: int = 1,
    timeout: float = 10.0,
) -> None:
    """Push the pipeline (P4Info + BMv2 JSON) to the P4Runtime device at ``address``
    and install ``entries`` (e.g. ``fabric_config(...)[node].entries``)."""
    from .p4info import P4InfoHelper
    from .p4runtime import P4RuntimeClient, P4RuntimeError

    helper = P4InfoHelper.from_file(p4info_path)
    try:
        device_config = Path(bmv2_json_path).read_bytes()
    except OSError as e:
        raise P4RuntimeError(f"{bmv2_json_path}: cannot read the BMv2 JSON: {e}") from e
    updates = helper.updates(entries)  # encode first: name errors before connecting
    with P4RuntimeClient(address, device_id, election_id=election_id, timeout=timeout) as c:
        c.set_pipeline(helper.p4info, device_config)
        c.write(updates, [e.describe() for e in entries])


def _key(e: TableEntry) -> tuple[str, tuple[tuple[str, Any], ...], int]:
    return (e.table, e.match, e.priority)


def entry_changes(
    old: Sequence[TableEntry], new: Sequence[TableEntry]
) -> list[tuple[str, TableEntry]]:
    """``(kind, entry)`` updates that turn a switch's ``old`` entries into ``new``:
    INSERT the new keys (match), MODIFY those whose action changed, DELETE the
    keys gone -- in that order, so that a route never points at a member that is
    not there yet."""
    before = {_key(e): e for e in old}
    after = {_key(e): e for e in new}
    out: list[tuple[str, TableEntry]] = []
    out += [("INSERT", e) for k, e in after.items() if k not in before]
    out += [
        ("MODIFY", e)
        for k, e in after.items()
        if k in before and (e.action, e.params) != (before[k].action, before[k].params)
    ]
    out += [("DELETE", e) for k, e in before.items() if k not in after]
    return out


def update_switch(
    address: str,
    device_id: int,
    p4info_path: str | os.PathLike[str],
    changes: Sequence[tuple[str, TableEntry]],
    *,
    election_id: int = 1,
    timeout: float = 10.0,
) -> None:
    """Write ``changes`` (from :func:`entry_changes`) to a configured device, as
    its primary controller."""
    from .p4info import P4InfoHelper
    from .p4runtime import P4RuntimeClient

    if not changes:
        return
    helper = P4InfoHelper.from_file(p4info_path)
    updates = [u for kind, e in changes for u in helper.updates([e], kind)]
    labels = [f"{kind} {e.describe()}" for kind, e in changes]
    with P4RuntimeClient(address, device_id, election_id=election_id, timeout=timeout) as c:
        c.write(updates, labels)


def read_counters(
    address: str,
    device_id: int,
    p4info_path: str | os.PathLike[str],
    names: Sequence[str],
    *,
    timeout: float = 10.0,
) -> dict[str, dict[int, tuple[int, int]]]:
    """``{counter: {index: (packets, bytes)}}`` of the indirect counters ``names``
    (every index), read over P4Runtime without becoming primary."""
    from .p4info import P4InfoHelper
    from .p4runtime import P4RuntimeClient

    helper = P4InfoHelper.from_file(p4info_path)
    out: dict[str, dict[int, tuple[int, int]]] = {}
    with P4RuntimeClient(address, device_id, primary=False, timeout=timeout) as c:
        for name in names:
            out[name] = {i: (v.packets, v.bytes) for i, v in c.read_counter(helper, name).items()}
    return out
