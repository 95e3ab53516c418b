"""torch.distributed backend ``"dlcp"``: a process group whose collectives run over DLCP.

    import shims.process_group          # registers the backend (so does `import dlcp`)
    dist.init_process_group("dlcp")          # torchrun's env:// variables, as with gloo
    model = DistributedDataParallel(model)   # unmodified DDP now reduces over DLCP

The group is a pure-Python subclass of ``torch.distributed.ProcessGroup``
(torch calls its methods from Python and, for DDP's reducer, from C++ through
its trampoline). Each method checks its arguments in the caller's thread,
queues the operation and returns a ``Work`` wrapping a ``torch.futures.Future``
at once; the group's transport threads run the queued operations one at a
time in call order, which is the same on every rank, and complete the futures
(a future's callback may wait for another operation of the group: see
:mod:`.pg_serve`). So
``async_op=True``, ``work.get_future()`` and DDP's overlap of backward with
communication behave as with Gloo.

What travels how:

* ``all_reduce`` with SUM or AVG of float32 / float16 / bfloat16 tensors: ring
  all-reduce (:func:`dlcp.collectives.ring_allreduce`); bfloat16 is reduced in
  float32. The reduce-scatter phase takes the loss bound ``p``; the all-gather
  phase is reliable, so every rank ends with identical bytes. An exact one
  (``p = 0``) of a small tensor (its copies to every other rank within
  ``DLCPOptions.direct_max_bytes``) goes in one round instead
  (:func:`dlcp.collectives.direct_allreduce`): latency bounds it, and a ring
  pays latency ``2 (n - 1)`` times.
* every other all-reduce (integer / bool / float64 tensors, MAX, MIN, PRODUCT,
  BAND, BOR, BXOR): an exact all-gather of the raw bytes, then the same
  reduction in rank order on every rank.
* ``broadcast``, ``all_gather``, ``all_gather_into_tensor``, ``gather``,
  ``scatter``: the tensors' raw bytes as uint8 messages with ``p = 0`` (any
  dtype; bitwise exact; :mod:`.pg_bytes`).
* ``reduce``, ``reduce_scatter``, ``reduce_scatter_tensor``: on top of all-reduce.
* ``barrier``: a token to and from every other rank, queued behind every
  operation issued before it; ``monitored_barrier`` as Gloo's (:mod:`.pg_barriers`).
* the coalesced forms (``all_reduce_coalesced``, ``all_gather_coalesced``,
  ``all_gather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``,
  ``dist._coalescing_manager``): one operation per tensor, one work for all;
  also the functional collectives (``torch.distributed._functional_collectives``,
  DTensor's) of the operations above.

Bounded loss is off by default (``p = 0``): generic code gets exact results.
Turn it on for large float all-reduces (DDP's gradient buckets) with
``DLCP_DEFAULT_P=0.05`` in the environment, or per group with
``dist.init_process_group("dlcp", pg_options=DLCPOptions(p=0.05))`` (also
``dist.new_group(backend="dlcp", pg_options=...)``). Tensors smaller than
``DLCPOptions.lossy_min_elems`` (metrics, flags) are always reduced exactly.
Every operation's :class:`~dlcp.collectives.CollectiveReport` (bytes, lost
elements, retransmissions, time) is kept in :attr:`DLCPProcessGroup.reports`;
:func:`dlcp_group` finds the group object.

* ``all_to_all_single`` (equal or uneven splits), ``all_to_all`` and the
  all-reduce of sparse COO tensors (DDP's sparse gradients, SUM): exact byte
  messages (:mod:`.pg_exchange`).
* ``send``, ``recv``, ``isend``, ``irecv``, a receive from any source and so
  ``batch_isend_irecv``: exact messages matched by (peer, tag, sequence number),
  started at once in the caller's thread, outside the collectives' order
  (:mod:`.pg_p2p`).

A timeout says "Timed out" and names the operation, the peers that did not
arrive and the timeout (:mod:`.pg_timeouts`). What is left unsupported raises
``NotImplementedError`` naming the operation.

CUDA tensors are staged through (pinned) host memory: the caller records an
event on the current stream, a transport thread waits on it, copies to the
host, runs the collective and copies back; futures are created with the
tensors' devices so that consumers synchronise with the copy. Those code paths
are written but untested here (no GPU on these machines).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from dlcp.collectives import CollectiveReport
from dlcp.errors import ArgumentTypeError, DLCPError, PeerTimeout, UsageError
from dlcp.io.endpoint import Endpoint
from dlcp.rendezvous import attempt, connect

from . import BACKEND, register
from .pg_barriers import Barriers
from .pg_bytes import ByteCollectives
from .pg_checks import check_gather_list, check_reducible, reduce_op, root_rank
from .pg_coalesced import CoalescingAndNames
from .pg_exchange import Exchanges
from .pg_options import DLCPOptions, job_world_size, rendezvous_env
from .pg_p2p import PointToPoint
from .pg_serve import OrderedServers
from .pg_signature import GroupCommunicator, Op
from .pg_tensors import (
    DLCPWork,
    Job,
    TensorList,
    check_tensors,
    flatten,
)
from .pg_timeouts import DLCPTimeout, peers_named, timed_out
from .pg_transport import GroupTransport

__all__ = [
    "BACKEND",
    "DLCPOptions",
    "DLCPProcessGroup",
    "DLCPWork",
    "create_group",
    "dlcp_group",
    "register",
]

log = logging.getLogger("dlcp.shims")

#: Communicator channel of process groups (the DDP hook uses 1); each group has
#: its own endpoint, the channel only keeps traces readable
CHANNEL = 2
#: seconds shutdown() lets queued operations finish before closing the endpoint
SHUTDOWN_GRACE = 30.0


class DLCPProcessGroup(  # type: ignore[misc]  # (ByteCollectives' overrides: see below)
    ByteCollectives, Barriers, Exchanges, CoalescingAndNames, dist.ProcessGroup
):
    """A process group over one DLCP endpoint. Created by torch through the
    registered backend; see the module docstring.

    (The collectives carry ``# type: ignore[override]``: torch's stub declares each as
    overloads of the C++ signatures, and torch calls a backend with the options form.
    Those of :class:`~shims.pg_bytes.ByteCollectives` differ from the stub's the same
    way, which mypy reports on this class statement.)"""

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        timeout: timedelta | None = None,
        options: DLCPOptions | None = None,
        *,
        name: str = "",
    ) -> None:
        # (torch's stub lists only the (store, rank, size) constructor; (rank, size) is the
        # one for a group implemented in Python)
        super().__init__(rank, world_size)  # type: ignore[call-arg]
        if options is not None and not isinstance(options, DLCPOptions):
            raise ArgumentTypeError(
                f"pg_options for the dlcp backend must be DLCPOptions, got {type(options).__name__}"
            )
        self.options = options if options is not None else DLCPOptions()
        self._name = name
        self._rank = rank
        self._size = world_size
        self.endpoint: Endpoint
        self.endpoint, _ = connect(
            group="pg",
            # (accepts str and bytes values; one namespace per torchrun attempt)
            store=cast(Any, PrefixStore(f"dlcp/{attempt(os.environ)}", store)),
            env=rendezvous_env(store, rank, world_size, timeout),
            job_world_size=job_world_size(),
        )
        try:
            self.comm = GroupCommunicator(self.endpoint, world_size, channel=CHANNEL)
            #: loss bound of large float SUM/AVG all-reduces
            self.p = (
                self.options.p
                if self.options.p is not None
                else self.endpoint.config.protocol.default_p
            )
            self._transport = GroupTransport(self.comm, self.options, self.p)
            self._p2p = PointToPoint(self.endpoint, rank, world_size, name=name)
        except BaseException:  # (a bad option: the endpoint would outlive the error)
            self.endpoint.close()
            raise
        self._reports: deque[CollectiveReport] = deque(maxlen=1024)
        self._reports_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closed = False
        self._servers: OrderedServers[Job] = OrderedServers(
            self._run, name=f"dlcp-pg-{name or 'default'}-{rank}", os_name=f"dlcp-pg-{rank}"
        )
        if self.p > 0:
            log.info("dlcp process group %r: float all-reduces with loss bound p=%g", name, self.p)

    @property
    def reports(self) -> tuple[CollectiveReport, ...]:
        """The latest 1024 collectives' reports, oldest first (one per tensor of an
        operation): a snapshot, safe to read while operations run."""
        with self._reports_lock:
            return tuple(self._reports)

    def __repr__(self) -> str:
        return f"DLCPProcessGroup(rank={self._rank}, size={self._size}, p={self.p:g})"

    # ------------------------------------------------------------------ torch's interface

    def getBackendName(self) -> str:  # the name torch's trampoline looks up
        return BACKEND

    def allreduce(self, tensors: TensorList, opts: Any = None) -> DLCPWork:  # type: ignore[override]
        red = reduce_op(opts, "allreduce")
        if any(isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, red)
        check_tensors(tensors, "allreduce")
        for t in tensors:
            check_reducible(t, red, "allreduce")

        op = Op("all_reduce", red.name)

        def run() -> list[CollectiveReport]:  # one per tensor
            return [self._transport.allreduce(t, red, op) for t in tensors]

        return self._submit("allreduce", run, tensors, tensors, calls=len(tensors))

    def allreduce_coalesced(self, tensors: TensorList, opts: Any = None) -> DLCPWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: TensorList, opts: Any = None) -> DLCPWork:  # type: ignore[override]
        red = reduce_op(opts, "reduce")
        root = root_rank(opts, "reduce", self._size)
        check_tensors(tensors, "reduce")
        for t in tensors:
            check_reducible(t, red, "reduce")

        op = Op("reduce", red.name, root)

        def run() -> list[CollectiveReport]:  # one per tensor
            reports = []
            for t in tensors:
                # every rank computes the result; only the root keeps it
                mine = t if self._rank == root else t.detach().clone()
                reports.append(self._transport.allreduce(mine, red, op))
            return reports

        return self._submit("reduce", run, tensors, tensors, calls=len(tensors))

    def reduce_scatter(  # type: ignore[override]
        self, output_tensors: TensorList, input_tensors: list[TensorList], opts: Any = None
    ) -> DLCPWork:
        red = reduce_op(opts, "reduce_scatter")
        check_tensors(output_tensors, "reduce_scatter")
        if len(output_tensors) != len(input_tensors):
            raise UsageError(
                f"reduce_scatter: {len(output_tensors)} outputs for "
                f"{len(input_tensors)} input lists"
            )
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            check_gather_list(ins, out, "reduce_scatter", self._size)
            check_reducible(out, red, "reduce_scatter")

        op = Op("reduce_scatter", red.name)

        def run() -> list[CollectiveReport]:  # one per output
            reports = []
            for out, ins in zip(output_tensors, input_tensors, strict=True):
                whole = torch.cat([t.detach().reshape(-1).cpu() for t in ins])
                reports.append(self._transport.allreduce(whole, red, op))
                with torch.no_grad():
                    out.copy_(whole.view(self._size, -1)[self._rank].view(out.shape))
            return reports

        return self._submit(
            "reduce_scatter", run, output_tensors, [*output_tensors, *flatten(input_tensors)],
            calls=len(output_tensors),
        )  # fmt: skip

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> DLCPWork:
        """``reduce_scatter_tensor``: slice r of the reduced input lands in rank r's output."""
        red = reduce_op(opts, "reduce_scatter_tensor")
        check_tensors([output, input], "reduce_scatter_tensor")
        if output.dtype != input.dtype or input.numel() != output.numel() * self._size:
            raise UsageError(
                f"reduce_scatter_tensor: input {input.dtype}{list(input.shape)} must hold "
                f"{self._size} x output {output.dtype}{list(output.shape)}"
            )
        check_reducible(output, red, "reduce_scatter_tensor")

        op = Op("reduce_scatter_tensor", red.name)

        def run() -> CollectiveReport | None:
            whole = input.detach().reshape(-1).cpu().clone()
            report = self._transport.allreduce(whole, red, op)
            with torch.no_grad():
                output.copy_(whole.view(self._size, -1)[self._rank].view(output.shape))
            return report

        return self._submit("reduce_scatter_tensor", run, [output], [output, input])

    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> DLCPWork:
        return self.reduce_scatter_single(output, input, opts)

    def shutdown(self) -> None:
        """Finish queued operations, stop the transport threads, close the endpoint."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._servers.stop()
        # queued work normally finishes at once; what still waits on a peer after
        # the grace period fails with EndpointClosed when the endpoint closes
        self._servers.join(timeout=min(self.comm.timeout, SHUTDOWN_GRACE))
        self.endpoint.close()  # (fails pending point-to-point transfers: queued below)
        self._p2p.close()
        self._servers.join(timeout=SHUTDOWN_GRACE)
        self._p2p.join(timeout=SHUTDOWN_GRACE)

    def abort(self) -> None:
        """Close the endpoint now: pending operations fail with EndpointClosed."""
        with self._lock:
            already = self._closed
            self._closed = True
        self.endpoint.close()
        if not already:
            self._servers.stop()
            self._p2p.close()

    # ------------------------------------------------------------------ caller side

    def _submit(
        self,
        name: str,
        run: Callable[[], CollectiveReport | list[CollectiveReport] | None],
        result: TensorList,
        touched: TensorList,
        *,
        calls: int = 1,
    ) -> DLCPWork:
        """Queue an operation that takes ``calls`` call numbers (see _serve)."""
        cuda: list[int | str | torch.device] = sorted(
            {t.device for t in touched if t.is_cuda}, key=str
        )
        future: torch.futures.Future[Any] = (
            torch.futures.Future(devices=cuda) if cuda else torch.futures.Future()
        )
        ready = None
        if cuda:  # pragma: no cover - no GPU here
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # (unannotated in torch)
            ready.record(torch.cuda.current_stream(cuda[0]))
        with self._lock:  # queue order is call order: the same on every rank
            if self._closed:
                raise DLCPError(f"dlcp process group (rank {self._rank}) is shut down: {name}")
            self._servers.put(Job(name, run, result, future, ready, calls))
        log.debug("dlcp process group rank %d: queued %s", self._rank, name)
        work = DLCPWork(name, future)
        if self._coalescing is not None:  # (see CoalescingAndNames)
            self._coalescing.append(work)
        return work

    @contextlib.contextmanager
    def _checks(self, name: str) -> Iterator[None]:
        """Argument checks that may fail on some ranks only (the root's and the
        others' differ): a refused operation still takes its call number, in
        queue order, so that this rank's later operations stay paired with the
        other ranks' (else they would meet this one's messages)."""
        try:
            yield
        except Exception:
            self._submit(f"{name} (refused)", self._take_call, [], [])
            raise

    def _take_call(self) -> CollectiveReport | None:
        self.comm.next_call()
        return None

    # ------------------------------------------------------------------ transport threads

    def _run(self, job: Job) -> Callable[[], None]:
        """Run ``job`` (in its turn: see :mod:`.pg_serve`); what completes its future."""
        started = time.monotonic()
        try:
            # an operation that fails here before it took its call numbers (in
            # staging, say) still uses them up: later ones stay paired
            with self.comm.reserve(job.calls):
                if job.ready is not None:  # pragma: no cover - no GPU here
                    job.ready.synchronize()
                report = job.run()
        except BaseException as exc:  # surfaces in the caller through the future
            elapsed = time.monotonic() - started
            log.error("dlcp process group rank %d: %s failed after %.2f s: %s: %s",
                      self._rank, job.name, elapsed, type(exc).__name__, exc)  # fmt: skip
            error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
            if isinstance(error, PeerTimeout) and not isinstance(error, DLCPTimeout):
                # worded as torch's backends word theirs (the peers, the timeout);
                # a peer's own timer may have ended it before the group's timeout
                peers = peers_named(error)
                error = timed_out(
                    job.name, self._rank, peers, self.comm.timeout, str(exc), elapsed=elapsed
                )
            error.add_note(f"in dlcp process group operation {job.name} on rank {self._rank}")
            return functools.partial(job.future.set_exception, error)
        if report is not None:  # (a list: a collective per tensor, each reported)
            with self._reports_lock:
                self._reports.extend(report if isinstance(report, list) else [report])
        return functools.partial(job.future.set_result, job.result)


def create_group(backend_opts: Any, pg_options: Any) -> DLCPProcessGroup:
    """The creator torch calls (extended API): store, group rank/size, timeout, options."""
    return DLCPProcessGroup(
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        pg_options,
        name=str(backend_opts.group_id),
    )


def dlcp_group(group: Any = None) -> DLCPProcessGroup:
    """The :class:`DLCPProcessGroup` behind ``group`` (default: the default group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, DLCPProcessGroup):
        raise UsageError(f"{pg!r} is not a dlcp process group (backend {dist.get_backend(pg)!r})")
    return pg


register()
