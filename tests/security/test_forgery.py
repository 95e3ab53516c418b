"""Forgeries from an outsider who knows the job id (not the key), against live
endpoints on loopback, both send engines.

With authentication:

* forged data datagrams for the message in flight (right geometry, tagged with
  another key, or untagged) and control messages sent as datagrams to the data
  port: each rejected and counted, exactly as many as were sent: the tagged ones
  by the session (``auth_failed``: a kernel filter cannot check a tag), the
  others by the data socket's kernel filter (its drops), or with that filter off
  by the receive pre-filter under their reasons; the transfer completes bit-exact;
* forged STOP, ABORT, NACK, RATE and FINISH over TCP (a connection that says
  hello as the peer, with a proof made without the key): the connection is
  closed at its hello (``hellos_refused``), nothing after it is read, the
  sender's message is not reported delivered nor failed; it completes exactly
  once the real receiver asks for it;
* the same control messages with a wrong tag reach the session's checks (as
  they would on a connection that got past the hello): each rejected
  ``auth_failed``, nothing changes.

Without authentication the same outsider succeeds, as the startup warning says
(``dlcp.io.arguments``): forged data lands in the receiver's message, a forged
STOP ends a send as delivered that nobody received, a forged ABORT fails it.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import struct
from collections.abc import Iterator

import numpy as np
import pytest

from dlcp.errors import TransferFailed
from dlcp.io import Endpoint, EndpointConfig, native_receive
from dlcp.io.control import HELLO
from dlcp.io.peers import PeerAddress
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.control import (
    Abort,
    AbortReason,
    ControlMessage,
    Finish,
    Nack,
    RateFeedback,
    Stop,
    encode_control,
)
from dlcp.proto.session import DataBatch, Session
from tests.io.endpoint_helpers import LocalStore

JOB = 0x3C1
KEY = bytes(range(1, 33))
OUTSIDER_KEY = bytes(range(2, 34))  # what an outsider tags with: not the job's key
ENGINES = ["native", "python"]
N = 50_000  # float32 elements: a few dozen datagrams
STEP, MSG = 4, 2
FRAME = struct.Struct(">I")


def _config(engine: str, auth: bool, timeout: float = 10.0) -> EndpointConfig:
    return EndpointConfig(
        protocol=ProtocolConfig(authenticate=auth), timeout=timeout, engine=engine
    )


def _forged_data(n: int, *, key: bytes | None) -> list[bytes]:
    """Datagrams of message (STEP, MSG) from rank 0 to rank 1, all zeros, as a
    session of the outsider's makes them (the real geometry; tagged with
    ``key``, or untagged)."""
    s = Session(
        rank=0, job=JOB, config=ProtocolConfig(authenticate=key is not None), key=key, peers=(0, 1)
    )
    s.send_message(1, np.zeros(n, dtype=np.float32), step=STEP, msg=MSG, now=0.0)
    out: list[bytes] = []
    for item in s.datagrams_to_send(now=0.0, max_batches=10_000):
        if isinstance(item, DataBatch):
            raw, seg = bytes(item.data), item.segment_size
            out += [raw[i : i + seg] for i in range(0, len(raw), seg)]
    return out


def _control_forgeries(src: int) -> list[ControlMessage]:
    """One of each control message about (STEP, MSG), as rank ``src`` would send it."""
    return [
        Stop(STEP, MSG, src, received_elems=N),
        Abort(STEP, MSG, src, reason=AbortReason.CANCELLED, by_receiver=True),
        Nack(STEP, MSG, src, round=0, needed_elems=N, ranges=((0, 3),)),
        RateFeedback(STEP, MSG, src, bytes_per_s=1, interval_us=1000),
        Finish(
            STEP,
            MSG,
            src,
            round=0,
            total_chunks=1,
            protected_chunks=1,
            class_chunks=(1,) + (0,) * 15,
        ),
    ]


def _say_as(rank: int, port: int, frames: list[bytes], *, proof: bytes = b"") -> bytes:
    """Connect to a control port, say hello as ``rank`` (with ``proof`` after it),
    send ``frames``, and return what comes back until the other side closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            HELLO.pack(b"DLCP", JOB, rank)
            + proof
            + b"".join(FRAME.pack(len(f)) + f for f in frames)
        )
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(4096):  # b"": the endpoint closed the connection
            got += chunk
        return got


@pytest.fixture
def black_hole() -> Iterator[PeerAddress]:
    """A rank 1 that never answers: a UDP port nobody reads and a control port
    that only listens (its connections sit in the kernel's backlog)."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        udp.bind(("127.0.0.1", 0))
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(8)
        yield PeerAddress("127.0.0.1", udp.getsockname()[1], tcp.getsockname()[1])
    finally:
        udp.close()
        tcp.close()


def _sender(engine: str, auth: bool, peer: PeerAddress) -> Endpoint:
    return Endpoint(
        0, {1: peer}, world_size=2, job=JOB, config=_config(engine, auth), key=KEY if auth else None
    )


# ------------------------------------------------------------------ with authentication


@pytest.mark.parametrize("kernel_filter", [True, False], ids=["kernel-filter", "no-kernel-filter"])
@pytest.mark.parametrize("engine", ENGINES)
def test_forged_data_and_control_datagrams_are_rejected_and_counted(
    engine: str, kernel_filter: bool
) -> None:
    store = LocalStore()
    cfg = dataclasses.replace(_config(engine, True), kernel_filter=kernel_filter)
    tx = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg, key=KEY)
    rx = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg, key=KEY)
    wrong_tag = _forged_data(N, key=OUTSIDER_KEY)
    untagged = _forged_data(N, key=None)
    control = [
        encode_control(c, job=JOB, key=OUTSIDER_KEY, nonce=i)
        for i, c in enumerate(_control_forgeries(0))
    ]
    x = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    try:
        got = rx.recv(src=0, msg=MSG, step=STEP)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for d in wrong_tag + untagged + control:
                s.sendto(d, ("127.0.0.1", rx.address.data_port))
        # (queued ahead of the real data: handled by the time the message completes)
        report = tx.send(x, to=1, msg=MSG, step=STEP).result(timeout=30)
        received = got.result(timeout=30)
        stats = rx.stats()
    finally:
        tx.close()
        rx.close()
    assert np.array_equal(received.data, x)
    assert report is not None
    # (the receive loop verifies tags itself where it was built with libcrypto)
    assert stats["native_receive"] is native_receive.verifies_tags()
    if kernel_filter:  # untagged data and control datagrams never reach the socket
        assert stats["rejected"] == {"auth_failed": len(wrong_tag)}
        assert stats["socket_drops"] == len(untagged) + len(control)
    else:
        assert stats["rejected"] == {
            "auth_failed": len(wrong_tag),
            "auth_required": len(untagged),
            "bad_type": len(control),
        }
        assert stats["socket_drops"] == 0
    assert stats["peers_gone"] == {}


@pytest.mark.parametrize("engine", ENGINES)
def test_forged_control_over_tcp_is_refused_at_the_hello(
    engine: str, black_hole: PeerAddress
) -> None:
    tx = _sender(engine, True, black_hole)
    try:
        sent = tx.send(np.ones(N, dtype=np.float32), to=1, msg=MSG, step=STEP)
        frames = [
            encode_control(c, job=JOB, key=OUTSIDER_KEY, nonce=i)
            for i, c in enumerate(_control_forgeries(1))
        ]
        # a hello as rank 1 with a made-up nonce and tag: closed with nothing answered
        assert _say_as(1, tx.address.control_port, frames, proof=bytes(32)) == b""
        stats = tx.stats()  # (a trip through the I/O thread, after the refusal)
        assert not sent.done(), "a forged control message ended the send"
    finally:
        tx.close()
    assert stats["hellos_refused"] == 1
    assert stats["control_in"] == 0 and stats["rejected"] == {}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_send_under_forged_control_completes_exactly_once_asked_for(engine: str) -> None:
    store = LocalStore()
    tx = Endpoint(0, store=store, world_size=2, job=JOB, config=_config(engine, True), key=KEY)
    rx = Endpoint(1, store=store, world_size=2, job=JOB, config=_config(engine, True), key=KEY)
    x = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    try:
        sent = tx.send(x, to=1, msg=MSG, step=STEP)
        to_tx = [
            encode_control(c, job=JOB, key=OUTSIDER_KEY, nonce=i)
            for i, c in enumerate(_control_forgeries(1))
        ]
        to_rx = [
            encode_control(c, job=JOB, key=OUTSIDER_KEY, nonce=i)
            for i, c in enumerate(_control_forgeries(0))
        ]
        assert _say_as(1, tx.address.control_port, to_tx, proof=bytes(32)) == b""
        assert _say_as(0, rx.address.control_port, to_rx, proof=bytes(32)) == b""
        received = rx.recv(src=0, msg=MSG, step=STEP).result(timeout=30)
        assert sent.result(timeout=30) is not None
        tx_stats, rx_stats = tx.stats(), rx.stats()
    finally:
        tx.close()
        rx.close()
    assert np.array_equal(received.data, x)
    assert tx_stats["hellos_refused"] == rx_stats["hellos_refused"] == 1
    assert tx_stats["peers_gone"] == rx_stats["peers_gone"] == {}


def test_control_messages_with_a_wrong_tag_fail_the_sessions_check() -> None:
    """What a forged frame meets if it gets past the hello: the session verifies
    every control message's tag (spec §3) before acting on it."""
    session = Session(
        rank=0, job=JOB, config=ProtocolConfig(authenticate=True), key=KEY, peers=(0, 1)
    )
    session.send_message(1, np.ones(N, dtype=np.float32), step=STEP, msg=MSG, now=0.0)
    session.datagrams_to_send(now=0.0, max_batches=10_000)
    forged = _control_forgeries(1)
    for i, c in enumerate(forged):
        session.receive_datagram(encode_control(c, job=JOB, key=OUTSIDER_KEY, nonce=i), now=0.01)
        session.receive_datagram(encode_control(c, job=JOB), now=0.01)  # untagged
    assert session.stats.rejected == {"auth_failed": len(forged), "auth_required": len(forged)}
    assert session.next_event() is None  # nothing delivered, failed or changed


# ------------------------------------------------------------------ without authentication


def test_the_startup_warning_names_what_forgeries_do(
    caplog: pytest.LogCaptureFixture, black_hole: PeerAddress
) -> None:
    with caplog.at_level(logging.WARNING, logger="dlcp"):
        _sender("python", False, black_hole).close()
    warning = caplog.text
    assert "runs without authentication" in warning
    assert "inject data into its messages" in warning
    assert "forge control messages that end or stall its transfers" in warning


@pytest.mark.parametrize("engine", ENGINES)
def test_without_authentication_a_forged_stop_ends_a_send_nobody_received(
    engine: str, black_hole: PeerAddress
) -> None:
    tx = _sender(engine, False, black_hole)
    try:
        sent = tx.send(np.ones(N, dtype=np.float32), to=1, msg=MSG, step=STEP)
        _say_as(1, tx.address.control_port, [encode_control(_control_forgeries(1)[0], job=JOB)])
        assert sent.result(timeout=10) is not None  # "delivered": rank 1 never got a byte
    finally:
        tx.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_without_authentication_a_forged_abort_fails_a_send(
    engine: str, black_hole: PeerAddress
) -> None:
    tx = _sender(engine, False, black_hole)
    try:
        sent = tx.send(np.ones(N, dtype=np.float32), to=1, msg=MSG, step=STEP)
        _say_as(1, tx.address.control_port, [encode_control(_control_forgeries(1)[1], job=JOB)])
        with pytest.raises(TransferFailed):
            sent.result(timeout=10)
    finally:
        tx.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_without_authentication_forged_data_lands_in_the_message(engine: str) -> None:
    store = LocalStore()
    cfg = _config(engine, False)
    tx = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg)
    rx = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg)
    try:
        got = rx.recv(src=0, msg=MSG, step=STEP)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for d in _forged_data(N, key=None):
                s.sendto(d, ("127.0.0.1", rx.address.data_port))
        received = got.result(timeout=10)  # complete before rank 0 sent anything
    finally:
        tx.close()
        rx.close()
    assert not received.data.any()  # the outsider's zeros
