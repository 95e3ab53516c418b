"""Per-switch entries from a topology: ports, MACs, single-spine routes, overrides."""

from __future__ import annotations

import pytest

from dlcp.switch.controller import (
    entry_changes,
    fabric_config,
    iface_mac,
    switch_entries,
    switch_ports,
)
from dlcp.switch.p4entries import Lpm, P4Names
from dlcp.switch.policy import SwitchPolicy
from testbed.topology import Topology

N = P4Names


def _one_spine() -> Topology:
    return Topology.from_dict(
        {"leaves": ["la", "lb"], "spines": ["s"], "hosts": {"a": "la", "b": "lb", "c": "la"}}
    )


def test_ports_and_macs() -> None:
    t = Topology.default()
    assert switch_ports(t, "leaf2") == {"h3": 1, "h4": 2, "spine1": 3, "spine2": 4}
    assert switch_ports(t, "spine2") == {"leaf1": 1, "leaf2": 2}
    assert iface_mac(t, "leaf2", "spine2") == "02:dc:00:05:00:07"
    with pytest.raises(ValueError, match="'h1' is not a switch"):
        switch_ports(t, "h1")
    with pytest.raises(ValueError, match="'x' is not a node"):
        iface_mac(t, "leaf1", "x")


def test_single_spine_routes_straight_to_the_spine() -> None:
    t = _one_spine()
    entries = switch_entries(t, SwitchPolicy(n_classes=1), "la")
    routes = [(e.match[0][1], e.action, dict(e.params)) for e in entries if e.table == N.IPV4_LPM]
    assert [r[0] for r in routes] == [
        Lpm("10.215.0.2", 32), Lpm("10.215.2.2", 32), Lpm("10.215.1.0", 24)]  # fmt: skip
    assert routes[2][1] == N.SET_NEXT_HOP and routes[2][2]["port"] == 3  # a=1, c=2, s=3
    assert not [e for e in entries if e.table == N.ECMP_MEMBER]
    spine = switch_entries(t, SwitchPolicy(n_classes=1), "s")
    assert [dict(e.params).get("port") for e in spine if e.table == N.IPV4_LPM] == [1, 2, 1]


def test_real_macs_override_the_convention() -> None:
    t = Topology.default()
    macs = {("leaf1", "h1"): "aa:00:00:00:00:01", ("h1", "leaf1"): "aa:00:00:00:00:02"}
    first = switch_entries(t, SwitchPolicy(), "leaf1", macs)[0]
    assert dict(first.params) == {"port": 1, "smac": "aa:00:00:00:00:01",
                                  "dmac": "aa:00:00:00:00:02"}  # fmt: skip


def test_fabric_config_covers_every_switch() -> None:
    cfg = fabric_config(Topology.default(), SwitchPolicy(n_classes=2))
    assert list(cfg) == ["leaf1", "leaf2", "spine1", "spine2"]
    assert cfg["leaf1"].queue_depths == {0: 100, 1: 100}
    assert cfg["spine1"].to_json()["ports"] == {"leaf1": 1, "leaf2": 2}


def _three_spines() -> Topology:
    return Topology.from_dict(
        {"leaves": ["la", "lb", "lc"], "spines": ["s1", "s2", "s3"],
         "hosts": {"a": "la", "b": "lb", "c": "lc"}}
    )  # fmt: skip


def _routes(entries: list, table: str = N.IPV4_LPM) -> dict:
    return {e.match: (e.action, dict(e.params)) for e in entries if e.table == table}


def test_failed_link_reroutes_and_shrinks_the_group() -> None:
    """la--s1 down: la reaches b and c over s2, s3 only (a new 2-member group);
    lb keeps all three spines towards c but only s2, s3 towards a; s1 withdraws a."""
    t, policy = _three_spines(), SwitchPolicy(n_classes=1)
    down = {("s1", "la")}  # either order names the link
    la = switch_entries(t, policy, "la", down=down)
    routes = list(_routes(la).values())
    assert [r[1] for r in routes[1:]] == [{"group_id": 2, "size": 2}] * 2
    members = _routes(la, N.ECMP_MEMBER)
    assert sorted((m[0][1].value, m[1][1].value, p["port"]) for m, (_a, p) in members.items()) == [
        (2, 0, 3), (2, 1, 4)]  # s2 = port 3, s3 = port 4 (a = 1, s1 = 2)  # fmt: skip
    lb = _routes(switch_entries(t, policy, "lb", down=down))
    by_dst = {m[0][1].value: p for m, (_a, p) in lb.items()}
    assert by_dst["10.215.0.0"] == {"group_id": 2, "size": 2}  # towards a: s2, s3
    assert by_dst["10.215.2.0"] == {"group_id": 1, "size": 3}  # towards c: every spine
    s1 = _routes(switch_entries(t, policy, "s1", down=down))
    assert [m[0][1].value for m in s1] == ["10.215.1.0", "10.215.2.0"]  # a's /24 withdrawn
    # no failure: the same entries as without the argument
    assert switch_entries(t, policy, "la", down=()) == switch_entries(t, policy, "la")


def test_entry_changes_insert_modify_delete() -> None:
    t, policy = Topology.default(), SwitchPolicy(n_classes=1)
    old = switch_entries(t, policy, "leaf1")
    new = switch_entries(t, policy, "leaf1", down={("leaf1", "spine1")})
    changes = entry_changes(old, new)
    assert [k for k, _e in changes] == ["MODIFY", "MODIFY", "DELETE", "DELETE"]
    assert all(e.action == N.SET_NEXT_HOP and dict(e.params)["port"] == 4  # spine2
               for k, e in changes if k == "MODIFY")  # fmt: skip
    assert {e.table for k, e in changes if k == "DELETE"} == {N.ECMP_MEMBER}
    assert [k for k, _e in entry_changes(new, old)] == ["INSERT", "INSERT", "MODIFY", "MODIFY"]
    assert entry_changes(old, old) == []
    # a link with no path left: the route goes (the table's default drops)
    one = _one_spine()
    gone = switch_entries(one, policy, "la", down={("lb", "s")})
    assert Lpm("10.215.1.0", 24) not in {e.match[0][1] for e in gone if e.table == N.IPV4_LPM}
