"""All-reduce of small arrays: every rank sends its array to every other rank at once.

A ring all-reduce takes ``2 (n - 1)`` steps one after the other. For an array
of a few hundred kilobytes each step is latency, not bandwidth (the sender's and
the receiver's per-message work, and waking the threads that wait on it), so the
ring costs ``2 (n - 1)`` message latencies. Here a rank's ``n - 1`` sends and
``n - 1`` receives are all in flight together: about one message latency, for
``(n - 1) / (2 (n - 1) / n) = n / 2`` times the bytes a ring rank sends. Measured
with 4 ranks on 2 cores over loopback: 8.6 against 25 ms for 8,000 float32, 23
against 30 ms for 262,144 (``dlcp.shims.ddp.DLCPState`` picks it by size).

The messages are exact (``p = 0``): every rank adds the same ``n`` arrays in the
same order (rank 0's first), so every replica ends with identical bytes. Bounded
loss is for arrays large enough that bandwidth matters: the ring.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..proto.config import FillPolicy
from .comm import CollectiveReport, Communicator, ReportBuilder, Segments
from .ring import _raise_failed_send, check_array

__all__ = ["direct_allreduce"]


def direct_allreduce(
    comm: Communicator,
    data: npt.NDArray[Any],
    *,
    segments: Segments | None = None,
    average: bool = False,
) -> CollectiveReport:
    """Sum (or average) ``data`` across the ranks, in place, in one round."""
    check_array(data, "direct_allreduce")
    n, r = comm.world_size, comm.rank
    call = comm.next_call()
    report = ReportBuilder("direct_allreduce", call, len(data))
    if n == 1:
        return report.build()
    # the sends read this copy: ``data`` can take the sum as soon as the receives
    # are in, before the I/O thread has necessarily packed every send
    mine = data.copy()
    others = [q for q in range(n) if q != r]
    arrays = {q: np.empty_like(data) for q in others}
    arrays[r] = mine
    recvs = [
        (q, comm.recv(arrays[q], src=q, call=call, role=0, p=0.0, fill=FillPolicy.ZERO))
        for q in others
    ]
    sends = [comm.send(mine, to=q, call=call, role=0, segments=segments, p=0.0) for q in others]
    for _, incoming in recvs:
        try:
            report.received(comm.wait(incoming), bounded=False)
        except Exception:
            _raise_failed_send(sends)  # a send's failure names the peer that went first
            raise
    np.copyto(data, arrays[0])
    for q in range(1, n):  # the same order on every rank: identical bytes everywhere
        data += arrays[q]
    if average:
        data /= data.dtype.type(n)
    for outgoing in sends:
        report.sent(comm.wait(outgoing), data.itemsize)
    return report.build()
