"""What a completed message lost (:class:`LossReport`), as every completion
reports it: elements and ranges filled, chunks per (priority, drop) class,
retransmissions, duplicates, NACK rounds."""

from __future__ import annotations

from dataclasses import dataclass

from .config import FillPolicy

__all__ = ["N_CLASSES", "LossReport"]

#: 8 priorities x {protected, drop-eligible}, index prio * 2 + drop
N_CLASSES = 16


@dataclass(frozen=True, slots=True)
class LossReport:
    """What a completed message lost. Every completion carries one."""

    msg_elems: int
    received_elems: int
    #: elements filled by the fill policy
    lost_elems: int
    #: (offset, length) element ranges that were filled
    lost_ranges: tuple[tuple[int, int], ...]
    #: chunks received / lost per class, index prio * 2 + drop
    received_chunks: tuple[int, ...]
    lost_chunks: tuple[int, ...]
    #: chunks that arrived as retransmissions, and duplicates ignored
    retransmitted_chunks: int
    duplicate_chunks: int
    #: NACK rounds the receiver asked for
    nack_rounds: int
    bound: float
    fill: FillPolicy
    #: seconds from the first packet to completion
    duration: float

    @property
    def lost_fraction(self) -> float:
        return self.lost_elems / self.msg_elems
