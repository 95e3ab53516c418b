"""BSP all-reduce over DLCP: the baseline the other schemes are measured against.

Each ``step()`` averages the gradients of every worker with DLCP's ring
all-reduce (reduce-scatter with loss bound ``p``, lost elements filled as
``fill`` says; reliable all-gather, so every replica stays identical), then
runs the optimizer on the average. Every rank is a worker.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..collectives import Communicator, ring_allreduce
from ..errors import ConfigError, UsageStateError
from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from .api import StepReport, SyncScheme, check_loss_bound, check_world

__all__ = ["AllReduceSync"]

#: the Communicator channel of the gradient all-reduces
ALLREDUCE_CHANNEL = 0x0C


class AllReduceSync(SyncScheme):
    """One rank of BSP all-reduce training (module docstring)."""

    name = "allreduce"

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        p: float = 0.0,
        fill: str | FillPolicy = FillPolicy.ZERO,
    ) -> None:
        check_world(endpoint.rank, world_size)
        check_loss_bound("p", p)
        self.fill = FillPolicy(fill) if isinstance(fill, str) else fill
        if self.fill is FillPolicy.PREVIOUS:
            raise ConfigError("fill='previous': a reduce adds what it receives")
        super().__init__(model, optimizer)
        self.p = p
        self.comm = Communicator(endpoint, world_size, channel=ALLREDUCE_CHANNEL)

    def step(self) -> StepReport:
        if self._closed:
            raise UsageStateError(f"rank {self.comm.rank}: step() after close()")
        grads = np.empty(self.flat.numel, np.float32)
        for p, a, b in zip(self.flat.params, self.flat.offsets, self.flat.offsets[1:],
                           strict=False):  # fmt: skip
            grads[a:b] = 0.0 if p.grad is None else p.grad.detach().reshape(-1).numpy()
        t0 = time.perf_counter()
        rep = ring_allreduce(self.comm, grads, p=self.p, fill=self.fill, average=True)
        wait = time.perf_counter() - t0
        with torch.no_grad():
            for p, a, b in zip(self.flat.params, self.flat.offsets, self.flat.offsets[1:],
                               strict=False):  # fmt: skip
                p.grad = torch.from_numpy(grads[a:b].copy()).view_as(p)
        self.optimizer.step()
        self.clock += 1
        report = StepReport(scheme=self.name, clock=self.clock, version=self.clock,
                            lost_elems=rep.lost_elems,
                            bounded_elems=rep.bounded_elems,
                            lost_chunks=rep.lost_chunks, class_chunks=rep.class_chunks,
                            wait_seconds=wait)  # fmt: skip
        self.reports.append(report)
        return report

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.comm.close()
