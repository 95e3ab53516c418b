"""Stop / finish / NACK: the per-message recovery state machines.

Sender, per message (``docs/spec.md``, "Exchange")::

    SENDING --all records of the round handed out--> AWAITING  (send FINISH r)
    AWAITING --NACK r--> SENDING round r+1 (retransmissions), or FAILED after
             max_rounds rounds in a row that left the receiver needing as much
    AWAITING --finish_timeout--> AWAITING (FINISH r again), or FAILED after finish_retries
    SENDING | AWAITING --STOP--> DONE
    any --ABORT--> FAILED

Receiver, per message (the full table is :class:`ReceiverRecovery`'s)::

    RECEIVING --complete--> DONE (send STOP; fill; report), or SETTLING for the
              reorder grace first when complete by the bound
    RECEIVING --FINISH r, bound unmet--> FINISHED --reorder grace--> NACKED (NACK r,
              repeated every nack_timeout while nothing new arrives)
    any live --no packet for recv_idle_timeout, or ABORT--> FAILED
    any live --cancel--> CANCELLED

Retransmission choice (sender): every missing protected chunk the NACK names,
then missing drop-eligible chunks in send order (highest priority first) until
the elements resent cover what the receiver said it still needs.

Nothing here touches a clock: each method that depends on time takes ``now``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from ..errors import ProtocolStateError
from .config import ProtocolConfig
from .context import ALL_ELEMS
from .control import Finish, Nack
from .packetizer import ChunkTable
from .reassembler import Reassembler
from .wire import MAX_NACK_RANGES

#: most parts one NACK round is split into (64 x 170 ranges)
MAX_NACK_PARTS = 64
#: the last round FINISH and NACK can name (a 16-bit field)
MAX_ROUND = 0xFFFF

__all__ = [
    "MAX_NACK_PARTS",
    "MAX_ROUND",
    "Failure",
    "ReceivePhase",
    "ReceiverRecovery",
    "SendPhase",
    "SenderRecovery",
    "chunks_in_ranges",
    "select_retransmissions",
]

Int64Array = npt.NDArray[np.int64]


class SendPhase(enum.Enum):
    SENDING = "sending"
    AWAITING = "awaiting"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a message failed; ``message`` is the text users see."""

    message: str
    peer_timeout: bool = False


def chunks_in_ranges(ranges: Sequence[tuple[int, int]], n_chunks: int) -> Int64Array:
    """The chunks ``(first, count)`` ranges name, sorted, each once, below
    ``n_chunks``: memory in ``n_chunks`` however the ranges overlap (a peer can
    send thousands that each name the whole message)."""
    named = np.zeros(n_chunks, dtype=np.bool_)
    for first, n in ranges:
        if first < n_chunks:
            named[first : min(first + n, n_chunks)] = True
    return np.flatnonzero(named)


def _received_elems_in(r: Reassembler, ranges: Sequence[tuple[int, int]]) -> int:
    """Elements of chunks that arrived, among those ``ranges`` name."""
    named = chunks_in_ranges(ranges, r.n_chunks)
    got = named[r.received[named]]
    if len(got) == 0:
        return 0
    last = r.msg_elems - (r.n_chunks - 1) * r.chunk_elems  # the last chunk may be short
    return len(got) * r.chunk_elems - (r.chunk_elems - last if got[-1] == r.n_chunks - 1 else 0)


def select_retransmissions(table: ChunkTable, nack: Nack) -> Int64Array:
    """Chunks to resend for ``nack``, in send order (see the module rules)."""
    return _select(table, chunks_in_ranges(nack.ranges, table.n_chunks), nack)


def _select(table: ChunkTable, named: Int64Array, nack: Nack) -> Int64Array:
    """:func:`select_retransmissions` of the chunks ``named`` (the NACK's ranges)."""
    if len(named) == 0:
        return np.zeros(0, dtype=np.int64)
    ordered = table.send_order(named)
    protected = ~table.drop[ordered]
    elems = table.chunk_len(ordered)
    covered = int(elems[protected].sum())
    droppable = ordered[~protected]
    if covered >= nack.needed_elems or len(droppable) == 0:
        chosen_droppable = droppable[:0]
    else:
        cum = np.cumsum(elems[~protected])
        k = int(np.searchsorted(cum, nack.needed_elems - covered)) + 1
        chosen_droppable = droppable[:k]
    keep = np.concatenate((ordered[protected], chosen_droppable))
    return table.send_order(keep)


class SenderRecovery:
    """Sender side of one message: rounds, FINISH timers, giving up."""

    def __init__(
        self,
        table: ChunkTable,
        config: ProtocolConfig,
        *,
        now: float,
        class_chunks: tuple[int, ...] | None = None,
    ) -> None:
        """``class_chunks``: the table's :meth:`~.ChunkTable.class_chunks`, if the
        caller has them already."""
        self.table = table
        self.config = config
        self.phase = SendPhase.SENDING
        self.round = 0
        self.started = now
        self.finish_tries = 0
        self.timer: float | None = None
        self.failure: Failure | None = None
        self.sent_packets = 0
        self.retransmitted_packets = 0
        self.received_elems = 0
        #: retransmission rounds in a row that left the receiver needing as much
        self.stalled_rounds = 0
        self._needed = 0  # what the receiver's last NACK said it still needed
        self._named = 0  # and how many chunks it named
        n = table.n_chunks
        # per-(priority, drop) chunk counts, announced in every FINISH
        self._class_chunks = table.class_chunks() if class_chunks is None else class_chunks
        self._protected = int(n - np.count_nonzero(table.drop))
        #: the current round's last chunk on each path (FINISH's ``tail``), if
        #: its records left in order on each path
        self._tail: tuple[int, ...] = ()

    def finish_message(
        self, *, step: int, msg: int, src: int, tail: tuple[int, ...] | None = None
    ) -> Finish:
        """The current round's FINISH; ``tail``: the one :meth:`round_sent` will be
        told (a driver that writes the FINISH itself gets it with the round), else
        the one it was told."""
        return Finish(
            step,
            msg,
            src,
            round=self.round,
            total_chunks=self.table.n_chunks,
            protected_chunks=self._protected,
            class_chunks=self._class_chunks,
            tail=self._tail if tail is None else tail,
        )

    def round_sent(self, *, now: float, tail: tuple[int, ...] = ()) -> None:
        """Every record of the current round went out: FINISH follows, naming
        ``tail``, the round's last chunk on each path (empty: its records may
        have left out of order, docs/spec.md §5.3)."""
        self.phase = SendPhase.AWAITING
        self.finish_tries = 1
        self.timer = now + self.config.finish_timeout
        self._tail = tail

    def on_nack(self, nack: Nack, *, now: float) -> Int64Array | None:
        """Chunks to resend for a NACK of the current round, or None if it is stale
        or arrives while this round is still being sent."""
        if self.phase is not SendPhase.AWAITING or nack.round != self.round:
            return None
        # a retransmission round that got the receiver closer to completing is
        # progress: fewer elements needed for the bound, or fewer chunks missing
        # (a receiver whose elements meet the bound still needs every protected
        # chunk, and says needed 0). Under incast most of a round may be lost,
        # round after round, while the pacer slows down; only rounds in a row
        # without progress count. (A transfer that never completes also ends at
        # its driver's deadline: the endpoint's timeout.)
        named = chunks_in_ranges(nack.ranges, self.table.n_chunks)
        if self.round > 0 and nack.needed_elems >= self._needed and len(named) >= self._named:
            self.stalled_rounds += 1
        else:
            self.stalled_rounds = 0
        self._needed, self._named = nack.needed_elems, len(named)
        if self.stalled_rounds >= self.config.max_rounds or self.round >= MAX_ROUND:
            self._fail(
                f"gave up after {self.round} retransmission rounds ({self.stalled_rounds} "
                "in a row without progress); receiver still "
                + (
                    # (a message too small for the receiver's silent-path verdict
                    # ends here first: say what that verdict would have said)
                    "has nothing of the message: none of its data arrived (is the "
                    "UDP data path to it blocked, or its data address wrong?)"
                    if nack.needed_elems == ALL_ELEMS
                    else f"needs {nack.needed_elems} elements"
                )
            )
            return None
        seqs = _select(self.table, named, nack)
        self.round += 1
        self.phase = SendPhase.SENDING
        self.timer = None
        return seqs

    def on_stop(self, received_elems: int) -> None:
        if self.phase in (SendPhase.SENDING, SendPhase.AWAITING):
            self.phase = SendPhase.DONE
            self.timer = None
            self.received_elems = received_elems

    def on_abort(self, why: str) -> None:
        if self.phase in (SendPhase.SENDING, SendPhase.AWAITING):
            self._fail(why)

    def on_timer(self, *, now: float) -> bool:
        """Handle an expired timer; True if FINISH must be sent again."""
        if self.timer is None or now < self.timer or self.phase is not SendPhase.AWAITING:
            return False
        if self.finish_tries >= self.config.finish_retries:
            waited = self.finish_tries * self.config.finish_timeout
            self._fail(f"receiver did not answer FINISH for {waited:.3g} s", peer_timeout=True)
            return False
        self.finish_tries += 1
        self.timer = now + self.config.finish_timeout
        return True

    def _fail(self, message: str, *, peer_timeout: bool = False) -> None:
        self.phase = SendPhase.FAILED
        self.timer = None
        self.failure = Failure(message, peer_timeout)


#: how many ``nack_timeout`` a NACK waits after its FINISH, at most, while the
#: receiver's driver says data is waiting unread (``data_pending``)
PENDING_NACK_TIMEOUTS = 10


def sender_quiet(
    config: ProtocolConfig,
    sender_active: float,
    finish_at: float | None,
    *,
    data_pending: bool = False,
) -> float:
    """When a NACK stops waiting for the sender's other data: the sender quiet
    for the reorder grace (a receiver working through a backlog, this message's
    data maybe behind another's), but at most ``nack_timeout`` after the FINISH
    (``finish_at``) that asks for the NACK: a sender that keeps streaming must not
    starve a message's repair (docs/spec.md §8). While datagrams wait unread in
    the receiver's socket (``data_pending``: its driver has not caught up), the
    message's own data may be among them, so the wait is up to
    :data:`PENDING_NACK_TIMEOUTS` times as long."""
    quiet = sender_active + config.reorder_grace
    if finish_at is None:
        return quiet
    waits = PENDING_NACK_TIMEOUTS if data_pending else 1
    return min(quiet, finish_at + waits * config.nack_timeout)


class ReceivePhase(enum.Enum):
    """Where one incoming message's recovery stands (:class:`ReceiverRecovery`)."""

    #: data arriving; no FINISH is waiting for a NACK
    RECEIVING = "receiving"
    #: a FINISH found the message short of its bound: NACK once the data behind
    #: it had its reorder grace
    FINISHED = "finished"
    #: the NACK of the FINISH's round went out; repeated every ``nack_timeout``
    NACKED = "nacked"
    #: complete by the bound: completes once no data arrived for the reorder grace
    SETTLING = "settling"
    #: complete and handed over (terminal)
    DONE = "done"
    #: no packet for ``recv_idle_timeout``, or its sender aborted it (terminal)
    FAILED = "failed"
    #: the receiver cancelled it (terminal)
    CANCELLED = "cancelled"

    # members are singletons compared by identity: hash them so too, in C (the
    # transition table is looked up on every move; Enum's own hash is Python code)
    __hash__ = object.__hash__


# the phases the per-message hot paths (open, complete, the timer every driver
# turn reads) name, as module constants: an Enum class attribute costs a lookup
# through its metaclass
_RECEIVING: Final = ReceivePhase.RECEIVING
_SETTLING: Final = ReceivePhase.SETTLING
_DONE: Final = ReceivePhase.DONE


_TERMINAL: Final = frozenset({ReceivePhase.DONE, ReceivePhase.FAILED, ReceivePhase.CANCELLED})
_LIVE: Final = frozenset(ReceivePhase) - _TERMINAL
#: phase -> the phases an event may move it to (the table in ReceiverRecovery's doc)
_RECEIVE_MOVES: Final[dict[ReceivePhase, frozenset[ReceivePhase]]] = {
    ReceivePhase.RECEIVING: frozenset({ReceivePhase.FINISHED, ReceivePhase.SETTLING, *_TERMINAL}),
    ReceivePhase.FINISHED: frozenset(
        {ReceivePhase.FINISHED, ReceivePhase.NACKED, ReceivePhase.SETTLING, *_TERMINAL}
    ),
    ReceivePhase.NACKED: frozenset(
        {ReceivePhase.FINISHED, ReceivePhase.NACKED, ReceivePhase.SETTLING, *_TERMINAL}
    ),
    ReceivePhase.SETTLING: frozenset(
        {ReceivePhase.RECEIVING, ReceivePhase.FINISHED, ReceivePhase.SETTLING, *_TERMINAL}
    ),
    ReceivePhase.DONE: frozenset(),
    ReceivePhase.FAILED: frozenset(),
    ReceivePhase.CANCELLED: frozenset(),
}


class ReceiverRecovery:
    """Receiver side of one message: when to NACK, when to complete, when to give up.

    Its :attr:`phase` is changed only by its own methods, each one event::

        phase      event                             next phase
        ---------  --------------------------------  -----------------------------
        RECEIVING  FINISH, bound unmet (on_finish)   FINISHED  (NACK at +grace)
        FINISHED   FINISH of a later round           FINISHED  (NACK at +grace)
        FINISHED   data completing the tail          FINISHED  (NACK now)
                   (on_data)
        FINISHED   timer, data quiet (on_timer)      NACKED    (NACK sent)
        NACKED     timer (on_timer)                  NACKED    (NACK sent again)
        NACKED     FINISH of a later round           FINISHED
        any live   complete, bound met, data may     SETTLING  (complete at the
                   still land (on_complete)                     end of the grace)
        any live   complete, quiet (on_complete)     DONE
        SETTLING   bound tightened, now unmet        FINISHED if a FINISH came,
                   (on_bound_tightened)              else RECEIVING
        SETTLING   FINISH                            SETTLING  (its time noted)
        any live   timer, idle recv_idle_timeout     FAILED    (:attr:`failure`)
        any live   ABORT (on_abort)                  FAILED
        any live   cancel (on_cancel)                CANCELLED

    ("any live": every phase but DONE, FAILED and CANCELLED.) A message
    complete by the bound waits the grace only if it was never NACKED: a
    NACKED message waited the grace before its NACK. No grace is waited, for a
    NACK or a completion, once the latest FINISH's tail landed
    (:meth:`tail_landed`): the round's data is then all in or lost. Any event in a terminal
    phase, and any move the table does not list, raises
    :class:`~dlcp.errors.ProtocolStateError`: it is a bug of the caller.
    """

    def __init__(self, reassembler: Reassembler, config: ProtocolConfig, *,
                 nacked_round: int | None = None) -> None:  # fmt: skip
        """``nacked_round``: the round of an orphan FINISH that was NACKed whole
        before any data arrived (its grace waited then), else None."""
        self.reassembler = reassembler
        self.config = config
        self.phase = _RECEIVING
        #: the FINISH round last NACKED (None: none yet)
        self.nack_round: int | None = nacked_round
        self.failure: Failure | None = None
        self._nack_at: float | None = None  # FINISHED / NACKED: when to NACK
        #: when the FINISH of a round not NACKED yet arrived
        self._finish_at: float | None = None
        self._complete_at: float | None = None  # SETTLING: when to complete
        #: the last NACK named exactly the chunks missing then (not merged ranges,
        #: spec §5.4): the next round resends only chunks this receiver lacked, so
        #: holding its tail means they arrived after that NACK
        self._nack_exact = True

    def _nacked(self, finish_round: int) -> bool:
        """Whether FINISH round ``finish_round`` (or a later one) was NACKED."""
        return self.nack_round is not None and finish_round <= self.nack_round

    def _move(self, to: ReceivePhase, event: str) -> None:
        if to not in _RECEIVE_MOVES[self.phase]:
            self._require_live(event)  # (an ended message: say so)
            raise ProtocolStateError(
                f"receiver recovery: {event} in phase {self.phase.name} cannot move it to {to.name}"
            )
        self.phase = to

    def _require_live(self, event: str) -> None:
        if self.phase not in _LIVE:
            raise ProtocolStateError(
                f"receiver recovery: {event} after the message ended ({self.phase.name})"
            )

    def tail_landed(self) -> bool:
        """Whether every data packet of the latest FINISH's round that was not
        lost has arrived: its records left in order on each path, and this
        receiver holds the last chunk of each (FINISH's ``tail``, docs/spec.md
        §5.3). Then nothing of the round is still in flight behind the FINISH,
        and the reorder grace has nothing left to wait for."""
        finish = self.reassembler.finish
        if (
            finish is None
            or not finish.tail
            or not self.config.ordered_paths
            or (finish.round > 0 and not self._nack_exact)
        ):
            return False
        received = self.reassembler.received
        return all(received[c] for c in finish.tail)

    @property
    def timer(self) -> float:
        """When :meth:`on_timer` (or, SETTLING, the completion check) is next due."""
        t = self.reassembler.last_activity + self.config.recv_idle_timeout
        due = self._complete_at if self.phase is _SETTLING else self._nack_at
        return t if due is None or due >= t else due

    def on_finish(self, finish_round: int, *, now: float) -> None:
        """FINISH arrived and the message is not complete: NACK after the grace
        (data travels by UDP, FINISH by the control channel and may overtake it)."""
        self._require_live("FINISH")
        if self._finish_at is None:
            self._finish_at = now
        if self.phase is _SETTLING:
            return  # complete by the bound: no NACK unless the bound tightens
        if self._nack_at is None or not self._nacked(finish_round):
            self._nack_at = now if self.tail_landed() else now + self.config.reorder_grace
            self._move(ReceivePhase.FINISHED, "FINISH")
        elif self.phase is ReceivePhase.NACKED:
            # the same round again: the repeat timer stands; the FINISH's time
            # is not that of a round waiting for its first NACK
            self._finish_at = None

    def on_complete(self, *, now: float) -> bool:
        """The reassembler is complete (by the bound, or whole): True if the
        message completes now (DONE), False if it waits out the reorder grace
        first (SETTLING), so that data still in flight behind the FINISH lands and
        nothing that was not lost is reported lost."""
        r = self.reassembler
        if r.received_elems < r.msg_elems and self.nack_round is None and not self.tail_landed():
            quiet = r.last_activity + self.config.reorder_grace
            if now < quiet:
                self._move(_SETTLING, "completion by the bound")
                self._complete_at = quiet
                self._nack_at = None  # the bound is met: no NACK while waiting
                return False
        # (the table's move to DONE, checked inline: every live phase may make it,
        # and this runs once per message received)
        if self.phase in _TERMINAL:
            self._move(_DONE, "completion")  # raises, naming the phase
        self.phase = _DONE
        self._nack_at = self._complete_at = None
        return True

    def on_data(self, *, now: float) -> None:
        """New data of the message landed: if it completed the latest FINISH's
        tail (:meth:`tail_landed`), a NACK or a completion waiting out the grace
        is due now."""
        if self.phase is ReceivePhase.FINISHED:
            if self._nack_at is not None and self._nack_at > now and self.tail_landed():
                self._nack_at = now
        elif (
            self.phase is _SETTLING
            and self._complete_at is not None
            and self._complete_at > now
            and self.tail_landed()
        ):
            self._complete_at = now

    def on_bound_tightened(self) -> None:
        """The application asked for a tighter bound. A message SETTLING that no
        longer meets it needs what is missing: a NACK at once if the FINISH came
        (else the FINISH arms one); any other phase is unchanged."""
        self._require_live("a tighter bound")
        if self.phase is not ReceivePhase.SETTLING or self.reassembler.is_complete():
            return
        if self.reassembler.finish is not None:
            self._move(ReceivePhase.FINISHED, "a tighter bound")
            self._nack_at = self._complete_at
        else:
            self._move(ReceivePhase.RECEIVING, "a tighter bound")
            self._nack_at = None
        self._complete_at = None

    def on_abort(self) -> None:
        """The sender aborted the message."""
        self._move(ReceivePhase.FAILED, "ABORT")
        self._nack_at = self._complete_at = None

    def on_cancel(self) -> None:
        """The receiver cancelled the message."""
        self._move(ReceivePhase.CANCELLED, "cancel")
        self._nack_at = self._complete_at = None

    def on_timer(
        self,
        *,
        now: float,
        step: int,
        msg: int,
        src: int,
        source_active: float = float("-inf"),
        data_pending: bool = False,
    ) -> list[Nack]:
        """The parts of a NACK to send now (none: nothing to send). Moves to FAILED,
        setting :attr:`failure`, on idle timeout. ``data_pending``: datagrams wait
        unread in the receiver's socket, any sender's (:func:`sender_quiet`)."""
        self._require_live("timer")
        r = self.reassembler
        if now >= r.last_activity + self.config.recv_idle_timeout:
            self._move(ReceivePhase.FAILED, "idle timeout")
            self._nack_at = self._complete_at = None
            self.failure = Failure(
                f"no packet for {self.config.recv_idle_timeout:.3g} s with "
                f"{r.received_elems} of {r.msg_elems} elements received",
                peer_timeout=True,
            )
            return []
        if (
            self.phase not in (ReceivePhase.FINISHED, ReceivePhase.NACKED)
            or self._nack_at is None
            or now < self._nack_at
            or r.finish is None
        ):
            return []
        quiet = now if self.tail_landed() else max(
            r.last_activity + self.config.reorder_grace,
            sender_quiet(self.config, source_active, self._finish_at, data_pending=data_pending),
        )
        if now < quiet:
            self._nack_at = quiet
            return []
        # repeated every nack_timeout until the sender answers with a new round
        if not self._nacked(r.finish.round):
            r.nack_rounds += 1  # (a repeat of the same round is not a new round)
        self._move(ReceivePhase.NACKED, "NACK timer")
        self.nack_round = r.finish.round
        self._finish_at = None
        self._nack_at = now + self.config.nack_timeout
        limit = MAX_NACK_RANGES * MAX_NACK_PARTS
        ranges = r.missing_ranges(limit)
        self._nack_exact = len(ranges) < limit
        needed = r.needed_elems()
        if needed and len(ranges) == limit:
            # merged ranges (too many gaps for one NACK) name chunks that arrived
            # too; the sender counts what it resends of them towards ``needed``, so
            # ask for that much more, or a round could resend only what is here
            needed = min(needed + _received_elems_in(r, ranges), ALL_ELEMS - 1)
        parts = [ranges[i : i + MAX_NACK_RANGES] for i in range(0, len(ranges), MAX_NACK_RANGES)]
        return [
            Nack(
                step,
                msg,
                src,
                round=r.finish.round,
                needed_elems=needed,
                ranges=part,
                more=i < len(parts) - 1,
            )
            for i, part in enumerate(parts)
        ]
