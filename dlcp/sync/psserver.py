"""One parameter-server shard on a DLCP endpoint, for the parameter-server schemes.

The server holds a shard (whole parameters, see
:meth:`~dlcp.sync.api.FlatModel.shard_by_parameter`) and one thread. Workers
talk to it with four messages of the sync channel (``step`` numbers them):

========  ==========  =======  ===========================================
role      direction   step     payload
========  ==========  =======  ===========================================
PUSH      w -> s      clock t  the update of w's iteration t (float32, bound ``p``)
REQUEST   w -> s      seq n    int64 [op, clock, read_version]: op 0 = read at
                               ``clock``, 1 = w has finished
META      s -> w      seq n    int64 (:func:`encode_meta`): status, versions, clocks,
                               what w's pushes lost since its last read
DATA      s -> w      seq n    the shard (float32, the pull bound)
========  ==========  =======  ===========================================

Every worker alternates: read (request + reply), compute, push. So the server
posts a worker's next REQUEST and PUSH receives when it answers that worker's
read: a posted receive then waits only while the worker computes, and one that
times out (the endpoint's timeout) means that worker went silent, which the
server reports to everyone else, naming it. A worker whose messages fail (its
endpoint closed, its process died) is reported the same way. A co-located
worker (same rank) reaches its server through :meth:`local_push` and
:meth:`local_request`, not the network.

What a read may see follows :mod:`dlcp.sync.clocks`; how much of an update is
applied follows the server's :class:`UpdateRule` (``1 / workers`` by default,
so that one update from every worker moves the parameters as one averaged
step would).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ..io.endpoint import Endpoint, Received
from ..proto.config import FillPolicy
from ..proto.loss_report import N_CLASSES
from .api import WorkerFailed, sync_msg
from .clocks import ClockTable, RoundBuffer
from .loss import LossTally

__all__ = ["META_HEADER", "ParameterServer", "ReadReply", "UpdateRule", "decode_meta"]

PUSH, REQUEST, META, DATA = 1, 2, 3, 4
READ, FINISH = 0, 1
OK, FAILED = 0, 1
#: int64 fields of META before the per-worker clocks
META_HEADER = 6 + 2 * N_CLASSES


@dataclass(frozen=True, slots=True)
class ReadReply:
    """A decoded META: what the read saw and what the reader's pushes lost."""

    status: int
    failed_rank: int
    version: int
    #: applied updates of the slowest worker still training (-1: none is)
    slowest: int
    lost_elems: int
    bounded_elems: int
    lost_chunks: tuple[int, ...]
    class_chunks: tuple[int, ...]
    clocks: tuple[int, ...]


def encode_meta(
    status: int,
    failed_rank: int,
    version: int,
    slowest: int | None,
    loss: list[int],
    clocks: tuple[int, ...],
) -> npt.NDArray[np.uint8]:
    least = -1 if slowest is None else slowest
    fields = np.array([status, failed_rank, version, least, *loss, *clocks], dtype=np.int64)
    return fields.view(np.uint8)


def decode_meta(raw: npt.NDArray[Any]) -> ReadReply:
    f = np.ascontiguousarray(raw).view(np.int64).tolist()
    n = N_CLASSES
    return ReadReply(
        status=f[0],
        failed_rank=f[1],
        version=f[2],
        slowest=f[3],
        lost_elems=f[4],
        bounded_elems=f[5],
        lost_chunks=tuple(f[6 : 6 + n]),
        class_chunks=tuple(f[6 + n : 6 + 2 * n]),
        clocks=tuple(f[META_HEADER:]),
    )


def encode_request(op: int, clock: int, read_version: int = 0) -> npt.NDArray[np.uint8]:
    return np.array([op, clock, read_version], dtype=np.int64).view(np.uint8)


class UpdateRule:
    """How much of a worker's update the server applies: ``scale`` times it.
    The default divides by the number of workers. Subclasses (staleness-aware
    schemes) decide from the read the update was computed on: its version and,
    where :attr:`wants_snapshot`, the shard as that read returned it."""

    #: keep a copy of the shard at every read until the update computed on it is applied
    wants_snapshot = False

    def __init__(self, n_workers: int) -> None:
        self.n_workers = n_workers

    def scale(
        self,
        worker: int,
        clock: int,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
        update: npt.NDArray[np.float32],
    ) -> float:
        """``base``: (version, snapshot or None) of the read update ``clock`` of
        ``worker`` was computed on; ``shard`` as it is now."""
        return 1.0 / self.n_workers


class ParameterServer:
    """A shard's server (module docstring). ``staleness`` None is ASP; ``bsp``
    applies each clock's updates together, in worker order."""

    def __init__(
        self,
        endpoint: Endpoint,
        shard: npt.NDArray[np.float32],
        *,
        workers: tuple[int, ...],
        staleness: int | None,
        bsp: bool = False,
        p_push: float = 0.0,
        p_pull: float = 0.0,
        fill: FillPolicy = FillPolicy.ZERO,
        rule: UpdateRule | None = None,
        lag: int = 0,
        on_event: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.rank = endpoint.rank
        self.shard = shard.astype(np.float32, copy=True)
        self.table = ClockTable(workers, 0 if bsp else staleness)
        self.rounds = RoundBuffer(workers) if bsp else None
        self.p_push, self.p_pull, self.fill = p_push, p_pull, fill
        self.rule = rule or UpdateRule(len(workers))
        #: update ``c`` of a worker was computed on its read at clock ``c - lag``
        #: (0: the read just before it; 1: an eager worker's, one step older)
        self.lag = lag
        #: trace hook (kind, worker, clock): "applied", "answered"
        self.on_event = on_event
        self._events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._posted: dict[tuple[int, int, int], Future[Any]] = {}  # (worker, role, step)
        #: the clock a worker said it finished at (its updates up to it still count)
        self._final: dict[int, int] = {}
        self._early: dict[tuple[int, int], npt.NDArray[np.float32]] = {}
        self._next_request = dict.fromkeys(workers, 0)
        #: the version each read was answered with: what that clock's update was computed on
        self._reads_answered: dict[
            tuple[int, int], tuple[int, npt.NDArray[np.float32] | None]
        ] = {}
        self._reads: list[tuple[int, int, int]] = []  # (worker, seq, clock) waiting
        self._loss = {w: LossTally() for w in workers}
        self._local: dict[int, Future[tuple[ReadReply, npt.NDArray[np.float32]]]] = {}
        self._told: set[int] = set()
        self.failure: WorkerFailed | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"dlcp-ps-{self.rank}", daemon=True)
        #: when the thread last handled a message (monotonic)
        self.last_event = time.monotonic()

    # ----------------------------------------------------------------- API

    def start(self) -> None:
        for w in self.table.workers:
            if w != self.rank:
                self._post(w, REQUEST, 0)
        self._thread.start()

    def local_push(self, clock: int, update: npt.NDArray[np.float32]) -> None:
        self._events.put(("push", self.rank, clock, update, None))

    def local_request(
        self, seq: int, op: int, clock: int, read_version: int
    ) -> Future[tuple[ReadReply, npt.NDArray[np.float32]]]:
        fut: Future[tuple[ReadReply, npt.NDArray[np.float32]]] = Future()
        self._local[seq] = fut
        self._events.put(("request", self.rank, seq, (op, clock, read_version)))
        return fut

    def join(self, timeout: float | None = None, *, idle: float | None = None) -> None:
        """Wait for the thread to end: at most ``timeout`` seconds, or (``idle``) for as
        long as it keeps handling messages, giving up after ``idle`` seconds without
        one (its workers are still training: their receives time out by themselves)."""
        if idle is None:
            self._thread.join(timeout)
        else:
            while self._thread.is_alive():
                self._thread.join(min(1.0, idle))
                if time.monotonic() - self.last_event > idle:
                    break
        if self._thread.is_alive():
            raise TimeoutError(f"rank {self.rank}: parameter server still serving")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Ask the thread to end now (this rank's endpoint is going away)."""
        self._events.put(("stop",))

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # ----------------------------------------------------------------- plumbing

    def _post(self, worker: int, role: int, step: int) -> None:
        fut = self.endpoint.recv(src=worker, step=step, msg=sync_msg(role),
                                 p=self.p_push if role == PUSH else None,
                                 fill=self.fill if role == PUSH else None)  # fmt: skip
        self._posted[(worker, role, step)] = fut
        fut.add_done_callback(lambda f: self._events.put(("rx", worker, role, step, f)))

    def _run(self) -> None:
        try:
            while not self._finished():
                ev = self._events.get()
                self.last_event = time.monotonic()
                if ev[0] == "stop":
                    break
                self._handle(ev)
                self._answer_ready()
        except BaseException as exc:  # the co-located worker's join() re-raises it
            self.error = exc
            self._fail_all(WorkerFailed(f"rank {self.rank}: parameter server failed: {exc!r}",
                                        self.rank))  # fmt: skip
        finally:
            for fut in self._posted.values():
                fut.cancel()

    def _finished(self) -> bool:
        """Every worker has finished or (after a failure) been told of it."""
        return all(w in self.table.finished or w in self._told for w in self.table.workers)

    def _handle(self, ev: tuple[Any, ...]) -> None:
        kind, worker = ev[0], ev[1]
        if kind == "rx":
            _, _, role, step, fut = ev
            if self._posted.get((worker, role, step)) is fut:
                del self._posted[(worker, role, step)]
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                self._worker_failed(worker, f"its message (step {step}) did not arrive: {exc}")
                return
            got: Received = fut.result()
            if role == PUSH:
                self._loss[worker].add(got, bounded=self.p_push > 0)
                self._push(worker, step, got.data.copy())
            else:
                op, clock, version = np.ascontiguousarray(got.data).view(np.int64).tolist()
                self._request(worker, step, op, clock, version)
        elif kind == "push":
            self._push(worker, ev[2], ev[3])
        elif kind == "request":
            self._request(worker, ev[2], *ev[3])
        elif kind == "sent":  # a reply that failed to reach its worker
            self._worker_failed(worker, f"a reply to it failed: {ev[2]}")

    def _push(self, worker: int, clock: int, update: npt.NDArray[np.float32]) -> None:
        if self.failure is not None or worker in self.table.finished:
            return
        if update.shape != self.shard.shape or update.dtype != np.float32:
            raise UsageError(
                f"rank {self.rank}: worker {worker} pushed {update.dtype} {update.shape}, "
                f"the shard is float32 {self.shard.shape}"
            )
        if self.rounds is None:
            # (asynchronous reads let a worker's next push overtake this one)
            self._early[(worker, clock)] = update
            while (nxt := self._early.pop((worker, self.table.applied[worker]), None)) is not None:
                c = self.table.applied[worker]
                base = self._reads_answered.get((worker, max(0, c - self.lag)), (0, None))
                s = self.rule.scale(worker, c, base, self.table, self.shard, nxt)
                self._reads_answered.pop((worker, c - self.lag - 1), None)  # (used up)
                self.shard += nxt * np.float32(s)
                self.table.applied_one(worker, c)
                self._trace("applied", worker, c)
            self._maybe_finished(worker)
            return
        for c, updates in self.rounds.add(worker, clock, update, self.table.finished):
            self._push_round(c, updates)

    def _request(self, worker: int, seq: int, op: int, clock: int, version: int) -> None:
        if seq != self._next_request[worker]:
            raise UsageError(f"rank {self.rank}: request {seq} of worker {worker} out of order")
        self._next_request[worker] = seq + 1
        if op == FINISH:  # its pushes before ``clock`` may still be on their way
            self._final[worker] = clock
            for (w, role, step), fut in list(self._posted.items()):
                if w == worker and role == PUSH and step >= clock:
                    fut.cancel()
            self._maybe_finished(worker)
            return
        self._reads.append((worker, seq, clock))

    def _push_round(self, clock: int, updates: list[tuple[int, npt.NDArray[np.float32]]]) -> None:
        total = updates[0][1].copy()
        for _, u in updates[1:]:
            total += u
        self.shard += total / np.float32(len(self.table.workers))
        for w, _ in updates:
            self.table.applied_one(w, clock)
            self._trace("applied", w, clock)
        for w, _ in updates:
            self._maybe_finished(w)

    def _maybe_finished(self, worker: int) -> None:
        final = self._final.get(worker)
        if final is None or self.table.applied[worker] < final or worker in self.table.finished:
            return
        self.table.finish(worker)
        if self.rounds is not None:  # the others' rounds no longer wait for it
            for c, updates in self.rounds.ready(self.table.finished):
                self._push_round(c, updates)

    def _answer_ready(self) -> None:
        waiting = []
        for worker, seq, clock in self._reads:
            if self.failure is not None:
                self._reply(worker, seq, clock, FAILED)
                self._told.add(worker)
            elif self.table.can_read(worker, clock):
                self._reply(worker, seq, clock, OK)
            else:
                waiting.append((worker, seq, clock))
        self._reads = waiting

    def _reply(self, worker: int, seq: int, clock: int, status: int) -> None:
        failed = self.failure.rank if self.failure is not None else -1
        meta = encode_meta(status, failed, self.table.version, self.table.slowest(),
                           self._loss[worker].fields(),
                           self.table.clocks())  # fmt: skip
        self._loss[worker] = LossTally()
        if self.rounds is None:  # (BSP applies whole rounds: no rule to feed)
            snapshot = self.shard.copy() if self.rule.wants_snapshot else None
            self._reads_answered[(worker, clock)] = (self.table.version, snapshot)
        self._trace("answered", worker, clock)
        if worker == self.rank:
            fut = self._local.pop(seq)
            fut.set_result((decode_meta(meta), self.shard.copy()))
            return
        if status == OK:  # its next messages: the push of this clock, then a request
            self._post(worker, PUSH, clock)
            self._post(worker, REQUEST, seq + 1)
        for payload, role, p in ((meta, META, 0.0), (self.shard, DATA, self.p_pull)):
            sent = self.endpoint.send(payload, to=worker, step=seq, msg=sync_msg(role), p=p)
            sent.add_done_callback(functools.partial(self._on_sent, worker))

    def _on_sent(self, worker: int, fut: Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is not None and self.failure is None:
            self._events.put(("sent", worker, fut.exception()))

    def _worker_failed(self, worker: int, why: str) -> None:
        if self.failure is None:
            self.failure = WorkerFailed(
                f"rank {self.rank} (parameter server): worker rank {worker} failed: {why}", worker
            )
        self._told.add(worker)  # (nothing more to tell it)
        for (w, _, _), fut in list(self._posted.items()):
            if w == worker:
                fut.cancel()

    def _fail_all(self, failure: WorkerFailed) -> None:
        self.failure = self.failure or failure
        for fut in self._local.values():
            if not fut.done():
                fut.set_exception(self.failure)

    def _trace(self, kind: str, worker: int, clock: int) -> None:
        if self.on_event is not None:
            self.on_event(kind, worker, clock)
