"""How a message ended at its receiver (:class:`Outcome`), and what the inbox
remembers of it afterwards (:class:`Ended`): late packets of it are ignored and a
repeated FINISH is answered, with STOP if it completed, else with the ABORT
:data:`ABORT_OF` names."""

from __future__ import annotations

import enum
import math
from typing import Final, NamedTuple

from .control import AbortReason

__all__ = ["ABORT_OF", "Ended", "Outcome"]


class Outcome(enum.Enum):
    """How a message ended here (:class:`Ended`); the value is how ``expect``
    names it to an application that asks for it afterwards."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: failed: nobody asked for it and it would pass max_unexpected_bytes
    REFUSED = "refused"


class Ended(NamedTuple):
    """What the inbox remembers of a message that ended: late packets of it are
    ignored (not started as a new message) and a repeated FINISH is answered,
    with STOP if it completed, else with ABORT. (A named tuple: one is made for
    every message received.)"""

    outcome: Outcome
    #: elements received (COMPLETED; 0 otherwise)
    received_elems: int = 0
    #: when it completed (COMPLETED; -inf otherwise)
    at: float = -math.inf


#: how a repeated FINISH of a message that ended without delivery is answered
ABORT_OF: Final = {
    Outcome.FAILED: AbortReason.GAVE_UP,
    Outcome.CANCELLED: AbortReason.CANCELLED,
    Outcome.REFUSED: AbortReason.UNCLAIMED_LIMIT,
}
