"""A collective's send futures: a failure is seen at the next check, in the order
the sends failed, without polling each future."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from dlcp.collectives.ring import SendTracker
from dlcp.errors import TransferFailed


def test_no_failure_raises_nothing_and_keeps_the_futures_in_order() -> None:
    sends = SendTracker()
    futs: list[Future[Any]] = [Future() for _ in range(3)]
    for f in futs:
        sends.add(f)
    sends.raise_first_failure()  # all pending
    futs[1].set_result("ok")
    sends.raise_first_failure()
    assert sends.futures == futs


def test_the_first_send_to_fail_is_raised() -> None:
    sends = SendTracker()
    a: Future[Any] = Future()
    b: Future[Any] = Future()
    sends.add(a)
    sends.add(b)
    b.set_exception(TransferFailed("rank 2 closed its control connection"))
    a.set_exception(TransferFailed("rank 1 closed its control connection"))
    with pytest.raises(TransferFailed, match="rank 2"):
        sends.raise_first_failure()


def test_a_send_that_failed_before_it_was_added_counts() -> None:
    sends = SendTracker()
    done: Future[Any] = Future()
    done.set_exception(TimeoutError("rank 3: no STOP"))
    cancelled: Future[Any] = Future()
    cancelled.cancel()
    sends.add(cancelled)
    sends.raise_first_failure()  # a cancelled send is no failure
    sends.add(done)
    with pytest.raises(TimeoutError, match="rank 3"):
        sends.raise_first_failure()
