"""``dlcp.io.readiness.ReadSelector``, the I/O thread's selector: epoll for reading,
with the ``selectors`` API the I/O loop and the control channel use (register with
data, unregister, also of a socket closed meanwhile, select with a timeout)."""

from __future__ import annotations

import select
import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from dlcp.io.readiness import ReadSelector


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_select_reports_a_readable_socket_with_its_data(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, writer = pair
    with ReadSelector() as sel:
        key = sel.register(reader, selectors.EVENT_READ, "wake")
        assert sel.select(0) == []
        writer.send(b"x")
        ready = sel.select(1.0)
        assert ready == [(key, selectors.EVENT_READ)]
        assert (ready[0][0].fileobj, ready[0][0].data) == (reader, "wake")
        assert sel.get_key(reader) is key


def test_select_waits_at_least_its_timeout() -> None:
    with ReadSelector() as sel:  # (nothing registered: epoll still needs one event slot)
        start = time.monotonic()
        assert sel.select(0.02) == []
        assert time.monotonic() - start >= 0.02


def test_unregistered_sockets_are_no_longer_reported(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, writer = pair
    with ReadSelector() as sel:
        sel.register(reader, selectors.EVENT_READ, "control")
        assert sel.unregister(reader).data == "control"
        writer.send(b"x")
        assert sel.select(0) == []
        with pytest.raises(KeyError, match="not registered"):
            sel.unregister(reader)


def test_a_socket_closed_while_registered_can_be_unregistered() -> None:
    a, b = socket.socketpair()
    with ReadSelector() as sel:
        key = sel.register(a, selectors.EVENT_READ, "control")
        a.close()  # (its fileno() is -1 now: found by identity)
        assert sel.unregister(a) is key
        assert sel.get_map() == {}
    b.close()


def test_registering_twice_or_for_writing_is_refused(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, _ = pair
    with ReadSelector() as sel:
        sel.register(reader, selectors.EVENT_READ)
        with pytest.raises(KeyError, match="already registered"):
            sel.register(reader, selectors.EVENT_READ)
        with pytest.raises(ValueError, match="reading only"):
            sel.register(reader.fileno(), selectors.EVENT_WRITE)


def _readable(epoll_fd: int) -> bool:
    return bool(select.select([epoll_fd], [], [], 0)[0])


def test_the_others_set_holds_every_file_but_the_one_set_apart() -> None:
    """The native receive loop's linger sleeps on ``others_fileno`` while it takes
    a trickle of data itself: data on the socket set apart must not wake it, any
    other watched file must, and a file unregistered leaves that set too."""
    data_r, data_w = socket.socketpair()
    wake_r, wake_w = socket.socketpair()
    try:
        with ReadSelector() as sel:
            sel.set_apart(data_r)
            sel.register(data_r, selectors.EVENT_READ, "data")
            sel.register(wake_r, selectors.EVENT_READ, "wake")
            data_w.send(b"x")
            assert _readable(sel.fileno()) and not _readable(sel.others_fileno())
            wake_w.send(b"x")
            assert _readable(sel.others_fileno())
            sel.unregister(wake_r)
            assert not _readable(sel.others_fileno()) and _readable(sel.fileno())
    finally:
        for s in (data_r, data_w, wake_r, wake_w):
            s.close()


def test_a_file_is_set_apart_before_any_is_registered(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    reader, _ = pair
    with ReadSelector() as sel:
        sel.register(reader, selectors.EVENT_READ, "wake")
        with pytest.raises(RuntimeError, match="before any file is registered"):
            sel.set_apart(reader)
