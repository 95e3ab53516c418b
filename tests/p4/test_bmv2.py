"""The DLCP P4 program on a real BMv2 switch (``simple_switch``, configured through
its thrift CLI): LPM routing, per-packet ECMP spraying of DLCP packets against
per-flow hashing of other traffic, class -> queue mapping and dequeue order,
selective drop under a filled queue, counters, loss injection.

Rig: namespace ``<prefix>sw`` runs the switch on ports 1-4 (``p1``..``p4``); their
veth peers ``h1``..``h4`` sit in namespace ``<prefix>h``, where this test opens raw
packet sockets (from a thread that joined the namespace). Crafted frames (scapy,
``dlcp.inspect`` layers) go in on one port; what comes out is read on all four.
A "marker" frame sent last to every port tells when the switch is done: frames of
one queue leave in order, so every frame before the marker has left.

Needs root and the p4lang binaries (simple_switch, simple_switch_CLI with the
thrift module); skipped with the reason otherwise.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from dlcp.inspect import DLCPData
from testbed.bmv2 import Bmv2Switch, bmv2_switch, in_netns, missing_bmv2, program_paths
from testbed.netns import run_prefix

MISSING = missing_bmv2()
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (BMv2 switch)"),
]

PORTS = (1, 2, 3, 4)
SW_MAC = {p: f"02:00:00:00:00:0{p}" for p in PORTS}  # the switch's MAC on port p
HOST_MAC = {p: f"02:00:00:00:01:0{p}" for p in PORTS}  # the neighbour behind port p
SENDER = 4  # frames enter on this port
SRC_IP = "10.0.4.1"
MARKER_DST = {1: "10.0.1.250", 2: "10.0.2.100", 3: "10.0.3.250", 4: "10.0.4.250"}
MARKER_UDP_PORT = 9

# DLCP priority class -> queue, and DSCP 8c -> queue c (spec §7 defaults)
CLASS_TO_QUEUE = {0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 6, 7: 7}
DSCP_TO_QUEUE = {8 * c: c for c in range(8)}
# queue -> drop threshold (packets); queue 4 deliberately has none
THRESHOLDS = {2: 4, 3: 8}
QUEUE_DEPTH = 1000

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4

ING = "DlcpIngress"
EGR = "DlcpEgress"
FORWARDED = f"{EGR}.selective_drop.forwarded"
DROPPED = f"{EGR}.selective_drop.dropped_selective"
EGRESS_PORT = f"{EGR}.port_counters.egress_port"
INGRESS_PORT = f"{ING}.port_counters.ingress_port"


def table_commands() -> list[str]:
    """The switch configuration, as simple_switch_CLI commands."""
    lpm = f"table_add {ING}.routing.ipv4_lpm"
    # queues deep enough for the tests' bursts (BMv2's default is 64 packets); the
    # selective-drop thresholds are far below
    cmds = [f"set_queue_depth {QUEUE_DEPTH}"]
    for p in PORTS:
        cmds.append(
            f"{lpm} {ING}.routing.set_next_hop 10.0.{p}.0/24 => {p} {SW_MAC[p]} {HOST_MAC[p]}"
        )
    # a longer prefix inside port 2's /24
    cmds.append(f"{lpm} {ING}.routing.set_next_hop 10.0.2.128/25 => 3 {SW_MAC[3]} {HOST_MAC[3]}")
    # ECMP: group 7 = ports 3, 4; group 9 = ports 1, 2, 4
    cmds.append(f"{lpm} {ING}.routing.set_ecmp_group 10.9.0.0/16 => 7 2")
    cmds.append(f"{lpm} {ING}.routing.set_ecmp_group 10.8.0.0/16 => 9 3")
    member = f"table_add {ING}.ecmp.ecmp_member {ING}.ecmp.set_member_next_hop"
    for group, ports in ((7, (3, 4)), (9, (1, 2, 4))):
        for i, p in enumerate(ports):
            cmds.append(f"{member} {group} {i} => {p} {SW_MAC[p]} {HOST_MAC[p]}")
    for prio, q in CLASS_TO_QUEUE.items():
        cmds.append(
            f"table_add {ING}.queueing.dlcp_class_to_queue {ING}.queueing.set_queue {prio} => {q}"
        )
    for dscp, q in DSCP_TO_QUEUE.items():
        cmds.append(
            f"table_add {ING}.queueing.dscp_to_queue {ING}.queueing.set_queue {dscp} => {q}"
        )
    for q, depth in THRESHOLDS.items():
        cmds.append(
            f"table_add {EGR}.selective_drop.drop_threshold "
            f"{EGR}.selective_drop.set_threshold {q} => {depth}"
        )
    return cmds


# --- frames ------------------------------------------------------------------------------

_ids = itertools.count(1)


def ip_header(dst: str, *, dscp: int = 0, ecn: int = 0, ttl: int = 64, proto_id: int = 0) -> IP:
    return IP(src=SRC_IP, dst=dst, tos=(dscp << 2) | ecn, ttl=ttl, id=proto_id or next(_ids))


def ether(port: int = SENDER) -> Ether:
    return Ether(src=HOST_MAC[port], dst=SW_MAC[port])


def dlcp_frame(
    dst: str,
    *,
    prio: int = 0,
    drop: int = 0,
    seq: int = 0,
    sport: int = 40000,
    payload: bytes = bytes(range(16)),
) -> bytes:
    """A DLCP data datagram with DSCP/ECN set as the sender does (spec §7)."""
    n = len(payload) // 4
    dlcp = DLCPData(
        job=1, step=7, msg=3, seq=seq, offset=seq * n, msg_elems=65536 * n, src=4,
        prio=prio, drop=drop, mag=5, bound=10, path=0, data=payload,
    )  # fmt: skip
    ip = ip_header(dst, dscp=8 * prio, ecn=0 if drop else 2)
    return bytes(ether() / ip / UDP(sport=sport, dport=9400) / dlcp)


def udp_frame(dst: str, *, sport: int = 5555, dport: int = 5000, dscp: int = 0) -> bytes:
    return bytes(ether() / ip_header(dst, dscp=dscp) / UDP(sport=sport, dport=dport) / (b"x" * 32))


def marker_frame(port: int, nonce: int, dscp: int) -> bytes:
    ip = ip_header(MARKER_DST[port], dscp=dscp)
    udp = UDP(sport=MARKER_UDP_PORT, dport=MARKER_UDP_PORT)
    return bytes(ether() / ip / udp / f"marker {nonce:08d}".encode())


def is_marker(frame: bytes, nonce: int) -> bool:
    pkt = Ether(frame)
    return (
        UDP in pkt
        and pkt[UDP].dport == MARKER_UDP_PORT
        and bytes(pkt[UDP].payload) == f"marker {nonce:08d}".encode()
    )


def dlcp_seq(frame: bytes) -> int:
    return int(Ether(frame)[DLCPData].seq)


# --- the rig -----------------------------------------------------------------------------


@dataclass
class Rig:
    sw: Bmv2Switch
    socks: dict[int, socket.socket]
    nonces: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def drain(self) -> None:
        for s in self.socks.values():
            while select.select([s], [], [], 0)[0]:
                s.recv(65535)

    def send(self, frames: Sequence[bytes], port: int = SENDER) -> None:
        for f in frames:
            self.socks[port].send(f)

    def exchange(
        self,
        frames: Sequence[bytes],
        *,
        marker_dscp: int = 0,
        timeout: float = 30.0,
        drain: bool = True,
    ) -> dict[int, list[bytes]]:
        """Send ``frames`` on port SENDER, then a marker to every port (in the queue of
        ``marker_dscp``); the frames each port emitted before its marker, in order.
        ``drain``: first discard whatever the sockets hold."""
        if drain:
            self.drain()
        nonce = next(self.nonces)
        self.send(frames)
        self.send([marker_frame(p, nonce, marker_dscp) for p in PORTS])
        got: dict[int, list[bytes]] = {p: [] for p in PORTS}
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        by_fd = {s.fileno(): p for p, s in self.socks.items()}
        while len(done) < len(PORTS):
            left = deadline - time.monotonic()
            if left <= 0:
                self.sw.check_alive()
                raise AssertionError(
                    f"no marker from ports {sorted(set(PORTS) - done)} within {timeout} s "
                    f"(received so far: { {p: len(v) for p, v in got.items()} })"
                )
            ready, _, _ = select.select(list(self.socks.values()), [], [], left)
            for s in ready:
                port = by_fd[s.fileno()]
                data, addr = s.recvfrom(65535)
                if addr[2] == PACKET_OUTGOING:
                    continue  # our own transmission on this interface
                if is_marker(data, nonce):
                    done.add(port)
                elif port not in done:
                    got[port].append(data)
        return got

    def counters(self, name: str, indices: Sequence[int]) -> dict[int, tuple[int, int]]:
        return self.sw.counters(name, indices)


def _ip(*argv: str) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed: {proc.stderr.strip()}")


def _raw_socket(iface: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return s


@contextmanager
def make_rig(json_path: Path, log_dir: Path) -> Iterator[Rig]:
    prefix = run_prefix()
    ns_sw, ns_h = f"{prefix}sw", f"{prefix}h"
    created: list[str] = []
    with ExitStack() as stack:
        try:
            for ns in (ns_sw, ns_h):
                _ip("netns", "add", ns)
                created.append(ns)
                # no IPv6 chatter (router solicitations, MLD) on the rig's links
                _ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
                _ip("netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
                _ip("-n", ns, "link", "set", "lo", "up")  # the switch's thrift port
            for p in PORTS:
                _ip("-n", ns_h, "link", "add", f"h{p}", "address", HOST_MAC[p], "type", "veth",
                    "peer", "name", f"p{p}", "netns", ns_sw)  # fmt: skip
                _ip("-n", ns_h, "link", "set", f"h{p}", "up")
                _ip("-n", ns_sw, "link", "set", f"p{p}", "up")
            sw = stack.enter_context(
                bmv2_switch(
                    {p: f"p{p}" for p in PORTS},
                    ns=ns_sw,
                    json_path=json_path,
                    log_dir=log_dir,
                    name=f"{prefix}sw",
                )
            )
            sw.cli(*table_commands())
            socks = {p: in_netns(ns_h, lambda p=p: _raw_socket(f"h{p}")) for p in PORTS}
            for s in socks.values():
                stack.callback(s.close)
            rig = Rig(sw, socks)
            rig.exchange([])  # readiness: every port forwards
            yield rig
        finally:
            stack.close()  # switch and sockets before their namespaces
            for ns in created:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    json_path, _p4info = program_paths()
    with make_rig(json_path, tmp_path_factory.mktemp("bmv2")) as r:
        yield r


def deltas(
    rig: Rig, name: str, indices: Sequence[int], before: dict[int, tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    now = rig.counters(name, indices)
    return {i: (now[i][0] - before[i][0], now[i][1] - before[i][1]) for i in indices}


# --- routing -----------------------------------------------------------------------------


def test_lpm_routing_rewrites_and_drops(rig: Rig) -> None:
    cases = {
        "10.0.1.5": 1,
        "10.0.2.5": 2,
        "10.0.2.200": 3,  # the /25 wins over port 2's /24
        "10.0.3.5": 3,
        "10.7.0.1": None,  # no route
    }
    frames = [dlcp_frame(dst, seq=i) for i, dst in enumerate(cases)]
    tcp = bytes(ether() / ip_header("10.0.1.7") / TCP(sport=1234, dport=80, flags="S"))
    icmp = bytes(ether() / ip_header("10.0.2.9") / ICMP() / b"ping")
    ttl1 = bytes(ether() / ip_header("10.0.1.6", ttl=1) / UDP(dport=5000) / b"x")
    bad = Ether(udp_frame("10.0.1.8"))
    bad[IP].chksum = (Ether(bytes(bad))[IP].chksum + 1) & 0xFFFF
    arp = bytes(Ether(src=HOST_MAC[SENDER], dst="ff:ff:ff:ff:ff:ff", type=0x0806) / (b"\0" * 28))
    got = rig.exchange([*frames, tcp, icmp, ttl1, bytes(bad), arp])

    received = {p: [Ether(f) for f in got[p]] for p in PORTS}
    by_dst = {pkt[IP].dst: (p, pkt) for p in PORTS for pkt in received[p]}
    # exactly the routable frames came out, each once, on its port
    assert sorted(by_dst) == sorted(["10.0.1.5", "10.0.2.5", "10.0.2.200", "10.0.3.5",
                                     "10.0.1.7", "10.0.2.9"])  # fmt: skip
    assert sum(len(v) for v in received.values()) == 6
    for dst, port in [*((d, p) for d, p in cases.items() if p), ("10.0.1.7", 1), ("10.0.2.9", 2)]:
        out_port, pkt = by_dst[dst]
        assert out_port == port, dst
        assert (pkt.src, pkt.dst) == (SW_MAC[port], HOST_MAC[port]), dst
        assert pkt[IP].ttl == 63, dst
        fresh = IP(bytes(pkt[IP]))
        sent_sum = fresh.chksum
        del fresh.chksum
        assert IP(bytes(fresh)).chksum == sent_sum, f"{dst}: IPv4 checksum not updated"
    # DLCP header and payload cross untouched
    for i, dst in enumerate(d for d, p in cases.items() if p):
        sent = Ether(frames[i])
        assert bytes(by_dst[dst][1][UDP]) == bytes(sent[UDP]), dst
    assert TCP in by_dst["10.0.1.7"][1] and ICMP in by_dst["10.0.2.9"][1]


# --- ECMP --------------------------------------------------------------------------------


def _ports_of(got: dict[int, list[bytes]]) -> dict[int, int]:
    return {p: len(v) for p, v in got.items() if v}


def test_ecmp_sprays_dlcp_per_packet(rig: Rig) -> None:
    n = 300
    # one 5-tuple for all: only per-packet choice can spread them
    got = rig.exchange([dlcp_frame("10.9.0.1", seq=i) for i in range(n)])
    counts = _ports_of(got)
    assert set(counts) == {3, 4} and sum(counts.values()) == n, counts
    assert min(counts.values()) > 60, f"not sprayed per packet: {counts}"  # mean 150, sd 8.7
    got = rig.exchange([dlcp_frame("10.8.0.1", seq=i) for i in range(n)])
    counts = _ports_of(got)
    assert set(counts) == {1, 2, 4} and sum(counts.values()) == n, counts
    assert min(counts.values()) > 40, f"not sprayed per packet: {counts}"  # mean 100, sd 8.2
    # every member of each group saw traffic: per-packet order across paths is free
    seqs = sorted(dlcp_seq(f) for p in (1, 2, 4) for f in got[p])
    assert seqs == list(range(n))


def test_ecmp_keeps_other_flows_on_one_path(rig: Rig) -> None:
    # a DLCP control datagram (STOP: ver_type 0x12, 16-byte header, 4-byte body) on
    # the DLCP port: not a data header, so it is hashed per flow like any UDP
    control = bytes.fromhex("12000001000000070003000400040000") + (4).to_bytes(4, "big")
    stop = bytes(ether() / ip_header("10.9.0.1") / UDP(sport=40000, dport=9400) / Raw(control))
    for flow in (
        [udp_frame("10.9.0.1", sport=5555)] * 100,
        [bytes(ether() / ip_header("10.9.0.1") / TCP(sport=33000, dport=443) / b"y")] * 50,
        [stop] * 50,
    ):
        counts = _ports_of(rig.exchange(flow))
        assert len(counts) == 1 and sum(counts.values()) == len(flow), counts
    # many flows spread over both members, each flow on one
    flows = [udp_frame("10.9.0.1", sport=1000 + i) for i in range(64)]
    got = rig.exchange(flows + flows)
    port_of: dict[int, set[int]] = {}
    for p, frames in got.items():
        for f in frames:
            port_of.setdefault(int(Ether(f)[UDP].sport), set()).add(p)
    assert len(port_of) == 64
    assert all(len(ports) == 1 for ports in port_of.values()), "a flow took two paths"
    assert {p for ports in port_of.values() for p in ports} == {3, 4}


# --- queues ------------------------------------------------------------------------------


def test_class_and_dscp_to_queue(rig: Rig) -> None:
    queues = list(range(8))
    before = rig.counters(FORWARDED, queues)
    frames = [dlcp_frame("10.0.1.5", prio=p, seq=10 * p + i) for p in range(8) for i in range(5)]
    frames += [udp_frame("10.0.1.6", dscp=40)] * 3  # CS5 -> queue 5
    frames += [udp_frame("10.0.1.6", dscp=46)] * 2  # EF: not mapped -> queue 0
    got = rig.exchange(frames)  # + 4 markers, DSCP 0 -> queue 0
    assert len(got[1]) == len(frames)
    want = {q: 0 for q in queues}
    for q in CLASS_TO_QUEUE.values():
        want[q] += 5
    want[5] += 3
    want[0] += 2 + len(PORTS)
    assert {q: d[0] for q, d in deltas(rig, FORWARDED, queues, before).items()} == want


def test_dequeue_order_follows_queue_priority(rig: Rig) -> None:
    """Queue 0 of port 1 limited to 10 packets/s: class-7 packets (queue 7) sent
    after class-0 packets overtake them; class-1 packets (also queue 0) do not."""
    rig.sw.cli("set_queue_rate 10 1 0")
    try:
        low = [dlcp_frame("10.0.1.5", prio=0, seq=i) for i in range(5)]
        high = [dlcp_frame("10.0.1.5", prio=7, seq=100 + i) for i in range(5)]
        order = [dlcp_seq(f) for f in rig.exchange(low + high)[1]]
        assert sorted(order) == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]
        assert [s for s in order if s < 100] == [0, 1, 2, 3, 4]
        assert [s for s in order if s >= 100] == [100, 101, 102, 103, 104]
        assert max(order.index(s) for s in range(100, 105)) < order.index(1), order
        same_queue = [dlcp_frame("10.0.1.5", prio=1, seq=100 + i) for i in range(5)]
        order = [dlcp_seq(f) for f in rig.exchange(low + same_queue)[1]]
        assert order == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]
    finally:
        rig.sw.cli("set_queue_rate 0 1 0")


def test_selective_drop_under_a_filled_queue(rig: Rig) -> None:
    """Port 2, class 3 -> queue 2 (threshold 4) drained at 20 packets/s: a burst of
    10 protected packets fills it past the threshold, so the 20 drop-eligible
    packets behind them are dropped in egress; protected packets and other traffic
    in the same queue all leave. With the queue empty again, drop-eligible packets
    pass; queue 4 has no threshold and drops nothing."""
    q, dscp = CLASS_TO_QUEUE[3], 8 * 2
    rig.sw.cli("set_queue_rate 20 2 2", "set_queue_rate 20 2 4")
    try:
        before_fwd = rig.counters(FORWARDED, [q, 4])
        before_drop = rig.counters(DROPPED, [q, 4])
        protected = [dlcp_frame("10.0.2.5", prio=3, seq=i) for i in range(10)]
        eligible = [dlcp_frame("10.0.2.5", prio=3, drop=1, seq=100 + i) for i in range(20)]
        other = [udp_frame("10.0.2.6", dscp=dscp, sport=7000 + i) for i in range(5)]
        late = [dlcp_frame("10.0.2.5", prio=3, seq=200 + i) for i in range(5)]
        got = rig.exchange(protected + eligible + other + late, marker_dscp=dscp)[2]
        dlcp_seqs = [dlcp_seq(f) for f in got if DLCPData in Ether(f)]
        assert dlcp_seqs == [*range(10), *range(200, 205)], "protected packets lost or reordered"
        assert sum(1 for f in got if DLCPData not in Ether(f)) == 5, "non-DLCP traffic dropped"
        drop = deltas(rig, DROPPED, [q, 4], before_drop)
        fwd = deltas(rig, FORWARDED, [q, 4], before_fwd)
        assert drop[q][0] == 20
        assert drop[q][1] == sum(len(f) for f in eligible)
        assert fwd[q][0] == 10 + 5 + 5 + len(PORTS)  # + markers (DSCP 16 -> queue 2)

        # an empty queue: depths 0..2 stay within the threshold
        before = rig.counters(DROPPED, [q])
        few = [dlcp_frame("10.0.2.5", prio=3, drop=1, seq=300 + i) for i in range(3)]
        got = rig.exchange(few, marker_dscp=dscp)[2]
        assert [dlcp_seq(f) for f in got] == [300, 301, 302]
        assert deltas(rig, DROPPED, [q], before)[q][0] == 0

        # queue 4 (class 5) has no threshold entry: nothing is dropped
        burst = [dlcp_frame("10.0.2.5", prio=5, drop=i % 2, seq=400 + i) for i in range(20)]
        got = rig.exchange(burst, marker_dscp=8 * 4)[2]
        assert sorted(dlcp_seq(f) for f in got) == list(range(400, 420))
        assert deltas(rig, DROPPED, [4], before_drop)[4][0] == 0
    finally:
        rig.sw.cli("set_queue_rate 0 2 2", "set_queue_rate 0 2 4")


# --- counters ----------------------------------------------------------------------------


def test_port_counters_count_packets_and_bytes(rig: Rig) -> None:
    before_in = rig.counters(INGRESS_PORT, list(PORTS))
    before_out = rig.counters(EGRESS_PORT, list(PORTS))
    frames = [
        dlcp_frame("10.0.1.5", payload=bytes(64)),
        dlcp_frame("10.0.2.5", payload=bytes(128)),
        dlcp_frame("10.0.2.5", payload=bytes(1024)),
        udp_frame("10.0.3.5"),
        udp_frame("10.7.0.1"),  # dropped in ingress: counted in, not out
    ]
    markers = [marker_frame(p, 0, 0) for p in PORTS]  # the exchange's markers have this size
    got = rig.exchange(frames)
    d_in = deltas(rig, INGRESS_PORT, list(PORTS), before_in)
    d_out = deltas(rig, EGRESS_PORT, list(PORTS), before_out)
    sent = frames + markers
    assert d_in[SENDER] == (len(sent), sum(len(f) for f in sent))
    assert all(d_in[p] == (0, 0) for p in PORTS if p != SENDER)
    for p in PORTS:
        out = [*got[p], markers[p - 1]]
        assert d_out[p] == (len(out), sum(len(f) for f in out)), f"port {p}"


# --- golden vectors ----------------------------------------------------------------------


def test_golden_data_vectors_cross_the_switch(rig: Rig) -> None:
    """Every golden data datagram is recognised as DLCP (queued by its class) and
    leaves byte for byte."""
    import json

    vectors = json.loads(
        (Path(__file__).resolve().parents[1] / "golden" / "wire_vectors.json").read_text()
    )["data"]
    queues = list(range(8))
    before = rig.counters(FORWARDED, queues)
    frames = [
        bytes(ether() / ip_header("10.0.3.9") / UDP(sport=40000, dport=9400) / Raw(
            bytes.fromhex(v["hex"])
        ))
        for v in vectors
    ]  # fmt: skip
    got = rig.exchange(frames)[3]
    # classes sit in different queues, so the order across classes may change
    assert sorted(bytes(Ether(f)[UDP].payload) for f in got) == sorted(
        bytes.fromhex(v["hex"]) for v in vectors
    )
    want = {q: 0 for q in queues}
    for v in vectors:
        want[CLASS_TO_QUEUE[v["header"]["prio"]]] += 1
    want[0] += len(PORTS)  # markers
    assert {q: d[0] for q, d in deltas(rig, FORWARDED, queues, before).items()} == want


# --- loss injection (the -DDLCP_LOSS_INJECTION build) ------------------------------------


@pytest.fixture(scope="module")
def loss_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    json_path, _p4info = program_paths(loss_injection=True)
    with make_rig(json_path, tmp_path_factory.mktemp("bmv2-loss")) as r:
        yield r


def test_loss_injection_drops_and_counts(loss_rig: Rig) -> None:
    reg = f"{ING}.loss.drop_per_65536"
    injected = f"{ING}.loss.injected"
    assert loss_rig.sw.register(reg, 0) == 0
    n = 400
    got = loss_rig.exchange([dlcp_frame("10.0.1.5", seq=i) for i in range(n)])
    assert len(got[1]) == n and loss_rig.sw.counter(injected, 0)[0] == 0
    loss_rig.sw.cli(f"register_write {reg} 0 16384")  # 25 %
    try:
        # markers may be dropped too: send the data, then markers until all arrive
        before = loss_rig.sw.counter(injected, 0)[0]
        arrived = loss_rig.sw.counter(INGRESS_PORT, SENDER)[0]
        loss_rig.drain()
        loss_rig.send([dlcp_frame("10.0.1.5", seq=i) for i in range(n)])
        deadline = time.monotonic() + 30
        while loss_rig.sw.counter(INGRESS_PORT, SENDER)[0] - arrived < n:  # all went through
            assert time.monotonic() < deadline, "the switch did not take all packets in"
        loss_rig.sw.cli(f"register_write {reg} 0 0")
        got = loss_rig.exchange([], drain=False)
        dropped = loss_rig.sw.counter(injected, 0)[0] - before
        received = sum(1 for f in got[1] if DLCPData in Ether(f))
        assert received + dropped == n
        assert 40 < dropped < 160, dropped  # mean 100, sd 8.7
    finally:
        loss_rig.sw.cli(f"register_write {reg} 0 0")


def test_rig_cleans_up_its_namespaces(tmp_path: Path) -> None:
    json_path, _p4info = program_paths()
    with make_rig(json_path, tmp_path) as r:
        assert r.sw.ns is not None
        names = [r.sw.ns, r.sw.ns.removesuffix("sw") + "h"]
        assert set(names) <= set(os.listdir("/run/netns"))
        proc = r.sw.proc
    assert proc is not None and proc.poll() is not None
    assert not any(n in os.listdir("/run/netns") for n in names)
