"""``dlcp.io.Endpoint`` and what crosses the wire: junk and forged datagrams, keyed
authentication, and the DSCP/ECN byte of each packet class (see test_endpoint.py
for how the worker processes are run)."""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.control import HELLO
from dlcp.proto.batch import decode_data
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.control import Abort, AbortReason, Finish, Stop, encode_control
from dlcp.proto.wire import DATA_HEADER_LEN, DataHeader, DType, Flags, TosMap, encode_data
from tests.io.endpoint_helpers import (
    JOB,
    KEY,
    MARGIN,
    WRONG_KEY,
    LocalStore,
    LoopbackCapture,
    assert_exact,
    local_endpoint,
    plan,
    recv,
    root_only,
    send,
)
from tests.io.peers import MB4, digest, make_data, transfer, workers

pytestmark = pytest.mark.integration

# ----------------------------------------------------------------------------- 7. junk


def _header(**fields: Any) -> DataHeader:
    base = {"job": JOB, "step": 0, "msg": 1, "seq": 0, "offset": 0, "msg_elems": 1000,
            "payload_len": 400, "src": 0}
    return DataHeader(**{**base, **fields})


def _junk_datagrams() -> list[tuple[str, bytes]]:
    """(reason the receiver must give, datagram): garbage, truncated, foreign and
    valid-looking-but-wrong datagrams. Those with the real message's key (rank 0,
    step 0, msg 1) have a geometry no real chunk can have; one is exactly as long
    as a real full-size datagram, so the kernel and the driver batch it with them."""
    rng = np.random.default_rng(3)
    good = encode_data(_header(), bytes(400))
    full = DATA_HEADER_LEN + ProtocolConfig().chunk_bytes
    bad_flags = bytearray(good)
    bad_flags[1] |= 0x80
    return [
        ("empty", b""),
        ("truncated", good[:20]),
        ("bad_version", b"\x21" + rng.bytes(200)),
        ("truncated", encode_control(Stop(0, 1, 0, received_elems=5), job=JOB)),  # 20 bytes
        ("bad_type", encode_control(Finish(0, 1, 0, round=0, total_chunks=1, protected_chunks=1,
                                           class_chunks=(1,) + (0,) * 15), job=JOB)),
        ("bad_type", b"\x1f" + rng.bytes(60)),
        ("wrong_job", encode_data(_header(job=JOB ^ 1), bytes(400))),
        ("bad_field", bytes(bad_flags)),
        ("length_mismatch", good[:-3]),
        ("out_of_bounds", encode_data(_header(offset=900, msg_elems=950), bytes(400))),
        ("unknown_peer", encode_data(_header(src=9), bytes(400))),
        ("geometry", encode_data(
            _header(seq=3, offset=7, msg_elems=MB4, flags=Flags.LAST), bytes(400))),
        ("geometry", encode_data(
            _header(seq=5, offset=7, msg_elems=MB4, payload_len=full - DATA_HEADER_LEN,
                    flags=Flags.LAST), bytes(full - DATA_HEADER_LEN))),
    ]


def _control_junk(host: str, port: int) -> Counter[str]:
    """Connect junk to the control port; the session reasons it causes."""
    caused: Counter[str] = Counter()
    conns = []
    for hello in (b"GET / HTTP/1.0\r\n\r\n", HELLO.pack(b"DLCP", JOB ^ 1, 0), b""):
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(hello)
        conns.append(s)
    # a well-formed hello from a rank that is no peer, then frames that are not
    # control messages: each is rejected by reason, the connection stays up
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(HELLO.pack(b"DLCP", JOB, 9))
    for reason, frame in (("bad_version", b"\x32" + bytes(20)), ("truncated", b"\x12\x00"),
                          ("wrong_job", encode_control(Stop(0, 1, 0, received_elems=1),
                                                       job=JOB ^ 1))):
        s.sendall(struct.pack(">I", len(frame)) + frame)
        caused[reason] += 1
    conns.append(s)
    for c in conns:
        c.close()
    return caused


#: the junk the kernel filter drops (it breaks a header rule of spec §6.1); the
#: rest passes every header rule and reaches the session
_HEADER_JUNK = frozenset(
    {"empty", "truncated", "bad_version", "bad_type", "wrong_job", "bad_field",
     "length_mismatch", "out_of_bounds"}
)


@pytest.mark.parametrize("kernel_filter", [True, False], ids=["kernel-filter", "no-kernel-filter"])
def test_junk_flood_during_transfer(tmp_path: Path, kernel_filter: bool) -> None:
    ops_tx = [send(1, n=MB4), send(2, n=MB4), send(3, step=1, n=MB4)]
    ops_rx = [recv(1), recv(2), recv(3, step=1)]
    junk = _junk_datagrams()
    sent: Counter[str] = Counter()
    stop = threading.Event()
    errors: list[BaseException] = []

    def blast(addr: tuple[str, int]) -> None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                while not stop.is_set():
                    for reason, datagram in junk:
                        s.sendto(datagram, addr)
                        sent[reason] += 1
                    # ~3,000 a second with the transfer's packets: well below what a
                    # receiver can inspect (~10,000 a second), so the junk cannot crowd
                    # real packets out of its socket buffer (a flood beyond that is a
                    # denial of service no receiver survives unscathed)
                    stop.wait(0.004)
        except BaseException as exc:
            errors.append(exc)

    plans = [plan(0, ops_tx), plan(1, ops_rx, kernel_filter=kernel_filter)]
    with workers(plans, tmp_path) as (a, b):
        assert b.address is not None
        host, data_port, control_port = b.address.split()
        blaster = threading.Thread(target=blast, args=((host, int(data_port)),))
        blaster.start()
        try:
            control_caused = _control_junk(host, int(control_port))
            before = sum(sent.values())
            a.say("go"), b.say("go")
            tx, rx = a.results(30), b.results(30)
            during = sum(sent.values()) - before
        finally:
            stop.set()
            blaster.join(timeout=10)
        assert not errors, errors
        assert a.finish() == b.finish() == []
    for i, op in enumerate(ops_tx):
        assert_exact(rx["results"][i], tx["results"][i], op)
    assert during > 0, "no junk arrived while the transfer was running"
    rejected = rx["stats"]["rejected"]
    assert rx["stats"]["kernel_filter"] is kernel_filter
    reaching = sent  # the junk that reaches user space
    if kernel_filter:
        # the header junk never reached the socket's queue: counted in its kernel
        # drops only (with any datagram that found the buffer full: none at this rate)
        header_junk = sum(sent[r] for r in _HEADER_JUNK)
        assert 0 < rx["stats"]["socket_drops"] <= header_junk, (rx["stats"], sent)
        assert rx["stats"]["empty_datagrams"] == 0
        reaching = Counter({r: n for r, n in sent.items() if r not in _HEADER_JUNK})
    else:
        assert rx["stats"]["socket_drops"] == 0
        assert rx["stats"]["empty_datagrams"] > 0
    caused = reaching + control_caused
    for reason in set(reaching) - {"empty"}:
        # every kind of junk that reached user space was counted under its reason
        assert rejected.get(reason, 0) > 0, (reason, rejected, caused)
    for reason, count in rejected.items():
        # and never more often than it was sent: no genuine packet was rejected with it
        assert count <= caused[reason], (reason, rejected, caused)


# ----------------------------------------------------------------------------- 8. auth


AUTH = {"authenticate": True}


def _forgeries(n: int, chunk_bytes: int) -> list[tuple[str, bytes]]:
    """Data datagrams for the real message (rank 0, step 0, msg 1) with a real
    chunk's geometry, that would overwrite real data if they were accepted."""
    elems = chunk_bytes // 4
    out = []
    for seq in range(0, n // elems, 97):
        h = _header(seq=seq, offset=seq * elems, msg_elems=n, payload_len=chunk_bytes,
                    dtype=DType.FLOAT32)
        payload = b"\xff" * chunk_bytes
        out.append(("auth_failed", encode_data(h, payload, key=WRONG_KEY, nonce=seq)))
        out.append(("auth_required", encode_data(h, payload)))
        tampered = bytearray(encode_data(h, bytes(chunk_bytes), key=KEY, nonce=seq))
        tampered[DATA_HEADER_LEN + 5] ^= 0x01  # one payload bit after tagging
        out.append(("auth_failed", bytes(tampered)))
    return out


def test_authenticated_transfer_rejects_forgeries(tmp_path: Path) -> None:
    op = send(1, n=MB4, seed=77, layers=1)
    forged = _forgeries(MB4, ProtocolConfig(**AUTH).chunk_bytes)
    sent: Counter[str] = Counter()
    stop = threading.Event()

    def forge(addr: tuple[str, int]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not stop.is_set():
                for reason, datagram in forged:
                    s.sendto(datagram, addr)
                    sent[reason] += 1
                stop.wait(0.01)  # ~9,000 a second: a rate limit, not readiness

    plans = [plan(0, [op], protocol=AUTH, key=KEY),
             plan(1, [recv(1, seed=77)], protocol=AUTH, key=KEY)]
    with workers(plans, tmp_path) as (a, b):
        assert b.address is not None
        host, data_port, control_port = b.address.split()
        forger = threading.Thread(target=forge, args=((host, int(data_port)),))
        forger.start()
        # a forged ABORT of the message on the control channel, with the wrong key
        ctrl = socket.create_connection((host, int(control_port)), timeout=5)
        try:
            abort = encode_control(Abort(0, 1, 0, reason=AbortReason.CANCELLED), job=JOB,
                                   key=WRONG_KEY, nonce=1)
            ctrl.sendall(HELLO.pack(b"DLCP", JOB, 0) + struct.pack(">I", len(abort)) + abort)
            a.say("go"), b.say("go")
            tx, rx = a.results(30), b.results(30)
        finally:
            stop.set()
            forger.join(timeout=10)
            assert a.finish() == b.finish() == []
            ctrl.close()
    assert_exact(rx["results"][0], tx["results"][0], op)
    rejected = rx["stats"]["rejected"]
    # untagged forgeries never reach the socket's queue: its kernel filter drops them
    assert rx["stats"]["kernel_filter"]
    assert 0 < rx["stats"]["socket_drops"] <= sent["auth_required"], (rx["stats"], sent)
    assert rejected.get("auth_failed", 0) > 0  # (a tag only the session can check)
    assert rejected["auth_failed"] <= sent["auth_failed"] + 1  # + the forged ABORT
    assert set(rejected) <= {"auth_failed"}


def test_endpoints_with_different_keys_cannot_talk(tmp_path: Path) -> None:
    timeout = 3.0
    plans = [plan(0, [send(1, n=200_000)], protocol=AUTH, key=KEY, timeout=timeout),
             plan(1, [recv(1, n=200_000)], protocol=AUTH, key=WRONG_KEY, timeout=timeout)]
    tx, rx = transfer(plans, tmp_path, timeout=timeout + 10)
    for side, peer in ((tx, 1), (rx, 0)):
        res = side["results"][0]
        assert not res["ok"]
        assert f"rank {peer}" in res["message"] and "(step 0, msg 1)" in res["message"]
        assert res["elapsed"] < timeout + MARGIN
    # the receiver never hears from the sender: its data fails the tag check, and
    # its control connection the hello's proof (so the sender may learn of it early,
    # its connection closed, instead of at its timeout)
    assert "PeerTimeout" in rx["results"][0]["bases"], rx
    assert "PeerTimeout" in tx["results"][0]["bases"] or (
        "control connection to rank 1" in tx["results"][0]["message"]
    ), tx
    assert rx["stats"]["rejected"].get("auth_failed", 0) > 0


def test_unauthenticated_hello_cannot_cut_off_a_peer() -> None:
    """A stranger who says hello as rank 0 and hangs up is not rank 0 leaving: only the
    end of a connection that carried a message passing the session's checks (with
    authentication, a valid tag) counts as the peer going away."""
    store = LocalStore()
    cfg = EndpointConfig(protocol=ProtocolConfig(**AUTH), timeout=5)
    a = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg, key=KEY)
    b = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg, key=KEY)
    try:
        with socket.create_connection(("127.0.0.1", b.address.control_port), timeout=5) as s:
            s.sendall(HELLO.pack(b"DLCP", JOB, 0))  # "I am rank 0", then hang up
        b.stats(), b.stats()  # two trips through b's I/O thread: the hangup is handled
        x, _ = make_data("float32", 100_000, 5)
        rfut = b.recv(src=0, msg=1)
        a.send(x, to=1, msg=1).result(timeout=10)
        assert digest(rfut.result(timeout=10).data) == digest(x)
    finally:
        a.close()
        b.close()


def test_data_frames_on_the_control_channel_are_rejected() -> None:
    """Data travels over UDP only. A data frame on a control connection (one that
    said hello as rank 0, which anyone can without authentication) is counted and
    dropped, never delivered as rank 0's data; the real message then arrives."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=5)
    a = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg)
    b = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg)
    try:
        # a whole one-chunk message from "rank 0", as the session would accept it
        forged = encode_data(_header(msg_elems=100, flags=Flags.LAST), bytes(400))
        rfut = b.recv(src=0, msg=1)
        with socket.create_connection(("127.0.0.1", b.address.control_port), timeout=5) as s:
            s.sendall(HELLO.pack(b"DLCP", JOB, 0) + struct.pack(">I", len(forged)) + forged)
            deadline = time.monotonic() + 5
            while b.stats()["control_in"] < 1:  # until b's I/O thread has read the frame
                assert time.monotonic() < deadline, "the frame never reached rank 1"
                threading.Event().wait(0.002)  # (poll interval, not a readiness guess)
        assert b.stats()["control_rejected"] == 1
        assert not rfut.done()
        x, _ = make_data("float32", 100_000, 5)
        a.send(x, to=1, msg=1).result(timeout=10)
        assert digest(rfut.result(timeout=10).data) == digest(x)
    finally:
        a.close()
        b.close()


def test_a_connection_that_never_says_hello_is_dropped() -> None:
    """Each inbound control connection holds a descriptor: one that says nothing
    is closed after the endpoint's timeout (the client sees the end of stream)."""
    with local_endpoint(timeout=0.3) as (ep, _):
        with socket.create_connection(("127.0.0.1", ep.address.control_port), timeout=5) as s:
            t0 = time.monotonic()
            assert s.recv(1) == b""  # the endpoint closed it
            elapsed = time.monotonic() - t0
        assert 0.3 <= elapsed < 0.3 + 1.0 + MARGIN  # (the I/O thread wakes at least each second)


class _RefusingListener:
    """The control listener, but its accept() fails as when the process is out of
    file descriptors, while ``refuse`` is set (fault injection)."""

    def __init__(self, real: socket.socket) -> None:
        self.real, self.calls = real, 0
        self.refuse = threading.Event()
        self.refuse.set()

    def fileno(self) -> int:
        return self.real.fileno()

    def accept(self) -> tuple[socket.socket, Any]:
        self.calls += 1
        if self.refuse.is_set():
            raise OSError(errno.EMFILE, "Too many open files")
        return self.real.accept()

    def close(self) -> None:
        self.real.close()


def test_a_refused_accept_pauses_the_listener_instead_of_spinning() -> None:
    """A connection the kernel cannot hand over stays queued, so the listener stays
    readable: the I/O thread stops watching it for a while instead of retrying at
    every turn, and accepts again once it can."""
    with local_endpoint() as (ep, _):
        listener = _RefusingListener(ep._control.listener)
        ep._control.listener = listener  # type: ignore[assignment]
        with socket.create_connection(("127.0.0.1", ep.address.control_port), timeout=5) as s:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.5:  # half a second of refusals
                threading.Event().wait(0.01)
            assert 1 <= listener.calls <= 0.5 / 0.1 + 2, listener.calls  # ~one per pause
            assert ep._control.accept_error is not None
            listener.refuse.clear()
            s.sendall(HELLO.pack(b"DLCP", JOB, 1))
            deadline = time.monotonic() + 5
            while ep._control.accept_error is not None or not ep._control.inbound:
                assert time.monotonic() < deadline, "the connection was never accepted"
                threading.Event().wait(0.01)


# ----------------------------------------------------------------------------- 9. DSCP/ECN


def _dlcp_datagrams(frame: bytes, port: int) -> list[tuple[int, bytes]]:
    """(TOS, DLCP datagram) for each datagram of a captured IPv4/UDP frame to
    ``port`` (a GSO frame on loopback carries many, one after the other)."""
    ip = frame[14:]
    if frame[12:14] != b"\x08\x00" or len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
        return []
    ihl = (ip[0] & 0x0F) * 4
    if struct.unpack_from(">H", ip, ihl + 2)[0] != port:
        return []
    tos, payload, out = ip[1], ip[ihl + 8 :], []
    while len(payload) >= DATA_HEADER_LEN:
        size = DATA_HEADER_LEN + struct.unpack_from(">H", payload, 24)[0]
        size += 16 if payload[1] & Flags.AUTH else 0
        out.append((tos, payload[:size]))
        payload = payload[size:]
    return out


def _tcp_tos(frame: bytes, ports: set[int]) -> int | None:
    """The TOS byte of a captured IPv4/TCP frame from or to one of ``ports``."""
    ip = frame[14:]
    if frame[12:14] != b"\x08\x00" or len(ip) < 40 or ip[0] >> 4 != 4 or ip[9] != 6:
        return None
    ihl = (ip[0] & 0x0F) * 4
    src, dst = struct.unpack_from(">HH", ip, ihl)
    return ip[1] if src in ports or dst in ports else None


#: another job's traffic on loopback: UDP datagrams as fast as one process sends them,
#: to a socket of its own, until its stdin closes; "flooding" once it has begun
_FLOOD = """
import socket, sys, threading
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
def sink():
    while True:
        rx.recv(1 << 16)
threading.Thread(target=sink, daemon=True).start()
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data, to, said = bytes(1400), rx.getsockname(), False
while not done.is_set():
    for _ in range(200):
        try:
            tx.sendto(data, to)
        except OSError:
            pass
    if not said:
        print("flooding", flush=True)
        said = True
"""


@contextlib.contextmanager
def _busy_loopback(busy: bool) -> Iterator[None]:
    if not busy:
        yield
        return
    flood = subprocess.Popen([sys.executable, "-c", _FLOOD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert flood.stdout is not None and flood.stdout.readline() == "flooding\n"
        yield
    finally:
        assert flood.stdin is not None
        flood.stdin.close()
        flood.wait(timeout=30)


@pytest.mark.root
@root_only
@pytest.mark.parametrize(("gso", "busy"), [("off", False), ("auto", False), ("auto", True)])
def test_tos_byte_on_the_wire_follows_each_packets_class(
    tmp_path: Path, gso: str, busy: bool
) -> None:
    """Every data packet carries its class's TOS byte, and control packets the top
    class's. The capture keeps exactly this test's traffic (a kernel filter on the
    receiver's data port and both control ports, attached before it sees a frame)
    and reads until the transfer's results, then what is still queued: with other
    jobs on the machine the unfiltered capture's buffer filled with their frames, or
    its reader fell behind and was stopped first ("captured only 0 data packets");
    ``busy`` runs it beside another process flooding loopback."""
    # p > 0: with p = 0 nothing would be drop-eligible (a drop would be resent anyway)
    op = send(1, n=MB4, layers=8, p=0.05)
    with (
        _busy_loopback(busy),
        workers([plan(0, [op], gso=gso), plan(1, [recv(1)])], tmp_path) as (a, b),
    ):
        assert a.address is not None and b.address is not None
        port = int(b.address.split()[1])
        control_ports = tuple(int(w.address.split()[2]) for w in (a, b) if w.address)
        cap = LoopbackCapture(udp_dst=port, tcp_ports=control_ports)
        try:
            a.say("go"), b.say("go")
            tx, rx = a.results(30), b.results(30)
        finally:
            frames = cap.stop()
        assert a.finish() == b.finish() == []
    assert cap.drops == 0, f"the capture's buffer overflowed: {cap.drops} frames dropped"
    assert_exact(rx["results"][0], tx["results"][0], op)
    tos_map = TosMap()
    seen: Counter[tuple[int, bool]] = Counter()
    for frame in frames:
        for tos, datagram in _dlcp_datagrams(frame, port):
            h, _ = decode_data(datagram, job=JOB)
            assert tos == tos_map.tos(h.prio, h.drop), (h, hex(tos))
            seen[(h.prio, h.drop)] += 1
    assert sum(seen.values()) > 1000, f"captured only {sum(seen.values())} data packets"
    ecn = {tos_map.tos(prio, drop) & 0x3 for prio, drop in seen}
    assert ecn == {0b10, 0b00}, "both ECT(0) (protected) and Not-ECT (drop-eligible) expected"
    assert {prio for prio, _ in seen} == set(range(8)), "8 layers should use all 8 classes"
    # control traffic (FINISH one way, STOP back, the TCP handshake and ACKs) travels
    # in the highest class; the kernel owns a TCP packet's ECN bits
    control = [tos for frame in frames if (tos := _tcp_tos(frame, set(control_ports))) is not None]
    assert len(control) >= 4, f"captured only {len(control)} control packets"
    assert {tos >> 2 for tos in control} == {tos_map.dscp[7]}, sorted({hex(t) for t in control})
