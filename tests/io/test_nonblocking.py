"""``dlcp.io.nonblocking``: one send or receive on a non-blocking stream socket (the
control connections), in C holding the GIL where
``dlcp.io._udpio`` is built (``send_now``, ``recv_now``) and with the socket's
methods elsewhere: what they return when data moves, when the call would block
and at the connection's end, and the errors they raise, the same both ways."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from dlcp.io import nonblocking
from dlcp.io.nonblocking import recv_now, send_now


@pytest.fixture(params=["C", "socket"])
def made_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "C" and nonblocking._udpio is None:
        pytest.skip("dlcp.io._udpio not built")
    if request.param == "socket":
        monkeypatch.setattr(nonblocking, "_udpio", None)
    return str(request.param)


@pytest.fixture
def pair(made_by: str) -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_bytes_sent_arrive_whole(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    payload = bytes(range(256)) * 4
    assert send_now(a, payload) == len(payload)
    assert send_now(a, memoryview(payload)[:10]) == 10  # any buffer
    buf = bytearray(4096)
    assert recv_now(b, buf) == len(payload) + 10
    assert bytes(buf[: len(payload) + 10]) == payload + payload[:10]


def test_a_call_that_would_block_returns_none_or_zero(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    assert recv_now(b, bytearray(64)) is None  # nothing waits
    chunk = b"x" * 65536
    sent = [send_now(a, chunk) for _ in range(200)]  # b reads nothing
    assert sent[-1] == 0 and 0 < sum(sent) < 200 * len(chunk)


def test_the_end_of_the_connection_reads_as_zero(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.close()
    assert recv_now(b, bytearray(64)) == 0
    with pytest.raises(BrokenPipeError):  # (an error, not a SIGPIPE)
        send_now(b, b"late")


@pytest.mark.usefixtures("made_by")
def test_a_closed_socket_raises_as_the_socket_methods_do() -> None:
    a, b = socket.socketpair()
    a.close()
    b.close()
    for call in (lambda: send_now(a, b"x"), lambda: recv_now(a, bytearray(8))):
        with pytest.raises(OSError) as raised:
            call()
        assert raised.value.errno == errno.EBADF


@pytest.mark.skipif(nonblocking._udpio is None, reason="dlcp.io._udpio not built")
def test_c_helpers_refuse_a_read_only_buffer() -> None:
    assert nonblocking._udpio is not None
    with pytest.raises(TypeError):
        nonblocking._udpio.recv_now(0, b"read-only")
