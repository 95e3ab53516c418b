"""A lent send (``borrow=True``) that fails or is cancelled: once its future is done
the array is its caller's again, so the native engine must have stopped reading
it by then. A slow pacer keeps the message under way for seconds; the send fails
(its timeout) or is cancelled in the middle, and from that moment on the engine
sends no datagram more, and the receiver never sees what the caller writes
after."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from dlcp.errors import PeerTimeout
from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.engine import native_available
from dlcp.proto.config import ProtocolConfig
from tests.io.endpoint_helpers import JOB, LocalStore

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not native_available(), reason="the native engine was not built"),
]

#: 4 MB at most 1 MB/s: several seconds under way
N = 1 << 20
SLOW = ProtocolConfig(pacer_options={"initial_rate": 5e5, "min_rate": 1e5, "max_rate": 1e6})


def _lent_send(sender_timeout: float) -> tuple[Endpoint, Endpoint, Any, Future[Any], Future[Any]]:
    """Two endpoints, and a lent send from the first to the second under way:
    (sender, receiver, the lent array, the receive, the send)."""
    store = LocalStore()
    a, b = (
        Endpoint(r, store=store, world_size=2, job=JOB, config=EndpointConfig(
            timeout=sender_timeout if r == 0 else 30.0, engine="native", protocol=SLOW))
        for r in range(2)
    )  # fmt: skip
    arr = np.ones(N, np.float32)
    rx = b.recv(src=0, msg=1, out=np.zeros_like(arr), p=0.0)
    return a, b, arr, rx, a.send(arr, to=1, msg=1, borrow=True, p=0.0)


def _engine_datagrams(ep: Endpoint) -> int:
    """The engine's count, read without the endpoint's lock (its ``stats()`` is a
    command, which wakes the I/O thread: that would flush what the test is about)."""
    assert ep._sender is not None
    return int(ep._sender.stats()["engine_datagrams"])


def _nothing_sent_after(a: Endpoint, arr: Any, rx: Future[Any], sent: int) -> None:
    arr[:] = 7.0  # the caller's array again: it writes it
    try:
        got = rx.result(timeout=30)  # (the sender's ABORT fails it, or it had all)
    except Exception:
        pass
    else:
        assert not (got.data == 7.0).any(), "the receiver got bytes written after the failure"
    assert _engine_datagrams(a) == sent, "the engine sent on after the future was done"


def test_a_lent_send_that_times_out_is_not_read_after_its_future_failed() -> None:
    a, b, arr, rx, fut = _lent_send(sender_timeout=0.5)
    try:
        assert isinstance(fut.exception(timeout=30), PeerTimeout)
        sent = _engine_datagrams(a)
        assert 0 < sent < N * 4 // 1400  # (it failed in the middle)
        _nothing_sent_after(a, arr, rx, sent)
    finally:
        a.close()
        b.close()


def test_a_lent_send_cancelled_is_not_read_after_cancel_returned() -> None:
    a, b, arr, rx, fut = _lent_send(sender_timeout=30.0)
    try:
        deadline = time.monotonic() + 30
        while _engine_datagrams(a) < 100:  # (under way: the engine has sent some)
            assert not fut.done() and time.monotonic() < deadline
            time.sleep(0.005)  # (polling the engine's count)
        assert fut.cancel()
        sent = _engine_datagrams(a)
        _nothing_sent_after(a, arr, rx, sent)
    finally:
        a.close()
        b.close()
