"""A parameter server over Gloo's point-to-point TCP: the baseline for DLCP's.

DDP over Gloo all-reduces gradients with a ring; it has no parameter-server
mode. To compare DLCP's parameter server with TCP under the same traffic
pattern (every worker sends to one server at once: incast), this DDP comm hook
does what a TCP parameter server does, with ``torch.distributed.isend/irecv``
of the process group (Gloo's TCP pairs):

* every rank but the server sends its bucket to the server;
* the server receives them all, adds them to its own in rank order, divides
  by the world size, and sends the average back to every rank.

Every replica ends with the server's bytes (the hook returns them), so
replicas stay identical. The hook waits for the exchange before it returns a
completed future: the backward pass stalls for it, as in a synchronous
parameter server (DLCP's hook instead completes its future from its own
thread). Only CPU tensors: a CUDA bucket is copied to the host and back.

    ddp.register_comm_hook(TcpPsState(server=0), tcp_ps_hook)
"""

# no `from __future__ import annotations` here: DDP inspects the hook's annotations
# at run time and wants the real dist.GradBucket / torch.futures.Future objects

from dataclasses import dataclass

import torch
import torch.distributed as dist

# torch.distributed re-exports GradBucket from here without declaring it to type checkers
from torch._C._distributed_c10d import GradBucket

__all__ = ["TcpPsState", "tcp_ps_hook"]


@dataclass
class TcpPsState:
    """Which rank serves, and in which process group (default: the default group)."""

    server: int = 0
    group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        world = dist.get_world_size(self.group)
        if not 0 <= self.server < world:
            raise ValueError(f"server={self.server} is not a rank of 0..{world - 1}")


def tcp_ps_hook(state: TcpPsState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Push the bucket to the server, pull the average back (module docstring)."""
    buffer = bucket.buffer()
    host = buffer if buffer.device.type == "cpu" else buffer.cpu()
    _exchange(state, host)
    if host is not buffer:  # pragma: no cover - no GPU here
        buffer.copy_(host)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _exchange(state: TcpPsState, grad: torch.Tensor) -> None:
    group, server = state.group, state.server
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world == 1:
        return
    if rank != server:
        dist.send(grad, dst=_global(group, server), group=group)
        dist.recv(grad, src=_global(group, server), group=group)
        return
    workers = [r for r in range(world) if r != server]
    pushed = {r: torch.empty_like(grad) for r in workers}
    _wait_all([dist.irecv(pushed[r], src=_global(group, r), group=group) for r in workers])
    total = torch.zeros_like(grad)
    for r in range(world):  # rank order: the same sum whichever push came first
        total += grad if r == server else pushed[r]
    grad.copy_(total.div_(world))
    _wait_all([dist.isend(grad, dst=_global(group, r), group=group) for r in workers])


def _wait_all(works: list[dist.Work | None]) -> None:
    """Wait for each of ``works`` (torch returns None to a rank outside the group,
    which this rank, a member, never is)."""
    for work in works:
        if work is None:
            raise RuntimeError("tcp_ps: this rank is not a member of the group")
        work.wait()


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (send/recv take global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)
