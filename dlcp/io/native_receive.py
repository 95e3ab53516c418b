"""The native receive path: the run path of the messages under way, in the receive loop.

:class:`MessageRuns` is the table of the messages under way that the UDP receive
loop (``dlcp.io._udpio``, C) scatters itself: the inbox registers each message it
opens (:class:`~dlcp.proto.receive_paths.NativeRuns`) and removes it when it
ends. :meth:`~dlcp.io.udp.DataSockets.receive` then reads, pre-filters and
scatters in C without the GIL, and Python runs once per receive call per message
(the counts of what was taken) instead of once per run of datagrams; what the
loop does not take (a new message, a foreign or bad datagram, authenticated
data) reaches the session as before, in arrival order. ``dlcp/io/_take_runs.h``
says which runs it takes and why it hands the others back.

The endpoint uses it (``EndpointConfig.native_receive``, ``DLCP_NATIVE_RECEIVE``;
a diagnostic: off, the run path runs in Python once per run, as it did) when the
extension and the protocol's C kernels were built, the session does not
authenticate, and no loss is emulated (the emulator drops datagrams in Python).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..proto import kernels
from ..proto.batch import PER_PACKET_FLAGS, SHARED_HEADER_MASK
from ..proto.context import Key
from ..proto.reassembler import RUN_LAYOUT, Reassembler
from ..proto.receive_paths import Taken
from ..proto.wire import HEADER_DTYPE, VERSION, PacketType
from .extensions import load

# (not built: the run path stays in Python)
_udpio: ModuleType | None = load("_udpio")

__all__ = [
    "TAKE_CHECK",
    "TAKE_REST",
    "TAKE_WHOLE",
    "MessageRuns",
    "TakenRuns",
    "available",
    "hand_over",
]

#: the kinds of a handover (dlcp/io/_take_runs.h): a run Python receives whole,
#: the datagrams after a taken prefix (general path), a completion check due
TAKE_WHOLE, TAKE_REST, TAKE_CHECK = 1, 2, 3

#: the fields a run's head is matched by, as the C table reads them
_HEAD_FIELDS = ("ver_type", "flags", "job", "step", "msg", "msg_elems", "src", "dtype")


def _head_layout() -> bytes:
    fields = HEADER_DTYPE.fields
    assert fields is not None
    return bytes(fields[name][1] for name in _HEAD_FIELDS)


def available() -> bool:
    """Whether the native receive path was built (the receive loop's extension,
    and the kernels whose run path it runs)."""
    return _udpio is not None and hasattr(_udpio, "MessageTable") and kernels.ACCELERATED


class MessageRuns:
    """The C table of the messages the receive loop scatters itself, as the inbox
    registers them (:class:`~dlcp.proto.receive_paths.NativeRuns`)."""

    def __init__(self, job: int) -> None:
        assert _udpio is not None
        self.table = _udpio.MessageTable(
            job,
            (VERSION << 4) | PacketType.DATA,
            PER_PACKET_FLAGS,
            _head_layout(),
            SHARED_HEADER_MASK,
            RUN_LAYOUT,
        )

    def register(self, key: Key, reassembler: Reassembler) -> None:
        self.table.register(*key, *reassembler.run_target(), *reassembler.completion_counts())

    def sync(self, key: Key, reassembler: Reassembler) -> None:
        self.table.sync(*key, *reassembler.completion_counts())

    def unregister(self, key: Key) -> None:
        self.table.unregister(*key)

    def __len__(self) -> int:
        return len(self.table)


class TakenRuns(Protocol):
    """Where the native path hands what it did besides runs for ``deliver``."""

    def taken(self, taken: list[Taken]) -> None:
        """What the registered messages took since the last call (applied before
        anything else: the runs that follow were read after it)."""

    def rest(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        """The datagrams of a run after the prefix its message took."""


def hand_over(
    table: Any,
    buf: npt.NDArray[np.uint8],
    deliver: Callable[[npt.NDArray[np.uint8], int], None],
    taken: TakenRuns,
) -> None:
    """The native path's turn over the runs staged in ``table`` (a
    :class:`MessageRuns`' C table) from ``buf``: it takes what the registered
    messages take, and hands over, in arrival order, what they took (to
    ``taken.taken``), the runs they do not take (to ``deliver``) and the
    datagrams after a taken prefix (to ``taken.rest``)."""
    while True:
        handover, took = table.next(buf)
        if took is not None:
            taken.taken(took)
        if handover is None:
            return
        start, end, seg, kind = handover
        if kind == TAKE_WHOLE:
            deliver(buf[start:end], seg)
        elif kind == TAKE_REST:
            taken.rest(buf[start:end], seg)
        # (TAKE_CHECK: applying what was taken, above, ran the completion check)
