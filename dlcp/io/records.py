"""What an :class:`~dlcp.io.endpoint.Endpoint` hands back and keeps: a completed
receive, a pending operation's future and deadline, the driver's counters."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from ..proto.reassembler import LossReport

__all__ = ["DriverStats", "Pending", "Received"]


@dataclass(frozen=True, slots=True)
class Received:
    """A completed receive: the data (``out`` if one was given) and what was lost."""

    src: int
    step: int
    msg: int
    data: npt.NDArray[Any]
    report: LossReport
    #: EMULATION: the share of received data datagrams this endpoint drops on
    #: purpose (``EndpointConfig.emulated_loss``); 0.0: any loss in ``report`` is real
    emulated_loss: float = 0.0


@dataclass(slots=True)
class Pending:
    """A send or receive in flight: its future, when it times out, where it writes."""

    future: Future[Any]
    deadline: float
    out: npt.NDArray[Any] | None = None


@dataclass(slots=True)
class DriverStats:
    """The I/O driver's own counters (the session keeps the protocol's)."""

    data_batches_out: int = 0
    #: data batches the kernel refused (their peer's transfers failed)
    data_send_errors: int = 0
    control_out: int = 0
    control_in: int = 0
    control_rejected: int = 0
    receive_calls: int = 0
