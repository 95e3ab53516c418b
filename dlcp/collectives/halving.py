"""Halving-doubling all-reduce over DLCP: the ring's guarantees in fewer steps.

For ``n`` ranks, ``n`` a power of two. A ring all-reduce takes ``2 (n - 1)``
steps; this one takes ``2 log2(n)`` and sends the same bytes (each rank sends
``(n - 1) / n`` of the array in each phase). For arrays of a few hundred
kilobytes the cost of a step is mostly per message -- packing, the control
round trip, waking the threads that wait -- so fewer steps are faster and cheaper
(4 ranks: 4 messages per rank instead of 6).

Reduce-scatter by recursive halving: in step ``k`` (distance ``d = n / 2^(k+1)``)
rank ``r`` pairs with ``r XOR d``; the pair splits the range both still reduce
in two, each sends the half it gives up (bounded loss ``p``, lost elements
filled and reported) and adds the half it keeps. After ``log2(n)`` steps rank
``r`` holds the fully reduced ``r``-th of ``n`` near-equal parts, computed once.
All-gather by recursive doubling retraces the splits in reverse: each rank sends
its reduced range to its partner (gather bound, default 0: exact), so every
replica ends with identical bytes whatever the reduce-scatter lost -- the same
argument as the ring's, with the same caveat for a gather bound above 0.

Where it pays, measured on the 2-core development VM with 4 ranks and the
digits CNN's 153 KB of gradients (p = 0.05): on one host (loopback) a call took
7.7 ms against the ring's 11-12 ms with 30 % less CPU, and training
(``examples/train_digits.py``, 2 % emulated loss) ran at 31-38 against 45-53
ms per iteration. On the namespace testbed (4 software routers, 200 Mbit/s
links) it was slower, 40-42 against 37-39 ms per call: its first step sends
half the array to a rank across the fabric at once, where the ring sends a
quarter. Since receivers stopped capping partners that overlap only for a moment
(2026-12-04, docs/results/2026-12-04/shared_windows_by_time/) it took 31-35
against the ring's 35-38 there, and 8.6-9.5 against 11.2-12.5 on the loopback;
but the demo's training under 1 % emulated loss ran at 29-58 ms an iteration
against the ring's 22-32 (its larger first messages wait for NACK rounds more
often). So it is a choice (the DDP hook's ``collective="halving-doubling"``),
not a default.
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from ..errors import UsageError
from ..proto.config import FillPolicy
from .comm import (
    CollectiveReport,
    Communicator,
    ReportBuilder,
    Segments,
    copy_fill,
    divide_first,
)
from .ring import PostedReceives, SendTracker, check_allreduce, exchange

__all__ = ["halving_doubling_allreduce", "is_power_of_two"]

_GATHER_ROLE = 2048


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _splits(n_elems: int, world: int, rank: int) -> list[tuple[int, int, int, int, bool]]:
    """The reduce-scatter's steps for ``rank``, first to last: (partner, lo, mid,
    hi, upper): the pair splits ``[lo, hi)`` at ``mid`` and ``rank`` keeps the
    upper half ``[mid, hi)`` if ``upper`` (its bit for that distance is 1), else
    the lower one. Both ranks of a pair compute the same split."""
    out = []
    lo, hi = 0, n_elems
    d = world // 2
    while d >= 1:
        mid = lo + (hi - lo) // 2
        upper = bool(rank & d)
        out.append((rank ^ d, lo, mid, hi, upper))
        lo, hi = (mid, hi) if upper else (lo, mid)
        d //= 2
    return out


def halving_doubling_allreduce(
    comm: Communicator,
    data: npt.NDArray[Any],
    *,
    segments: Segments | None = None,
    p: float = 0.0,
    p_gather: float = 0.0,
    fill: FillPolicy = FillPolicy.ZERO,
    average: bool = False,
) -> CollectiveReport:
    """Sum (or average) ``data`` across a power-of-two number of ranks, in place."""
    call = comm.next_call()  # first: a call this rank refuses still takes its number
    check_allreduce(data, "halving_doubling_allreduce", fill=fill, p=p, p_gather=p_gather)
    n, r = comm.world_size, comm.rank
    if not is_power_of_two(n):
        raise UsageError(f"halving_doubling_allreduce needs a power-of-two world, got {n}")
    average = divide_first(data, n, average)
    report = ReportBuilder("halving_doubling_allreduce", call, len(data))
    if n == 1 or len(data) == 0:  # (an empty array: every rank's is, nothing to move)
        return report.build()
    steps = _splits(len(data), n, r)
    lend = p_gather == 0  # (see ring_allreduce: the same holds of the halves sent)
    # each reduce-scatter step receives into a scratch row of its own (a half,
    # a quarter, ...: less than the array in all), so all can be posted at once
    rows = [0]
    for _, lo, mid, hi, upper in steps:
        rows.append(rows[-1] + (hi - mid if upper else mid - lo))
    # (see ring_allreduce: receives posted before the first send; sends waited
    # for at the end)
    with SendTracker() as sends, PostedReceives(comm, call=call) as incoming:
        scratch = incoming.scratch(data.dtype, rows[-1])
        for k, (partner, *_) in enumerate(steps):
            incoming.post(scratch[rows[k] : rows[k + 1]], src=partner, role=k, p=p, fill=fill)
        if p_gather == 0:  # (else the gather's buffers are rescaled first, below)
            _post_gather(incoming, data, steps, 0.0)
        for k, (partner, lo, mid, hi, upper) in enumerate(steps):  # reduce-scatter
            (ta, tb), give = ((mid, hi), (lo, mid)) if upper else ((lo, mid), (mid, hi))
            if exchange(
                comm, data, give, incoming.take(k, src=partner), to=partner, call=call,
                role=k, p=p, segments=segments, report=report, sends=sends, borrow=lend,
            ):  # fmt: skip
                data[ta:tb] += scratch[rows[k] : rows[k + 1]]
        _, lo, mid, hi, upper = steps[-1]
        lo, hi = (mid, hi) if upper else (lo, mid)  # the range this rank reduced
        if average:
            data[lo:hi] /= data.dtype.type(n)
        if p_gather > 0:  # what a lost all-gather element keeps: this rank's estimate
            for k, (_, slo, smid, shi, upper) in enumerate(steps):
                ga, gb = (slo, smid) if upper else (smid, shi)  # given away at step k,
                data[ga:gb] *= data.dtype.type((1 if average else n) / 2**k)  # 2**k ranks' sum
            _post_gather(incoming, data, steps, p_gather)
        for k, (partner, slo, _, shi, _) in enumerate(reversed(steps)):  # all-gather
            role = _GATHER_ROLE + k
            exchange(
                comm, data, (lo, hi), incoming.take(role, src=partner), to=partner, call=call,
                role=role, p=p_gather, segments=segments, report=report, sends=sends,
                borrow=lend,
            )  # fmt: skip
            lo, hi = slo, shi
        sends.wait(comm, report, data.itemsize)
    return report.build()


def _post_gather(
    incoming: PostedReceives,
    data: npt.NDArray[Any],
    steps: list[tuple[int, int, int, int, bool]],
    p: float,
) -> None:
    """Post the all-gather's receives: reverse step ``k`` brings back the half
    given away at reduce-scatter step ``L - 1 - k``. Early is safe: the partner
    sends it only once it holds what this rank sent of it at that step."""
    fill = copy_fill(p)
    for k, (partner, slo, smid, shi, upper) in enumerate(reversed(steps)):
        ta, tb = (slo, smid) if upper else (smid, shi)
        incoming.post(data[ta:tb], src=partner, role=_GATHER_ROLE + k, p=p, fill=fill)
