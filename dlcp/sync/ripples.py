"""Ripples: asynchronous decentralised training with partial all-reduce.

After each local step a worker averages its parameters with one group of
workers (P-Reduce, :mod:`dlcp.sync.preduce`), not with everyone. The groups
come from a group generator every rank runs alike
(:class:`~dlcp.sync.groups.GroupGenerator`: Group Division of the workers
active in each round, seeded), consumed through each worker's Group Buffer
(:class:`~dlcp.sync.groups.GroupBuffer`: the pre-generated global sequence,
in order, so no set of workers can wait on each other in a cycle). There is no
global barrier: a worker waits only for the members of its next group.

Heterogeneity: ``slowdown={rank: x}`` marks a worker ``x`` times slower; it
joins one round in ``x``, so it meets the others about as often as its speed
allows and the fast workers average among themselves in between. A
homogeneous cluster (no slowdown) uses the static schedule by default
(``static=True``): a fixed rotation of groups, no randomness.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from .groups import GroupBuffer, GroupGenerator
from .preduce import GroupAveraging

__all__ = ["Ripples"]


class Ripples(GroupAveraging):
    """One rank of Ripples (module docstring)."""

    name = "ripples"
    role = 48

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        group_size: int = 2,
        seed: int = 0,
        slowdown: Mapping[int, int] | None = None,
        static: bool | None = None,
        p: float = 0.0,
        fill: str | FillPolicy = FillPolicy.PREVIOUS,
    ) -> None:
        homogeneous = all(x == 1 for x in (slowdown or {}).values())
        self.generator = GroupGenerator(
            world_size, group_size, seed=seed, slowdown=slowdown,
            static=homogeneous if static is None else static,
        )  # fmt: skip
        self.buffer = GroupBuffer(self.generator, endpoint.rank)
        super().__init__(model, optimizer, endpoint=endpoint, world_size=world_size, p=p,
                         fill=fill)  # fmt: skip

    def next_group(self) -> tuple[int, tuple[int, ...]]:
        g = self.buffer.next()
        return g.gid, g.members
