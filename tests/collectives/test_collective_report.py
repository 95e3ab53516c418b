"""A collective's report adds up its messages' loss reports: lost elements over
the bounded phases, lost chunks per (priority, drop) class, and each class's
lost share of the chunks that class carried."""

from __future__ import annotations

import numpy as np

from dlcp.collectives.comm import ReportBuilder
from dlcp.io.endpoint import Received
from dlcp.proto.config import FillPolicy
from dlcp.proto.loss_report import N_CLASSES, LossReport


def _received(lost: dict[int, int], got: dict[int, int], elems_per_chunk: int = 10) -> Received:
    def per_class(d: dict[int, int]) -> tuple[int, ...]:
        return tuple(d.get(c, 0) for c in range(N_CLASSES))

    n = sum(lost.values()) + sum(got.values())
    lost_elems = sum(lost.values()) * elems_per_chunk
    report = LossReport(
        msg_elems=n * elems_per_chunk,
        received_elems=n * elems_per_chunk - lost_elems,
        lost_elems=lost_elems,
        lost_ranges=(),
        received_chunks=per_class(got),
        lost_chunks=per_class(lost),
        retransmitted_chunks=0,
        duplicate_chunks=0,
        nack_rounds=1,
        bound=0.05,
        fill=FillPolicy.ZERO,
        duration=0.001,
    )
    return Received(0, 0, 0, np.zeros(n * elems_per_chunk, np.float32), report)


def test_lost_fraction_per_class_counts_every_message_of_the_call() -> None:
    b = ReportBuilder("ring_allreduce", call=3, elems=1000)
    # class 1 (priority 0, drop-eligible): 2 of 20 lost; class 14 (priority 7,
    # protected): none of 30; class 15: 1 of 4 over two messages
    b.received(_received({1: 2, 15: 1}, {1: 8, 14: 30, 15: 1}), bounded=True)
    b.received(_received({}, {1: 10, 15: 2}), bounded=True)
    r = b.build()
    per_class = r.lost_fraction_per_class
    assert len(per_class) == N_CLASSES
    assert per_class[1] == 2 / 20 and per_class[14] == 0.0 and per_class[15] == 1 / 4
    assert all(per_class[c] == 0.0 for c in range(N_CLASSES) if c not in (1, 14, 15))
    assert r.lost_chunks[1] == 2 and r.class_chunks[1] == 20 and r.class_chunks[14] == 30
    assert r.lost_fraction == 30 / 540  # elements lost over elements received bounded
    assert r.nack_rounds == 2
