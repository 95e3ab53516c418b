"""The TCP control channel: frames arrive whole and in order; a peer that stops
reading is declared gone after ``connect_timeout`` instead of stalling the sender."""

from __future__ import annotations

import socket
import time

from dlcp.io.control import ControlChannel, LostPeer


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
