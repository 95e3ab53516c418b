"""A message that completes before its receive is posted waits in a buffer of its
own. A receive that then brings its own buffer gets the values copied in, and the
message's buffer goes back to the session, for the next message of that size that
comes before its receive. A collective's neighbour that starts the next call first
sends into such a buffer every few calls, and a new buffer of a bucket's size cost
page faults that zeroed it each time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore

pytestmark = pytest.mark.integration

N = 1 << 16


@pytest.fixture
def pair() -> Iterator[tuple[Endpoint, Endpoint]]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2))
    yield a, b
    a.close()
    b.close()


def _kept(ep: Endpoint) -> list[Any]:
    """The spare buffers of ``N`` float32 elements ``ep``'s session holds."""
    return list(ep._session._inbox._spares._free.get((N, 4), []))


def test_a_late_receive_with_a_buffer_gives_the_message_buffer_back(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    a, b = pair
    first = np.arange(N, dtype=np.float32)
    a.send(first, to=1, msg=1).result(10)  # completed at b, nobody asked for it yet
    assert _kept(b) == []
    out = np.zeros(N, np.float32)
    got = b.recv(src=0, msg=1, out=out).result(10)
    assert got.data is out and np.array_equal(out, first)
    (kept,) = _kept(b)
    # the next message of that size that comes first starts in that memory, and
    # carries its own values, not the first message's
    second = -np.arange(N, dtype=np.float32)
    a.send(second, to=1, msg=2).result(10)
    assert _kept(b) == []
    got = b.recv(src=0, msg=2).result(10)  # (no buffer: the message's own is handed over)
    assert np.shares_memory(got.data, kept)
    assert np.array_equal(got.data, second) and got.report.lost_elems == 0
    assert _kept(b) == []  # (handed over: the caller holds it now)


def test_a_late_receive_without_a_buffer_keeps_the_message_buffer(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    a, b = pair
    a.send(np.ones(N, np.float32), to=1, msg=3).result(10)
    got = b.recv(src=0, msg=3).result(10)
    assert np.array_equal(got.data, np.ones(N, np.float32))
    assert _kept(b) == []  # the caller's array now: never reused
