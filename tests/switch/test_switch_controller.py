"""Per-switch entries from a topology: ports, MACs, single-spine routes, overrides."""

from __future__ import annotations

import pytest
from dlcp.testbed.topology import Topology

from dlcp.switch.controller import fabric_config, iface_mac, switch_entries, switch_ports
from dlcp.switch.p4entries import Lpm, P4Names
from dlcp.switch.policy import SwitchPolicy

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
