"""What the two halves of a session share: identity, configuration, counters,
the event queue and the queue of control messages to send.

:class:`~dlcp.proto.session.Session` builds one :class:`SessionContext` and hands
it to its receive side (:class:`~dlcp.proto.inbox.Inbox`) and its send side
(:class:`~dlcp.proto.outbox.Outbox`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .config import ProtocolConfig
from .events import ControlDatagram, Event, SessionStats
from .wire import ControlMessage, encode_control

__all__ = ["ALL_ELEMS", "Key", "SessionContext", "SessionSide"]

Key = tuple[int, int, int]  # (peer rank, step, msg id)
ALL_ELEMS = 0xFFFFFFFF  # NACK.needed_elems meaning "everything"


@dataclass(slots=True)
class SessionContext:
    """One rank's identity and what both halves of its session write to."""

    config: ProtocolConfig
    rank: int
    job: int
    #: the job's authentication key, or None when authentication is off
    key: bytes | None
    stats: SessionStats = field(default_factory=SessionStats)
    events: deque[Event] = field(default_factory=deque)
    control: list[ControlDatagram] = field(default_factory=list)

    def queue(self, dst: int, ctrl: ControlMessage) -> None:
        """Encode ``ctrl`` for the reliable control channel to ``dst``."""
        self.control.append(ControlDatagram(dst, encode_control(ctrl, job=self.job, key=self.key)))


class SessionSide:
    """Base of the session's receive and send sides: the context's identity and
    configuration as attributes, and where events and control messages go."""

    def __init__(self, ctx: SessionContext) -> None:
        self.config, self.stats = ctx.config, ctx.stats
        self.rank, self.job, self.key = ctx.rank, ctx.job, ctx.key
        self._events = ctx.events
        self._queue = ctx.queue
