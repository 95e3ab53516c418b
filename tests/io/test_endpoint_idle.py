"""An idle endpoint costs (almost) no CPU: its I/O thread waits, it does not spin.

The driver runs the core's timers and waits on its sockets until the next timer
or deadline (at most a second); it must never busy-wait while there is nothing
to do, neither with nothing pending nor once a transfer is over. Two real
endpoints in this process, each with one receive posted that nothing will ever
answer, are left alone for a while (waiting is the point here, not a readiness
guess): the process's CPU time over that interval must stay far below the
interval, and each I/O thread must have taken only a handful of turns (a 1 ms
polling loop would burn little CPU yet take thousands). The same holds after a
completed transfer between them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads
from tests.io.peers import digest, make_data

pytestmark = pytest.mark.integration

IDLE_S = 2.0  # wall time each endpoint pair is left idle
MAX_CPU_S = 0.2  # process CPU allowed over it (a spinning I/O thread takes ~IDLE_S)
MAX_TURNS = 20  # I/O thread turns allowed over it per endpoint (waits of >= 100 ms)
TIMEOUT = 60.0  # the endpoints' timeout: no deadline falls inside the test


@contextlib.contextmanager
def _pair() -> Iterator[tuple[Endpoint, Endpoint]]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=TIMEOUT)
    a = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg)
    try:
        b = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg)
        try:
            yield a, b
        finally:
            b.close()
    finally:
        a.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"


def _turns(ep: Endpoint) -> int:
    """How many turns (waits on the sockets) the I/O thread has taken."""
    turns: int = ep.stats()["receive_calls"]
    return turns


def _assert_idle(a: Endpoint, b: Endpoint, when: str) -> None:
    """Over IDLE_S of wall time: little process CPU, few I/O thread turns."""
    turns = [_turns(a), _turns(b)]
    cpu0, wall0 = time.process_time(), time.monotonic()
    threading.Event().wait(IDLE_S)  # the idle interval itself, not a readiness wait
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    turns = [_turns(a) - turns[0], _turns(b) - turns[1]]
    assert wall >= IDLE_S
    assert cpu < MAX_CPU_S, (
        f"{when}: {cpu:.3f} s of CPU in {wall:.2f} s idle (limit {MAX_CPU_S} s): "
        f"an I/O thread busy-waits; turns per endpoint {turns}"
    )
    assert max(turns) <= MAX_TURNS, (
        f"{when}: I/O threads took {turns} turns in {wall:.2f} s idle "
        f"(limit {MAX_TURNS}): they poll instead of waiting for a timer or input"
    )


def test_endpoints_with_pending_receives_do_not_spin() -> None:
    with _pair() as (a, b):
        pending = [a.recv(src=1, msg=9), b.recv(src=0, msg=9)]  # never sent
        _assert_idle(a, b, "pending receives, nothing sent")
        assert not any(f.done() for f in pending), "a receive nobody answered completed"


def test_endpoints_are_idle_again_after_a_transfer() -> None:
    with _pair() as (a, b):
        x, _ = make_data("float32", 1 << 20, 3)
        rfut = b.recv(src=0, msg=1)
        a.send(x, to=1, msg=1).result(timeout=30)
        assert digest(rfut.result(timeout=30).data) == digest(x)
        pending = [a.recv(src=1, msg=9), b.recv(src=0, msg=9)]  # never sent
        _assert_idle(a, b, "after a completed transfer")
        assert not any(f.done() for f in pending), "a receive nobody answered completed"
