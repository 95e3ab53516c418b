"""What the two halves of a session share: identity, configuration, counters,
the event queue and the queue of control messages to send.

:class:`~dlcp.proto.session.Session` builds one :class:`SessionContext` and hands
it to its receive side (:class:`~dlcp.proto.inbox.Inbox`) and its send side
(:class:`~dlcp.proto.outbox.Outbox`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ..errors import UsageError
from .config import ProtocolConfig
from .control import ControlMessage, encode_control
from .events import ControlDatagram, Event, SessionStats

__all__ = ["ALL_ELEMS", "Key", "PairKeyLookup", "PairKeys", "SessionContext", "SessionSide"]

Key = tuple[int, int, int]  # (peer rank, step, msg id)
ALL_ELEMS = 0xFFFFFFFF  # NACK.needed_elems meaning "everything"

#: the authentication key of the ordered pair of ranks (src, dst): spec §3
PairKeyLookup = Callable[[int, int], bytes]


def _check_key(key: bytes) -> bytes:
    if not 16 <= len(key) <= 64:
        raise UsageError(f"authentication key must be 16..64 bytes, got {len(key)}")
    return bytes(key)


class PairKeys:
    """One rank's authentication keys (spec §3): what it sends ``dst`` is tagged
    with the key of the pair (this rank, ``dst``), :meth:`to`; what claims to
    come from ``src`` is verified with the key of (``src``, this rank), :meth:`of`.

    ``key`` is one key for every pair (the single-key API), or a lookup
    ``(src, dst) -> key`` (the I/O side derives one key per pair and run from the
    job's secret, :mod:`dlcp.keyring`); keys looked up are kept per peer. With
    ``peers`` known, a rank outside them has no key: what claims to come from
    it verifies with none (:meth:`of` gives None), at no cost (a flood of
    made-up source ranks derives nothing and keeps nothing)."""

    __slots__ = ("_lookup", "_of", "_peers", "_to", "rank")

    def __init__(
        self, rank: int, key: bytes | PairKeyLookup, peers: Collection[int] | None = None
    ) -> None:
        self.rank = rank
        if isinstance(key, bytes | bytearray):
            one = _check_key(key)
            self._lookup: PairKeyLookup = lambda src, dst: one
        else:
            self._lookup = key
        self._peers = frozenset(peers) if peers is not None else None
        self._to: dict[int, bytes] = {}
        self._of: dict[int, bytes] = {}

    def to(self, dst: int) -> bytes:
        """The key this rank tags what it sends to ``dst`` with (a session sends
        only to its peers)."""
        key = self._to.get(dst)
        if key is None:
            key = self._to[dst] = _check_key(self._lookup(self.rank, dst))
        return key

    def of(self, src: int) -> bytes | None:
        """The key a datagram that claims to come from ``src`` is verified with;
        None for a rank outside the session's peers."""
        key = self._of.get(src)
        if key is None:
            if self._peers is not None and src not in self._peers:
                return None
            key = self._of[src] = _check_key(self._lookup(src, self.rank))
        return key


@dataclass(slots=True)
class SessionContext:
    """One rank's identity and what both halves of its session write to."""

    config: ProtocolConfig
    rank: int
    job: int
    #: this rank's authentication keys, or None when authentication is off
    keys: PairKeys | None
    stats: SessionStats = field(default_factory=SessionStats)
    events: deque[Event] = field(default_factory=deque)
    control: list[ControlDatagram] = field(default_factory=list)

    def queue(self, dst: int, ctrl: ControlMessage) -> None:
        """Encode ``ctrl`` for the reliable control channel to ``dst``."""
        key = self.keys.to(dst) if self.keys is not None else None
        self.control.append(ControlDatagram(dst, encode_control(ctrl, job=self.job, key=key)))


class SessionSide:
    """Base of the session's receive and send sides: the context's identity and
    configuration as attributes, and where events and control messages go."""

    def __init__(self, ctx: SessionContext) -> None:
        self.config, self.stats = ctx.config, ctx.stats
        self.rank, self.job, self.keys = ctx.rank, ctx.job, ctx.keys
        self._events = ctx.events
        self._queue = ctx.queue
