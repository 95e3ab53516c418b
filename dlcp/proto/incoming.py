"""What the receive side keeps per message under way (the rules acting on it are
:class:`~dlcp.proto.inbox.Inbox`'s), and what keeping one costs."""

from __future__ import annotations

from dataclasses import dataclass

from .reassembler import Reassembler
from .recovery import ReceiverRecovery

__all__ = ["OPEN_MESSAGE_BYTES", "IncomingMessage"]

#: what an open message costs beyond its buffer (its reassembler and recovery
#: state, a few hundred bytes of Python objects; counted against
#: ``max_unexpected_bytes`` with the buffer)
OPEN_MESSAGE_BYTES = 1024


@dataclass(slots=True)
class IncomingMessage:
    """One message coming in: its reassembly and recovery state, and its charge."""

    reassembler: Reassembler
    recovery: ReceiverRecovery
    unexpected_bytes: int  # buffer bytes charged against max_unexpected_bytes
    #: the application asked for it (expect): once complete it is handed over, not
    #: parked, so its charge ends then
    expected: bool = False
