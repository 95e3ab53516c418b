"""What the application said about a message it will receive, before any of
the message's data fitted: where it goes, how strict to be, and (once packets
for it arrived that did not fit) why they did not.

A datagram that passes the wire checks but does not fit the buffer the receive
named may be a stray or, without authentication, a forgery: it must not decide
the message. Such packets are refused and the receive keeps waiting; the
sender's FINISH settles it (:meth:`Expectation.disagreement`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from .config import FillPolicy
from .control import Finish
from .reassembler import Reassembler
from .wire import DType, allowed_loss, bound_from_wire

__all__ = ["Expectation"]


@dataclass(slots=True)
class Expectation:
    out: npt.NDArray[np.generic] | None
    p: float | None
    fill: FillPolicy
    #: the message's values are added to ``out`` (Reassembler's ``accumulate``)
    accumulate: bool = False
    #: why data for it did not fit ``out``, and how many packets did not (they
    #: were refused; the sender's FINISH, if none fitted by then, fails the
    #: message with this)
    misfit: str | None = None
    misfits: int = 0
    #: the message's state, made when the receive was posted and registered with
    #: the native receive loop in the geometry the sender most likely uses, so
    #: that the loop takes even its first datagrams (None: it opens as they come)
    posted: Reassembler | None = None

    def post(self, chunk_bytes: int) -> Reassembler | None:
        """The message's state in the geometry a sender cutting ``chunk_bytes``-byte
        chunks gives a message that fills ``out`` (kept as :attr:`posted`), or
        None if ``out`` can hold no message (its data then says what it is)."""
        out = self.out
        if out is None or not len(out):
            return None
        try:
            dtype = DType.of(out, bfloat16=True)
            chunk_elems = min(chunk_bytes // dtype.itemsize, len(out))
            self.posted = Reassembler(
                dtype=dtype, msg_elems=len(out), chunk_elems=chunk_elems, out=out, bound=0.0,
                fill=self.fill, now=0.0, accumulate=self.accumulate,
            )  # fmt: skip
        except (UsageError, ValueError):
            return None
        return self.posted

    def opened(self, bound: int, *, now: float) -> Reassembler:
        """:attr:`posted`, its first datagrams (of wire bound ``bound``) taken at
        ``now``: its bound is the tighter of the sender's and ``p``."""
        r = self.posted
        assert r is not None
        sender_p = bound_from_wire(bound)
        r.bound = sender_p if self.p is None else min(sender_p, self.p)
        r.allowed_loss = allowed_loss(r.bound, r.msg_elems)
        r.started = r.last_activity = now
        return r

    def note_misfit(self, why: str, packets: int) -> None:
        self.misfit = f"packet does not fit the expected message: {why}"
        self.misfits += packets

    def disagreement(self, finish: Finish, chunk_bytes: int) -> str | None:
        """Why the sender's ``finish``, after packets that did not fit, shows the
        two sides disagree on the message; None if it does not. It does not if no
        packet misfit, or if at most one did (a stray; the sender's are many) and
        ``finish`` could end a message into ``out`` cut in chunks of
        ``chunk_bytes`` (the chunk count is all a FINISH says of the geometry):
        then the FINISH may have overtaken its data."""
        if self.misfit is None:
            return None
        if self.out is not None and self.misfits <= 1:
            chunk_elems = max(1, chunk_bytes // self.out.dtype.itemsize)
            if finish.total_chunks == -(-len(self.out) // chunk_elems):
                return None
        return self.misfit
