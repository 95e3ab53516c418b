"""What a rank had seen of one message when its driver gave up waiting for it, in
words, for the error that ends it (the endpoint's timeout,
:class:`~dlcp.errors.PeerTimeout`).

A receive that times out may have had nothing at all (its sender never sent it, or
sent it somewhere else), its FINISH without any data (the data path drops it), part
of its data and no FINISH (the sender stalled before the end of its first round), or
its FINISH and part of its data (recovery did not finish). A send that times out may
be unsent (paced, or behind an earlier message of its step), handed to the send
engine, or sent with its FINISH unanswered. Each says where to look next.

Pure: times are the caller's ``now`` and the times the state recorded.
"""

from __future__ import annotations

import numpy as np

from .outgoing import OutgoingMessage
from .reassembler import Reassembler
from .recovery import SendPhase

__all__ = ["receive_progress", "send_progress"]


def _ago(t: float, now: float) -> str:
    return f"{max(now - t, 0.0):.3g} s ago"


def receive_progress(
    r: Reassembler | None,
    *,
    finish_first: float | None,
    nacked_round: int | None,
    last_data: float | None,
    now: float,
    misfit: str | None = None,
    misfits: int = 0,
) -> str:
    """A receive's state: ``r`` the message's reassembler (None: no data of it was
    taken), ``finish_first`` when its first FINISH came with none of its data (None:
    none came), ``nacked_round`` the round whose chunks were all asked for again
    (None: none), ``last_data`` when any data of the same sender last arrived
    (None: none has), ``misfit`` why its datagrams were refused and ``misfits`` how
    many (the receive posted for it does not fit them)."""
    sender = (
        "no data from that rank has arrived here"
        if last_data is None
        else f"data from that rank last arrived {_ago(last_data, now)}"
    )
    if r is None and misfits:
        return (
            f"{misfits:,} of its datagrams arrived and were refused: {misfit}; "
            f"{'its FINISH arrived' if finish_first is not None else 'no FINISH came'}; {sender}"
        )
    if r is None:
        if finish_first is None:
            return f"nothing of it arrived here, neither data nor its FINISH; {sender}"
        asked = "" if nacked_round is None else f" (all of round {nacked_round} was NACKed)"
        return (
            f"its FINISH arrived {_ago(finish_first, now)}{asked} but none of its data did: "
            f"the data path from that rank loses it; {sender}"
        )
    chunks = int(np.count_nonzero(r.received))
    held = (
        f"{r.received_elems:,} of its {r.msg_elems:,} elements arrived ({chunks:,} of "
        f"{r.n_chunks:,} chunks), the last {_ago(r.last_activity, now)}"
    )
    if r.finish is None:
        return f"{held}; no FINISH came (the sender had not sent all of it)"
    nacks = f", after {r.nack_rounds} NACK round(s)" if r.nack_rounds else ""
    return f"{held}; its FINISH of round {r.finish.round} came{nacks}"


def send_progress(o: OutgoingMessage, *, finish_timeout: float, now: float) -> str:
    """A send's state, from its :class:`~.outgoing.OutgoingMessage`; the FINISH's
    timeout says when the last FINISH went (its timer runs from it)."""
    rec = o.recovery
    total = len(o.run)
    if rec.phase is SendPhase.AWAITING:
        last = "" if rec.timer is None else f", the last {_ago(rec.timer - finish_timeout, now)}"
        return (
            f"all {total:,} datagrams of round {rec.round} went out and its FINISH was sent "
            f"{rec.finish_tries} time(s){last}, and neither STOP nor NACK came back"
        )
    if rec.phase is SendPhase.DONE:
        return "its STOP had come"
    if rec.phase is SendPhase.FAILED:
        return f"it had failed: {rec.failure.message if rec.failure else 'no reason kept'}"
    if o.cursor == 0:
        return (
            f"none of the {total:,} datagrams of round {rec.round} had gone out (held by "
            "the pacer, or behind an earlier message of its step to that rank)"
        )
    if o.cursor < total:
        return f"{o.cursor:,} of the {total:,} datagrams of round {rec.round} had gone out"
    return (
        f"the {total:,} datagrams of round {rec.round} were with the send engine, which had "
        "not reported them sent"
    )
