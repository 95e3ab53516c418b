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

from .auth import NonceCounter, check_auth_key
from .config import ProtocolConfig
from .control import ControlMessage, encode_control
from .events import ControlDatagram, Event, SessionStats

__all__ = ["ALL_ELEMS", "Key", "PairKeyLookup", "PairKeys", "SessionContext", "SessionSide"]

Key = tuple[int, int, int]  # (peer rank, step, msg id)
ALL_ELEMS = 0xFFFFFFFF  # NACK.needed_elems meaning "everything"

#: the authentication key of the ordered pair of ranks (src, dst): spec §3
PairKeyLookup = Callable[[int, int], bytes]


class PairKeys:
    """One rank's authentication keys (spec §3): what it sends ``dst`` is tagged
    with the key of the pair (this rank, ``dst``), :meth:`to`; what claims to
    come from ``src`` is verified with the key of (``src``, this rank), :meth:`of`.

    ``key`` is one key for every pair (the single-key API), or a lookup
    ``(src, dst) -> key`` (the I/O side derives one key per pair and run from the
    job's secret, :mod:`dlcp.keyring`); keys looked up are kept per peer. With
    ``peers`` known, a rank outside them has no key: what claims to come from
    it verifies with none (:meth:`of` gives None), at no cost (a flood of
    made-up source ranks derives nothing and keeps nothing).

    The rank's nonces (spec §3) come from two counters, one per domain, that
    every destination and every sending thread shares: :attr:`data_nonces`,
    :attr:`control_nonces`."""

    __slots__ = ("_lookup", "_of", "_peers", "_to", "control_nonces", "data_nonces", "rank")

    def __init__(
        self,
        rank: int,
        key: bytes | PairKeyLookup,
        peers: Collection[int] | None = None,
        *,
        nonce_start: int = 0,
    ) -> None:
        self.rank = rank
        if isinstance(key, bytes | bytearray):
            one = check_auth_key(key)
            self._lookup: PairKeyLookup = lambda src, dst: one
        else:
            self._lookup = key
        self._peers = frozenset(peers) if peers is not None else None
        self._to: dict[int, bytes] = {}
        self._of: dict[int, bytes] = {}
        #: nonces of the data datagrams this rank tags (for every destination)
        self.data_nonces = NonceCounter(nonce_start)
        #: nonces of the control datagrams this rank tags
        self.control_nonces = NonceCounter(nonce_start)

    def to(self, dst: int) -> bytes:
        """The key this rank tags what it sends to ``dst`` with (a session sends
        only to its peers)."""
        key = self._to.get(dst)
        if key is None:
            key = self._to[dst] = check_auth_key(self._lookup(self.rank, dst))
        return key

    def of(self, src: int) -> bytes | None:
        """The key a datagram that claims to come from ``src`` is verified with;
        None for a rank outside the session's peers."""
        key = self._of.get(src)
        if key is None:
            if self._peers is not None and src not in self._peers:
                return None
            key = self._of[src] = check_auth_key(self._lookup(src, self.rank))
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

    def encode(self, dst: int, ctrl: ControlMessage) -> bytes:
        """``ctrl`` as the reliable control channel to ``dst`` carries it (tagged,
        with a nonce of its own, when the session authenticates)."""
        if self.keys is None:
            return encode_control(ctrl, job=self.job)
        return encode_control(
            ctrl, job=self.job, key=self.keys.to(dst), nonce=self.keys.control_nonces.take(1)
        )

    def queue(self, dst: int, ctrl: ControlMessage) -> None:
        """Encode ``ctrl`` for the reliable control channel to ``dst``."""
        self.control.append(ControlDatagram(dst, self.encode(dst, ctrl)))

    def queue_encoded(self, dst: int, raw: bytes) -> None:
        """A control message :meth:`encode` made for ``dst``, for the channel now."""
        self.control.append(ControlDatagram(dst, raw))


class SessionSide:
    """Base of the session's receive and send sides: the context's identity and
    configuration as attributes, and where events and control messages go."""

    def __init__(self, ctx: SessionContext) -> None:
        self.config, self.stats = ctx.config, ctx.stats
        self.rank, self.job, self.keys = ctx.rank, ctx.job, ctx.keys
        self._events = ctx.events
        self._queue = ctx.queue
        self._encode, self._queue_encoded = ctx.encode, ctx.queue_encoded
