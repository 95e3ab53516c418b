"""A receive posted after its message completed: what it gets (pure decision).

A message that completed before anyone asked for it was received by the sender's
bound, its lost elements filled as the session's default fill says. The receive
posted later brings its own ``p`` and ``fill``; it must not get silently looser
data than it asked for. :func:`claim_completed` decides, and applies the fill
where that can be done after the fact; the driver only settles the receive with
the result (:class:`ClaimAccepted`) or fails it with the reason
(:class:`ClaimRefused`).

Rules:

* a message that lost nothing is accepted as it is, whatever ``p`` and ``fill``;
* one that lost more elements than ``p`` allows is refused;
* one whose fill differs from ``fill`` is refilled: PREVIOUS into ``out`` (which
  must match the message's shape and dtype; its old values stay where elements
  were lost), RESCALE by scaling the received values up (not for uint8). Only a
  message zero-filled (the session default) can be refilled; anything else is
  refused, naming both fills.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .config import FillPolicy
from .events import MessageReceived
from .rescale import rescale
from .wire import DType, allowed_loss

__all__ = ["ClaimAccepted", "ClaimRefused", "claim_completed"]


@dataclass(frozen=True, slots=True)
class ClaimAccepted:
    """The receive gets ``event`` (its report names the fill applied)."""

    event: MessageReceived
    #: the message's values are in the receive's ``out`` already (PREVIOUS)
    in_out: bool = False


@dataclass(frozen=True, slots=True)
class ClaimRefused:
    """The receive fails: ``why`` names the message and what it asked for."""

    why: str


def claim_completed(
    ev: MessageReceived,
    out: npt.NDArray[Any] | None,
    *,
    p: float | None,
    fill: FillPolicy,
) -> ClaimAccepted | ClaimRefused:
    """What a receive asking for ``p`` and ``fill`` (into ``out``) gets of ``ev``,
    a message that completed before it was posted (see the module's rules)."""
    rep = ev.report
    if not rep.lost_elems:
        return ClaimAccepted(ev)
    what = (
        f"message (step {ev.step}, msg {ev.msg}) from rank {ev.src} completed before "
        "this receive was posted, by the sender's bound"
    )
    if p is not None and rep.lost_elems > allowed_loss(p, rep.msg_elems):
        return ClaimRefused(
            f"{what}: {rep.lost_elems} of {rep.msg_elems} elements lost, more than p={p:g} allows"
        )
    if fill is rep.fill:
        return ClaimAccepted(ev)
    if not _refill(ev, out, fill):
        return ClaimRefused(
            f"{what}, its lost elements filled with fill={rep.fill.value}: "
            f"fill={fill.value} cannot be applied afterwards to {ev.data.dtype} data "
            "(post the receive before the data comes)"
        )
    refilled = dataclasses.replace(ev, report=dataclasses.replace(rep, fill=fill))
    return ClaimAccepted(refilled, in_out=fill is FillPolicy.PREVIOUS)


def _refill(ev: MessageReceived, out: npt.NDArray[Any] | None, fill: FillPolicy) -> bool:
    """Turn ``ev``'s zero-filled lost elements into ``fill``'s (PREVIOUS: into
    ``out``, whose values stay there; RESCALE: received values scaled up, in
    ``ev.data``). False where that cannot be done afterwards."""
    data, rep = ev.data, ev.report
    if rep.fill is not FillPolicy.ZERO:
        return False  # (a non-default session fill: not undone after the fact)
    if fill is FillPolicy.PREVIOUS:
        if out is None or out.shape != data.shape or out.dtype != data.dtype:
            return False
        kept = [(off, out[off : off + n].copy()) for off, n in rep.lost_ranges]
        out[...] = data
        for off, values in kept:
            out[off : off + len(values)] = values
        return True
    if fill is FillPolicy.RESCALE and data.dtype != np.uint8 and rep.received_elems:
        # (the session's own rescale: float32, rounded once; uint16 words are bfloat16)
        dtype = DType.of(data, bfloat16=data.dtype == np.uint16)
        rescale(data, dtype, rep.msg_elems / rep.received_elems)
        return True
    return False
