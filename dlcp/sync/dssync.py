"""DS-Sync (divide and shuffle): the workers split into disjoint groups of
``group_size`` that average their parameters within the group only (P-Reduce,
:mod:`dlcp.sync.preduce`); the grouping changes every iteration, by a seeded
schedule every rank computes alike (:class:`~dlcp.sync.groups.ShuffleSchedule`),
so information mixes across the whole cluster while no iteration waits for
more than ``group_size`` workers.

Each ``step()`` runs the optimizer on this rank's gradients, then averages the
parameters with round ``clock``'s group. With ``world_size = group_size ** m``
every ``m`` rounds from an epoch start give every worker the exact mean of the
parameters (``ShuffleSchedule.rounds_to_mix``). ``group_size`` must divide the
number of workers; ``group_size == world_size`` is all-reduce averaging (BSP).
"""

from __future__ import annotations

import torch

from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from .groups import ShuffleSchedule
from .preduce import GroupAveraging

__all__ = ["DSSync"]


class DSSync(GroupAveraging):
    """One rank of DS-Sync (module docstring)."""

    name = "ds-sync"
    role = 32

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        group_size: int = 2,
        seed: int = 0,
        p: float = 0.0,
        fill: str | FillPolicy = FillPolicy.PREVIOUS,
    ) -> None:
        # (checked before the base class looks at the model or the endpoint)
        self.schedule = ShuffleSchedule(world_size, group_size, seed)
        super().__init__(model, optimizer, endpoint=endpoint, world_size=world_size, p=p,
                         fill=fill)  # fmt: skip

    def next_group(self) -> tuple[int, tuple[int, ...]]:
        # one group per rank per round: the round numbers the messages
        return self.clock, self.schedule.group_of(self.rank, self.clock)
