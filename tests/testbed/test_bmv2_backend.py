"""``dlcp testbed up --switch bmv2``: the leaf-spine testbed with BMv2 switches running
the DLCP P4 program, configured over P4Runtime by dlcp.switch.controller."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from dlcp.switch.policy import SwitchPolicy
from testbed import cli as testbed_cli
from testbed.bmv2 import Bmv2Error, missing_bmv2
from testbed.bmv2_backend import build_bmv2
from testbed.topology import Topology

MISSING = missing_bmv2(grpc=True)


def _policy(t: Topology) -> SwitchPolicy:
    policy = testbed_cli._policy("dlcp", t)
    assert isinstance(policy, SwitchPolicy)
    return policy


def test_missing_binaries_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    t = Topology.default()
    with (
        pytest.raises(Bmv2Error, match=r"--switch bmv2 needs .*simple_switch_grpc"),
        build_bmv2(t, _policy(t)),
    ):
        pass


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "mininet"], "--switch bmv2 needs --backend namespaces"),
        (["--profile", "fifo"], "--profile fifo is not available with it"),
    ],
)
def test_bmv2_option_conflicts(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlcp.cli", "testbed", "up", "--switch", "bmv2", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.root
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (BMv2 switch)")
def test_bmv2_fabric_forwards_and_sprays() -> None:
    t = Topology.default()
    prefix = "dlcpbm"
    with build_bmv2(t, _policy(t), prefix=prefix) as net:
        assert set(net.switches) == {*t.leaves, *t.spines}
        # Linux does not forward any more: only the switches do
        for r in net.switches:
            fwd = net.run(r, ["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip()
            assert fwd == "0", r
        # DLCP datagrams from h1 to h3 over both spines, per packet, one 5-tuple
        leaf = net.switches["leaf1"]
        uplinks = [p for nb, p in _ports(t, "leaf1").items() if nb in t.spines]
        before = leaf.counters("DlcpEgress.port_counters.egress_port", uplinks)
        n = 200
        send = (
            "import socket,struct\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "s.bind(('0.0.0.0',40000))\n"
            f"for i in range({n}):\n"
            "    hdr=struct.pack('!BBHIHHIIIHHBBBB',0x11,0,1,7,3,0,i,i*4,4*65536,16,0,"
            "(5<<5),0,10,0)\n"
            f"    s.sendto(hdr+bytes(16),('{net.host_addr('h3')}',9400))\n"
        )
        queue = _policy(t).queue_of(5)
        fwd_before = leaf.counter("DlcpEgress.selective_drop.forwarded", queue)[0]
        net.run("h1", [sys.executable, "-c", send])
        deadline = time.monotonic() + 30
        while True:  # until the leaf's counters show every datagram left it
            after = leaf.counters("DlcpEgress.port_counters.egress_port", uplinks)
            sent = {p: after[p][0] - before[p][0] for p in uplinks}
            if sum(sent.values()) >= n or time.monotonic() > deadline:
                break
        assert sum(sent.values()) >= n, sent
        assert min(sent.values()) > n // 5, f"DLCP not sprayed over the spines: {sent}"
        # class 5 went through its class's queue on the leaf
        assert leaf.counter("DlcpEgress.selective_drop.forwarded", queue)[0] - fwd_before >= n
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(f"{prefix}{node}" in present.split() for node in t.nodes)


def _ports(t: Topology, node: str) -> dict[str, int]:
    from dlcp.switch.controller import switch_ports

    return switch_ports(t, node)
