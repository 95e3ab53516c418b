"""A control connection reset between two live ranks reconnects instead of
marking the peer gone for good (before, one ``ss -K`` failed every later
transfer in both directions): the rank whose connection was reset opens a new
one when it next sends; the rank whose connection from the peer ended checks
that the peer's control port still answers. A peer whose process is gone is
still found gone at once."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.control import Inbound, LostPeer
from dlcp.io.control_in_waits import ControlInWaits
from dlcp.proto.config import ProtocolConfig
from tests.io.endpoint_helpers import IS_ROOT, JOB, KEY, LocalStore, closed_endpoint

pytestmark = pytest.mark.integration

X = np.arange(50_000, dtype=np.float32)


def _pair(auth: bool) -> tuple[Endpoint, Endpoint]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0, protocol=ProtocolConfig(authenticate=auth))
    key = KEY if auth else None
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg, key=key) for r in (0, 1))
    return a, b


def _exchange(a: Endpoint, b: Endpoint, msg: int) -> None:
    """A message each way, both exact."""
    got_b, got_a = b.recv(src=0, msg=msg), a.recv(src=1, msg=msg)
    sent = [a.send(X, to=1, msg=msg), b.send(X[::-1].copy(), to=0, msg=msg)]
    for fut in sent:
        fut.result(timeout=15)
    assert np.array_equal(got_b.result(timeout=15).data, X)
    assert np.array_equal(got_a.result(timeout=15).data, X[::-1])


def _ss_kill(a: Endpoint, b: Endpoint) -> None:
    """``ss -K`` every established control connection between the two (each end
    is destroyed; the other gets a reset)."""
    ports = [str(e.address.control_port) for e in (a, b)]
    expr = " or ".join(f"sport = :{p} or dport = :{p}" for p in ports)
    done = subprocess.run(["ss", "-K", "-t", "state", "established", f"( {expr} )"],
                          capture_output=True, text=True, timeout=10)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("127.0.0.1") >= 4, done.stdout  # both connections, both ends


def _close_from_the_test(a: Endpoint, b: Endpoint) -> None:
    """Shut each endpoint's outbound control connection down under its lock (the
    socket stays open, so its I/O thread is not disturbed): its peer reads the
    end, and its next send on it fails."""
    for e in (a, b):
        with e._lock:
            for sock in e._control.outbound.values():
                sock.shutdown(socket.SHUT_RDWR)


def _wait_for_the_ends(a: Endpoint, b: Endpoint, first: dict[int, set[socket.socket]]) -> None:
    """Until each endpoint's I/O thread has handled the end of the inbound
    connections it had (``first``, from before the kill)."""
    deadline = time.monotonic() + 10
    while any(first[e.rank] & set(e._control.inbound) for e in (a, b)):
        assert time.monotonic() < deadline, "an inbound end was never handled"
        time.sleep(0.005)  # (polling what the I/O threads did, not a readiness guess)


KILLS = {
    "ss -K": pytest.param(_ss_kill, marks=pytest.mark.skipif(
        not IS_ROOT or shutil.which("ss") is None, reason="needs root and ss")),
    "closed from the test": pytest.param(_close_from_the_test),
}  # fmt: skip


@pytest.mark.parametrize("kill", list(KILLS.values()), ids=list(KILLS))
@pytest.mark.parametrize("auth", [False, True], ids=["plain", "auth"])
def test_a_reset_control_connection_between_live_ranks_reconnects(kill: object, auth: bool) -> None:
    a, b = _pair(auth)
    try:
        _exchange(a, b, 1)  # connections both ways, each trusted
        with a._lock, b._lock:
            first = {e.rank: set(e._control.inbound) for e in (a, b)}
        assert all(first.values())
        kill(a, b)  # type: ignore[operator]
        _wait_for_the_ends(a, b, first)
        for msg in (2, 3, 4):  # later transfers, both ways
            _exchange(a, b, msg)
        assert a.stats()["peers_gone"] == {} and b.stats()["peers_gone"] == {}
    finally:
        a.close()
        b.close()


def test_a_peer_whose_process_is_gone_is_still_gone_at_once() -> None:
    """Its control port refuses the check: its receives fail at once, not at
    their timeout."""
    a, b = _pair(False)
    try:
        _exchange(a, b, 1)
        pending = b.recv(src=0, msg=2)
        started = time.monotonic()
        a.close()  # (its listener closes with it: the check is refused)
        with pytest.raises(Exception, match=closed_endpoint(0)):
            pending.result(timeout=8)
        assert time.monotonic() - started < 5  # far sooner than the 10 s timeout
        assert 0 in b.stats()["peers_gone"]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("kill", list(KILLS.values()), ids=list(KILLS))
def test_transfers_in_flight_when_the_connection_resets_complete(kill: object) -> None:
    """The reset lands while messages are on their way, both directions: what a
    reset connection lost (a FINISH, a STOP) is resent by the exchange's timers,
    and every transfer completes exactly."""
    a, b = _pair(True)
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB each way
    try:
        _exchange(a, b, 1)
        got_b, got_a = b.recv(src=0, msg=2), a.recv(src=1, msg=2)
        sent = [a.send(big, to=1, msg=2), b.send(big[::-1].copy(), to=0, msg=2)]
        kill(a, b)  # type: ignore[operator]
        for fut in sent:
            fut.result(timeout=20)
        assert np.array_equal(got_b.result(timeout=20).data, big)
        assert np.array_equal(got_a.result(timeout=20).data, big[::-1])
        _exchange(a, b, 3)
        assert a.stats()["peers_gone"] == {} and b.stats()["peers_gone"] == {}
    finally:
        a.close()
        b.close()


def test_a_receiver_that_answered_and_left_completes_the_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receiver sends its STOP once its message is whole and may close at once
    (the last step of a job). Its sender may not have read that STOP yet (a turn
    that holds control back behind a data backlog, a busy core) when it next
    sends the peer a control message (a FINISH again) and finds it gone: the
    STOP waiting unread counts first, and the send succeeds instead of failing
    with "connection refused". Here the sender's control reads are held back
    until it found the receiver gone: a control send to it failed, or the
    connection to it ended and its port refused. The receive loop's waits take
    no STOP meanwhile (they would end the send without a control read: about 1
    run in 5 did, dlcp.io.control_in_waits)."""
    a, b = _pair(False)
    waits = a._in_waits
    if waits is not None:
        real_follow = ControlInWaits.follow

        def follow(self: ControlInWaits, conn: Inbound) -> None:
            if self is not waits or not held.is_set():
                real_follow(self, conn)

        monkeypatch.setattr(ControlInWaits, "follow", follow)
    held = threading.Event()
    real_read, real_send = a._control.read, a._control.send
    real_ended = a._control.outbound_ended

    def read(sock: socket.socket) -> tuple[list[tuple[int, bytes]], str | None]:
        return ([], None) if held.is_set() else real_read(sock)

    def send(peer: int, addr: tuple[str, int], data: bytes) -> LostPeer | None:
        gone = real_send(peer, addr, data)
        if gone is not None:
            held.clear()
        return gone

    def outbound_ended(sock: socket.socket) -> LostPeer | None:
        gone = real_ended(sock)
        if gone is not None:
            held.clear()
        return gone

    try:
        _exchange(a, b, 1)  # both control connections up
        with a._lock:
            a._control.read, a._control.send = read, send  # type: ignore[method-assign]
            a._control.outbound_ended = outbound_ended  # type: ignore[method-assign]
            held.set()
            if waits is not None:
                for sock in list(a._control.inbound):
                    waits.forget(sock.fileno())
        got = b.recv(src=0, msg=2)
        sent = a.send(X, to=1, msg=2)
        assert np.array_equal(got.result(timeout=15).data, X)
        b.close()
        sent.result(timeout=15)  # (it failed here: "... failed: Connection refused")
        assert not held.is_set(), "the receiver was never found gone"
        assert 1 in a.stats()["peers_gone"]  # gone it is, with nothing pending
    finally:
        held.clear()
        a.close()
        b.close()


def test_a_connection_closed_since_select_saw_it_is_skipped() -> None:
    """A command (the application's thread, under the lock) can read a departed
    peer's connection to its end and close it while the I/O thread waits in
    ``select()`` with that connection in its ready list; the I/O thread then
    skips it (it raised KeyError and died, failing every transfer)."""
    a, b = _pair(False)
    try:
        _exchange(a, b, 1)
        with a._lock:
            sock = next(iter(a._control.inbound))
            assert a._selector is not None
            a._control.drop(sock, "closed by the test")  # (gone from the table)
            a._selector.unregister(sock)  # (as the drain does after a connection's end)
            assert a._read_control(a._selector, sock) is False
        _exchange(a, b, 2)  # the I/O thread lives on
    finally:
        a.close()
        b.close()


def test_a_peer_whose_listener_closes_after_its_connections_is_gone_at_once() -> None:
    """A process that dies closes its sockets one by one, its control listener
    not necessarily first. The end of its connection makes the survivor check
    the peer's control port, which the kernel still accepts for the listener
    that is about to close: the peer looked alive, and a receive from it waited
    out its whole timeout. Here b dies in that order, its I/O thread held (a
    dying process runs none): its connection to a ends, a checks and is
    accepted, then b's listener closes and then b's connection from a. The
    connections a opened are watched: their end is checked too, and b is gone."""
    a, b = _pair(False)
    try:
        _exchange(a, b, 1)
        pending = a.recv(src=1, msg=2)
        with b._lock:  # (b's I/O thread stops before its next turn)
            first = set(a._control.inbound)
            for sock in b._control.outbound.values():  # b's connection to a ends ...
                sock.shutdown(socket.SHUT_RDWR)
            deadline = time.monotonic() + 10
            while first & set(a._control.inbound):  # ... a checked b: its port accepted
                assert time.monotonic() < deadline, "a never handled the end of b's connection"
                time.sleep(0.005)  # (polling what a's I/O thread did, not a readiness guess)
            assert not pending.done() and a.stats()["peers_gone"] == {}
            started = time.monotonic()
            # ... then its listener stops (shut down, not closed under b's I/O thread:
            # the kernel resets the queued check and refuses new ones), then the rest
            b._control.listener.shutdown(socket.SHUT_RDWR)
            for sock in b._control.inbound:
                sock.shutdown(socket.SHUT_RDWR)
            try:
                error = pending.exception(timeout=8)
            except FutureTimeout:
                pytest.fail("the receive from the departed peer was still waiting after 8 s")
        assert error is not None and re.search(closed_endpoint(1), str(error)), error
        assert time.monotonic() - started < 5  # far sooner than the 10 s timeout
        assert 1 in a.stats()["peers_gone"]
    finally:
        a.close()
        b.close()
