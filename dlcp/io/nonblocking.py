"""One send or receive on a non-blocking stream socket, keeping the GIL.

The control connections carry a frame of a few dozen bytes a call. Python's socket
methods let the GIL go around the system call, and on a busy core a thread that
does so for a few microseconds then waits for the GIL again behind whichever thread
took it: a context switch or two for every control frame. Where ``dlcp.io._udpio``
is built, :func:`send_now` and :func:`recv_now` make the same call in C without
letting the GIL go (the sockets are non-blocking: the call does not wait);
elsewhere they use the socket's methods.

(The wake socket keeps the socket's methods: there letting the GIL go is what lets
the thread that woke the I/O thread finish with the endpoint's lock before the I/O
thread asks for it; measured, keeping the GIL there cost two context switches more
per message, ``dlcp.bench.turns``.)
"""

from __future__ import annotations

import socket

from .extensions import load

__all__ = ["recv_now", "send_now"]

_udpio = load("_udpio")


def send_now(sock: socket.socket, data: bytes | bytearray | memoryview) -> int:
    """One send on non-blocking ``sock``: the bytes sent, 0 where it would block.
    Errors raise as the socket's ``send`` raises them."""
    if _udpio is not None:
        return int(_udpio.send_now(sock.fileno(), data))
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError):
        return 0


def recv_now(sock: socket.socket, buf: bytearray) -> int | None:
    """One receive on non-blocking ``sock`` into ``buf``: the bytes read (0: the
    connection ended), None where nothing waits. Errors raise as the socket's
    ``recv_into`` raises them."""
    if _udpio is not None:
        got: int | None = _udpio.recv_now(sock.fileno(), buf)
        return got
    try:
        return sock.recv_into(buf)
    except (BlockingIOError, InterruptedError):
        return None
