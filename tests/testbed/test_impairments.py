"""Impairments and traffic on the leaf-spine testbed, and ``dlcp testbed up|down`` (root)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testbed import impairments as im
from testbed.netns import missing_tools
from testbed.switch_profile import SwitchPolicy
from testbed.topology import Network, Topology, build

MISSING = missing_tools(loss=True, offloads=True)
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)"),
]


@pytest.fixture
def net() -> Iterator[Network]:
    with build(Topology.default(), prefix=f"dlcpim{os.getpid() % 100000}-") as n:
        yield n


def _tx(net: Network, router: str, neighbour: str) -> int:
    return net.link_counters(router, net.ifaces[router][neighbour])[0]


def _flow(
    net: Network, src: str, dst: str, spine: str, seconds: float, mbit: float
) -> im.CrossTraffic:
    h = im.cross_traffic(net, src, dst, spine=spine, seconds=seconds, mbit=mbit)
    try:
        assert h.wait(timeout=seconds + 10) == 0
    finally:
        h.stop()
    return h


def test_apply_profile_every_router_interface(net: Network) -> None:
    im.apply_profile(net, SwitchPolicy())
    routers = (*net.topology.leaves, *net.topology.spines)
    for r in routers:
        for dev in net.ifaces[r].values():
            out = net.run(r, ["tc", "qdisc", "show", "dev", dev, "root"]).stdout
            assert out.startswith("qdisc htb 1: root"), (r, dev, out)
    h = _flow(net, "h1", "h4", "spine2", 0.5, 20)
    assert h.received["packets"] == h.sent["packets"] > 0
    counters = im.profile_counters(net)
    assert set(counters) == set(routers)
    # the flow (TOS 0, Not-ECT) went through class 0's drop-eligible queue on its path
    assert counters["spine2"]["leaf2"]["c0-drop"]["packets"] >= h.sent["packets"]
    assert counters["spine1"]["leaf2"]["c0-drop"]["packets"] < h.sent["packets"]


def test_link_loss_only_that_link(net: Network) -> None:
    im.link_loss(net, "leaf1", "spine1", 20)
    lossy = _flow(net, "h1", "h3", "spine1", 1.0, 20)
    clean = _flow(net, "h1", "h3", "spine2", 0.5, 20)
    back = _flow(net, "h3", "h1", "spine1", 0.5, 20)
    sent, got = lossy.sent["packets"], lossy.received["packets"]
    assert 0.14 < 1 - got / sent < 0.26, (sent, got)
    assert clean.received["packets"] == clean.sent["packets"]
    assert 0.12 < 1 - back.received["packets"] / back.sent["packets"] < 0.28
    dropped = im.link_dropped(net, "leaf1", "spine1")
    # the rules dropped exactly what went missing (probes of pin_port included)
    assert dropped["leaf1->spine1"] >= sent - got
    assert dropped["spine1->leaf1"] >= back.sent["packets"] - back.received["packets"]
    im.link_loss(net, "leaf1", "spine1", 0)
    assert _flow(net, "h1", "h3", "spine1", 0.3, 20).received["packets"] > 0
    assert im.link_dropped(net, "leaf1", "spine1") == {"leaf1->spine1": 0, "spine1->leaf1": 0}


def test_link_down_reroutes_then_up_restores(net: Network) -> None:
    im.link_down(net, "leaf1", "spine1")  # returns once hosts reach each other again
    before = {n: _tx(net, "spine1", n) for n in ("leaf1", "leaf2")}
    before2 = _tx(net, "spine2", "leaf2")
    # many flows (ports) h1 -> h3 and back: none may use spine1 any more
    for sport in range(40000, 40016):
        net.run("h1", ["ping", "-c", "1", "-W", "2", "-q", net.host_addr("h3")])
        net.run(
            "h3",
            [sys.executable, "-c", "import socket,sys; s=socket.socket(2,2); "
             f"s.bind(('',{sport})); s.sendto(b'x',(sys.argv[1],9))", net.host_addr("h1")],
        )  # fmt: skip
    assert _tx(net, "spine1", "leaf2") == before["leaf2"]
    assert _tx(net, "spine1", "leaf1") == before["leaf1"]
    assert _tx(net, "spine2", "leaf2") >= before2 + 16
    with pytest.raises(Exception, match="no source port"):
        im.pin_port(net, "h1", "h3", "spine1", 5201, tries=4)
    im.link_up(net, "leaf1", "spine1")
    h = _flow(net, "h1", "h3", "spine1", 0.3, 10)
    assert h.received["packets"] == h.sent["packets"] > 0


def _capped_at(h: im.CrossTraffic, limit: float) -> None:
    """The flow got through at no more than ``limit`` Mbit/s (with a margin for
    timing), and at no less than half of what it could have: the limit, or what
    the sender managed to offer where a busy machine held it back (a CI run's
    flow reached 19.5 of 30; the sender's own rate tells that case from a limit
    set too low)."""
    rate = h.received["bytes"] * 8 / h.received["seconds"] / 1e6
    offered = h.sent["mbit"]
    assert 0.5 * min(limit, offered) <= rate <= 1.25 * limit, (rate, h.sent)


def test_rate_limit_caps_throughput(net: Network) -> None:
    im.rate_limit(net, "leaf2", "h3", 20)  # no profile there: a single HTB class
    _capped_at(_flow(net, "h1", "h3", "spine1", 1.5, 60), 20)
    im.apply_profile(net, SwitchPolicy())
    im.rate_limit(net, "leaf2", "h3", 30)  # with the profile: its HTB root rate
    _capped_at(_flow(net, "h1", "h3", "spine2", 1.5, 80), 30)
    # above the profile's own rate HTB's class ceilings would keep the old rate:
    # refused (before, it changed 1:1 and the link stayed where it was)
    with pytest.raises(ValueError, match=r"above the .* Mbit/s of the profile"):
        im.rate_limit(net, "leaf2", "h3", 1_000_000)
    installed = SwitchPolicy().link_rate_mbit  # back up to the profile's rate: allowed
    im.rate_limit(net, "leaf2", "h3", installed)


def test_cross_traffic_pinned_to_spine(net: Network) -> None:
    s1, s2 = _tx(net, "spine1", "leaf2"), _tx(net, "spine2", "leaf2")
    h = _flow(net, "h2", "h4", "spine2", 1.0, 30)
    assert h.received["packets"] == h.sent["packets"] > 1000
    assert _tx(net, "spine2", "leaf2") - s2 >= h.sent["packets"]
    # spine1 saw at most the pin_port probes of other candidate ports
    assert _tx(net, "spine1", "leaf2") - s1 < h.sent["packets"] // 10


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def test_cli_up_ready_then_sigterm_removes() -> None:
    prefix = f"dlcpcli{os.getpid() % 100000}-"
    names = {f"{prefix}{n}" for n in Topology.default().nodes}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlcp.cli", "testbed", "up", "--prefix", prefix],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.strip() == "ready":
                break
        assert lines and lines[-1].strip() == "ready", "".join(lines) + proc.stderr.read()
        assert names <= _netns()
        assert any(f"{prefix}h1" in line and "10.215.0.2" in line for line in lines)
        # the live testbed holds its prefix: down refuses and kills nothing of it
        refused = subprocess.run(
            [sys.executable, "-m", "dlcp.cli", "testbed", "down", "--prefix", prefix],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "in use by a running testbed" in refused.stderr
        assert names <= _netns() and proc.poll() is None
        proc.terminate()
        assert proc.wait(timeout=20) == 0
        assert not names & _netns()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(
            [sys.executable, "-m", "dlcp.cli", "testbed", "down", "--prefix", prefix],
            capture_output=True,
            check=False,
        )
    assert not names & _netns()


def test_cli_down_removes_only_its_names() -> None:
    prefix = f"dlcpdn{os.getpid() % 100000}-"
    other = f"{prefix}x-not-a-node"
    subprocess.run(["ip", "netns", "add", f"{prefix}h1"], check=True)
    subprocess.run(["ip", "netns", "add", other], check=True)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "dlcp.cli", "testbed", "down", "--prefix", prefix],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "removed 1 namespaces" in out
        present = _netns()
        assert f"{prefix}h1" not in present
        assert other in present
    finally:
        for ns in (f"{prefix}h1", other):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
