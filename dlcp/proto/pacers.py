"""Pacers by name: :func:`make_pacer` (``ProtocolConfig.pacer``), and the pacer that
does not pace (:class:`Unpaced`). The receiver-driven pacer and the rules every pacer
follows are in :mod:`dlcp.proto.pacing`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from ..errors import UsageError
from .pacing import (
    UNLIMITED,
    Pacer,
    ReceiverDrivenPacer,
    _check_loss,
    _check_nbytes,
    _check_now,
    _check_reported,
)

__all__ = ["Unpaced", "available_pacers", "make_pacer"]


class Unpaced:
    """No pacing: everything may go now."""

    __slots__ = ()

    @property
    def rate(self) -> float:
        return math.inf

    @property
    def burst(self) -> int:
        return UNLIMITED

    def allowance(self, *, now: float) -> int:
        _check_now(now)
        return UNLIMITED

    def on_sent(self, nbytes: int, *, now: float) -> None:
        _check_nbytes(nbytes)
        _check_now(now)

    def next_send_time(self, nbytes: int, *, now: float) -> float:
        _check_nbytes(nbytes)
        return _check_now(now)

    def note_backlogged(self, *, now: float) -> None:
        _check_now(now)

    def on_feedback(
        self, bytes_per_s: float, *, now: float, shared: bool = False, window: float = 0.0
    ) -> None:
        _check_reported(bytes_per_s)
        _check_now(now)

    def on_loss(
        self, lost_fraction: float, send_rate: float, *, now: float, queue: bool = False
    ) -> None:
        _check_loss(lost_fraction, send_rate)
        _check_now(now)


_PACERS: Final[dict[str, Callable[..., Pacer]]] = {
    "unpaced": Unpaced,
    "receiver": ReceiverDrivenPacer,
}


def available_pacers() -> list[str]:
    return sorted(_PACERS)


def make_pacer(name: str, **options: object) -> Pacer:
    """A pacer by name (``"unpaced"``, ``"receiver"``) with its options.

    Raises :class:`ValueError` for an unknown name, option or option value.
    """
    try:
        factory = _PACERS[name]
    except KeyError:
        raise UsageError(
            f"unknown pacer {name!r}; known pacers: {', '.join(available_pacers())}"
        ) from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise UsageError(f"bad options for pacer {name!r}: {exc}") from exc
