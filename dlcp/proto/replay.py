"""Authenticated data sent again after its receiver forgot the message (spec §3).

A tag proves who sealed a datagram, not that it is new: a copy of an authenticated
data datagram verifies as often as it is sent. While the receiver remembers the
message (its last ``completed_memory`` ended ones) a copy counts as a late packet.
Once it forgot it, a copy would open the message again as an unexpected one,
which nobody claims: a few dozen such messages would fill
``max_unexpected_bytes``, and genuine early messages would then be refused.

:class:`ReplayFloor` closes that window with the nonces the senders already
draw. A sender's data nonces come from one counter that only grows, and a
resent datagram draws a fresh one, so, per source rank, the receiver keeps:

* the **high** mark: the highest data nonce it took from that source (every
  receive path reports the nonces of the authenticated datagrams it took);
* a **floor**: when a message ends here, one above the source's high mark then
  is queued;
  when ``completed_memory`` more messages have ended, which is when the inbox
  forgets that message, the queued mark becomes the source's floor.

An authenticated data datagram whose nonce is below its source's floor is
refused (``replayed``) on every path. Every datagram of a forgotten message was
taken before it ended, so none passes. A genuine datagram with such a nonce
was sent before a message that has since been forgotten had ended, and was still
travelling ``completed_memory`` message ends later. Refusing it costs what a
loss costs: the receiver asks again, and the retransmission carries a fresh
nonce. What the floor does not cover: a datagram of a message that completed
by its loss bound without it (never taken, so never in a mark), if the sender
drew no later nonce that a message ending before the forgotten one carried.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from .auth import AUTH_NONCE_LEN

__all__ = ["ReplayFloor", "group_nonces"]


class ReplayFloor:
    """Per source rank, the lowest data nonce an authenticated datagram may
    carry (this module's docstring says why and when it rises)."""

    __slots__ = ("_floor", "_marks", "_next")

    def __init__(self, memory: int) -> None:
        #: source -> one above the highest data nonce taken from it
        self._next: dict[int, int] = {}
        #: source -> the lowest nonce taken from it (0: any)
        self._floor: dict[int, int] = {}
        #: (source, its ``_next`` then) for the last ``memory`` messages that ended
        self._marks: deque[tuple[int, int]] = deque(maxlen=memory)

    def floor(self, src: int) -> int:
        """The lowest nonce still taken from ``src`` (0: any)."""
        return self._floor.get(src, 0)

    def took(self, src: int, high: int) -> None:
        """Datagrams from ``src`` were taken, the highest nonce among them ``high``."""
        if high >= self._next.get(src, 0):
            self._next[src] = high + 1

    def ended(self, src: int) -> None:
        """A message from ``src`` ended here; the oldest remembered end, if the
        memory is full, is forgotten and raises its source's floor."""
        marks = self._marks
        if len(marks) == marks.maxlen:
            old_src, mark = marks[0]
            if mark > self._floor.get(old_src, 0):
                self._floor[old_src] = mark
        marks.append((src, self._next.get(src, 0)))


def group_nonces(
    headers: npt.NDArray[np.void], payloads: npt.NDArray[np.uint8]
) -> npt.NDArray[np.uint64]:
    """The nonces of parsed authenticated records (their trailers follow
    ``payload_len`` bytes of payload)."""
    at = headers["payload_len"].astype(np.intp)[:, None] + np.arange(AUTH_NONCE_LEN)
    raw = np.take_along_axis(payloads, at, axis=1)
    return np.ascontiguousarray(raw).view(">u8").ravel().astype(np.uint64)
