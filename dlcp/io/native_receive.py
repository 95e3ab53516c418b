"""The native receive path: the run path of the messages under way, in the receive loop.

:class:`MessageRuns` is the table of the messages under way that the UDP receive
loop (``dlcp.io._udpio``, C) scatters itself: the inbox registers each message it
opens (:class:`~dlcp.proto.receive_paths.NativeRuns`), and each whose receive was
posted with its buffer before any of its data came (then the table's reports
carry the bound of the first datagrams it took, which the message opens with), and
removes it when it ends. :meth:`~dlcp.io.udp.DataSockets.receive` then reads, pre-filters and
scatters in C without the GIL, and Python runs once per receive call per message
(the counts of what was taken) instead of once per run of datagrams; what the
loop does not take (a new message, a foreign or bad datagram, a tag that does
not verify) reaches the session as before, in arrival order. ``dlcp/io/_take_runs.h``
says which runs it takes and why it hands the others back.

Authenticated sessions: the inbox registers each message with the key of the
pair (source rank -> this rank) it verifies that source's tags with, and the
table takes only the leading datagrams of a run whose AES-GMAC tags verify under
it (libcrypto, ``dlcp/proto/gmac.h``: the bytes of :mod:`dlcp.proto.auth`),
leaving their trailers out of the payload; the first datagram that does not
verify goes back to the session with everything behind it, whose general path
rejects it (``auth_failed``) as it always did. The table keeps one key per source
rank; a registration that gives another replaces it (:meth:`MessageRuns.register`).

The endpoint uses it (``EndpointConfig.native_receive``, ``DLCP_NATIVE_RECEIVE``;
a diagnostic: off, the run path runs in Python once per run, as it did) when the
extension and the protocol's C kernels were built, the extension verifies tags
if the session authenticates (:func:`verifies_tags`: built with libcrypto), and
no loss is emulated (the emulator drops datagrams in Python).
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
from ..proto.control import RATE_SHARED
from ..proto.reassembler import RUN_LAYOUT, Reassembler
from ..proto.receive_paths import Taken
from ..proto.wire import HEADER_DTYPE, VERSION, Flags, PacketType
from .extensions import load

# (not built: the run path stays in Python)
_udpio: ModuleType | None = load("_udpio")

__all__ = [
    "TAKE_CHECK",
    "TAKE_REST",
    "TAKE_WHOLE",
    "MessageRuns",
    "RunHandlers",
    "TakenRuns",
    "available",
    "hand_over",
    "verifies_tags",
]

#: the kinds of a handover (dlcp/io/_take_runs.h): a run Python receives whole,
#: the datagrams after a taken prefix (general path), a completion check due
TAKE_WHOLE, TAKE_REST, TAKE_CHECK = 1, 2, 3

#: the fields a run's head is matched by, as the C table reads them
_HEAD_FIELDS = ("ver_type", "flags", "job", "step", "msg", "msg_elems", "src", "dtype", "bound")


def _head_layout() -> bytes:
    fields = HEADER_DTYPE.fields
    assert fields is not None
    return bytes(fields[name][1] for name in _HEAD_FIELDS)


def available() -> bool:
    """Whether the native receive path was built (the receive loop's extension,
    and the kernels whose run path it runs)."""
    return _udpio is not None and hasattr(_udpio, "MessageTable") and kernels.ACCELERATED


def verifies_tags() -> bool:
    """Whether the native receive path verifies authenticated datagrams' tags
    itself (the extension was built with libcrypto): an authenticating session
    uses it only then."""
    return available() and bool(getattr(_udpio, "VERIFIES_TAGS", False))


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
            int(Flags.AUTH),
        )

    @property
    def verifies_tags(self) -> bool:
        """Whether messages registered with a tag key are taken (:func:`verifies_tags`)."""
        return verifies_tags()

    def register(self, key: Key, reassembler: Reassembler, tag_key: bytes | None = None,
                 nonce_floor: int = 0) -> None:  # fmt: skip
        """Take message ``key``'s runs from now on; with ``tag_key`` (the key of
        the pair source -> this rank) only the datagrams whose tags verify under
        it and whose nonces are at least ``nonce_floor``. The table keeps one key
        per source rank: another ``tag_key`` for the same source replaces it for
        every message of that source."""
        self.table.register(
            *key, *reassembler.run_target(), *reassembler.completion_counts(), tag_key,
            nonce_floor,
        )  # fmt: skip

    def sync(self, key: Key, reassembler: Reassembler) -> None:
        self.table.sync(*key, *reassembler.completion_counts())

    def unregister(self, key: Key) -> None:
        self.table.unregister(*key)

    def __len__(self) -> int:
        return len(self.table)

    # RATE reports and STOPs on control connections, taken while the I/O thread
    # waits (dlcp.io.control_in_waits, dlcp/io/_control_frames.h)

    def take_rates(self, pacer_api: Any, job: int, *, authenticates: bool = False) -> None:
        """While :meth:`DataSockets.receive <dlcp.io.udp.DataSockets.receive>`
        lingers or the table's ``wait`` waits (the I/O thread's selector), the
        RATE frames of job ``job`` at the head of a watched control connection go
        to the pacer of their source (:meth:`rate_pacer`) without Python
        (``pacer_api``: the native engine's ``PACER_API``): untagged ones, or, for
        a session that ``authenticates`` (only where :attr:`verifies_tags`), the
        tagged ones whose tags verify under the key of their source
        (:meth:`watch_control`'s); this holds for the STOPs and FINISHes below."""
        first = (VERSION << 4) | PacketType.RATE
        auth = int(Flags.AUTH) if authenticates else 0
        self.table.take_rates(pacer_api, job, first, RATE_SHARED, auth)

    def take_stops(self, hold: float) -> None:
        """From now on (after :meth:`take_rates`) the STOP frames at the head of a
        watched connection are taken too (tagged where the session authenticates):
        the native engine's round of the message each ends is stopped at once, and
        the frame is kept for :meth:`stops`; a wait ends at most ``hold`` seconds
        after the first one kept, so that Python applies it by then."""
        self.table.take_stops((VERSION << 4) | PacketType.STOP, round(hold * 1e9))

    def take_finishes(self, crossed: float, keys: int) -> None:
        """From now on (after :meth:`take_rates`) the waits drop the FINISH frames
        (tagged where the session authenticates) at the head of a watched connection
        whose message completed here less than ``crossed`` seconds ago (the inbox
        answers such a FINISH with nothing: it crossed the STOP), of the last
        ``keys`` messages that ended (:meth:`ended`; at most what the inbox
        remembers)."""
        first = (VERSION << 4) | PacketType.FINISH
        self.table.take_finishes(first, round(crossed * 1e9), keys)

    def ended(self, key: Key, completed_at: float | None) -> None:
        self.table.ended(*key, completed_at)

    def stops(self) -> list[tuple[int, bytes, float]]:
        """The STOPs kept since the last call, oldest first: (source rank, the
        control datagram, when it was taken on the monotonic clock)."""
        return self.table.stops()  # type: ignore[no-any-return]

    def rate_pacer(self, src: int, pacer: Any) -> None:
        """The native engine's pacer that ``src``'s RATE reports go to."""
        self.table.rate_pacer(src, pacer)

    def watch_control(self, fd: int, src: int, tag_key: bytes | None = None) -> None:
        """The loop may take ``src``'s RATE frames from inbound control connection
        ``fd``: Python holds none of its stream's bytes unread, so the frames at
        the head of the socket are its next ones. ``tag_key``: the key of the pair
        ``src`` -> this rank, which a session that authenticates verifies ``src``'s
        tags with (the table's key of ``src``, its data's too: :meth:`register`)."""
        self.table.watch_control(fd, src, tag_key)

    def unwatch_control(self, fd: int) -> None:
        """Not any more (before ``fd`` is closed, and while Python holds a partial
        frame of its stream)."""
        self.table.unwatch_control(fd)

    @property
    def rates_taken(self) -> int:
        """RATE reports the loop handed to pacers itself."""
        return int(self.table.control_counts()[0])

    @property
    def finishes_taken(self) -> int:
        """FINISHes the loop dropped (their message had completed here)."""
        return int(self.table.control_counts()[4])

    @property
    def stops_taken(self) -> tuple[int, int]:
        """STOPs the loop kept for Python, and the engine's rounds they stopped."""
        counts = self.table.control_counts()
        return int(counts[2]), int(counts[3])


class TakenRuns(Protocol):
    """Where the native path hands what it did besides runs for ``deliver``."""

    def taken(self, taken: list[Taken]) -> None:
        """What the registered messages took since the last call (applied before
        anything else: the runs that follow were read after it)."""

    def rest(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        """The datagrams of a run after the prefix its message took."""


class RunHandlers:
    """A :class:`TakenRuns` of two callables: what an endpoint's I/O thread hands
    the native path, its session's ``taken`` and ``rest``.

    Time: what the C loop took is applied, and so metered by the session's rate
    meter, at the time Python applies it, after the C call that took it (its steps
    of ``dlcp.io.udp.RECEIVE_STEP_BYTES`` each, until the socket ran dry and its
    linger ended, the budget was spent or a run needed Python), not at a time per
    run as the Python run path meters it. A call reads at most its budget, 4 MB (a
    few milliseconds of data at 10 Gbit/s), and takes a trickle of data in naps for
    at most ``dlcp.io.io_loop.TRICKLE_LINGER`` (20 ms); the meter's interval is
    ``rate_interval`` (5 ms by default; 20 ms, ``lone_rate_interval``, while one source
    sends at a steady rate), and the bytes are counted either way."""

    __slots__ = ("rest", "taken")

    def __init__(
        self,
        taken: Callable[[list[Taken]], None],
        rest: Callable[[npt.NDArray[np.uint8], int], None],
    ) -> None:
        self.taken = taken
        self.rest = rest


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
