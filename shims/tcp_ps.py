"""A parameter server over Gloo's point-to-point TCP: the baseline for DLCP's.

DDP over Gloo all-reduces gradients with a ring; it has no parameter-server
mode. To compare DLCP's parameter server with TCP under the same traffic
pattern (every worker sends to one server at once: incast), this DDP comm hook
does what a TCP parameter server does, with ``torch.distributed.isend/irecv``
of the process group (Gloo's TCP pairs):

* every rank but the server sends its bucket to the server;
* the server receives them all, adds them to its own in rank order, divides
  by the world size, and sends the average back to every rank.

It moves a bucket in the pieces DLCP's parameter server cuts a co-located
server's shard into (:func:`dlcp.collectives.ps.piece_bounds`, ``piece_bytes``,
0 for whole buckets), a tagged send and receive each: the server sends a
piece's average back once every rank's push of it is in, while the later
pieces are still pushed, as DLCP's does.

Every replica ends with the server's bytes (the hook returns them), so
replicas stay identical. As DLCP's hook does, it hands the bucket to a
transport thread of its own and returns a future at once: the exchange
overlaps the rest of the backward pass, and buckets are exchanged one at a
time in the order DDP hands them over (the same on every rank). Only CPU
tensors: a CUDA bucket is copied to the host and back.

    state = TcpPsState(server=0)
    ddp.register_comm_hook(state, tcp_ps_hook)
    ...
    state.close()  # (or leave it: its threads are daemons)
"""

# no `from __future__ import annotations` here: DDP inspects the hook's annotations
# at run time and wants the real dist.GradBucket / torch.futures.Future objects

import functools
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# torch.distributed re-exports GradBucket from here without declaring it to type checkers
from torch._C._distributed_c10d import GradBucket

from dlcp.collectives.ps import MAX_PIECES, PIECE_BYTES, check_piece_bytes, piece_bounds
from dlcp.errors import UsageError, UsageStateError

from .pg_serve import OrderedServers, result_of

__all__ = ["TcpPsState", "tcp_ps_hook"]

#: a bucket's exchange: its buffer and the future the hook returned for it
_Job = tuple[torch.Tensor, "torch.futures.Future[torch.Tensor]"]


@dataclass
class TcpPsState:
    """Which rank serves, in which process group (default: the default group),
    the pieces a bucket moves in (module doc); and the transport threads that
    exchange the buckets."""

    server: int = 0
    group: dist.ProcessGroup | None = None
    piece_bytes: int = PIECE_BYTES
    _servers: "OrderedServers[_Job] | None" = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        world = dist.get_world_size(self.group)
        if not 0 <= self.server < world:
            raise UsageError(f"server={self.server} is not a rank of 0..{world - 1}")
        check_piece_bytes(self.piece_bytes, "TcpPsState: ")

    def submit(self, buffer: torch.Tensor) -> "torch.futures.Future[torch.Tensor]":
        """Queue ``buffer``'s exchange; the future completes with it averaged."""
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        with self._lock:
            if self._closed:
                raise UsageStateError("TcpPsState is closed: no more buckets")
            if self._servers is None:  # (started by the first bucket)
                self._servers = OrderedServers(
                    self._run, name="tcp-ps-hook", os_name="tcp-ps-hook"
                )
            self._servers.put((buffer, fut))
        return fut

    def close(self, timeout: float = 30.0) -> None:
        """Refuse later buckets and let the queued ones finish (at most ``timeout`` s)."""
        with self._lock:
            self._closed = True
            servers, self._servers = self._servers, None
        if servers is not None:
            servers.stop()
            servers.join(timeout)

    def _run(self, job: _Job) -> Callable[[], None]:
        """Exchange one bucket (in its turn); what completes its future."""
        buffer, fut = job
        try:
            host = buffer if buffer.device.type == "cpu" else buffer.cpu()
            _exchange(self, host)
            if host is not buffer:  # pragma: no cover - no GPU here
                buffer.copy_(host)
        except Exception as exc:  # surfaces in the training loop via the future
            # (torch's stub types set_exception's argument as the future's value type)
            return functools.partial(fut.set_exception, exc)  # type: ignore[arg-type]
        return functools.partial(fut.set_result, buffer)


def tcp_ps_hook(state: TcpPsState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Push the bucket to the server, pull the average back (module docstring),
    from the state's transport thread: the future is returned at once."""
    return state.submit(bucket.buffer()).then(result_of)


def _exchange(state: TcpPsState, grad: torch.Tensor) -> None:
    group, server = state.group, state.server
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world == 1:
        return
    bounds = piece_bounds(0, len(grad), grad.element_size(), state.piece_bytes)
    pieces = list(itertools.pairwise(bounds))
    if rank != server:
        src = _global(group, server)
        # (pull k lands in grad[a:b] only after the server has all of push k)
        works = [dist.isend(grad[a:b], dst=src, group=group, tag=k)
                 for k, (a, b) in enumerate(pieces)]  # fmt: skip
        works += [dist.irecv(grad[a:b], src=src, group=group, tag=MAX_PIECES + k)
                  for k, (a, b) in enumerate(pieces)]  # fmt: skip
        _wait_all(works)
        return
    workers = [r for r in range(world) if r != server]
    pushed = {r: torch.empty_like(grad) for r in workers}
    incoming = [
        [dist.irecv(pushed[r][a:b], src=_global(group, r), group=group, tag=k) for r in workers]
        for k, (a, b) in enumerate(pieces)
    ]
    outgoing: list[dist.Work | None] = []
    for k, (a, b) in enumerate(pieces):
        _wait_all(incoming[k])
        total = torch.zeros_like(grad[a:b])
        for r in range(world):  # rank order: the same sum whichever push came first
            total += grad[a:b] if r == server else pushed[r][a:b]
        grad[a:b].copy_(total.div_(world))
        outgoing += [dist.isend(grad[a:b], dst=_global(group, r), group=group, tag=MAX_PIECES + k)
                     for r in workers]  # fmt: skip
    _wait_all(outgoing)


def _wait_all(works: list[dist.Work | None]) -> None:
    """Wait for each of ``works`` (torch returns None to a rank outside the group,
    which this rank, a member, never is)."""
    for work in works:
        if work is None:
            raise UsageStateError("tcp_ps: this rank is not a member of the group")
        work.wait()


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (send/recv take global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)
