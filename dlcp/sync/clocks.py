"""The clock rules of a parameter server's consistency models (no sockets, no
threads, no clock: the server feeds events in and asks what it may answer).

Terms. A worker's *clock* is the number of iterations it has completed, i.e.
the number of updates it has pushed. Update ``t`` of a worker is the one it
computed in its iteration ``t`` (``t = 0, 1, ...``). The server counts, per
worker, the updates it has *applied*; a worker's updates are applied in order.

Rules, for a worker at clock ``c`` asking to read (before iteration ``c``):

1. **SSP** with staleness bound ``s >= 0``: the read is answered once
   (a) the slowest unfinished worker's applied count is at least ``c - s``, so the
   parameters hold every worker's updates ``0 .. c - s - 1``; and
   (b) the reader's own applied count is at least ``c`` (it reads its own writes).
   So while a worker computes iteration ``c``, no worker has completed fewer
   than ``c - s`` iterations: the spread of clocks never exceeds ``s``.
2. **BSP** is SSP with ``s = 0``, and the updates of one clock are applied
   together, in worker order, once every unfinished worker has pushed its own
   (:class:`RoundBuffer`): every read at clock ``c`` sees exactly the updates
   ``0 .. c - 1`` of every worker, as a single process would.
3. **ASP** (``s = None``) answers every read at once, with whatever is applied.
4. A worker that has finished (said so with its final clock) no longer holds
   the others back: it is left out of the minimum.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..errors import UsageError

__all__ = ["ClockTable", "RoundBuffer", "read_is_consistent"]


@dataclass(slots=True)
class ClockTable:
    """Applied updates per worker and which workers have finished."""

    workers: tuple[int, ...]
    #: staleness bound; None: asynchronous (ASP)
    staleness: int | None
    applied: dict[int, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.staleness is not None and self.staleness < 0:
            raise UsageError(f"staleness={self.staleness} must be >= 0 (None: asynchronous)")
        if not self.workers or len(set(self.workers)) != len(self.workers):
            raise UsageError(f"workers={self.workers} must be distinct and not empty")
        for w in self.workers:
            self.applied.setdefault(w, 0)

    @property
    def version(self) -> int:
        """Updates applied in all (every worker's)."""
        return sum(self.applied.values())

    def clocks(self) -> tuple[int, ...]:
        return tuple(self.applied[w] for w in self.workers)

    def slowest(self) -> int | None:
        """The applied count of the slowest unfinished worker (None: all finished)."""
        live = [self.applied[w] for w in self.workers if w not in self.finished]
        return min(live) if live else None

    def applied_one(self, worker: int, clock: int) -> None:
        """Record worker's update ``clock`` as applied; updates come in order."""
        if self.applied[worker] != clock:
            raise UsageError(
                f"update {clock} of worker {worker} out of order (applied so far: "
                f"{self.applied[worker]})"
            )
        self.applied[worker] = clock + 1

    def finish(self, worker: int) -> None:
        self.finished.add(worker)

    def can_read(self, worker: int, clock: int) -> bool:
        """Whether a read by ``worker`` at ``clock`` may be answered now (rules 1-4)."""
        if self.staleness is None:
            return True
        if self.applied[worker] < clock:
            return False
        slowest = self.slowest()
        return slowest is None or slowest >= clock - self.staleness


@dataclass(slots=True)
class RoundBuffer:
    """BSP's rounds: the updates of clock ``t`` wait until every unfinished worker
    has pushed its own, then come out together, in worker order."""

    workers: tuple[int, ...]
    pending: dict[int, dict[int, npt.NDArray[np.float32]]] = field(default_factory=dict)

    def add(
        self, worker: int, clock: int, update: npt.NDArray[np.float32], finished: Iterable[int]
    ) -> list[tuple[int, list[tuple[int, npt.NDArray[np.float32]]]]]:
        self.pending.setdefault(clock, {})[worker] = update
        return self.ready(finished)

    def ready(
        self, finished: Iterable[int]
    ) -> list[tuple[int, list[tuple[int, npt.NDArray[np.float32]]]]]:
        """Complete rounds, oldest first: (clock, [(worker, update), ...] in worker order)."""
        done = set(finished)
        out = []
        for clock in sorted(self.pending):
            got = self.pending[clock]
            if not all(w in got or w in done for w in self.workers):
                break
            out.append((clock, [(w, got[w]) for w in self.workers if w in got]))
            del self.pending[clock]
        return out


def read_is_consistent(clocks: Iterable[int], reader_clock: int, staleness: int) -> bool:
    """Whether a read at ``reader_clock`` whose parameters hold ``clocks`` updates of
    each worker (the reader's own included) honours SSP's bound: every worker's
    updates up to ``reader_clock - staleness - 1`` are in it."""
    return min(clocks) >= reader_clock - staleness
