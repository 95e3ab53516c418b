"""The sans-I/O DLCP protocol core: bytes and events in, bytes and events out.

No sockets, threads, asyncio, torch or clocks here: every method that depends on
time takes ``now``. ``tests/tree/test_purity.py`` checks it.
"""

from .config import FillPolicy, ProtocolConfig
from .loss_report import LossReport
from .session import (
    ControlDatagram,
    DataBatch,
    Event,
    MessageDelivered,
    MessageFailed,
    MessageReceived,
    RoundPost,
    RoundRelease,
    SendReport,
    Session,
    SessionStats,
    Transmit,
)
from .wire import TosMap, WireError

__all__ = [
    "ControlDatagram",
    "DataBatch",
    "Event",
    "FillPolicy",
    "LossReport",
    "MessageDelivered",
    "MessageFailed",
    "MessageReceived",
    "ProtocolConfig",
    "RoundPost",
    "RoundRelease",
    "SendReport",
    "Session",
    "SessionStats",
    "TosMap",
    "Transmit",
    "WireError",
]
