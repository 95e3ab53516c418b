"""DDP communication hook over DLCP, in the style of torch's ddp_comm_hooks.

    from shims.ddp import DLCPState, dlcp_hook

    state = DLCPState(model=ddp_model, p=0.05, collective="ring")  # or its .module
    ddp_model.register_comm_hook(state, dlcp_hook)

The hook hands the bucket to the state's transport threads and returns a future
at once, so backward never waits on the network. Buckets take turns over
``lanes`` (default 1) independent lanes, bucket ``i`` on lane ``i % lanes``,
each with its own communicator (message channel) and threads: a lane runs its
buckets' collectives one at a time, in the order DDP hands them over (the same
on every rank), so the buckets of two lanes are reduced at once, as Gloo's
process group runs two operations at once. Each averages over the world size
and completes its future with the bucket tensor.
The thread that reduced a bucket passes the turn on before it completes the
future (:class:`~shims.pg_serve.OrderedServers`, as the process group
does), so a callback chained to the future may submit another bucket and wait
for it, as torch's PowerSGD hook does with its all-reduces; with one thread
that waited for itself for ever. Each parameter's layer index comes from the
model's module order (front layers first), looked up by parameter identity, so
it holds when DDP rebuilds its buckets after the first iteration.

CUDA buckets are staged through pinned host memory: a transport thread waits
on an event recorded on the producing stream, reduces on the host, and copies
back with a non-blocking copy on the bucket's device. These code paths are
written and reviewed but untested here (no GPU on these machines).
"""

# no `from __future__ import annotations` here: DDP inspects the hook's annotations
# at run time and wants the real dist.GradBucket / torch.futures.Future objects

import functools
import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

# torch.distributed re-exports GradBucket from here without declaring it to type checkers
from torch._C._distributed_c10d import GradBucket

from dlcp.collectives import (
    DIRECT_MAX_BYTES,
    Communicator,
    allreduce,
    halving_doubling_allreduce,
    ps_allreduce,
)
from dlcp.collectives.comm import CollectiveReport, check_reduce_fill
from dlcp.collectives.halving import is_power_of_two
from dlcp.collectives.ps import check_piece_bytes, check_roles
from dlcp.errors import ArgumentTypeError, UsageError, UsageStateError
from dlcp.io.endpoint import Endpoint
from dlcp.proto.config import FillPolicy
from dlcp.proto.wire import MAX_LOSS_BOUND

from .metrics import StepMetrics, Tracer, rank_path
from .pg_serve import OrderedServers, result_of

__all__ = ["COLLECTIVES", "LANE_CHANNELS", "DLCPState", "dlcp_hook"]

#: what ``DLCPState.collective`` may name
COLLECTIVES = ("ring", "halving-doubling", "ps")
#: gradient types the hook reduces (bfloat16 staged through float32)
_BUCKET_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

log = logging.getLogger("dlcp.shims")

#: how often close() looks up from waiting for the queued buckets (it waits for all)
_JOIN_POLL_S = 60.0
#: the message channel of each lane (lane 0 keeps channel 1, the hook's before
#: it had lanes; process groups use 2, monitored barriers 4)
LANE_CHANNELS = (1, 8, 9, 10)


@dataclass(slots=True)
class _Job:
    tensor: torch.Tensor
    segments: list[tuple[int, int, int]]
    future: torch.futures.Future[torch.Tensor]
    last: bool
    #: the bucket's place in submission order; its lane is ``seq % lanes``
    seq: int
    ready: Any = None  # CUDA event the host copy waits on


class _InOrder:
    """Bucket outcomes handed to :class:`StepMetrics` in submission order: lanes
    finish out of order, and a step ends with the bucket DDP marks last."""

    def __init__(self, metrics: StepMetrics) -> None:
        self._metrics = metrics
        self._next = 0
        self._held: dict[int, tuple[CollectiveReport | None, bool]] = {}
        self._lock = threading.Lock()

    def add(self, seq: int, report: CollectiveReport | None, *, last: bool) -> None:
        """Bucket ``seq``'s report (None: its collective failed)."""
        with self._lock:
            self._held[seq] = (report, last)
            while self._next in self._held:
                done, is_last = self._held.pop(self._next)
                self._next += 1
                if done is None:
                    self._metrics.add_failure(last_bucket=is_last)
                else:
                    self._metrics.add(done, last_bucket=is_last)


@dataclass
class DLCPState:
    """Everything the hook needs; create it once, before the first backward.

    ``collective``: ``"ring"`` (ring all-reduce), ``"halving-doubling"`` (the
    ring's guarantees in ``2 log2(n)`` steps instead of ``2 (n - 1)``; a
    power-of-two number of ranks; see :mod:`dlcp.collectives.halving` for where
    it pays) or ``"ps"`` (parameter server with every rank serving a shard, or
    the ranks in ``servers``; ``piece_bytes``: the pieces a shard moves in,
    :func:`dlcp.collectives.ps_allreduce`'s, None for its default).
    ``p``: loss bound of the reduce-scatter / push phase; the gather / pull
    phase uses ``p_gather`` (default 0: every replica gets identical bytes; above
    0, at most ``p``, a replica keeps its own estimate where its copy lost some:
    the mean of the values it has there, so replicas drift apart by the elements
    the reports count as lost). ``fill``: what a lost reduce-scatter / push
    element becomes, ``"zero"`` or ``"rescale"`` (``"previous"`` is refused: that
    phase receives into scratch space). ``close()`` finishes, and closes the
    endpoint if this state made it.
    ``direct_max_bytes``: with ``collective="ring"`` and no loss allowed (``p``
    and ``p_gather`` 0), a bucket whose copies to every other rank add up to at
    most this many bytes is reduced in one round
    (:func:`dlcp.collectives.direct_allreduce`: latency, not bandwidth, bounds
    small buckets, and a ring pays it ``2 (n - 1)`` times); 0 turns this off.
    With ``p > 0`` buckets always take the ring, whose owner per chunk keeps
    replicas identical whatever was lost.
    ``lanes``: how many buckets are reduced at once (1 to
    ``len(LANE_CHANNELS)``); lane ``k`` uses message channel
    ``LANE_CHANNELS[k]`` of the endpoint, so a state given an endpoint needs
    those channels free. One lane reduces one bucket at a time, as the hook did
    before it had lanes.
    ``trace_path``: a Chrome trace of the buckets' collectives, written at
    ``close()``; with several ranks each writes its own, ``name.rank<r>.json``.
    ``process_group``: the group DDP reduces over (taken from ``model`` when that
    is the DDP module itself). The hook averages over every rank of the job's
    endpoint; a DDP over a smaller group (hybrid or 2-D parallelism) is refused
    here, instead of having its gradients averaged with other groups' ranks.
    """

    model: nn.Module | None = None
    collective: str = "ring"
    p: float = 0.05
    p_gather: float = 0.0
    fill: str = "zero"
    servers: list[int] | None = None
    piece_bytes: int | None = None
    direct_max_bytes: int = DIRECT_MAX_BYTES
    lanes: int = 1
    endpoint: Endpoint | None = None
    world_size: int | None = None
    trace_path: str | None = None
    metrics: StepMetrics = field(default_factory=StepMetrics)
    process_group: Any = None

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise UsageError(
                f"collective={self.collective!r}: use one of {', '.join(COLLECTIVES)}"
            )
        if self.direct_max_bytes < 0:
            raise UsageError(f"direct_max_bytes={self.direct_max_bytes} must be >= 0")
        if not 1 <= self.lanes <= len(LANE_CHANNELS):
            raise UsageError(f"DLCPState: lanes={self.lanes} outside 1..{len(LANE_CHANNELS)}")
        if not 0.0 <= self.p <= MAX_LOSS_BOUND:
            raise UsageError(f"DLCPState: p={self.p} outside [0, {MAX_LOSS_BOUND}]")
        if not 0.0 <= self.p_gather <= self.p:
            raise UsageError(f"DLCPState: p_gather={self.p_gather} must be in [0, p={self.p}]")
        for name in ("servers", "piece_bytes"):
            if getattr(self, name) is not None and self.collective != "ps":
                raise UsageError(
                    f"DLCPState: {name}= is for collective='ps', not {self.collective!r}"
                )
        if self.piece_bytes is not None:
            check_piece_bytes(self.piece_bytes, "DLCPState: ")
        self._fill = FillPolicy(self.fill)
        check_reduce_fill(self._fill, "DLCPState")
        created = self.endpoint is None
        if self.endpoint is None:
            from dlcp.rendezvous import connect

            env = None
            if dist.is_initialized():  # (its init_method may have set no env:// variable)
                from .pg_options import rendezvous_env

                store = dist.distributed_c10d._get_default_store()
                env = rendezvous_env(store, dist.get_rank(), dist.get_world_size(), None)
            self.endpoint, job = connect(group="ddp-hook", env=env)
            self.world_size = job.world_size
        elif self.world_size is None:
            self.world_size = dist.get_world_size() if dist.is_initialized() else None
        if self.world_size is None:
            raise UsageError(
                "DLCPState needs world_size= when given an endpoint outside "
                "an initialised process group"
            )
        self._comms: list[Communicator] = []
        try:
            self._check_ranks(self.world_size)
            self._check_group(self.world_size)
            for channel in LANE_CHANNELS[: self.lanes]:
                self._comms.append(Communicator(self.endpoint, self.world_size, channel=channel))
        except ValueError as exc:
            if self._comms:  # (a channel of a later lane was taken)
                exc.add_note(f"DLCPState(lanes={self.lanes}) uses channels "
                             f"{', '.join(map(str, LANE_CHANNELS[: self.lanes]))}")  # fmt: skip
            for comm in self._comms:
                comm.close()
            if created:
                self.endpoint.close()
            raise
        #: lane 0's communicator
        self.comm = self._comms[0]
        self._layer_of: dict[int, int] = {}
        if self.model is not None:
            self._layer_of = _layer_index(self.model)
        else:
            warnings.warn(
                "DLCPState without model=: every parameter counts as layer 0, "
                "so packets carry no layer priority",
                stacklevel=2,
            )
        self._tracer = (
            Tracer(rank_path(self.trace_path, self.endpoint.rank, self.world_size))
            if self.trace_path
            else None
        )
        #: the endpoint was made here, so close() closes it
        self._owns_endpoint = created
        self._closed = False
        self._closing_lock = threading.Lock()  # submit's check-and-put against close
        self._submitted = 0  # (under _closing_lock)
        self._outcomes = _InOrder(self.metrics)
        self._servers: list[OrderedServers[_Job]] = [
            OrderedServers(
                functools.partial(self._run, comm), name="dlcp-ddp-hook", os_name="dlcp-ddp-hook"
            )
            for comm in self._comms
        ]

    def _check_group(self, world: int) -> None:
        group = self.process_group
        if group is None and isinstance(self.model, nn.parallel.DistributedDataParallel):
            group = self.model.process_group
        if group is not None and group.size() != world:
            raise UsageError(
                f"DLCPState averages over all {world} ranks of the job, but DDP's "
                f"process group has {group.size()}: the DLCP hook does not serve "
                "a DDP over a subgroup"
            )

    def _check_ranks(self, world: int) -> None:
        if self.collective == "halving-doubling" and not is_power_of_two(world):
            raise UsageError(
                f"collective='halving-doubling' needs a power-of-two number of ranks, "
                f"got {world}: use 'ring'"
            )
        if self.collective == "ps":
            check_roles(world, self.servers, None)  # (what ps_allreduce would refuse later)

    # ------------------------------------------------------------------ hook side

    def segments_for(self, params: list[torch.Tensor]) -> list[tuple[int, int, int]]:
        """(offset, length, layer) of each parameter in the flattened bucket."""
        out, offset = [], 0
        for prm in params:
            n = prm.numel()
            out.append((offset, n, self._layer_of.get(id(prm), 0)))
            offset += n
        return out

    def submit(
        self, tensor: torch.Tensor, segments: list[tuple[int, int, int]], last: bool
    ) -> torch.futures.Future[torch.Tensor]:
        # a CUDA bucket's future carries its device, so consumers sync with the copy back
        fut: torch.futures.Future[torch.Tensor] = (
            torch.futures.Future(devices=[tensor.device])
            if tensor.is_cuda
            else torch.futures.Future()
        )
        if tensor.dtype not in _BUCKET_DTYPES:
            raise ArgumentTypeError(
                f"the DLCP DDP hook reduces float32, float16 and bfloat16 gradients, "
                f"got a {tensor.dtype} bucket"
            )
        ready = None
        if tensor.is_cuda:  # pragma: no cover - no GPU here
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # (unannotated in torch)
            ready.record(torch.cuda.current_stream(tensor.device))
        with self._closing_lock:  # a job put after close()'s stop marker would never run
            if self._closed:
                raise UsageStateError("DLCPState is closed: the DDP hook cannot reduce a bucket")
            seq = self._submitted
            self._submitted += 1
            lane = self._servers[seq % len(self._servers)]
            lane.put(_Job(tensor, segments, fut, last, seq, ready))
        return fut

    def close(self) -> None:
        """Finish queued buckets, stop the transport threads, write the trace, and
        close the endpoint if this state made it (one passed in stays open)."""
        with self._closing_lock:
            if self._closed:
                return
            self._closed = True
            for servers in self._servers:
                servers.stop()
        # every queued bucket ends, reduced or failed within the endpoint's
        # timeout; a callback chained to a bucket's future may take longer
        for servers in self._servers:
            while not servers.join(timeout=_JOIN_POLL_S):
                log.warning("DLCPState.close(): still waiting for %d transport thread(s) "
                            "(a queued bucket, or a callback on a bucket's future)",
                            servers.threads)  # fmt: skip
        try:
            if self._tracer is not None:
                self._tracer.write()
        finally:  # a trace that cannot be written still releases the endpoint
            for comm in self._comms:  # (their channels: a later state continues their calls)
                comm.close()
            if self._owns_endpoint and self.endpoint is not None:
                self.endpoint.close()

    # ------------------------------------------------------------------ transport threads

    def _run(self, comm: Communicator, job: _Job) -> Callable[[], None]:
        """Reduce ``job``'s bucket over its lane's ``comm`` (in the lane's turn:
        see :mod:`.pg_serve`); returns what completes its future, run after the
        turn has passed on."""
        try:
            # a bucket that fails here before its collective took a call number
            # (staging it, say) still uses one up: later buckets stay paired
            with comm.reserve(1):
                report = self._reduce(comm, job)
            self._outcomes.add(job.seq, report, last=job.last)
            if self._tracer is not None:
                self._tracer.add(report)
        except BaseException as exc:  # surfaces in the training loop via the future
            log.error("dlcp hook: %s", exc)
            self._outcomes.add(job.seq, None, last=job.last)
            # (a torch future takes an Exception only: anything else killed this thread)
            error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
            # (torch's stub types set_exception's argument as the future's value type)
            return functools.partial(job.future.set_exception, error)  # type: ignore[arg-type]
        return functools.partial(job.future.set_result, job.tensor)

    def _reduce(self, comm: Communicator, job: _Job) -> CollectiveReport:
        t = job.tensor
        # bfloat16 travels and is summed as float32 (numpy has no bfloat16)
        wire = torch.float32 if t.dtype == torch.bfloat16 else t.dtype
        if t.is_cuda:  # pragma: no cover - no GPU here
            job.ready.synchronize()
            host = torch.empty(t.shape, dtype=wire, pin_memory=True)
            host.copy_(t)
            report = self._collective(comm, host.numpy(), job.segments)
            with torch.cuda.device(t.device):
                t.copy_(host, non_blocking=True)
                torch.cuda.current_stream(t.device).synchronize()
            return report
        if wire != t.dtype:
            staged = t.detach().to(wire)
            report = self._collective(comm, staged.numpy(), job.segments)
            t.copy_(staged)
            return report
        return self._collective(comm, t.detach().numpy(), job.segments)

    def _collective(
        self, comm: Communicator, data: np.ndarray, segments: list[tuple[int, int, int]]
    ) -> CollectiveReport:
        if self.collective != "ps":
            reduce = (
                halving_doubling_allreduce
                if self.collective == "halving-doubling"
                # the ring, or one round for a small exact bucket
                else functools.partial(allreduce, direct_max_bytes=self.direct_max_bytes)
            )
            return reduce(
                comm,
                data,
                segments=segments,
                p=self.p,
                p_gather=self.p_gather,
                fill=self._fill,
                average=True,
            )
        return ps_allreduce(
            comm,
            data,
            servers=self.servers,
            piece_bytes=self.piece_bytes,
            segments=segments,
            p_push=self.p,
            p_pull=self.p_gather,
            fill=self._fill,
            average=True,
        )


def dlcp_hook(state: DLCPState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket across ranks over DLCP."""
    tensor = bucket.buffer()
    segments = state.segments_for(bucket.parameters())
    # (the transport thread's exception re-raised in the chained future: result_of)
    return state.submit(tensor, segments, bucket.is_last()).then(result_of)


def _layer_index(model: nn.Module) -> dict[int, int]:
    """Parameter identity -> layer index, in module order (front layers first)."""
    layers: dict[int, int] = {}
    index = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        for prm in own:
            layers.setdefault(id(prm), index)
        index += 1
    return layers
