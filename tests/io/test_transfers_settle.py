"""``Transfers.dispatch(defer=True)`` matches the session's events to their
transfers at once and settles their futures later (the endpoint sends in
between, so that a receive's STOP leaves before its future's callbacks run).
Matched transfers are out of the tables, so a peer that fails meanwhile does
not fail them; and none is left pending: ``settle()`` or the next
``dispatch()`` settles them in event order, ``fail_all`` (the I/O thread's
crash and close paths) too. A fake session stands in for the real one."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from dlcp.errors import EndpointClosed, PeerTimeout, TransferFailed
from dlcp.io.records import Pending
from dlcp.io.transfers import Transfers
from dlcp.proto.config import FillPolicy
from dlcp.proto.events import MessageDelivered, MessageReceived, SendReport
from dlcp.proto.loss_report import LossReport

N = 4


class _Session:
    def __init__(self) -> None:
        self.events: deque[Any] = deque()

    def next_event(self) -> Any:
        return self.events.popleft() if self.events else None

    def cancel(self, peer: int, *, step: int, msg: int, outgoing: bool) -> None:
        pass

    def progress(self, peer: int, *, step: int, msg: int, outgoing: bool, now: float) -> str:
        return f"as far as message {msg} to rank {peer} got" if outgoing else ""


def _transfers() -> tuple[Transfers, _Session]:
    session = _Session()
    return Transfers(session, rank=0, timeout=5.0, emulated_loss=0.0), session  # type: ignore[arg-type]


def _received(src: int, msg: int) -> MessageReceived:
    report = LossReport(N, N, 0, (), (), (), 0, 0, 0, 0.0, FillPolicy.ZERO, 0.0)
    return MessageReceived(src, 0, msg, np.full(N, msg, dtype=np.float32), report)


def _delivered(dst: int, msg: int) -> MessageDelivered:
    return MessageDelivered(dst, 0, msg, SendReport(N, 1, 1, 0, 1, N, 0.0))


def _post_recv(transfers: Transfers, src: int, msg: int,
               out: np.ndarray[Any, Any] | None = None) -> Future[Any]:
    fut: Future[Any] = Future()
    transfers.pend((src, 0, msg), Pending(fut, 5.0, out), outgoing=False)
    return fut


def _post_send(transfers: Transfers, dst: int, msg: int, deadline: float = 5.0) -> Future[Any]:
    fut: Future[Any] = Future()
    transfers.pend((dst, 0, msg), Pending(fut, deadline), outgoing=True)
    return fut


def test_matched_transfers_wait_for_settle_and_survive_their_peer_failing() -> None:
    transfers, session = _transfers()
    got, sent = _post_recv(transfers, 1, 1), _post_send(transfers, 1, 2)
    order: list[str] = []
    got.add_done_callback(lambda f: order.append("recv"))
    sent.add_done_callback(lambda f: order.append("send"))
    session.events.extend([_received(1, 1), _delivered(1, 2)])
    transfers.dispatch(defer=True)
    assert not got.done() and not sent.done()
    assert not transfers.waits_on(1)
    transfers.fail_peer(1, "rank 1 closed its control connection")  # (as a send may find)
    transfers.dispatch()
    assert order == ["recv", "send"]
    assert np.array_equal(got.result().data, np.full(N, 1, np.float32))
    assert sent.result().acknowledged_elems == N


def test_deferred_settlements_come_before_the_next_dispatchs_own_and_may_reenter() -> None:
    transfers, session = _transfers()
    first, second, third = (_post_recv(transfers, 1, m) for m in (1, 2, 3))
    order: list[int] = []

    def reenter(fut: Future[Any]) -> None:  # a callback that has the endpoint dispatch again
        order.append(1)
        session.events.append(_received(1, 3))
        transfers.dispatch()

    first.add_done_callback(reenter)
    second.add_done_callback(lambda f: order.append(2))
    third.add_done_callback(lambda f: order.append(3))
    session.events.append(_received(1, 1))
    transfers.dispatch(defer=True)
    session.events.append(_received(1, 2))
    transfers.dispatch()
    assert order == [1, 2, 3]


def test_fail_all_settles_what_was_matched_and_fails_the_rest() -> None:
    transfers, session = _transfers()
    matched, waiting = _post_recv(transfers, 1, 1), _post_recv(transfers, 1, 2)
    session.events.append(_received(1, 1))
    transfers.dispatch(defer=True)
    transfers.fail_all(EndpointClosed("rank 0: endpoint closed"))
    assert np.array_equal(matched.result(timeout=0).data, np.full(N, 1, np.float32))
    with pytest.raises(EndpointClosed):
        waiting.result(timeout=0)


def test_a_settlement_that_raises_fails_its_own_future_and_leaves_none_pending() -> None:
    transfers, session = _transfers()
    read_only = np.zeros(N, np.float32)
    broken = _post_recv(transfers, 1, 1, out=read_only)
    later = _post_recv(transfers, 1, 2)
    read_only.flags.writeable = False  # (after posting: the copy into it fails)
    session.events.extend([_received(1, 1), _received(1, 2)])
    transfers.dispatch(defer=True)
    with pytest.raises(ValueError, match="read-only"):
        transfers.settle()  # (the I/O thread's turn raises: its crash path follows)
    assert isinstance(broken.exception(timeout=0), ValueError)
    assert not later.done()
    transfers.fail_all(TransferFailed("rank 0: I/O thread failed"))
    assert np.array_equal(later.result(timeout=0).data, np.full(N, 2, np.float32))


def test_earliest_bounds_the_deadlines_and_expire_finds_the_next_one() -> None:
    """The I/O thread calls expire() only once ``earliest`` has passed: it must
    never be later than a pending deadline, and expire() sets it to the next."""
    transfers, session = _transfers()
    assert transfers.earliest == float("inf")
    deadlines = ((1, 5.0), (2, 6.0), (3, 7.0))
    done, first, second = (_post_send(transfers, 1, m, deadline=d) for m, d in deadlines)
    assert transfers.earliest == 5.0
    session.events.append(_delivered(1, 1))  # (ends before its deadline: the bound stays)
    transfers.dispatch()
    assert done.done() and transfers.earliest == 5.0
    transfers.expire(5.5)  # (nothing past its deadline: the next one is found)
    assert not first.done() and transfers.earliest == 6.0
    transfers.expire(6.0)
    # (the session's words for how far the message got follow the timeout's)
    with pytest.raises(PeerTimeout, match=r"within 5 s: as far as message 2 to rank 1 got$"):
        first.result(timeout=0)
    assert not second.done() and transfers.earliest == 7.0
    transfers.expire(7.5)
    assert second.done() and transfers.earliest == float("inf")
