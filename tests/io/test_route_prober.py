"""The route prober's bookkeeping (dlcp.io.path_probe.RouteProber): which peers it
probes, in which thread, once each. The probing itself runs on a real leaf-spine
network in tests/testbed/test_route_probe.py (root)."""

from __future__ import annotations

import threading

import pytest

from dlcp.io import path_probe
from dlcp.io.path_probe import ProbeResult, RouteProber, default_attempts
from dlcp.io.peers import PeerAddress

HOST = "10.0.0.1"


def test_each_hop_is_asked_at_least_once_per_path() -> None:
    # a Linux router answers a burst of 6 and then one a second: 16 paths asking
    # one hop need about 11 attempts, 8 left 4 of 16 untraced on the testbed
    assert [default_attempts(n) for n in (1, 2, 8, 9, 16, 64)] == [8, 8, 8, 9, 16, 64]


def test_peers_on_this_host_are_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[object] = []
    monkeypatch.setattr(path_probe, "probe_routes", lambda *a, **k: called.append(a))
    prober = RouteProber(HOST, [1000, 1001], rank=0, found=lambda p, r: called.append(p))
    prober.request(1, PeerAddress("127.0.0.1", 5000, 5001))
    prober.request(2, PeerAddress("127.8.0.3", 5000, 5001))
    prober.request(3, PeerAddress(HOST, 5000, 5001))
    assert not [t for t in threading.enumerate() if t.name.startswith("dlcp-routes-")]
    prober.close(1.0)
    assert called == []


def test_one_thread_probes_each_peer_once_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    probing: list[tuple[str, str]] = []  # (thread name, peer host)

    def fake_probe(host: str, ports: list[int], peer: PeerAddress, **kw: object) -> ProbeResult:
        probing.append((threading.current_thread().name, peer.host))
        release.wait(10)
        return ProbeResult(4, (("a", "s1", "b"), ("a", "s2", "b")), 6)

    monkeypatch.setattr(path_probe, "probe_routes", fake_probe)
    found: dict[int, ProbeResult] = {}
    done = threading.Event()

    def on_found(peer: int, result: ProbeResult) -> None:
        found[peer] = result
        if len(found) == 2:
            done.set()

    prober = RouteProber(HOST, [1000, 1001], rank=3, found=on_found)
    prober.request(1, PeerAddress("10.0.1.1", 5000, 5001))
    prober.request(2, PeerAddress("10.0.2.1", 5000, 5001))
    prober.request(1, PeerAddress("10.0.1.1", 5000, 5001))  # asked already: nothing more
    release.set()
    assert done.wait(10)
    assert probing == [("dlcp-routes-3", "10.0.1.1"), ("dlcp-routes-3", "10.0.2.1")]
    assert set(found) == {1, 2} and found[1].distance == 4
    prober.request(2, PeerAddress("10.0.2.1", 5000, 5001))  # once per peer, ever
    prober.close(10.0)
    assert len(probing) == 2
    assert not [t for t in threading.enumerate() if t.name == "dlcp-routes-3"]


def test_close_stops_probing_and_nothing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    started = threading.Event()

    def fake_probe(host: str, ports: list[int], peer: PeerAddress, **kw: object) -> ProbeResult:
        started.set()
        stop = kw["stop"]
        assert isinstance(stop, threading.Event)
        assert stop.wait(10)  # the real probe polls its stop event between waits
        return ProbeResult(None, (None, None), 1)

    monkeypatch.setattr(path_probe, "probe_routes", fake_probe)
    found: list[int] = []
    prober = RouteProber(HOST, [1000, 1001], rank=5, found=lambda p, r: found.append(p))
    prober.request(1, PeerAddress("10.0.1.1", 5000, 5001))
    assert started.wait(10)
    prober.close(10.0)
    assert found == []
    assert not [t for t in threading.enumerate() if t.name == "dlcp-routes-5"]
    prober.request(2, PeerAddress("10.0.2.1", 5000, 5001))  # closed: nothing starts
    assert not [t for t in threading.enumerate() if t.name == "dlcp-routes-5"]
