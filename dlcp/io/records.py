"""What an :class:`~dlcp.io.endpoint.Endpoint` hands back and keeps: a completed
receive, a pending operation's future and deadline, the driver's counters."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy.typing as npt

from ..errors import UsageStateError
from ..proto.loss_report import LossReport

__all__ = ["DriverStats", "Pending", "Received", "TransferFuture"]

_T = TypeVar("_T")
_R = TypeVar("_R")


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


class TransferFuture(Future[_T]):
    """The future of a send or receive. Its caller may cancel it (the endpoint then
    forgets the transfer); the endpoint settling a cancelled one is a no-op, not
    an error in the I/O thread, whichever of the two came first. ``what`` names
    the transfer (rank, message, peer) for errors raised about it elsewhere.

    Callbacks run in the thread that settles the future, with the endpoint's lock
    held: its I/O thread, or a caller's. Waiting there for a transfer that is not
    done would stop the thread that must move it: ``result()`` and
    ``exception()`` raise RuntimeError instead (``blocked`` tells when: the
    endpoint's test for "this thread runs its I/O or holds its lock").
    ``waiting(1)`` and ``waiting(-1)`` are called around a wait for it that is
    not done yet (a send's: the receive loop leaves the STOP that settles it to
    the I/O thread's turn meanwhile, ``dlcp.io.control_in_waits``)."""

    def __init__(
        self,
        what: str = "",
        *,
        blocked: Callable[[], bool] | None = None,
        waiting: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__()
        self.what = what
        self._blocked = blocked
        self._waiting = waiting

    def result(self, timeout: float | None = None) -> _T:
        return self._wait(super().result, timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._wait(super().exception, timeout)

    def _wait(self, get: Callable[[float | None], _R], timeout: float | None) -> _R:
        self._check_wait()
        if self._waiting is None or self.done():
            return get(timeout)
        self._waiting(1)
        try:
            return get(timeout)
        finally:
            self._waiting(-1)

    def _check_wait(self) -> None:
        if not self.done() and self._blocked is not None and self._blocked():
            raise UsageStateError(
                f"{self.what}: waiting for it here would deadlock the endpoint (this "
                "thread runs its I/O or holds its lock: a future's callback?); chain "
                "with add_done_callback, or wait in another thread"
            )

    def set_result(self, result: _T) -> None:
        try:
            super().set_result(result)
        except InvalidStateError:
            if not self.cancelled():
                raise

    def set_exception(self, exception: BaseException | None) -> None:
        try:
            super().set_exception(exception)
        except InvalidStateError:
            if not self.cancelled():
                raise


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
    #: data datagrams the receive loop scattered itself (dlcp.io.native_receive;
    #: the session counts them in datagrams_fast too)
    datagrams_native: int = 0
    #: sends to a rank with no published address (a stray or forged datagram's)
    unroutable: int = 0
