"""Staleness-aware learning-rate factors (pure functions, no sockets).

A parameter server applies ``factor * update / workers``. Two measures of how
stale an update is:

* **Staleness** (eager-pull PS, :mod:`dlcp.sync.eager`): ``tau``, the updates
  the server applied between the read the update was computed on and now,
  divided by the number of workers: how many rounds of the whole cluster the
  update lags behind (0: nobody else moved).
* **Value staleness** (VSGD, :mod:`dlcp.sync.vsgd`): ``nu``, the Euclidean
  distance between the parameters the update was computed on and the server's
  current parameters (of the server's shard), divided by a running mean of
  the Euclidean norm of the updates applied (after scaling): how many typical
  steps away the update's starting point is. It is 0 when the parameters did
  not move, whatever the number of updates in between.

Both feed the same normalised factor::

    factor(x, mean_x) = (1 + mean_x) / (1 + x),  clipped to [min_factor, max_factor]

where ``mean_x`` is a running mean of ``x`` over the updates the server has
seen (:class:`RunningMean`). It is monotone: non-increasing in ``x`` and
non-decreasing in ``mean_x``. An update as stale as the cluster's usual gets
factor 1, so a cluster that is uniformly stale (every update lags by about
the same amount) is not simply slowed down; only updates staler than usual
are damped, and fresher ones amplified up to ``max_factor``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError

__all__ = ["RunningMean", "normalised_factor", "staleness_rounds", "value_staleness"]


def normalised_factor(
    x: float, mean_x: float, *, min_factor: float = 0.1, max_factor: float = 2.0
) -> float:
    """The factor above; ``x`` and ``mean_x`` >= 0."""
    if x < 0 or mean_x < 0 or math.isnan(x) or math.isnan(mean_x):
        raise UsageError(f"staleness {x} and its mean {mean_x} must be >= 0")
    return min(max_factor, max(min_factor, (1.0 + mean_x) / (1.0 + x)))


def staleness_rounds(version_now: int, version_read: int, workers: int) -> float:
    """``tau``: updates applied since the read, in rounds of ``workers`` updates."""
    if version_now < version_read:
        raise UsageError(f"version {version_now} is older than the read's {version_read}")
    return (version_now - version_read) / workers


def value_staleness(distance: float, typical_step: float) -> float:
    """``nu``: ``distance`` in typical steps (0 when nothing moved; a distance with
    no step seen yet counts as one step)."""
    if distance < 0:
        raise UsageError(f"distance {distance} must be >= 0")
    if distance == 0.0:
        return 0.0
    return distance / typical_step if typical_step > 0 else 1.0


@dataclass(slots=True)
class RunningMean:
    """Exponential moving average; the first value seeds it."""

    weight: float = 0.1
    value: float = 0.0
    count: int = 0

    def add(self, x: float) -> float:
        self.value = x if self.count == 0 else (1 - self.weight) * self.value + self.weight * x
        self.count += 1
        return self.value
