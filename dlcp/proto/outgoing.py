"""What the send side keeps per message and per destination, and the order in which
a destination's messages take turns.

:class:`OutgoingMessage` is one message being sent: its chunk table, its records
(round 0's, the source of every retransmission, and the current round's), its
recovery state and where its current round stands. :class:`Destination` is one
receiving rank: its pacer, its path scheduler and the messages going to it, with
the rule that picks whose batch goes next (:meth:`Destination.first_to_send`)
and where that batch ends (:meth:`Destination.batch_end`).

The rules acting on these records (sending, retransmitting, STOP, NACK, ABORT,
timers) are :class:`~dlcp.proto.outbox.Outbox`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .context import Key
from .control import Nack
from .pacing import Pacer, queue_signal
from .packetizer import ChunkTable, MessageId, RecordRun
from .paths import PathScheduler
from .recovery import SenderRecovery, SendPhase

__all__ = ["Destination", "OutgoingMessage"]


@dataclass(slots=True)
class OutgoingMessage:
    """One message being sent: its records, recovery state and current round."""

    ident: MessageId
    table: ChunkTable
    recovery: SenderRecovery
    first: RecordRun  # round 0, in send order; source of every retransmission
    row_of_seq: npt.NDArray[np.int64]
    run: RecordRun
    #: the message's place in the send order (the native engine's rule 1)
    order: int = 0
    cursor: int = 0
    path_of_seq: npt.NDArray[np.uint8] = field(default_factory=lambda: np.zeros(0, np.uint8))
    round_of_seq: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    nack_parts: list[Nack] = field(default_factory=list)
    #: the current round's FINISH, encoded, and its tail, made when the round was
    #: handed to the driver whole (RoundPost.finish), until the round is sent
    posted_finish: tuple[bytes, tuple[int, ...]] | None = None
    #: (time, bytes sent to the peer before it) of this round's first batch and of
    #: its latest batch, and the rate the peer was sent at between the two (at
    #: most the pacer's; the pacer's if the round went at once; 0: unknown)
    round_began: tuple[float, int] | None = None
    round_last: tuple[float, int] | None = None
    round_rate: float = 0.0

    @property
    def pending(self) -> bool:
        return self.recovery.phase is SendPhase.SENDING and self.cursor < len(self.run)

    def round_tail(self) -> tuple[int, ...]:
        """The last chunk of the current round on each path it went on (FINISH's
        ``tail``, docs/spec.md §5.3)."""
        seqs = self.run.seq
        if len(seqs) == 0:
            return ()
        paths = self.path_of_seq[seqs]
        if bool((paths == paths[0]).all()):  # (one path: the usual case)
            return (int(seqs[-1]),)
        _, last_from_end = np.unique(paths[::-1], return_index=True)
        return tuple(int(c) for c in seqs[len(seqs) - 1 - last_from_end])

    def round_went(self, allowed: float, *, ordered: bool) -> tuple[bytes | None, tuple[int, ...]]:
        """The current round's last record went: its rate (:attr:`round_rate`, at
        most ``allowed``, the pacer's rate, 0 if unknown), and its FINISH as it was
        encoded when the round was posted whole (None: it was not) with its tail
        (``ordered``: its records left in order on each path; else none)."""
        began, last = self.round_began, self.round_last
        self.round_began = self.round_last = None
        if began is not None and last is not None and last[0] > began[0]:
            # the bytes sent before the last batch over the time until it went (the
            # last batch's own bytes would need the time after it); the first batch
            # may have spent tokens saved up, so this may exceed the pacer's rate
            sent = (last[1] - began[1]) / (last[0] - began[0])
            self.round_rate = min(sent, allowed) if allowed else sent
        else:  # the whole round went at once: as fast as the pacer let it
            self.round_rate = allowed
        posted, self.posted_finish = self.posted_finish, None
        if posted is not None:
            return posted
        return None, self.round_tail() if ordered else ()

    def queue_lost(self, sent: npt.NDArray[np.int64], missing: npt.NDArray[np.int64]) -> bool:
        """Whether the chunks ``missing`` of the round that sent ``sent`` were lost to a
        switch's drop-eligible threshold (:func:`~.pacing.queue_signal`): only a first
        round's drop-eligible chunks travel drop-eligible, a resent one is protected."""
        if self.recovery.round > 0:
            return False
        drop = self.table.drop
        # (a first round sent every chunk: no gather of the whole message)
        eligible_sent = int(np.count_nonzero(drop if len(sent) == len(drop) else drop[sent]))
        eligible_lost = int(np.count_nonzero(drop[missing]))
        eligible = eligible_lost / eligible_sent if eligible_sent else 0.0
        protected_sent = len(sent) - eligible_sent
        protected = (len(missing) - eligible_lost) / protected_sent if protected_sent else 0.0
        return queue_signal(eligible, protected)


@dataclass(slots=True)
class Destination:
    """One receiving rank: its pacer, its paths and the messages going to it."""

    pacer: Pacer
    paths: PathScheduler
    outgoing: dict[Key, OutgoingMessage] = field(default_factory=dict)
    planned: list[int] = field(default_factory=list)  # paths of the next batches
    sent_bytes: int = 0  # data bytes sent to this peer in all

    def next_path(self) -> int:
        if self.paths.n_paths == 1:
            return 0
        if not self.planned:  # plan a few batches ahead: one scheduler call per 32 batches
            self.planned = self.paths.assign(32).tolist()[::-1]
        return self.planned.pop()

    def replan(self) -> None:
        self.planned.clear()

    def first_to_send(self) -> tuple[Key, OutgoingMessage] | None:
        """The message whose batch goes next to this destination: of each step,
        only the earliest sent message that has data to send; of those, the one
        with the highest priority class at its cursor (the earliest sent on a tie).

        A collective call is one step, and its later messages depend on its
        earlier ones (a ring's all-gather needs its reduce-scatter done): a
        later message of the call that overtook an earlier one, for a higher
        class of its chunks, stalled every rank waiting on the earlier one. A
        later message still goes while an earlier one waits for its STOP, and
        the earlier one's retransmissions then go first. Priority orders
        messages of different steps (an application's own messages, or the
        calls of two communicators sharing one endpoint: two such calls with
        the same number count as one step, and go in send order)."""
        best: tuple[int, Key, OutgoingMessage] | None = None
        steps: set[int] = set()  # steps whose earliest pending message was seen
        for key, o in self.outgoing.items():
            if o.pending and key[1] not in steps:
                steps.add(key[1])
                prio = int(o.run.prio[o.cursor])
                if best is None or prio > best[0]:
                    best = (prio, key, o)
        return None if best is None else best[1:]

    def batch_end(self, o: OutgoingMessage, batch_packets: int) -> int:
        """Where the next batch of ``o`` ends: ``batch_packets`` records, fewer if
        the pacer allows a shorter burst (never none)."""
        most = min(batch_packets, max(1, self.pacer.burst // o.run.stride))
        return o.run.batch_end(o.cursor, most)
