"""VSGD: value-staleness-aware SGD on the stale-synchronous parameter server.

Workers and servers run SSP (:mod:`dlcp.sync.ps`, staleness bound ``s``). A
server scales each update by a factor of its *value staleness*
(:mod:`dlcp.sync.lr`): ``nu`` = the Euclidean distance between the server's
shard now and the shard as the read the update was computed on returned it,
divided by a running mean of the Euclidean norm of the (scaled) updates the
server has applied, i.e. how many typical steps the parameters moved under the
update. The factor is ``(1 + mean_nu) / (1 + nu)``, clipped to
``[min_factor, max_factor]``, divided by the number of workers: an update whose
starting point the others have moved far from is damped, whatever the count
of updates in between (iteration staleness counts those; value staleness
measures their effect). Each server measures on its own shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from .clocks import ClockTable
from .eager import FactorRule, check_factors
from .lr import RunningMean, value_staleness
from .ps import ParameterServerSync
from .psserver import UpdateRule

__all__ = ["VSGD", "ValueStalenessRule"]


class ValueStalenessRule(FactorRule):
    """Scale by the normalised value-staleness factor (module docstring): ``x``
    is ``nu``, and each applied update's norm feeds the typical step."""

    wants_snapshot = True

    def __init__(self, n_workers: int, *, min_factor: float, max_factor: float) -> None:
        super().__init__(n_workers, min_factor=min_factor, max_factor=max_factor)
        self.step_norm = RunningMean()

    def measure(
        self,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
    ) -> float:
        snapshot = base[1]
        distance = float(np.linalg.norm(shard - snapshot)) if snapshot is not None else 0.0
        return value_staleness(distance, self.step_norm.value)

    def scale(
        self,
        worker: int,
        clock: int,
        base: tuple[int, npt.NDArray[np.float32] | None],
        table: ClockTable,
        shard: npt.NDArray[np.float32],
        update: npt.NDArray[np.float32],
    ) -> float:
        scale = super().scale(worker, clock, base, table, shard, update)
        self.step_norm.add(float(np.linalg.norm(update)) * scale)
        return scale


class VSGD(ParameterServerSync):
    """One rank of a VSGD job (module docstring): SSP with bound ``staleness``."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        staleness: int = 2,
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
        super().__init__(model, optimizer, endpoint=endpoint, world_size=world_size, mode="ssp",
                         staleness=staleness, servers=servers, workers=workers, p=p,
                         p_pull=p_pull, fill=fill, name="vsgd")  # fmt: skip

    def update_rule(self, n_workers: int) -> UpdateRule:
        return ValueStalenessRule(n_workers, min_factor=self.min_factor,
                                  max_factor=self.max_factor)  # fmt: skip
