"""A co-located server's shard moves in pieces (``dlcp.collectives.ps``): where
the pieces fall, that each piece goes back as soon as its pushes are in (a fake
communicator records the order), and that the result is still exact over real
endpoints: one server on rank 0 (the testbed's incast), every rank a server, and
a co-located server beside a dedicated one (whose shard moves whole).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.collectives import Communicator, ps_allreduce, ps_serve
from dlcp.collectives.comm import MAX_ROLE, ReportBuilder
from dlcp.collectives.ps import MAX_PIECES, PIECE_BYTES, PULL, PUSH, piece_bounds
from dlcp.collectives.ring import chunk_bounds
from dlcp.errors import PeerTimeout, UsageError
from dlcp.proto.config import FillPolicy
from tests.collectives.test_ps_dedicated import (
    TIMEOUT,
    assert_identical,
    endpoints,
    worker_data,
)


@pytest.mark.parametrize(
    ("a", "b", "itemsize", "piece_bytes", "pieces"),
    [
        (0, 1000, 4, 0, 1),  # 0: the whole shard
        (0, 1000, 4, 4096, 1),  # smaller than a piece: one
        (10, 10 + 4096, 4, 4096, 4),  # 16 KiB in pieces of 4 KiB
        (0, 8190, 2, 4096, 3),  # 16,380 bytes: 3 pieces of at least 4 KiB, not 4
        (0, 1 << 20, 4, 4096, MAX_PIECES),  # no more than MAX_PIECES
    ],
)
def test_piece_bounds(a: int, b: int, itemsize: int, piece_bytes: int, pieces: int) -> None:
    bounds = piece_bounds(a, b, itemsize, piece_bytes)
    assert len(bounds) == pieces + 1
    assert bounds[0] == a and bounds[-1] == b
    sizes = np.diff(bounds)
    assert (sizes > 0).all() and sizes.max() - sizes.min() <= 1
    if pieces > 1:
        assert sizes.min() * itemsize >= piece_bytes


@pytest.mark.parametrize("piece_bytes", [-1, 1.5, True])
def test_piece_bytes_must_be_an_int_of_zero_or_more(piece_bytes: Any) -> None:
    class _Comm:
        rank, world_size = 0, 2

        def next_call(self) -> int:
            return 0

    with pytest.raises(UsageError, match="piece_bytes="):
        ps_allreduce(_Comm(), np.ones(8, np.float32), piece_bytes=piece_bytes)  # type: ignore[arg-type]


class _Recorder:
    """A communicator that settles nothing itself: a posted receive's future
    completes when the collective waits for it, and every post, send and wait is
    recorded in order, by role."""

    def __init__(self, rank: int, world: int, *, fail_wait_role: int | None = None) -> None:
        self.rank, self.world_size = rank, world
        self.events: list[tuple[str, int, int]] = []  # (what, role, peer)
        self.futures: list[Future[Any]] = []
        self.fail_wait_role = fail_wait_role
        self._roles: dict[int, tuple[int, int]] = {}

    def next_call(self) -> int:
        return 3

    def msg_id(self, role: int) -> int:
        assert 0 <= role <= MAX_ROLE
        return role

    def recv(self, out: Any, *, src: int, role: int, **kw: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._roles[id(fut)] = (role, src)
        self.events.append(("recv", role, src))
        self.futures.append(fut)
        return fut

    def send_part(self, data: Any, a: int, b: int, *, role: int, to: int, **kw: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._roles[id(fut)] = (role, to)
        self.events.append(("send", role, to))
        self.futures.append(fut)
        return fut

    def wait(self, fut: Future[Any]) -> Any:
        role, peer = self._roles[id(fut)]
        self.events.append(("wait", role, peer))
        if role == self.fail_wait_role:
            raise PeerTimeout(f"rank {self.rank}: role {role} from rank {peer} did not complete")
        return None


def test_a_piece_goes_back_before_the_next_pieces_pushes_are_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ReportBuilder, "received", lambda self, got, bounded: None)
    monkeypatch.setattr(ReportBuilder, "sent", lambda self, report, itemsize: None)
    comm = _Recorder(0, 3)  # rank 0 serves the one shard; ranks 1 and 2 push to it
    ps_allreduce(comm, np.ones(4096, np.float32), servers=[0], piece_bytes=4096)  # type: ignore[arg-type]
    pushes = [e for e in comm.events if e[0] == "recv"]
    # every piece's pushes are posted before the server waits for any
    assert pushes == [("recv", PUSH + k, w) for k in range(4) for w in (1, 2)]
    assert comm.events[: len(pushes)] == pushes
    served = comm.events[len(pushes) :]
    for k in range(4):
        # piece k: its two pushes waited for, then sent back to both workers,
        # all before the server waits for piece k + 1
        at = served.index(("wait", PUSH + k, 1))
        assert served[at : at + 4] == [
            ("wait", PUSH + k, 1),
            ("wait", PUSH + k, 2),
            ("send", PULL + k, 1),
            ("send", PULL + k, 2),
        ]
    assert [e for e in served if e[0] == "wait" and e[1] >= PULL] == [
        ("wait", PULL + k, w) for k in range(4) for w in (1, 2)
    ]  # (the sends, waited for at the end)


def test_a_worker_pushes_in_pieces_and_pulls_in_pieces() -> None:
    comm = _Recorder(1, 3)
    comm.wait = lambda fut: None  # type: ignore[method-assign]
    monkey = pytest.MonkeyPatch()
    monkey.setattr(ReportBuilder, "received", lambda self, got, bounded: None)
    monkey.setattr(ReportBuilder, "sent", lambda self, report, itemsize: None)
    try:
        ps_allreduce(comm, np.ones(4096, np.float32), servers=[0], piece_bytes=4096)  # type: ignore[arg-type]
    finally:
        monkey.undo()
    assert comm.events == [("send", PUSH + k, 0) for k in range(4)] + [
        ("recv", PULL + k, 0) for k in range(4)
    ]


@pytest.mark.parametrize(
    ("world", "servers", "workers", "pieces"),
    [
        (3, [0], None, 6),
        (5, [0, 3, 4], [0, 1, 2], 2),
        (3, [0, 1, 2], None, 1),
        (3, None, None, 1),
    ],
    ids=["one-server", "a-worker-serving-nothing", "every-rank", "every-rank-by-default"],
)
def test_pieces_by_default_only_where_a_worker_serves_no_shard(
    monkeypatch: pytest.MonkeyPatch,
    world: int,
    servers: list[int] | None,
    workers: list[int] | None,
    pieces: int,
) -> None:
    """Where every worker serves a shard, each rank's link carries both ways in
    both phases already: whole shards, as many messages as before."""
    monkeypatch.setattr(ReportBuilder, "received", lambda self, got, bounded: None)
    monkeypatch.setattr(ReportBuilder, "sent", lambda self, report, itemsize: None)
    comm = _Recorder(0, world)
    # 6 pieces' worth: one server's shard makes 6 pieces, each of three 2
    nbytes = 6 * PIECE_BYTES
    ps_allreduce(comm, np.ones(nbytes // 4, np.float32), servers=servers, workers=workers)  # type: ignore[arg-type]
    roles = {role for what, role, _ in comm.events if what == "recv" and role < PULL}
    assert roles == {PUSH + k for k in range(pieces)}


def test_a_failure_after_the_first_piece_went_back_cancels_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 serves, sends piece 0 back, then the wait for piece 1 fails: the
    pushes it still had posted, and the pulls it had sent, stop."""
    monkeypatch.setattr(ReportBuilder, "received", lambda self, got, bounded: None)
    comm = _Recorder(0, 3, fail_wait_role=PUSH + 1)
    with pytest.raises(PeerTimeout, match="role 1 from rank 1 did not complete"):
        ps_allreduce(comm, np.ones(4096, np.float32), servers=[0], piece_bytes=4096)  # type: ignore[arg-type]
    assert ("send", PULL + 0, 2) in comm.events  # (piece 0 had gone back)
    assert len(comm.futures) == 4 * 2 + 2  # every piece's pushes, piece 0's pulls
    assert all(f.cancelled() for f in comm.futures)


def _run(
    world: int,
    servers: list[int],
    workers: list[int],
    *,
    piece_bytes: int,
    dtype: type[np.floating[Any]] = np.float32,
    **kwargs: Any,
) -> tuple[dict[int, Any], dict[int, Any]]:
    """One PS call on every rank of ``world`` endpoints, a thread each."""
    with endpoints(world) as eps:

        def rank_main(rank: int) -> tuple[npt.NDArray[Any] | None, Any]:
            comm = Communicator(eps[rank], world)
            if rank not in workers:
                serve = {k: v for k, v in kwargs.items() if k != "p_pull"}
                return None, ps_serve(comm, servers=servers, workers=workers, **serve)
            data = worker_data(rank).astype(dtype)
            return data, ps_allreduce(comm, data, servers=servers, workers=workers,
                                      piece_bytes=piece_bytes, **kwargs)  # fmt: skip

        with ThreadPoolExecutor(world, thread_name_prefix="ps-rank") as pool:
            done = [f.result(timeout=TIMEOUT + 10) for f in
                    [pool.submit(rank_main, r) for r in range(world)]]  # fmt: skip
    return {r: done[r][0] for r in workers}, {r: done[r][1] for r in range(world)}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("world", "servers", "workers", "options"),
    [
        # one co-located server, as in the testbed's incast: float32 added on arrival
        (4, [0], [0, 1, 2, 3], {"average": True}),
        # its other paths: buffers added in worker order (float16, rescale), and a
        # pull bound, which leaves a worker's estimate of the sum where a pull lost
        (4, [0], [0, 1, 2, 3], {"dtype": np.float16}),
        (4, [0], [0, 1, 2, 3], {"fill": FillPolicy.RESCALE}),
        (4, [0], [0, 1, 2, 3], {"p_push": 0.05, "p_pull": 0.05}),
        (3, [0, 1, 2], [0, 1, 2], {}),  # every rank serves a shard
        (4, [0, 3], [0, 1, 2], {"average": True}),  # beside a dedicated server
    ],
    ids=["one-server", "float16", "rescale", "pull-bound", "every-rank", "mixed"],
)
def test_pieces_leave_the_aggregate_exact(
    world: int, servers: list[int], workers: list[int], options: dict[str, Any]
) -> None:
    arrays, reports = _run(world, servers, workers, piece_bytes=32 * 1024, **options)
    assert_identical([arrays[w] for w in workers])
    dtype = options.get("dtype", np.float32)
    want = np.sum([worker_data(w).astype(dtype).astype(np.float64) for w in workers], axis=0)
    want /= len(workers) if options.get("average") else 1
    tol = 1e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(arrays[workers[0]].astype(np.float64), want, rtol=tol, atol=tol)
    if dtype == np.float16 or options.get("fill") is FillPolicy.RESCALE:
        # added from buffers in worker order: the same bits as whole shards
        whole, _ = _run(world, servers, workers, piece_bytes=0, **options)
        assert arrays[workers[0]].tobytes() == whole[workers[0]].tobytes()
    shards = np.diff(chunk_bounds(len(want), len(servers)))
    itemsize = np.dtype(dtype).itemsize
    for r in workers:
        rep = reports[r]
        assert rep.lost_elems == 0 and rep.elems == len(want)
        # a worker pushes the other servers' shards and pulls them back; a
        # co-located server also takes its own shard from every other worker
        # and sends it back to each
        pushed = sum(int(n) for s, n in zip(servers, shards, strict=True) if s != r)
        served = int(shards[servers.index(r)]) * (len(workers) - 1) if r in servers else 0
        assert rep.bytes_sent == rep.bytes_received == (pushed + served) * itemsize
