"""Eager-pull parameter server with a staleness-aware learning rate.

Push and pull are decoupled: after its local step a worker pushes its update
and at once asks for the parameters, without waiting for its push, or anyone
else's, to be applied (the servers answer reads at once, as in ASP). It does
not wait for that answer either: ``step()`` returns and the next iteration's
computation runs while the push and the pull are in flight; the next
``step()`` installs the pulled parameters (the freshest the worker has) after
pushing, so the iteration after that starts from them. Update ``c`` is thus
computed on the read made at step ``c - 2`` (``ParameterServer.lag`` = 1 in
read clocks), and every update's staleness is known to the server.

The servers apply each update with the factor of :mod:`dlcp.sync.lr`:
``(1 + mean_tau) / (1 + tau)`` (clipped to ``[min_factor, max_factor]``)
divided by the number of workers, where ``tau`` is the updates applied since
the update's read, in rounds of the cluster, and ``mean_tau`` its running mean.
A uniformly stale cluster gets factor 1; only stragglers' stale updates are
damped.

``trace`` records, per step, when ``step()`` returned (the next computation
starts) and when each push finished arriving: a push that finishes after its
step returned overlapped the next computation.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..errors import ConfigError, UsageStateError
from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from .api import StepReport
from .clocks import ClockTable
from .lr import RunningMean, normalised_factor, staleness_rounds
from .ps import ParameterServerSync
from .psserver import READ, UpdateRule

__all__ = ["EagerPullSync", "FactorRule", "StalenessRule"]


class FactorRule(UpdateRule):
    """Scale each update by ``normalised_factor(x, running mean of x)`` divided
    by the number of workers, ``x`` being what :meth:`measure` says of the
    update's staleness; ``history`` keeps (worker, clock, x, factor) of the
    latest updates."""

    def __init__(self, n_workers: int, *, min_factor: float, max_factor: float) -> None:
        super().__init__(n_workers)
        self.min_factor, self.max_factor = min_factor, max_factor
        self.mean = RunningMean()
        self.history: list[tuple[int, int, float, float]] = []

    def measure(
        self,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
    ) -> float:
        raise NotImplementedError

    def scale(
        self,
        worker: int,
        clock: int,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
        update: npt.NDArray[np.float32],
    ) -> float:
        x = self.measure(base, table, shard)
        factor = normalised_factor(x, self.mean.add(x), min_factor=self.min_factor,
                                   max_factor=self.max_factor)  # fmt: skip
        self.history = [*self.history[-999:], (worker, clock, x, factor)]
        return factor / self.n_workers


class StalenessRule(FactorRule):
    """Scale by the normalised staleness factor (module docstring): ``x`` is the
    update's staleness in rounds."""

    def measure(
        self,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
    ) -> float:
        return staleness_rounds(table.version, base[0], self.n_workers)


def check_factors(min_factor: float, max_factor: float) -> None:
    if not 0 < min_factor <= 1 <= max_factor:
        raise ConfigError(
            f"min_factor={min_factor}, max_factor={max_factor}: need 0 < min <= 1 <= max"
        )


class EagerPullSync(ParameterServerSync):
    """One rank of an eager-pull parameter-server job (module docstring)."""

    lag = 1

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        servers: Sequence[int] | None = None,
        workers: Sequence[int] | None = None,
        p: float = 0.0,
        p_pull: float = 0.0,
        fill: str | FillPolicy = FillPolicy.ZERO,
        min_factor: float = 0.1,
        max_factor: float = 2.0,
    ) -> None:
        check_factors(min_factor, max_factor)
        self.min_factor, self.max_factor = min_factor, max_factor
        super().__init__(model, optimizer, endpoint=endpoint, world_size=world_size, mode="asp",
                         servers=servers, workers=workers, p=p, p_pull=p_pull, fill=fill,
                         name="eager")  # fmt: skip
        self._inflight: list[tuple[Any, Any, Any]] | None = None
        #: (event, clock, perf_counter time): "returned" (step() returned: the next
        #: computation starts), "pushed" (a push finished arriving)
        self.trace: list[tuple[str, int, float]] = []

    def update_rule(self, n_workers: int) -> UpdateRule:
        return StalenessRule(n_workers, min_factor=self.min_factor, max_factor=self.max_factor)

    def step(self) -> StepReport:
        if not self.is_worker:
            raise ConfigError(f"rank {self.rank} is a dedicated server: it calls serve()")
        if self._closed:
            raise UsageStateError(f"rank {self.rank}: step() after close()")
        update = self.local_update()
        t0 = time.perf_counter()
        clock = self.clock
        for fut in self._push(update):
            fut.add_done_callback(functools.partial(self._pushed, clock))
        if self._inflight is not None:  # the pull asked for last step: install it
            report = self._collect(self._inflight, self.clock, t0)
        else:  # (the first step: nothing pulled since the start)
            report = StepReport(scheme=self.name, clock=self.clock,
                                wait_seconds=time.perf_counter() - t0)  # fmt: skip
        self._inflight = None
        self._inflight = self._request(READ, self.clock)
        self.reports.append(report)
        self.trace.append(("returned", clock, time.perf_counter()))
        return report

    def _pushed(self, clock: int, _fut: object) -> None:
        self.trace.append(("pushed", clock, time.perf_counter()))

    def close(self) -> None:
        if not self._closed and self.failure is None and self._inflight is not None:
            try:
                self._collect(self._inflight, self.clock, time.perf_counter())
            finally:
                self._inflight = None
        super().close()
