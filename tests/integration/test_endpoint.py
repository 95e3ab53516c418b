"""``dlcp.io.Endpoint`` on real sockets between real processes.

Workers (``tests/integration/peers.py``) bind ephemeral ports and report them on
a ``ready`` line; nothing here sleeps for readiness. Every wait has a timeout,
every child is killed by its Popen handle in a ``finally``. Data is regenerated
from a seed on both sides, so a receiver checks every element against what was
sent: bit-exact where it arrived, zero where the loss report says it was lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dlcp.testbed import netns

from dlcp.errors import ConfigError, EndpointClosed, PeerTimeout, TransferFailed
from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.control import HELLO
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.wire import (
    DATA_HEADER_LEN,
    Abort,
    AbortReason,
    DataHeader,
    DType,
    Finish,
    Flags,
    Stop,
    TosMap,
    decode_data,
    encode_control,
    encode_data,
)
from tests.integration.peers import MB4, digest, make_data, transfer, workers

JOB = 0x2A7
KEY = bytes(range(32))
WRONG_KEY = bytes(range(1, 33))
IS_ROOT = os.geteuid() == 0
MARGIN = 1.5  # seconds an error may come after the configured timeout

root_only = pytest.mark.skipif(not IS_ROOT, reason="needs root")


def plan(rank: int, ops: list[dict[str, Any]], *, timeout: float = 15.0,
         protocol: dict[str, Any] | None = None, key: bytes | None = None,
         host: str = "127.0.0.1", **config: Any) -> dict[str, Any]:
    return {"rank": rank, "world_size": 2, "job": JOB, "host": host,
            "key": key.hex() if key else None, "config": {"timeout": timeout, **config},
            "protocol": protocol or {}, "ops": ops, "wait_timeout": 30.0}


def send(msg: int, *, to: int = 1, kind: str = "float32", n: int = MB4, seed: int | None = None,
         p: float = 0.0, step: int = 0, layers: int = 8) -> dict[str, Any]:
    return {"op": "send", "to": to, "msg": msg, "step": step, "kind": kind, "n": n,
            "seed": msg * 1000 + step if seed is None else seed, "p": p, "layers": layers}


def recv(msg: int, *, src: int = 0, kind: str = "float32", n: int = MB4,
         seed: int | None = None, step: int = 0) -> dict[str, Any]:
    return {"op": "recv", "src": src, "msg": msg, "step": step, "kind": kind, "n": n,
            "seed": msg * 1000 + step if seed is None else seed}


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"], f"{result['error']}: {result['message']}"
    return result


def assert_exact(rx: dict[str, Any], tx: dict[str, Any], op: dict[str, Any]) -> None:
    """The receiver got exactly what the sender sent (and the parent regenerates)."""
    ok(rx), ok(tx)
    want, _ = make_data(op["kind"], op["n"], op["seed"])
    assert rx["report"]["lost_elems"] == 0, (rx["report"], tx["report"])
    assert rx["report"]["lost_ranges"] == []
    assert rx["mismatched_outside_lost"] == 0, (rx["mismatch_sample"], rx["report"], op)
    assert rx["sha256"] == tx["sha256"] == digest(want)


def assert_within_bound(rx: dict[str, Any], p: float) -> None:
    """Completed within the bound; exact where received, zero-filled where lost;
    only drop-eligible chunks lost (protected ones are always recovered)."""
    ok(rx)
    rep = rx["report"]
    assert rep["lost_fraction"] <= p
    assert rx["lost_mask_elems"] == rep["lost_elems"] == rep["msg_elems"] - rep["received_elems"]
    assert rx["mismatched_outside_lost"] == 0
    assert rx["nonzero_in_lost"] == 0
    assert sum(rep["lost_chunks"][0::2]) == 0, f"protected chunks lost: {rep['lost_chunks']}"


def dlcp_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dlcp")]


class LocalStore:
    """An in-process ``store=`` that the test fills with a worker's address."""

    def __init__(self) -> None:
        self._known: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: str | bytes) -> None:
        with self._cond:
            self._known[key] = value.encode() if isinstance(value, str) else value
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._known, 10.0):
                raise KeyError(key)
            return self._known[key]

    def add(self, rank: int, address: str) -> None:
        self.set(f"dlcp/{JOB}/addr/{rank}", address)


@contextlib.contextmanager
def local_endpoint(rank: int = 0, **config: Any) -> Iterator[tuple[Endpoint, LocalStore]]:
    store = LocalStore()
    protocol = config.pop("protocol", ProtocolConfig())
    ep = Endpoint(rank, store=store, world_size=2, job=JOB,
                  config=EndpointConfig(protocol=protocol, **config))
    try:
        yield ep, store
    finally:
        ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"


# ----------------------------------------------------------------------------- 1. exact


@pytest.mark.parametrize("kind,n", [("float32", MB4), ("float16", 2 * MB4), ("bfloat16", 2 * MB4)])
def test_lossless_transfer_between_processes_is_bit_exact(tmp_path: Path, kind: str,
                                                          n: int) -> None:
    op = send(1, kind=kind, n=n, step=3)
    tx, rx = transfer([plan(0, [op]), plan(1, [recv(1, kind=kind, n=n, step=3)])], tmp_path)
    assert_exact(rx["results"][0], tx["results"][0], op)
    assert rx["results"][0]["dtype"] == {"float32": "float32", "float16": "float16",
                                         "bfloat16": "uint16"}[kind]
    assert rx["results"][0]["n"] == n
    assert rx["stats"]["rejected"] == {}
    assert tx["results"][0]["report"]["acknowledged_elems"] == n
    assert tx["threads_after_close"] == rx["threads_after_close"] == []


# ----------------------------------------------------------------------------- 2. emulated


def test_bounded_loss_transfer_under_emulated_loss(tmp_path: Path) -> None:
    bounded, exact = send(1, p=0.05), send(2, p=0.0)
    tx, rx = transfer(
        [plan(0, [bounded, exact]),
         plan(1, [recv(1), recv(2)], emulated_loss=0.02, emulated_loss_seed=11)],
        tmp_path)
    assert_within_bound(rx["results"][0], 0.05)
    assert rx["results"][0]["report"]["lost_elems"] > 0  # 2 % loss, 80 % drop-eligible
    assert_exact(rx["results"][1], tx["results"][1], exact)  # p = 0: retransmitted
    assert rx["results"][1]["report"]["retransmitted_chunks"] > 0
    stats = rx["stats"]
    assert stats["emulated_loss"] == 0.02 and stats["emulated_loss_dropped"] > 0
    assert "EMULATED" in (tmp_path / "rank1.stderr").read_text()
    assert tx["stats"]["emulated_loss"] == 0.0 and tx["stats"]["emulated_loss_dropped"] == 0


# ----------------------------------------------------------------------------- 3. kernel


@pytest.mark.root
@pytest.mark.skipif(bool(netns.missing_tools(loss=True, offloads=True)),
                    reason=f"needs {netns.missing_tools(loss=True, offloads=True)}")
def test_transfer_under_kernel_loss_in_namespaces(tmp_path: Path) -> None:
    bounded, exact = send(1, p=0.05), send(2, p=0.0)
    with netns.netns_pair(subnet="10.213.41") as pair:
        pair.set_offloads(on=False)  # real MTU-sized packets, each dropped on its own
        pair.set_loss(pair.ns_b, 2)
        plans = [plan(0, [bounded, exact], host=pair.addr_a),
                 plan(1, [recv(1), recv(2)], host=pair.addr_b)]
        prefixes = [pair.exec_argv(pair.ns_a, []), pair.exec_argv(pair.ns_b, [])]
        tx, rx = transfer(plans, tmp_path, prefixes=prefixes)
        dropped = pair.dropped(pair.ns_b)
    assert dropped > 0, "the nftables rule dropped nothing: the test proves nothing"
    assert_within_bound(rx["results"][0], 0.05)
    assert_exact(rx["results"][1], tx["results"][1], exact)
    assert rx["results"][1]["report"]["retransmitted_chunks"] > 0
    assert rx["stats"]["emulated_loss_dropped"] == 0


# ----------------------------------------------------------------------------- 4. concurrent


def test_eight_messages_each_way_at_once(tmp_path: Path) -> None:
    kinds = ["float32", "float16", "bfloat16", "uint8"]
    ops: list[list[dict[str, Any]]] = [[], []]
    sent: dict[tuple[int, int, int], dict[str, Any]] = {}
    for me in (0, 1):
        other = 1 - me
        for i in range(8):
            op = send(i, to=other, step=i % 3, kind=kinds[i % 4], n=50_000 + 37_001 * i,
                      seed=100 * me + i, layers=1 + i)
            sent[(me, op["step"], i)] = op
            ops[me].append(op)
    for me in (0, 1):
        other = 1 - me
        for i in reversed(range(8)):  # posted in the other order than they are sent
            op = sent[(other, i % 3, i)]
            ops[me].append(recv(i, src=other, step=op["step"], kind=op["kind"], n=op["n"],
                                seed=op["seed"]))
    out = transfer([plan(0, ops[0]), plan(1, ops[1])], tmp_path)
    for me in (0, 1):
        other = 1 - me
        results = out[me]["results"]
        for i in range(8):
            rx = results[8 + (7 - i)]
            op = sent[(other, i % 3, i)]
            assert_exact(rx, out[other]["results"][i], op)


def test_message_that_arrives_before_recv_is_kept(tmp_path: Path) -> None:
    """The receiver posts recv only after the sender's future completed: the
    message was buffered, acknowledged (STOP to a peer it never looked up), and
    is handed over intact."""
    op = send(5, step=9, n=300_000)
    with workers([plan(0, [op]), plan(1, [{"op": "wait", "line": "now"},
                                         recv(5, step=9, n=300_000)])], tmp_path) as (a, b):
        a.say("go"), b.say("go")
        tx = a.results(20)
        ok(tx["results"][0])
        b.say("now")
        rx = b.results(20)
        assert_exact(rx["results"][0], tx["results"][0], op)
        assert a.finish() == b.finish() == []


# ----------------------------------------------------------------------------- 5. death


def _check_failure(exc: BaseException, *, peer: int, step: int, msg: int) -> None:
    text = str(exc)
    assert isinstance(exc, TransferFailed), repr(exc)
    assert f"rank {peer}" in text, text
    assert f"(step {step}, msg {msg})" in text, text


def test_peer_killed_before_sending(tmp_path: Path) -> None:
    timeout = 3.0
    with local_endpoint(timeout=timeout) as (ep, store), \
            workers([plan(1, [send(4, to=0, step=2)])], tmp_path,
                    extra_peers={0: ep.address.encode()}) as (child,):
        assert child.address is not None
        store.add(1, child.address)
        fut = ep.recv(src=1, msg=4, step=2)
        child.kill()
        assert child.proc.returncode == -signal.SIGKILL
        t0 = time.monotonic()
        exc = fut.exception(timeout=timeout + 5)
        elapsed = time.monotonic() - t0
        assert exc is not None
        _check_failure(exc, peer=1, step=2, msg=4)
        assert isinstance(exc, PeerTimeout)
        assert elapsed < timeout + MARGIN


def _wait_for(predicate: Any, what: str, timeout: float = 10.0) -> None:
    """Poll an observable condition (not a readiness sleep: it must become true)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


# the paced message takes ~1 s: long enough to be killed in the middle
SLOW = {"pacer_options": {"initial_rate": 4e6, "max_rate": 4e6, "min_rate": 1e6}}


def test_sender_killed_mid_transfer(tmp_path: Path) -> None:
    timeout = 3.0
    child_plan = plan(1, [send(1, to=0, n=1000), {"op": "await"}, send(2, to=0)],
                      protocol=SLOW)
    with local_endpoint(timeout=timeout) as (ep, store), \
            workers([child_plan], tmp_path, extra_peers={0: ep.address.encode()}) as (child,):
        assert child.address is not None
        store.add(1, child.address)
        first, second = ep.recv(src=1, msg=1), ep.recv(src=1, msg=2)
        child.say("go")
        first.result(timeout=10)
        base = ep.stats()["datagrams_in"]
        _wait_for(lambda: ep.stats()["datagrams_in"] > base + 20, "part of message 2")
        assert not second.done()
        child.kill()
        t0 = time.monotonic()
        exc = second.exception(timeout=timeout + 5)
        elapsed = time.monotonic() - t0
        assert exc is not None
        _check_failure(exc, peer=1, step=0, msg=2)
        assert elapsed < timeout + MARGIN
        # later operations with the dead peer fail at once, and say which message
        late = ep.recv(src=1, msg=3).exception(timeout=timeout + 5)
        assert late is not None
        _check_failure(late, peer=1, step=0, msg=3)
        x, _ = make_data("float32", 1000, 0)
        late_send = ep.send(x, to=1, msg=9).exception(timeout=timeout + 5)
        assert late_send is not None
        _check_failure(late_send, peer=1, step=0, msg=9)


def test_receiver_killed_mid_transfer(tmp_path: Path) -> None:
    timeout = 3.0
    child_plan = plan(1, [recv(1, n=1000, seed=1), recv(2, seed=2)])
    with local_endpoint(timeout=timeout, protocol=ProtocolConfig(**SLOW)) as (ep, store), \
            workers([child_plan], tmp_path, extra_peers={0: ep.address.encode()}) as (child,):
        assert child.address is not None
        store.add(1, child.address)
        child.say("go")
        ep.send(make_data("float32", 1000, 1)[0], to=1, msg=1).result(timeout=10)
        base = ep.stats()["packets_out"]
        second = ep.send(make_data("float32", MB4, 2)[0], to=1, msg=2)
        _wait_for(lambda: ep.stats()["packets_out"] > base + 20, "part of message 2 sent")
        assert not second.done()
        child.kill()
        t0 = time.monotonic()
        exc = second.exception(timeout=timeout + 5)
        elapsed = time.monotonic() - t0
        assert exc is not None
        _check_failure(exc, peer=1, step=0, msg=2)
        assert elapsed < timeout + MARGIN


def test_message_the_sender_gave_up_on_before_recv() -> None:
    """The sender times out and aborts a message the receiver has not asked for
    yet: the receiver's later recv fails at once, naming the peer and message."""
    store = LocalStore()
    a = Endpoint(0, store=store, world_size=2, job=JOB,
                 config=EndpointConfig(protocol=ProtocolConfig(**SLOW), timeout=1.0))
    b = Endpoint(1, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=5))
    try:
        b.stats()  # b exists and has published its address
        fut = a.send(make_data("float32", 4 * MB4, 0)[0], to=1, msg=8, step=4)
        assert isinstance(fut.exception(timeout=5), PeerTimeout)  # 16 MB at 4 MB/s
        _wait_for(lambda: b.stats()["control_in"] > 0, "the ABORT to reach the receiver")
        t0 = time.monotonic()
        exc = b.recv(src=0, msg=8, step=4).exception(timeout=5)
        assert time.monotonic() - t0 < 1.0
        assert exc is not None
        _check_failure(exc, peer=0, step=4, msg=8)
    finally:
        a.close()
        b.close()
    assert dlcp_threads() == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_crashed_io_thread_fails_calls_instead_of_hanging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dlcp.proto.session import Session

    def boom(self: Session, *, now: float) -> None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(Session, "handle_timer", boom)
    with silent_peer(listen=True) as addr:
        ep = Endpoint(0, {1: addr}, job=JOB, config=EndpointConfig(timeout=30))
        try:
            first = ep.send(make_data("float32", 10_000, 0)[0], to=1, msg=1)
            exc = first.exception(timeout=5)  # the send arms a timer, the timer crashes
            assert isinstance(exc, TransferFailed) and "I/O thread failed" in str(exc)
            later = ep.recv(src=1, msg=2)
            assert isinstance(later.exception(timeout=2), EndpointClosed)
            with pytest.raises(EndpointClosed):
                ep.stats()
        finally:
            ep.close()
    assert dlcp_threads() == []


# ----------------------------------------------------------------------------- 6. silence


@contextlib.contextmanager
def silent_peer(listen: bool) -> Iterator[tuple[str, int, int]]:
    """Ports nobody answers on: a UDP socket never read, and a TCP socket that is
    bound but not listening (connections refused) or listening but never accepting."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        udp.bind(("127.0.0.1", 0))
        tcp.bind(("127.0.0.1", 0))
        if listen:
            tcp.listen(1)
        yield "127.0.0.1", udp.getsockname()[1], tcp.getsockname()[1]
    finally:
        udp.close()
        tcp.close()


@pytest.mark.parametrize("what", ["send_refused", "send_unanswered", "recv"])
def test_peer_that_never_answers(what: str) -> None:
    timeout = 2.0
    with silent_peer(listen=what == "send_unanswered") as addr:
        ep = Endpoint(0, {1: addr}, job=JOB, config=EndpointConfig(timeout=timeout))
        try:
            t0 = time.monotonic()
            if what == "recv":
                fut: Any = ep.recv(src=1, msg=6, step=5)
            else:
                fut = ep.send(make_data("float32", 100_000, 0)[0], to=1, msg=6, step=5)
            exc = fut.exception(timeout=timeout + 5)
            elapsed = time.monotonic() - t0
        finally:
            ep.close()
    assert exc is not None
    _check_failure(exc, peer=1, step=5, msg=6)
    if what != "send_refused":
        assert isinstance(exc, PeerTimeout)
    assert elapsed < timeout + MARGIN
    assert dlcp_threads() == []


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


def test_junk_flood_during_transfer(tmp_path: Path) -> None:
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

    with workers([plan(0, ops_tx), plan(1, ops_rx)], tmp_path) as (a, b):
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
    caused = sent + control_caused
    assert rx["stats"]["empty_datagrams"] > 0
    for reason in set(caused) - {"empty"}:
        # every kind of junk was counted under its reason, and never more often
        # than it was sent: no genuine packet was rejected alongside it
        assert 0 < rejected.get(reason, 0) <= caused[reason], (reason, rejected, caused)
    assert set(rejected) <= set(caused), rejected


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
        out.append(("auth_failed", encode_data(h, payload, key=WRONG_KEY)))
        out.append(("auth_required", encode_data(h, payload)))
        tampered = bytearray(encode_data(h, bytes(chunk_bytes), key=KEY))
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
                                   key=WRONG_KEY)
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
    assert rejected.get("auth_required", 0) > 0
    assert rejected.get("auth_failed", 0) > 0
    assert rejected["auth_failed"] <= sent["auth_failed"] + 1  # + the forged ABORT
    assert set(rejected) <= {"auth_failed", "auth_required"}


def test_endpoints_with_different_keys_cannot_talk(tmp_path: Path) -> None:
    timeout = 3.0
    plans = [plan(0, [send(1, n=200_000)], protocol=AUTH, key=KEY, timeout=timeout),
             plan(1, [recv(1, n=200_000)], protocol=AUTH, key=WRONG_KEY, timeout=timeout)]
    tx, rx = transfer(plans, tmp_path, timeout=timeout + 10)
    for side, peer in ((tx, 1), (rx, 0)):
        res = side["results"][0]
        assert not res["ok"]
        assert "PeerTimeout" in res["bases"], res
        assert f"rank {peer}" in res["message"] and "(step 0, msg 1)" in res["message"]
        assert res["elapsed"] < timeout + MARGIN
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


# ----------------------------------------------------------------------------- 9. DSCP/ECN


ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def _open_capture() -> socket.socket:
    try:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except (PermissionError, OSError, AttributeError) as exc:
        pytest.skip(f"cannot capture packets here (AF_PACKET): {exc}")
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    s.bind(("lo", 0))
    s.settimeout(0.05)
    return s


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


@pytest.mark.root
@root_only
@pytest.mark.parametrize("gso", ["off", "auto"])
def test_tos_byte_on_the_wire_follows_each_packets_class(tmp_path: Path, gso: str) -> None:
    cap = _open_capture()
    frames: list[bytes] = []
    stop = threading.Event()

    def capture() -> None:
        while not stop.is_set():
            try:
                frame, addr = cap.recvfrom(1 << 17)
            except TimeoutError:
                continue
            if addr[2] == PACKET_OUTGOING:
                frames.append(frame)

    op = send(1, n=MB4, layers=8)
    try:
        with workers([plan(0, [op], gso=gso), plan(1, [recv(1)])], tmp_path) as (a, b):
            assert b.address is not None
            port = int(b.address.split()[1])
            thread = threading.Thread(target=capture)
            thread.start()
            try:
                a.say("go"), b.say("go")
                tx, rx = a.results(30), b.results(30)
            finally:
                stop.set()
                thread.join(timeout=10)
            assert a.finish() == b.finish() == []
    finally:
        cap.close()
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


# ----------------------------------------------------------------------------- 10. config


def test_config_from_env() -> None:
    with pytest.raises(ConfigError, match="DLCP_TIMEOUT"):
        EndpointConfig.from_env({"DLCP_TIMEOUT": "abc"})
    with pytest.raises(ConfigError, match="DLCP_FOO"):
        EndpointConfig.from_env({"DLCP_FOO": "1"})
    with pytest.raises(ConfigError, match="host"):
        EndpointConfig.from_env({"DLCP_HOST": "not-an-address"})
    with pytest.raises(ConfigError, match="host"):
        EndpointConfig(host="300.1.2.3")
    with pytest.raises(ConfigError, match="n_paths"):
        EndpointConfig.from_env({"DLCP_N_PATHS": "0"})
    with pytest.raises(ConfigError, match="DLCP_AUTHENTICATE"):
        EndpointConfig.from_env({"DLCP_AUTHENTICATE": "perhaps"})
    with pytest.raises(ConfigError, match="emulated_loss"):
        EndpointConfig.from_env({"DLCP_EMULATED_LOSS": "1.5"})
    with pytest.raises(ConfigError, match="timeout"):
        EndpointConfig.from_env({"DLCP_TIMEOUT": "-1"})

    cfg = EndpointConfig.from_env({"DLCP_N_PATHS": "4", "DLCP_TIMEOUT": "2.5",
                                   "DLCP_EMULATED_LOSS": "0.01", "DLCP_JOB": "7",
                                   "DLCP_DEFAULT_FILL": "previous", "PATH": "/x"})
    assert cfg.protocol.n_paths == 4
    assert cfg.timeout == 2.5 and cfg.emulated_loss == 0.01
    assert cfg.protocol.default_fill.value == "previous"
    assert EndpointConfig.from_env({"DLCP_TIMEOUT": "9"}, timeout=1.0).timeout == 1.0  # args win
    assert EndpointConfig.from_env({}) == EndpointConfig()


def test_endpoint_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("DLCP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("DLCP_TIMEOUT", "abc")
    with pytest.raises(ConfigError, match="DLCP_TIMEOUT"):
        Endpoint(0, {1: ("127.0.0.1", 9, 9)})
    monkeypatch.setenv("DLCP_TIMEOUT", "4")
    monkeypatch.setenv("DLCP_N_PATHS", "4")
    with Endpoint(0, {1: ("127.0.0.1", 9, 9)}) as ep:
        assert ep.config.protocol.n_paths == 4 and ep.config.timeout == 4.0
    assert dlcp_threads() == []


# ----------------------------------------------------------------------------- 11. close


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_close_releases_sockets_threads_and_fails_what_is_pending() -> None:
    before = _fds()
    store = LocalStore()
    a = Endpoint(0, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=5))
    b = Endpoint(1, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=5))
    ports = [(e.address.data_port, e.address.control_port) for e in (a, b)]
    try:
        x, _ = make_data("float32", 200_000, 1)
        rfut = b.recv(src=0, msg=1)
        a.send(x, to=1, msg=1).result(timeout=10)
        assert digest(rfut.result(timeout=10).data) == digest(x)
        pending = b.recv(src=0, msg=2)  # never sent: close must fail it
        assert not pending.done()
    finally:
        b.close()
        a.close()
    assert isinstance(pending.exception(timeout=5), EndpointClosed)
    assert dlcp_threads() == []
    assert _fds() == before, "file descriptors left open after close()"

    # the same ports bind again at once
    for data_port, control_port in ports:
        with Endpoint(0, {1: ("127.0.0.1", 9, 9)}, job=JOB,
                      config=EndpointConfig(data_port=data_port, control_port=control_port)):
            pass
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", data_port))

    # after close: everything fails with EndpointClosed, close() again is harmless
    with pytest.raises(EndpointClosed):
        a.send(x, to=1, msg=3).result(timeout=5)
    with pytest.raises(EndpointClosed):
        a.recv(src=1, msg=3).result(timeout=5)
    with pytest.raises(EndpointClosed):
        a.stats()
    a.close()
    assert dlcp_threads() == []


def test_close_fails_a_pending_send() -> None:
    with silent_peer(listen=True) as addr:
        ep = Endpoint(0, {1: addr}, job=JOB, config=EndpointConfig(timeout=30))
        try:
            fut = ep.send(make_data("float32", 100_000, 0)[0], to=1, msg=1)
            _wait_for(lambda: ep.stats()["packets_out"] > 0, "the send to start")
        finally:
            t0 = time.monotonic()
            ep.close()
        assert time.monotonic() - t0 < 2.0
        assert isinstance(fut.exception(timeout=5), EndpointClosed)
    assert dlcp_threads() == []
