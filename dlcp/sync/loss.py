"""What the messages a scheme received lost, summed for its reports."""

from __future__ import annotations

from ..io.endpoint import Received
from ..proto.loss_report import N_CLASSES

__all__ = ["LossTally"]


class LossTally:
    """The lost elements of the messages added, the elements of those received
    under a loss bound, and per class (priority x drop eligibility) the chunks lost
    and the chunks sent."""

    __slots__ = ("bounded", "class_chunks", "lost", "lost_chunks")

    def __init__(self) -> None:
        self.lost = self.bounded = 0
        self.lost_chunks = [0] * N_CLASSES
        self.class_chunks = [0] * N_CLASSES

    def add(self, got: Received, bounded: bool) -> None:
        """Count ``got``'s report; ``bounded``: it was received under a loss bound."""
        r = got.report
        self.lost += r.lost_elems
        if bounded:
            self.bounded += r.msg_elems
        for i in range(N_CLASSES):
            self.lost_chunks[i] += r.lost_chunks[i]
            self.class_chunks[i] += r.lost_chunks[i] + r.received_chunks[i]

    def fields(self) -> list[int]:
        """The counts as a flat list: lost, bounded, lost chunks, sent chunks."""
        return [self.lost, self.bounded, *self.lost_chunks, *self.class_chunks]
