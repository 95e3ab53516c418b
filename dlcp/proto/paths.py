"""Spraying packets over K paths, and path health from loss reports.

DLCP packets carry their destination offset, so the order they arrive in does
not matter and a sender may spread one message over every equal-cost path
(per-packet or, with GSO, per-batch load balancing). :class:`PathScheduler`
picks the path of each batch:

* **Smooth weighted round-robin.** Each path ``i`` has a share ``s_i`` of the
  traffic; its picks are spaced evenly, ``1 / s_i`` picks apart, and the paths'
  picks are interleaved in the order they fall due (ties to the lower path
  id). A credit per path (picks owed minus picks made) carries over between
  calls, so after any number of calls each path's count is within a couple of
  picks of its share of the total, even when the shares change in between.
  Equal shares give plain round-robin ``0, 1, ..., K-1, 0, ...``.
* **Loss-aware shares.** Each feedback round reports, per path, the packets
  sent and lost; an EWMA of the loss ratio lowers a path's share:
  ``base_weight / (1 + loss_sensitivity * loss)``, renormalised. With the default
  sensitivity, 100, a path that loses 1 % gets half a clean path's share and one
  that loses 5 % a sixth, so the traffic moves off a link that drops packets of
  its own (a bad cable, a gray failure), while loss that every path shares (a
  receiver's port, random loss) moves no share. At 10, a path losing 1 % kept
  91 % of its share: in the testbed's ``loss`` scenario at 50 Mbit/s DLCP lost
  0.14-0.20 % of its values, at 100 0.05-0.13 %, in 4-8 % less time
  (``docs/testbed.md``). A path whose loss estimate reaches ``down_loss`` is
  *down* and only probed, with ``min_share``; no share ever falls below
  ``min_share``, so a recovering path keeps getting the reports that let its
  estimate decay (by ``1 - loss_alpha`` a report; reports come with NACKs).

* **Route-balanced weights.** ECMP hashes the paths' source ports onto the
  routes as they fall; :func:`weights_for_routes` turns the route each path was
  found to take (``dlcp.io.path_probe``) into base weights that give every
  distinct route the same share, and :meth:`PathScheduler.set_weights` installs
  them under the loss estimates.

:func:`path_loss_from_nack` turns "which path carried each sequence number" and
a receiver's list of missing sequence numbers into such a report.

Rules of this module (it is part of the sans-I/O core): no I/O, no clock, no
randomness (the schedule is deterministic); vectorised with numpy (no Python
loop over packets or batches); bad input raises :class:`ValueError` naming
what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from ..errors import UsageError

__all__ = ["MAX_PATHS", "PathScheduler", "path_loss_from_nack", "weights_for_routes"]

#: path ids are one byte in the data header
MAX_PATHS: Final = 256
#: starting credit of every path: half a pick, which centres each path's picks
#: in its period (weights 5:1:1 give a a a b c a a rather than a a a a a b c)
_START_CREDIT: Final = 0.5


def _counts(name: str, values: NDArray[np.integer] | Sequence[int], n: int) -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise UsageError(f"{name} must have one count per path ({n}), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise UsageError(f"{name} must be integer packet counts, got dtype {arr.dtype}")
    out = arr.astype(np.int64)
    if out.size and int(out.min()) < 0:
        raise UsageError(f"{name} must not be negative: {out.tolist()}")
    return out


class PathScheduler:
    """Deterministic weighted spraying over ``n_paths`` paths with loss-aware shares."""

    __slots__ = (
        "_base",
        "_credit",
        "_loss",
        "_shares",
        "down_loss",
        "loss_alpha",
        "loss_sensitivity",
        "min_share",
        "n_paths",
    )

    def __init__(
        self,
        n_paths: int,
        weights: Sequence[float] | None = None,
        *,
        loss_alpha: float = 0.3,
        loss_sensitivity: float = 100.0,
        min_share: float = 0.02,
        down_loss: float = 0.5,
    ) -> None:
        if isinstance(n_paths, bool) or not isinstance(n_paths, int | np.integer):
            raise UsageError(f"n_paths={n_paths!r} must be an integer")
        if not 1 <= n_paths <= MAX_PATHS:
            raise UsageError(f"n_paths={n_paths} outside 1..{MAX_PATHS}")
        base = _base_weights(weights, n_paths)
        if not 0.0 < loss_alpha <= 1.0:
            raise UsageError(f"loss_alpha={loss_alpha} outside (0, 1]")
        if not (loss_sensitivity >= 0.0 and np.isfinite(loss_sensitivity)):
            raise UsageError(f"loss_sensitivity={loss_sensitivity} must be finite and >= 0")
        if not 0.0 <= min_share <= 1.0 / n_paths:
            raise UsageError(f"min_share={min_share} outside [0, 1/n_paths={1.0 / n_paths:.6g}]")
        if not 0.0 < down_loss <= 1.0:
            raise UsageError(f"down_loss={down_loss} outside (0, 1]")
        self.n_paths = int(n_paths)
        self.loss_alpha = float(loss_alpha)
        self.loss_sensitivity = float(loss_sensitivity)
        self.min_share = float(min_share)
        self.down_loss = float(down_loss)
        self._base = base
        self._loss = np.zeros(n_paths, dtype=np.float64)
        self._credit = np.full(n_paths, _START_CREDIT, dtype=np.float64)
        self._shares = self._compute_shares()

    def __repr__(self) -> str:
        shares = np.array2string(self._shares, precision=3)
        return f"PathScheduler(n_paths={self.n_paths}, shares={shares})"

    # ------------------------------------------------------------------ shares

    @property
    def effective_weights(self) -> NDArray[np.float64]:
        """Each path's share of the traffic (sums to 1), a copy."""
        return self._shares.copy()

    @property
    def loss(self) -> NDArray[np.float64]:
        """EWMA loss-ratio estimate per path, a copy."""
        return self._loss.copy()

    def healthy(self) -> NDArray[np.bool_]:
        """Paths whose loss estimate is below ``down_loss``."""
        return self._loss < self.down_loss

    def _compute_shares(self) -> NDArray[np.float64]:
        up = self.healthy()
        w = self._base / (1.0 + self.loss_sensitivity * self._loss)
        if up.any():
            w = np.where(up, w, 0.0)  # down paths are only probed, with min_share
        return _floor_shares(w / w.sum(), self.min_share)

    def set_weights(self, weights: Sequence[float] | None) -> None:
        """New base weights (None: equal), as given at creation. The loss
        estimates and the schedule's credits carry over: the shares change, the
        picks stay spaced as the new shares say from the next call on."""
        self._base = _base_weights(weights, self.n_paths)
        self._shares = self._compute_shares()

    def on_loss_report(
        self, sent: NDArray[np.integer] | Sequence[int], lost: NDArray[np.integer] | Sequence[int]
    ) -> None:
        """One feedback round: per path, packets sent and how many of them were lost.

        Paths that sent nothing keep their estimate.
        """
        s = _counts("sent", sent, self.n_paths)
        lo = _counts("lost", lost, self.n_paths)
        over = np.flatnonzero(lo > s)
        if over.size:
            i = int(over[0])
            raise UsageError(f"path {i} lost {int(lo[i])} packets of only {int(s[i])} sent")
        reported = s > 0
        ratio = lo[reported] / s[reported]
        a = self.loss_alpha
        self._loss[reported] = (1.0 - a) * self._loss[reported] + a * ratio
        self._shares = self._compute_shares()

    # ------------------------------------------------------------------ schedule

    def assign(self, n: int) -> NDArray[np.uint8]:
        """The path of each of the next ``n`` batches (smooth weighted round-robin)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise UsageError(f"n={n!r} must be a non-negative integer")
        n = int(n)
        if n == 0:
            return np.zeros(0, dtype=np.uint8)
        s, credit = self._shares, self._credit
        live = np.flatnonzero(s > 0)
        # path i falls due for its k-th next pick at virtual time (k - credit_i) / s_i;
        # up to `horizon`, the paths hold at least n due picks between them
        horizon = n + len(live) - float(credit[live].sum()) + 1.0
        due = np.maximum(np.floor(credit[live] + horizon * s[live]), 0).astype(np.int64)
        paths = np.repeat(live, due)
        k = np.arange(len(paths), dtype=np.int64) - np.repeat(np.cumsum(due) - due, due) + 1
        when = (k - credit[paths]) / s[paths]
        order = np.lexsort((paths, when))[:n]
        out = paths[order]
        self._credit += n * s - np.bincount(out, minlength=self.n_paths)
        return out.astype(np.uint8)


def _base_weights(weights: Sequence[float] | None, n_paths: int) -> NDArray[np.float64]:
    """``weights`` checked and normalised to sum 1 (None: equal)."""
    if weights is None:
        return np.full(n_paths, 1.0 / n_paths)
    base = np.asarray(weights, dtype=np.float64)
    if base.shape != (n_paths,):
        raise UsageError(
            f"weights must have one weight per path ({n_paths}), got shape {base.shape}"
        )
    if not (np.all(np.isfinite(base)) and np.all(base > 0)):
        raise UsageError(f"weights must be finite and positive, got {base.tolist()}")
    out: NDArray[np.float64] = base / base.sum()
    return out


def weights_for_routes(routes: Sequence[Sequence[str] | None]) -> tuple[float, ...] | None:
    """Base weights that give each distinct route the same share, from the
    route each path took (its hops, as probed: ``dlcp.io.path_probe``; None
    where the probe learned nothing). ECMP hashes the paths' source ports onto
    the routes as they fall, 8 ports over 2 spines 4/4 only 27 % of the time:
    equal weights would load the routes as unevenly as the hash did.

    A route's share is split equally among its paths. A path with no known
    route keeps an equal path's share (``1 / len(routes)``), taken from no
    route in particular; the known ones share the rest by route. None when
    there is nothing to even out: fewer than two distinct routes known."""
    if not routes:
        raise UsageError("routes must name at least one path")
    known: dict[tuple[str, ...], list[int]] = {}
    for i, route in enumerate(routes):
        if route is not None:
            known.setdefault(tuple(route), []).append(i)
    if len(known) < 2:
        return None
    n = len(routes)
    unknown_share = 1.0 / n
    per_route = (1.0 - unknown_share * (n - sum(len(v) for v in known.values()))) / len(known)
    weights = [unknown_share] * n
    for paths in known.values():
        for i in paths:
            weights[i] = per_route / len(paths)
    return tuple(weights)


def _floor_shares(shares: NDArray[np.float64], floor: float) -> NDArray[np.float64]:
    """Raise shares below ``floor`` to it, taking the difference proportionally from
    the others (water-filling; at most one pass per path)."""
    out = shares.copy()
    fixed = np.zeros(len(out), dtype=np.bool_)
    for _ in range(len(out)):
        low = ~fixed & (out < floor)
        if not low.any():
            break
        fixed |= low
        free = ~fixed
        rest = 1.0 - floor * int(fixed.sum())
        out[fixed] = floor
        total = float(shares[free].sum())
        if total > 0:
            out[free] = shares[free] * (rest / total)
        elif free.any():
            out[free] = rest / int(free.sum())
    return out


def path_loss_from_nack(
    path_of_seq: NDArray[np.uint8], missing_seqs: NDArray[np.integer], n_paths: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Per-path ``(sent, lost)`` counts for :meth:`PathScheduler.on_loss_report`.

    ``path_of_seq[q]`` is the path chunk ``q`` went out on; ``missing_seqs`` are
    the sequence numbers the receiver reported missing (duplicates count once).
    """
    if not 1 <= n_paths <= MAX_PATHS:
        raise UsageError(f"n_paths={n_paths} outside 1..{MAX_PATHS}")
    paths = np.asarray(path_of_seq)
    missing = np.asarray(missing_seqs)
    if paths.ndim != 1 or missing.ndim != 1:
        raise UsageError(
            f"path_of_seq and missing_seqs must be 1-D, got shapes {paths.shape} and "
            f"{missing.shape}"
        )
    for name, arr in (("path_of_seq", paths), ("missing_seqs", missing)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise UsageError(f"{name} must be integers, got dtype {arr.dtype}")
    p = paths.astype(np.int64)
    if p.size and (int(p.min()) < 0 or int(p.max()) >= n_paths):
        bad = int(p.min()) if int(p.min()) < 0 else int(p.max())
        raise UsageError(f"path_of_seq holds path {bad}, outside 0..{n_paths - 1}")
    m = np.unique(missing.astype(np.int64))
    if m.size and (int(m[0]) < 0 or int(m[-1]) >= len(p)):
        bad = int(m[0]) if int(m[0]) < 0 else int(m[-1])
        raise UsageError(f"missing sequence {bad} outside 0..{len(p) - 1} (chunks sent)")
    sent = np.bincount(p, minlength=n_paths).astype(np.int64)
    lost = np.bincount(p[m], minlength=n_paths).astype(np.int64)
    return sent, lost
