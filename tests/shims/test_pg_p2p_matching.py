"""How the process group's point-to-point side (``shims/pg_p2p.py``) matches
receives to messages, against an in-memory stand-in for the endpoint: torch's
rules (non-overtaking per peer and tag, earlier receives first, any source
reports its source), empty tensors, sizes that disagree, an arrival that timed
out with nobody waiting for it, and misuse named in the error."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dlcp.errors import PeerTimeout  # noqa: E402
from shims.pg_p2p import MAX_TAG, PointToPoint, message_key  # noqa: E402
from shims.pg_timeouts import DLCPTimeout  # noqa: E402

WAIT = timedelta(seconds=10)


@dataclass
class _Got:
    src: int
    data: np.ndarray[Any, Any]


class FakeNet:
    """Endpoints of ranks 0..n-1 in one process: a message completes the
    receive posted for its key, or waits for one (as the endpoint keeps a
    message nobody asked for yet); sends complete at once."""

    def __init__(self, n: int) -> None:
        self.parked: dict[tuple[int, int, int, int], np.ndarray[Any, Any]] = {}
        self.posted: dict[tuple[int, int, int, int], tuple[Future[Any], Any]] = {}
        self.endpoints = [self._endpoint(r) for r in range(n)]

    def _endpoint(self, rank: int) -> Any:
        def send(payload: Any, *, to: int, step: int, msg: int, p: float) -> Future[Any]:
            key = (rank, to, step, msg)
            data = np.array(payload, copy=True)
            if key in self.posted:
                fut, out = self.posted.pop(key)
                self._complete(fut, rank, data, out)
            else:
                self.parked[key] = data
            done: Future[Any] = Future()
            done.set_result(None)
            return done

        def recv(*, src: int, step: int, msg: int, out: Any = None, p: float) -> Future[Any]:
            key = (src, rank, step, msg)
            fut: Future[Any] = Future()
            if key in self.parked:
                self._complete(fut, src, self.parked.pop(key), out)
            else:
                self.posted[key] = (fut, out)
            return fut

        return SimpleNamespace(send=send, recv=recv, config=SimpleNamespace(timeout=30.0))

    @staticmethod
    def _complete(fut: Future[Any], src: int, data: Any, out: Any) -> None:
        if out is not None:
            if out.shape != data.shape or out.dtype != data.dtype:
                fut.set_exception(ValueError(f"out is {out.dtype}{list(out.shape)}"))
                return
            out[...] = data
            data = out
        fut.set_result(_Got(src, data))


@pytest.fixture
def ranks() -> Any:
    net = FakeNet(3)
    p2p = [PointToPoint(ep, r, 3, name="test") for r, ep in enumerate(net.endpoints)]
    yield net, p2p
    for side in p2p:
        side.close()
        assert side.join(10)


def test_messages_of_one_tag_keep_their_order_and_tags_do_not_block_each_other(
    ranks: Any,
) -> None:
    _, (a, b, _) = ranks
    for v, tag in ((1.0, 7), (2.0, 7), (3.0, 3)):
        a.send(torch.full((4,), v), 1, tag).wait(WAIT)
    x, first, second = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    b.recv(x, 0, 3).wait(WAIT)
    w1, w2 = b.recv(first, 0, 7), b.recv(second, 0, 7)
    w2.wait(WAIT)
    w1.wait(WAIT)
    assert x.eq(3).all() and first.eq(1).all() and second.eq(2).all()


def test_a_receive_from_any_source_posted_first_takes_the_message_first(ranks: Any) -> None:
    _, (a, b, c) = ranks
    anywhere, specific = torch.zeros(2), torch.zeros(2)
    w_any = b.recv(anywhere, None, 0)
    w_one = b.recv(specific, 0, 0)  # posted later: it must get rank 0's second message
    a.send(torch.full((2,), 5.0), 1, 0).wait(WAIT)
    w_any.wait(WAIT)
    assert anywhere.eq(5).all() and w_any._source_rank() == 0
    assert not w_one.is_completed()
    a.send(torch.full((2,), 6.0), 1, 0).wait(WAIT)
    w_one.wait(WAIT)
    assert specific.eq(6).all() and w_one.is_completed() and w_one.get_future().done()
    # a later any-source receive takes what came from rank 2, and says so
    c.send(torch.full((2,), 9.0), 1, 0).wait(WAIT)
    late = torch.zeros(2)
    w = b.recv(late, None, 0)
    w.wait(WAIT)
    assert late.eq(9).all() and w._source_rank() == 2


def test_a_send_has_no_source_rank(ranks: Any) -> None:
    _, (a, _, _) = ranks
    w = a.send(torch.ones(1), 1, 0)
    w.wait(WAIT)
    with pytest.raises(ValueError, match="only a completed receive has one"):
        w._source_rank()


def test_empty_and_strided_tensors_and_other_dtypes_arrive_whole(ranks: Any) -> None:
    _, (a, b, _) = ranks
    sent = [torch.empty(0), torch.arange(12.0).view(3, 4).t(), torch.tensor([True, False]),
            torch.arange(5, dtype=torch.int64)]
    into = [torch.empty(0), torch.zeros(4, 3), torch.zeros(2, dtype=torch.bool),
            torch.zeros(5, dtype=torch.int64)]
    for t in sent:
        a.send(t, 1, 2).wait(WAIT)
    for t, got in zip(sent, into, strict=True):
        b.recv(got, 0, 2).wait(WAIT)
        assert torch.equal(got, t.contiguous())


def test_a_message_of_another_size_fails_the_receive_naming_both(ranks: Any) -> None:
    _, (a, b, _) = ranks
    a.send(torch.zeros(5), 1, 0).wait(WAIT)
    w = b.recv(torch.zeros(3), None, 0)  # (into its own buffer: the size is checked here)
    with pytest.raises(
        ValueError, match=r"rank 0 sent 20 bytes, the tensor \(torch.float32\[3\]\) takes 12"
    ):
        w.wait(WAIT)
    assert w.is_completed() and not w.is_success() and isinstance(w.exception(), ValueError)


def test_an_arrival_that_timed_out_unclaimed_is_skipped(ranks: Any) -> None:
    """A receive from any source left arrivals posted on the other peers; one
    of them timed out with nobody waiting for it. Its key is spent on both
    sides (the endpoint cancelled it): the next receive takes the next one."""
    net, (a, b, c) = ranks
    w = b.recv(torch.zeros(1), None, 0)
    a.send(torch.ones(1), 1, 0).wait(WAIT)
    w.wait(WAIT)
    step, msg = message_key(0, 0)
    fut, _ = net.posted.pop((2, 1, step, msg))  # rank 2's arrival, still posted
    fut.set_exception(PeerTimeout("message from rank 2 did not complete within 30 s"))
    c._send_seq[1, 0] = 1  # (rank 2's own message of that number failed, cancelled)
    x = torch.zeros(1)
    got = b.recv(x, 2, 0)
    c.send(torch.full((1,), 4.0), 1, 0).wait(WAIT)
    got.wait(WAIT)
    assert x.eq(4).all()


def test_a_receive_whose_message_times_out_says_timed_out(ranks: Any) -> None:
    net, (_, b, _) = ranks
    w = b.recv(torch.zeros(1), 0, 9)
    step, msg = message_key(9, 0)
    fut, _ = net.posted.pop((0, 1, step, msg))
    fut.set_exception(PeerTimeout("rank 1: message from rank 0 did not complete within 30 s"))
    with pytest.raises(DLCPTimeout, match=r"^Timed out: dlcp recv from rank 0 \(tag 9\) on rank 1 "
                                          r"reached its timeout of 30 s: rank 0 did not arrive"):
        w.wait(WAIT)
    assert isinstance(w.exception(), RuntimeError)


def test_wait_with_a_timeout_says_timed_out_and_names_the_operation(ranks: Any) -> None:
    _, (_, b, _) = ranks
    w = b.recv(torch.zeros(1), 2, 11)
    with pytest.raises(DLCPTimeout, match=r"Timed out: dlcp recv from rank 2 \(tag 11\) did not "
                                          r"complete within the 0.05 s timeout given to wait\(\)"):
        w.wait(timedelta(seconds=0.05))
    assert not w.is_completed() and not w.get_future().done() and w.exception() is None


@pytest.mark.parametrize(("peer", "tag", "tensors", "match"), [
    (0, 0, [torch.zeros(1)], "recv: rank 0 names itself as the peer"),
    (3, 0, [torch.zeros(1)], r"recv: peer rank 3 outside 0..2"),
    (1, MAX_TAG + 1, [torch.zeros(1)], rf"recv: tag={MAX_TAG + 1} outside 0..{MAX_TAG}"),
    (1, -1, [torch.zeros(1)], r"recv: tag=-1 outside"),
    (1, 0, [torch.zeros(1), torch.zeros(1)], "recv takes one tensor, got 2"),
    (1, 0, [torch.zeros(2).to_sparse()], "dense"),
])
def test_misuse_is_refused_naming_what_was_wrong(
    ranks: Any, peer: int, tag: int, tensors: list[Any], match: str
) -> None:
    _, (a, _, _) = ranks
    with pytest.raises(ValueError, match=match):
        a.check("recv", tensors, peer, tag)
