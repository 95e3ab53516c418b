"""P4Runtime table entries as plain data, and the ones a policy implies.

The names are those of ``docs/switch.md`` (the interface with the P4 program);
:class:`~dlcp.switch.p4info.P4InfoHelper` resolves them to ids through the P4Info
and :class:`~dlcp.switch.p4runtime.P4RuntimeClient` sends them. Values stay
readable here: integers, dotted IPv4 addresses (``"10.215.0.2"``) and MAC
addresses (``"02:dc:00:04:00:00"``); the encoder turns them into P4Runtime
canonical bytestrings of the field's bitwidth.

:func:`policy_entries` gives the priority map and the drop thresholds of a
:class:`~dlcp.switch.policy.SwitchPolicy` (the same on every switch);
:mod:`dlcp.switch.controller` adds each switch's routes and ECMP groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .policy import SwitchPolicy

__all__ = [
    "Exact",
    "Lpm",
    "P4Names",
    "TableEntry",
    "entries_to_json",
    "policy_entries",
    "queue_depths",
]

Value = int | str


class P4Names:
    """Table, action, match-field, parameter and counter names of docs/switch.md."""

    IPV4_LPM = "DlcpIngress.routing.ipv4_lpm"
    SET_NEXT_HOP = "DlcpIngress.routing.set_next_hop"
    SET_ECMP_GROUP = "DlcpIngress.routing.set_ecmp_group"
    ECMP_MEMBER = "DlcpIngress.ecmp.ecmp_member"
    SET_MEMBER_NEXT_HOP = "DlcpIngress.ecmp.set_member_next_hop"
    CLASS_TO_QUEUE = "DlcpIngress.queueing.dlcp_class_to_queue"
    DSCP_TO_QUEUE = "DlcpIngress.queueing.dscp_to_queue"
    SET_QUEUE = "DlcpIngress.queueing.set_queue"
    DROP_THRESHOLD = "DlcpEgress.selective_drop.drop_threshold"
    SET_THRESHOLD = "DlcpEgress.selective_drop.set_threshold"

    DST_ADDR = "hdr.ipv4.dst_addr"
    ECMP_GROUP_ID = "meta.ecmp_group_id"
    ECMP_MEMBER_FIELD = "meta.ecmp_member"
    DLCP_PRIO = "meta.dlcp_prio"
    DSCP = "hdr.ipv4.dscp"
    QUEUE = "meta.queue"

    FORWARDED = "DlcpEgress.selective_drop.forwarded"
    DROPPED_SELECTIVE = "DlcpEgress.selective_drop.dropped_selective"
    EGRESS_PORT = "DlcpEgress.port_counters.egress_port"
    INGRESS_PORT = "DlcpIngress.port_counters.ingress_port"
    LOSS_INJECTED = "DlcpIngress.loss.injected"
    LOSS_PROBABILITY = "DlcpIngress.loss.drop_per_65536"  # register, 1/65536 units


@dataclass(frozen=True, slots=True)
class Exact:
    value: Value


@dataclass(frozen=True, slots=True)
class Lpm:
    value: Value
    prefix_len: int


Match = Exact | Lpm


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One table entry: ``match`` maps match-field names to :class:`Exact` /
    :class:`Lpm`, ``params`` action-parameter names to values. ``note`` is a
    human-readable comment (why the entry exists); it is not sent."""

    table: str
    match: tuple[tuple[str, Match], ...]
    action: str
    params: tuple[tuple[str, Value], ...] = ()
    priority: int = 0
    note: str = ""

    def describe(self) -> str:
        """``table[field=value, ...] -> action(param=value, ...)``, for messages."""
        ms = ", ".join(f"{k}={_show(m)}" for k, m in self.match)
        ps = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.table}[{ms}] -> {self.action}({ps})"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "table": self.table,
            "match": {k: _match_json(m) for k, m in self.match},
            "action": self.action,
            "params": dict(self.params),
        }
        if self.priority:
            out["priority"] = self.priority
        if self.note:
            out["note"] = self.note
        return out


def _show(m: Match) -> str:
    return f"{m.value}/{m.prefix_len}" if isinstance(m, Lpm) else str(m.value)


def _match_json(m: Match) -> Any:
    if isinstance(m, Lpm):
        return {"lpm": m.value, "prefix_len": m.prefix_len}
    return {"exact": m.value}


def entries_to_json(entries: Iterable[TableEntry]) -> list[dict[str, Any]]:
    return [e.to_json() for e in entries]


def policy_entries(policy: SwitchPolicy) -> list[TableEntry]:
    """The priority map and drop thresholds of ``policy``: DLCP class ``c`` and its
    DSCP go to queue ``policy.queue_of(c)`` (for the
    :meth:`~.SwitchPolicy.marked_classes`: those above the policy's share its
    top queue, as tc and SONiC map them), and that queue drops drop-eligible DLCP
    packets above ``policy.drop_threshold(c)`` packets. Other DSCPs take the
    tables' default (queue 0, no threshold)."""
    n = P4Names
    out: list[TableEntry] = []
    for c in policy.marked_classes():  # (those above the policy's: its top queue)
        out.append(
            TableEntry(
                n.CLASS_TO_QUEUE,
                ((n.DLCP_PRIO, Exact(c)),),
                n.SET_QUEUE,
                (("queue", policy.queue_of(c)),),
                note=f"DLCP class {c}",
            )
        )
    for c in policy.marked_classes():
        out.append(
            TableEntry(
                n.DSCP_TO_QUEUE,
                ((n.DSCP, Exact(policy.tos.dscp[c])),),
                n.SET_QUEUE,
                (("queue", policy.queue_of(c)),),
                note=f"DSCP of class {c}",
            )
        )
    for c in range(policy.n_classes):
        out.append(
            TableEntry(
                n.DROP_THRESHOLD,
                ((n.QUEUE, Exact(policy.queue_of(c))),),
                n.SET_THRESHOLD,
                (("depth", policy.drop_threshold(c)),),
                note=f"class {c}: drop-eligible above {policy.drop_threshold(c)} packets",
            )
        )
    return out


def queue_depths(policy: SwitchPolicy) -> Mapping[int, int]:
    """Queue -> capacity in packets, for BMv2's ``set_queue_depth`` (thrift CLI; not
    a P4Runtime entity): each class's protected limit, best effort the default."""
    depths = {0: policy.queue_packets}
    for c in range(policy.n_classes):
        depths[policy.queue_of(c)] = policy.queue_limit(c)
    return dict(sorted(depths.items()))
