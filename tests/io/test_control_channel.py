"""The TCP control channel: frames arrive whole and in order; a peer that stops
reading is declared gone after ``connect_timeout`` instead of stalling the sender."""

from __future__ import annotations

import selectors
import socket
import time

import pytest

from dlcp.io import nonblocking
from dlcp.io.control import ControlChannel, LostPeer


@pytest.fixture(params=["C", "socket"], autouse=True)
def frames_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with the frames read and written in C (``dlcp.io.nonblocking``,
    where built) and by the socket's own methods (a build without the extension)."""
    if request.param == "C" and nonblocking._udpio is None:
        pytest.skip("dlcp.io._udpio not built")
    if request.param == "socket":
        monkeypatch.setattr(nonblocking, "_udpio", None)
    return str(request.param)


def _accept(server: ControlChannel) -> socket.socket:
    # the sender's connect returned: the handshake is done, the connection queued
    conn = server.accept()
    assert conn is not None
    return conn


def test_frames_arrive_whole_and_in_order() -> None:
    a = ControlChannel("127.0.0.1", 0, rank=0, job=9, connect_timeout=2.0)
    b = ControlChannel("127.0.0.1", 0, rank=1, job=9, connect_timeout=2.0)
    try:
        sent = [bytes([i]) * (16 + i) for i in range(50)]
        for frame in sent:
            assert a.send(1, b.address, frame) is None
        conn = _accept(b)
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 5
        while len(got) < len(sent):
            assert time.monotonic() < deadline, f"{len(got)} of {len(sent)} frames arrived"
            frames, ended = b.read(conn)
            assert ended is None
            got += frames
        assert got == [(0, frame) for frame in sent]
    finally:
        a.close()
        b.close()


def test_a_peer_that_stops_reading_is_gone_after_the_timeout() -> None:
    a = ControlChannel("127.0.0.1", 0, rank=0, job=9, connect_timeout=0.3)
    b = ControlChannel("127.0.0.1", 0, rank=1, job=9, connect_timeout=0.3)
    try:
        frame = b"x" * 60_000
        started = time.monotonic()
        gone = None
        for _ in range(10_000):  # b accepts nothing and reads nothing: buffers fill up
            gone = a.send(1, b.address, frame)
            if gone is not None:
                break
        elapsed = time.monotonic() - started
        assert isinstance(gone, LostPeer) and gone.rank == 1
        assert "control connection to rank 1" in gone.why
        assert elapsed < 10  # one timeout of 0.3 s, not one per frame
        assert 1 not in a.outbound  # a later send opens a new connection
    finally:
        a.close()
        b.close()


def test_a_check_accepted_by_a_closing_listener_is_found_out_when_it_resets() -> None:
    """A dying peer closed its connection before its listener: the check of that
    end connects (the kernel queues it for the listener) and says "alive". When
    the listener closes, the queued checking connection is reset; watched, that
    end is checked again, and the closed port makes the peer gone."""
    a = ControlChannel("127.0.0.1", 0, rank=0, job=9, connect_timeout=2.0)
    b = ControlChannel("127.0.0.1", 0, rank=1, job=9, connect_timeout=2.0)
    a.address_of = lambda rank: b.address if rank == 1 else None
    sel = selectors.DefaultSelector()
    try:
        a.watch_ends(sel)
        assert b.send(0, a.address, b"\x01" * 16) is None
        conn = _accept(a)
        deadline = time.monotonic() + 5
        while not a.read(conn)[0]:
            assert time.monotonic() < deadline, "the frame never arrived"
        a.inbound[conn].trusted = True  # (the session accepted its frame)
        inbound = a.inbound[conn]
        b.outbound.pop(0).close()  # b dies: its connection ends first ...
        while (ended := a.read(conn)[1]) is None:
            assert time.monotonic() < deadline, "the end never arrived"
        assert a.ended(inbound, ended) is None  # ... its listener still queues the check
        assert 1 in a.outbound and not sel.select(0)
        b.listener.close()  # ... then its listener closes: the queued check is reset
        ready = sel.select(5)
        assert [key.data for key, _ in ready] == ["outbound"]
        gone = a.outbound_ended(ready[0][0].fileobj)  # type: ignore[arg-type]
        assert isinstance(gone, LostPeer) and gone.rank == 1, gone
        assert gone.why == (
            "control connection to rank 1 ended ([Errno 104] Connection reset by peer) "
            "and rank 1 no longer accepts control connections"
        )
        assert 1 not in a.outbound and sel.get_map() == {}
    finally:
        a.watch_ends(None)
        sel.close()
        a.close()
        b.close()
