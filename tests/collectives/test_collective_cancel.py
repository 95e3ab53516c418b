"""A collective that fails part-way cancels the receives it had posted: a receive
posted into the caller's array must not write there after the call raised. The
failures here are synchronous ones (a peer without an address, a wait that times
out) at the moment other receives are already posted. A fake communicator stands
in for the endpoint."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import pytest

from dlcp.collectives.comm import MAX_ROLE, ReportBuilder
from dlcp.collectives.ps import PULL, ps_allreduce
from dlcp.collectives.ring import ring_allreduce
from dlcp.errors import PeerTimeout, TransferFailed


class _FailingComm:
    """Posts receives as plain futures; ``send_part`` / ``wait`` raise on demand."""

    def __init__(self, rank: int, world: int, *, fail_send_role: int | None = None,
                 fail_wait: bool = False) -> None:
        self.rank, self.world_size = rank, world
        self.fail_send_role, self.fail_wait = fail_send_role, fail_wait
        self.recvs: list[Future[Any]] = []
        self.sends: list[Future[Any]] = []

    def next_call(self) -> int:
        return 7

    def msg_id(self, role: int) -> int:
        assert 0 <= role <= MAX_ROLE
        return role

    def recv(self, out: Any, **kw: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.recvs.append(fut)
        return fut

    def send_part(self, data: Any, a: int, b: int, *, role: int, to: int, **kw: Any) -> Future[Any]:
        if self.fail_send_role is None or role == self.fail_send_role:
            raise PeerTimeout(f"rank {self.rank}: rank {to} published no address")
        fut: Future[Any] = Future()
        self.sends.append(fut)
        return fut

    def take_scratch(self, nbytes: int) -> Any:
        return np.empty(nbytes, np.uint8)

    def give_back_scratch(self, buf: Any) -> None:
        raise AssertionError("a failed call keeps its scratch (a cancelled receive may hold it)")

    def wait(self, fut: Future[Any]) -> Any:
        if self.fail_wait:
            raise PeerTimeout(f"rank {self.rank}: a message did not complete")
        raise AssertionError("this fake settles nothing")


def test_ring_cancels_its_posted_receive_when_a_send_cannot_start() -> None:
    comm = _FailingComm(0, 2)
    with pytest.raises(PeerTimeout, match="published no address"):
        ring_allreduce(comm, np.ones(100, np.float32), p=0.05)  # type: ignore[arg-type]
    # every receive of the call (its reduce-scatter and its all-gather step) was
    # posted before the first send, and each is cancelled
    assert len(comm.recvs) == 2
    assert all(f.cancelled() for f in comm.recvs)


def test_ps_cancels_its_posted_pulls_when_aggregating_fails() -> None:
    # rank 0 serves shard 0 and pulls shard 1: the pull is posted before rank 0
    # waits for the pushes into its own shard, and that wait fails
    comm = _FailingComm(0, 2, fail_send_role=-1, fail_wait=True)
    with pytest.raises(PeerTimeout, match="did not complete"):
        ps_allreduce(comm, np.ones(100, np.float32))  # type: ignore[arg-type]
    pulls = comm.recvs[:1]  # (the second receive is the push into scratch space)
    assert len(comm.recvs) == 2 and all(f.cancelled() for f in pulls)


def test_ps_cancels_its_posted_pulls_when_serving_back_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the push into rank 0's shard arrives (waits succeed, their reports are not
    # looked at), then sending the sum back to rank 1 cannot start
    monkeypatch.setattr(ReportBuilder, "received", lambda self, got, bounded: None)
    comm = _FailingComm(0, 2, fail_send_role=PULL)
    comm.wait = lambda fut: None  # type: ignore[method-assign]
    with pytest.raises(PeerTimeout, match="published no address"):
        ps_allreduce(comm, np.ones(100, np.float32))  # type: ignore[arg-type]
    assert comm.recvs[0].cancelled()  # the pull into data[50:]


@pytest.mark.parametrize("collective", ["ring", "direct"])
def test_a_failed_call_cancels_its_sends_and_receives(collective: str) -> None:
    """A wait that fails leaves nothing of the call behind: its sends stopped
    (they retransmitted until the endpoint's timeout, 30 minutes under a process
    group) and its receives too."""
    from dlcp.collectives.direct import direct_allreduce

    comm = _FailingComm(0, 3, fail_send_role=-1, fail_wait=True)
    comm.send = lambda data, **kw: comm.send_part(data, 0, 1, **kw)  # type: ignore[attr-defined]
    with pytest.raises(PeerTimeout, match="did not complete"):
        if collective == "ring":
            ring_allreduce(comm, np.ones(100, np.float32), p=0.05)  # type: ignore[arg-type]
        else:
            direct_allreduce(comm, np.ones(100, np.float32))  # type: ignore[arg-type]
    assert comm.sends and all(f.cancelled() for f in comm.sends)
    if collective == "direct":  # (the ring's one receive is the wait that failed)
        assert len(comm.recvs) == 2 and all(f.cancelled() for f in comm.recvs)


def test_a_dedicated_server_cancels_its_receives_when_a_push_fails() -> None:
    from dlcp.collectives.ps import ps_serve

    comm = _FailingComm(2, 3, fail_wait=True)
    posted: list[Future[Any]] = []

    class _Endpoint:
        def recv(self, **kw: Any) -> Future[Any]:
            posted.append(Future())
            return posted[-1]

    comm.endpoint = _Endpoint()  # type: ignore[attr-defined]
    with pytest.raises(PeerTimeout, match="did not complete"):
        ps_serve(comm, servers=[2], workers=[0, 1])  # type: ignore[arg-type]
    assert len(posted) == 2 and all(f.cancelled() for f in posted)


def test_process_group_transfer_cancels_posted_receives_when_a_send_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shims.pg_options import DLCPOptions
    from shims.pg_signature import Op
    from shims.pg_transport import GroupTransport

    comm = _FailingComm(0, 3)
    comm.send = lambda *a, **kw: comm.send_part(None, 0, 1, role=0, to=kw["to"])  # type: ignore[attr-defined]
    signatures: list[Future[Any]] = []

    class _Endpoint:  # (the signatures: posted beside the data, cancelled with it)
        def recv(self, **kw: Any) -> Future[Any]:
            signatures.append(Future())
            return signatures[-1]

        def send(self, *a: Any, **kw: Any) -> Future[Any]:
            return Future()

    comm.endpoint = _Endpoint()  # type: ignore[attr-defined]
    monkeypatch.setenv("DLCP_CHECK_COLLECTIVES", "1")
    transport = GroupTransport(comm, DLCPOptions(), p=0.0)  # type: ignore[arg-type]
    outs = [np.zeros(16, np.uint8) for _ in range(2)]
    d = ("uint8", (16,))
    with pytest.raises(PeerTimeout, match="rank 1 published no address"):
        transport.transfer(
            7,
            [(1, 0, np.ones(16, np.uint8), d)],
            [(1, 0, outs[0], d), (2, 0, outs[1], d)],
            ReportBuilder("allgather", 7, 16),
            Op("all_gather"),
        )
    assert len(comm.recvs) == 2 and all(f.cancelled() for f in comm.recvs)
    assert len(signatures) == 2 and all(f.cancelled() for f in signatures)


def test_the_wait_backstop_names_the_message_and_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A future nobody settles (it should not happen: the endpoint times its
    transfers out first) ends the wait with an error naming the transfer."""
    from dlcp.collectives.comm import Communicator
    from dlcp.io.records import TransferFuture

    comm = Communicator.__new__(Communicator)  # no endpoint needed for wait()
    comm.rank, comm.timeout = 2, 0.01
    monkeypatch.setattr(Communicator, "BACKSTOP_MARGIN", 0.01)
    fut: TransferFuture[Any] = TransferFuture("rank 2: message (step 4, msg 4097) from rank 3")
    with pytest.raises(PeerTimeout, match=r"rank 2: message \(step 4, msg 4097\) from rank 3 "
                                          r"did not complete within 0\.02 s"):  # fmt: skip
        comm.wait(fut)
    assert fut.cancelled()


def test_a_call_that_fails_before_taking_its_numbers_still_uses_them_up() -> None:
    """Staging that fails on one rank before its collective took a call number:
    the number is skipped, so this rank's next call pairs with the other ranks'
    next call (it took the failed one's number and met their old messages)."""
    from dlcp.collectives import Communicator
    from tests.io.endpoint_helpers import local_endpoint

    with local_endpoint() as (ep, _):
        comm = Communicator(ep, 2)
        first = comm.next_call()
        with pytest.raises(MemoryError), comm.reserve(1):
            raise MemoryError("staging failed")
        with pytest.raises(MemoryError), comm.reserve(3):
            comm.next_call()  # the first of three collectives ran, the second failed
            raise MemoryError("staging failed")
        assert comm.next_call() == first + 5
        with comm.reserve(1):
            assert comm.next_call() == first + 6
        with pytest.raises(RuntimeError, match="2 call numbers taken, 1 reserved"), comm.reserve(1):
            comm.next_call()
            comm.next_call()
        # a miscount does not hide the error the body raised: it becomes a note of it
        with pytest.raises(MemoryError) as raised, comm.reserve(1):
            comm.next_call()
            comm.next_call()
            raise MemoryError("staging failed")
        assert any("call numbers taken" in note for note in raised.value.__notes__)
        comm.close()
        # closed, it takes no more: a later communicator on the channel has them now
        with pytest.raises(RuntimeError, match="communicator is closed"):
            comm.next_call()
        later = Communicator(ep, 2)
        assert later.next_call() == first + 11
        later.close()


def test_a_failed_ps_worker_stops_its_pushes() -> None:
    comm = _FailingComm(0, 2, fail_send_role=-1, fail_wait=True)
    with pytest.raises(PeerTimeout, match="did not complete"):
        ps_allreduce(comm, np.ones(100, np.float32))  # type: ignore[arg-type]
    assert comm.sends and all(f.cancelled() for f in comm.sends)


def test_an_interrupt_in_a_ring_step_cancels_its_receive() -> None:
    """KeyboardInterrupt while the main thread waits in a collective: the receive
    it posted into the caller's buffer must not write there afterwards."""
    comm = _FailingComm(0, 2, fail_send_role=-1)

    def interrupted(fut: Future[Any]) -> Any:
        raise KeyboardInterrupt

    comm.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        ring_allreduce(comm, np.ones(100, np.float32), p=0.05)  # type: ignore[arg-type]
    assert comm.recvs and all(f.cancelled() for f in comm.recvs)
    assert comm.sends and all(f.cancelled() for f in comm.sends)


class _LateFailingComm(_FailingComm):
    """Sends start; those to rank ``gone`` fail ``after`` seconds later (it went
    away), the others and the receives never settle: ``wait`` blocks up to ``limit``."""

    def __init__(self, rank: int, world: int, *, gone: int, after: float, limit: float) -> None:
        super().__init__(rank, world, fail_send_role=-1)
        self.gone, self.after, self.limit = gone, after, limit

    def send_part(self, data: Any, a: int, b: int, *, role: int, to: int, **kw: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.sends.append(fut)
        if to == self.gone:
            error = TransferFailed(f"rank {self.rank}: message to rank {to}: rank {to} closed")

            def fail() -> None:
                if fut.set_running_or_notify_cancel():  # (not if the call cancelled it)
                    fut.set_exception(error)

            timer = threading.Timer(self.after, fail)
            timer.daemon = True
            timer.start()
        return fut

    def wait(self, fut: Future[Any]) -> Any:
        try:
            return fut.result(timeout=self.limit)
        except FutureTimeout:
            raise PeerTimeout(f"rank {self.rank}: a message did not complete") from None


@pytest.mark.parametrize("collective", ["ring", "ps"])
def test_a_send_that_fails_ends_the_wait_for_a_receive(collective: str) -> None:
    """Rank 1 of 3 sends to rank 2, which goes away, while it waits for rank 0,
    which is alive but has not reached the call (it waits for rank 2 too). The
    wait lasted the receive's whole timeout although rank 1 knew of the failure
    at once; now the failed send cancels the receive and is raised."""
    comm = _LateFailingComm(1, 3, gone=2, after=0.05, limit=10.0)
    started = time.monotonic()
    with pytest.raises(TransferFailed, match="rank 2 closed"):
        if collective == "ring":
            ring_allreduce(comm, np.ones(300, np.float32), p=0.05)  # type: ignore[arg-type]
        else:  # rank 1 a worker only: it pushes to the servers and waits for their pulls
            ps_allreduce(comm, np.ones(300, np.float32),  # type: ignore[arg-type]
                         servers=[0, 2], workers=[0, 1, 2])  # fmt: skip
    assert time.monotonic() - started < 5.0
    assert comm.recvs and all(f.cancelled() for f in comm.recvs)


def test_ps_aggregation_cancels_the_pushes_it_posted_when_a_later_one_cannot_be() -> None:
    """A co-located server posts one receive per worker's push; when posting one
    raised (a worker without an address), those posted before stayed in the
    endpoint, taking that worker's push, so it was never told the call failed."""

    class _Comm(_FailingComm):
        def recv(self, out: Any, **kw: Any) -> Future[Any]:
            if kw["src"] == 2:
                raise PeerTimeout(f"rank {self.rank}: rank 2 published no address")
            return super().recv(out, **kw)

    comm = _Comm(0, 3, fail_send_role=-1)
    with pytest.raises(PeerTimeout, match="rank 2 published no address"):
        ps_allreduce(comm, np.ones(300, np.float32), servers=[0],  # type: ignore[arg-type]
                     workers=[0, 1, 2])  # fmt: skip
    assert len(comm.recvs) == 1 and comm.recvs[0].cancelled()  # rank 1's push
