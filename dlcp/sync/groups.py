"""Group schedules for the decentralised schemes (no sockets, no threads, no clock):
every rank computes the same schedule from the same settings and seed.

* :func:`divide` (Group Division): the workers of one round cut into disjoint
  groups that together cover them.
* :class:`ShuffleSchedule` (DS-Sync): round ``r``'s division of all ``n`` workers
  into groups of ``k`` (``k`` must divide ``n``), different every round. When
  ``n = k ** m`` the rounds come in epochs of ``m``: each epoch draws a seeded
  permutation ``pi`` of the workers, and round ``j`` of the epoch groups the
  workers whose ``pi``-labels, written in base ``k``, agree on every digit but
  digit ``j``. Averaging within those groups for ``m`` rounds leaves every worker
  with the exact global mean (each round averages out one digit), which
  :attr:`ShuffleSchedule.rounds_to_mix` reports. Otherwise every round is an
  independent seeded division, which mixes geometrically but never exactly.
* :class:`GroupGenerator` (Ripples): one global sequence of groups, round after
  round. A worker with slowdown ``x`` (it computes ``x`` times slower) takes part
  in every ``x``-th round only, so it joins fewer groups and the others are not
  held back by it in the rounds between. Homogeneous clusters (no slowdown)
  may use the static schedule: the digit rounds above without shuffling when
  ``n = k ** m``, else rank order rotated by one every round.
* :class:`GroupBuffer` (Ripples): a worker's own subsequence of the global
  sequence, pre-generated ahead and consumed in order. Because every member of
  every group consumes its groups in the one global order, the earliest
  unfinished group always has all its members waiting at it: no deadlock.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = [
    "Group",
    "GroupBuffer",
    "GroupGenerator",
    "ShuffleSchedule",
    "divide",
    "exact_power",
]


@dataclass(frozen=True, slots=True)
class Group:
    """One group of the global sequence: ``gid`` numbers it (unique), ``round`` is
    the division it belongs to, ``members`` are ranks in increasing order."""

    gid: int
    round: int
    members: tuple[int, ...]


def exact_power(n: int, k: int) -> int | None:
    """``m`` with ``k ** m == n`` (m >= 1), or None."""
    if k < 2 or n < k:
        return None
    m, x = 0, 1
    while x < n:
        x *= k
        m += 1
    return m if x == n else None


def divide(workers: Sequence[int], k: int, rng: random.Random | None) -> list[tuple[int, ...]]:
    """Group Division: ``workers`` (shuffled by ``rng`` if given) cut into groups of
    ``k``; the last one smaller when ``k`` does not divide their number."""
    order = list(workers)
    if rng is not None:
        rng.shuffle(order)
    return [tuple(sorted(order[i : i + k])) for i in range(0, len(order), k)]


def _digit_groups(labels: Sequence[int], k: int, digit: int) -> list[tuple[int, ...]]:
    """Workers (``labels[w]`` is worker w's label) grouped by every base-``k`` digit
    of their label but ``digit``."""
    unit = k**digit
    groups: dict[int, list[int]] = {}
    for w, label in enumerate(labels):
        groups.setdefault(label - (label // unit) % k * unit, []).append(w)
    return sorted(tuple(sorted(g)) for g in groups.values())


def check_group_size(n: int, k: int, *, divides: bool) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"group_size={k!r} must be an integer >= 1")
    if k > n:
        raise ConfigError(f"group_size={k} exceeds the {n} workers")
    if divides and n % k:
        raise ConfigError(f"group_size={k} does not divide the {n} workers")


class ShuffleSchedule:
    """DS-Sync's groups, round by round (module docstring)."""

    def __init__(self, n: int, k: int, seed: int = 0) -> None:
        check_group_size(n, k, divides=True)
        self.n, self.k, self.seed = n, k, seed
        #: rounds after which averaging leaves every worker with the global mean
        #: (from the start of an epoch), None where no round count does
        self.rounds_to_mix: int | None = 1 if k == n else exact_power(n, k)
        self._attempt = 0

        self._rounds: list[list[tuple[int, ...]]] = []

    def _draw(self, r: int, attempt: int) -> list[tuple[int, ...]]:
        m = self.rounds_to_mix
        if m is not None:  # the epoch's permutation; its rounds take one digit each
            labels = list(range(self.n))
            random.Random(f"dssync/{self.seed}/{r // m}/{attempt}").shuffle(labels)
            return _digit_groups(labels, self.k, r % m)
        return divide(range(self.n), self.k, random.Random(f"dssync/{self.seed}/r{r}/{attempt}"))

    def division(self, r: int) -> list[tuple[int, ...]]:
        """Round ``r``'s groups (a partition of ``0..n-1``), never the same as round
        ``r - 1``'s: a draw that repeats it is drawn again (the next attempt's seed;
        for an epoch, its first round decides)."""
        if self.k == self.n:
            return [tuple(range(self.n))]
        m = self.rounds_to_mix or 1
        while len(self._rounds) <= r:
            q = len(self._rounds)
            attempt = 0
            if q % m == 0 and q > 0:  # a new epoch (or random round): differ from the last
                while self._draw(q, attempt) == self._rounds[-1]:
                    attempt += 1
                self._attempt = attempt
            elif q > 0:
                attempt = self._attempt
            self._rounds.append(self._draw(q, attempt))
        return self._rounds[r]

    def group_of(self, rank: int, r: int) -> tuple[int, ...]:
        return next(g for g in self.division(r) if rank in g)


class GroupGenerator:
    """Ripples' global group sequence (module docstring). ``slowdown`` maps a rank
    to how many times slower it computes (1: not slow)."""

    def __init__(
        self,
        n: int,
        k: int,
        *,
        seed: int = 0,
        slowdown: Mapping[int, int] | None = None,
        static: bool = False,
    ) -> None:
        check_group_size(n, k, divides=False)
        slow = dict(slowdown or {})
        for rank, x in slow.items():
            if not 0 <= rank < n:
                raise ConfigError(f"slowdown names rank {rank}, outside the world 0..{n - 1}")
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ConfigError(f"slowdown of rank {rank} is {x!r}: an integer >= 1")
        if static and any(x > 1 for x in slow.values()):
            raise ConfigError("the static schedule is for homogeneous workers (no slowdown)")
        self.n, self.k, self.seed, self.static = n, k, seed, static
        self.slowdown = {w: slow.get(w, 1) for w in range(n)}
        self._power = exact_power(n, k)

    def round(self, r: int) -> list[tuple[int, ...]]:
        """Round ``r``'s division of the workers active in it (singletons included)."""
        active = [w for w in range(self.n) if r % self.slowdown[w] == 0]
        if self.static:
            if self._power is not None:
                return _digit_groups(list(range(self.n)), self.k, r % self._power)
            shift = r % self.n
            return divide(active[shift:] + active[:shift], self.k, None)
        return divide(active, self.k, random.Random(f"ripples/{self.seed}/{r}"))

    def steps_of(self, rank: int, rounds: int) -> int:
        """How many groups ``rank`` joins in rounds ``0 .. rounds - 1``: the steps it
        takes to keep pace with workers that run ``rounds`` rounds."""
        return sum(1 for r in range(rounds) if any(rank in g for g in self.round(r)))

    def sequence(self) -> Iterator[Group]:
        """The global sequence: round 0's groups, then round 1's, ..."""
        gid = 0
        r = 0
        while True:
            for members in self.round(r):
                yield Group(gid, r, members)
                gid += 1
            r += 1


class GroupBuffer:
    """One worker's groups, in the global order, ``ahead`` generated in advance."""

    def __init__(self, generator: GroupGenerator, rank: int, *, ahead: int = 64) -> None:
        if not 0 <= rank < generator.n:
            raise ConfigError(f"rank {rank} is outside the world 0..{generator.n - 1}")
        self.rank = rank
        self.ahead = ahead
        self._source = generator.sequence()
        self._buffer: deque[Group] = deque()
        self.consumed = 0

    def _fill(self) -> None:
        while len(self._buffer) < self.ahead:
            g = next(self._source)
            if self.rank in g.members:
                self._buffer.append(g)

    def peek(self) -> Group:
        self._fill()
        return self._buffer[0]

    def next(self) -> Group:
        self._fill()
        self.consumed += 1
        return self._buffer.popleft()
