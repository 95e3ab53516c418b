"""The controller against a real ``simple_switch_grpc`` running the committed DLCP
program: pipeline push, every entry of a leaf, a rejected duplicate with its
per-update error, counters. Skipped (with what is missing) without BMv2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import COMMITTED_JSON, COMMITTED_P4INFO, protos

from dlcp.switch.controller import configure_switch, fabric_config
from dlcp.switch.p4entries import P4Names
from dlcp.switch.policy import SwitchPolicy

pytestmark = pytest.mark.root


def _missing() -> list[str]:
    from testbed.bmv2 import missing_bmv2

    missing = missing_bmv2(grpc=True)
    if not COMMITTED_P4INFO.exists() or not COMMITTED_JSON.exists():
        missing.append("the compiled program (p4/bmv2/build)")
    return missing


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_configure_and_read_a_real_bmv2(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    protos()
    from dlcp.switch.p4info import P4InfoHelper
    from dlcp.switch.p4runtime import CounterValue, P4RuntimeClient, P4RuntimeWriteError
    from testbed.bmv2 import bmv2_switch
    from testbed.topology import Topology

    addr = f"127.0.0.1:{_free_port()}"
    entries = fabric_config(Topology.default(), SwitchPolicy())["leaf1"].entries
    with bmv2_switch({}, log_dir=tmp_path, grpc_addr=addr, thrift_port=_free_port()):
        configure_switch(addr, 0, COMMITTED_P4INFO, COMMITTED_JSON, entries, timeout=30)
        helper = P4InfoHelper.from_file(COMMITTED_P4INFO)
        with P4RuntimeClient(addr, 0, election_id=2, timeout=30) as c:
            routes = c.read([helper.table_entity(P4Names.IPV4_LPM)])
            assert len(routes) == 4
            members = c.read([helper.table_entity(P4Names.ECMP_MEMBER)])
            assert len(members) == 2
            assert len(c.read([helper.table_entity(P4Names.DROP_THRESHOLD)])) == 8
            # the device itself rejects a duplicate: the per-update error comes out
            with pytest.raises(P4RuntimeWriteError) as ei:
                c.write_entries(helper, entries[:2])
            assert [f.index for f in ei.value.failures] == [0, 1]
            assert all(f.code == "ALREADY_EXISTS" for f in ei.value.failures)
            assert "10.215.0.2/32" in str(ei.value)
            counters = c.read_counter(helper, P4Names.FORWARDED)
            assert counters == {q: CounterValue(0, 0) for q in range(8)}


def test_controller_entries_route_and_count_packets(tmp_path: Path) -> None:
    """spine1's entries on a BMv2 with two veth ports: a class-5 packet for h3 leaves
    on port 2 (leaf2) with spine1's MAC, in queue 5, and the counters read over
    P4Runtime say so."""
    missing = _missing()
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    protos()
    import os
    import subprocess
    import threading

    from scapy.all import IP, UDP, AsyncSniffer, Ether, Raw, sendp

    from dlcp.switch.p4info import P4InfoHelper
    from dlcp.switch.p4runtime import CounterValue, P4RuntimeClient
    from testbed.bmv2 import bmv2_switch
    from testbed.topology import Topology

    tag = f"sw{os.getpid() % 100000}"
    ns, outer = f"{tag}ns", [f"{tag}x1", f"{tag}x2"]

    def sh(*argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True)

    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        for i, ext in enumerate(outer, 1):
            sh("ip", "link", "add", f"{tag}p{i}", "type", "veth", "peer", "name", ext)
            sh("ip", "link", "set", f"{tag}p{i}", "netns", ns)
            sh("ip", "-n", ns, "link", "set", f"{tag}p{i}", "up")
            sh("ip", "link", "set", ext, "up")
        t = Topology.default()
        entries = fabric_config(t, SwitchPolicy())["spine1"].entries  # leaf1=1, leaf2=2
        addr = f"unix:{tmp_path}/p4rt.sock"
        ports = {1: f"{tag}p1", 2: f"{tag}p2"}
        with bmv2_switch(ports, log_dir=tmp_path, ns=ns, grpc_addr=addr, thrift_port=_free_port()):
            configure_switch(addr, 0, COMMITTED_P4INFO, COMMITTED_JSON, entries, timeout=30)
            # the capture stops at the 5th packet (or is stopped after 30 s); the packets
            # are sent once its socket is open (started_callback), not after a guessed delay
            capturing = threading.Event()
            sniff = AsyncSniffer(iface=outer[1], filter="udp", count=5,
                                 started_callback=capturing.set)  # fmt: skip
            sniff.start()
            assert capturing.wait(30), "the capture on the switch's port did not start"
            tos = SwitchPolicy().tos.tos(5, drop=False)
            pkt = (
                Ether(dst="02:dc:00:06:00:04")
                / IP(src=t.host_addr("h1"), dst=t.host_addr("h3"), tos=tos)
                / UDP(sport=5000, dport=7)
                / Raw(b"x" * 100)
            )
            sendp([pkt] * 5, iface=outer[0], verbose=False)
            sniff.join(timeout=30)
            got = sniff.stop() if sniff.running else sniff.results
            helper = P4InfoHelper.from_file(COMMITTED_P4INFO)
            with P4RuntimeClient(addr, 0, primary=False, timeout=30) as c:
                forwarded = c.read_counter(helper, P4Names.FORWARDED)
                egress = c.read_counter(helper, P4Names.EGRESS_PORT, 2)
        assert len(got) == 5
        assert got[0][Ether].src == "02:dc:00:06:00:05"  # spine1 towards leaf2
        assert got[0][Ether].dst == "02:dc:00:05:00:06"  # leaf2 towards spine1
        assert got[0][IP].ttl == pkt[IP].ttl - 1
        assert {q: v.packets for q, v in forwarded.items() if v.packets} == {5: 5}
        assert egress == {2: CounterValue(5, 5 * len(pkt))}
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for ext in outer:
            subprocess.run(["ip", "link", "del", ext], capture_output=True)
