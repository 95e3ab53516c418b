"""The send side of a session: messages going out to peers.

:class:`Outbox` holds, per destination, the pacer, the path scheduler and every
message being sent: its chunk table, its records (built once, in send order),
and its recovery state (those records: :mod:`dlcp.proto.outgoing`). It hands out
data batches as the pacers allow (the earliest message of a step with data to
send first, of those the highest priority class:
:meth:`~dlcp.proto.outgoing.Destination.first_to_send`), sprayed over the paths; it
acts on the receiver's STOP, NACK and ABORT (retransmitting what a NACK names,
from the first round's records), and reports each message delivered or failed.

With ``whole_rounds`` the outbox neither paces nor cuts batches: it hands each
transmission round to the driver whole (:class:`~dlcp.proto.events.RoundPost`,
with a TOS byte, a path and a class per record), and the driver paces and
sends it by the same rules (the native engine, ``dlcp.io._engine``, whose
pacers the driver supplies through ``pacer_factory``) and reports the round
sent (:meth:`Outbox.round_sent`). A message's record memory then goes back to
the pool only once the driver has let go of it (:meth:`Outbox.release`).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from .buffer_pool import BufferPool
from .classify import Classifier, make_classifier
from .context import Key, SessionContext, SessionSide
from .control import Abort, AbortReason, ControlMessage, Nack, RateFeedback, Stop
from .events import (
    DataBatch,
    MessageDelivered,
    MessageFailed,
    RoundPost,
    RoundRelease,
    SendReport,
    Transmit,
)
from .first_round import plan_first_round
from .outgoing import Destination, OutgoingMessage
from .pacers import make_pacer
from .pacing import Pacer, queue_signal
from .packetizer import (
    MessageId,
    Segments,
    build_records,
    seal,
)
from .paths import PathScheduler, path_loss_from_nack
from .recovery import MAX_NACK_PARTS, SenderRecovery, SendPhase, chunks_in_ranges
from .wire import (
    MAX_NACK_RANGES,
    DType,
    bound_from_wire,
    bound_to_wire,
    check_message_key,
)

__all__ = ["LOSS_SIGNAL_CHUNKS", "Outbox"]

#: a round of fewer chunks says too little about the path to slow the pacer
#: (one lost chunk of 8 is 12 %); a longer one's loss is congestion above the
#: pacer's ``loss_tolerance``
LOSS_SIGNAL_CHUNKS = 32


class Outbox(SessionSide):
    """Send state of one rank: every message going out, to any peer."""

    def __init__(
        self,
        ctx: SessionContext,
        *,
        pacer_factory: Callable[[int], Pacer] | None = None,
        whole_rounds: bool = False,
        ordered_rounds: bool = True,
    ) -> None:
        super().__init__(ctx)
        self._pacer_factory = pacer_factory
        self.whole_rounds = whole_rounds
        #: every round's records leave in order on each path (one sending thread):
        #: FINISH then names each path's last chunk (its ``tail``)
        self.ordered_rounds = ordered_rounds
        #: whole_rounds: record buffers of ended messages the driver may still be
        #: sending from, and the releases that tell it to stop
        self._lent: dict[Key, npt.NDArray[np.uint8]] = {}
        self._releases: list[RoundRelease] = []
        self._sent_messages = 0
        tos = self.config.tos
        #: the TOS byte of each class, at prio * 2 + drop
        self._tos_table = np.array(
            [tos.tos(prio, drop) for prio in range(8) for drop in (False, True)], np.uint8
        )
        self._classifier: Classifier = make_classifier(
            self.config.classifier, **self.config.classifier_kwargs()
        )
        #: per destination rank: pacer, paths and the messages to it
        self.peers: dict[int, Destination] = {}
        self._next_peer = 0
        self._pool = BufferPool()
        #: the messages that ended lately, oldest first: their keys are not reused
        #: (a receiver remembers its last completed_memory messages, and would take
        #: a reused key for the old message)
        self._ended: OrderedDict[Key, None] = OrderedDict()
        #: False once a scan found no message with records left to hand out, until a
        #: send or a retransmission round adds some, or an ended message's
        #: release waits: while it is False and no control message waits, the
        #: session's datagrams_to_send returns at once (a driver asks every turn)
        self.may_send = False

    # ------------------------------------------------------------------ application

    def send(
        self,
        dst: int,
        data: npt.NDArray[np.generic],
        *,
        step: int,
        msg: int,
        now: float,
        segments: Segments | None = None,
        p: float | None = None,
        bfloat16: bool = False,
        borrow: bool = False,
    ) -> None:
        """Queue ``data`` (1-D) for ``dst``. The bytes are copied into packets here,
        so the caller may reuse ``data`` as soon as this returns, unless
        ``borrow``: then, where rounds go whole to a driver (the native engine),
        the records hold headers (and, authenticating, trailers) only and the
        driver reads the payload from ``data`` itself, as long as the message
        lasts (its :class:`RoundRelease`). A byte changed meanwhile goes out
        changed: the caller writes ``data`` only where the receiver has already
        completed the message (its datagrams then count as late there)."""
        check_message_key(step, msg)
        key = (dst, step, msg)
        peer = self.peer(dst)
        if key in peer.outgoing:
            raise UsageError(f"message (step {step}, msg {msg}) to rank {dst} is already in flight")
        if key in self._ended:
            raise UsageError(
                f"message (step {step}, msg {msg}) to rank {dst} was sent already: a key is "
                f"not reused until {self.config.completed_memory} later messages of this rank "
                "have ended (the receiver would answer for the old message; completed_memory)"
            )
        dtype = DType.of(data, bfloat16=bfloat16)
        bound = bound_to_wire(self.config.default_p if p is None else p)
        ident = MessageId(job=self.job, step=step, msg=msg, src=self.rank, bound=bound)
        table, (first, _, row_of_seq, class_chunks) = plan_first_round(
            np.ascontiguousarray(data),
            dtype,
            ident,
            chunk_bytes=self.config.chunk_bytes,
            classifier=self._classifier,
            segments=segments,
            magnitude_sample=self.config.magnitude_sample,
            loss_bound=bound_from_wire(bound),  # as the receiver will see it
            authenticate=self.keys is not None,
            lend=borrow and self.whole_rounds,
            take=self._pool.take,
        )
        n_chunks = table.n_chunks
        self.may_send = True
        self._sent_messages += 1
        peer.outgoing[key] = OutgoingMessage(
            ident=ident,
            table=table,
            recovery=SenderRecovery(table, self.config, now=now, class_chunks=class_chunks),
            first=first,
            row_of_seq=row_of_seq,
            run=first,
            order=self._sent_messages,
            path_of_seq=np.zeros(n_chunks, np.uint8),
            round_of_seq=np.zeros(n_chunks, np.int32),
        )

    def cancel(self, key: Key) -> bool:
        """Forget message ``key`` (the sender cancelled it); True if it was known."""
        peer = self.peers.get(key[0])
        o = peer.outgoing.pop(key, None) if peer is not None else None
        if o is None:
            return False
        self._remember_ended(key)
        self._give_back(key, o.first.records)
        return True

    def _give_back(self, key: Key, records: npt.NDArray[np.uint8]) -> None:
        """Message ``key`` ended: its record memory goes back to the pool, at once
        or (whole rounds) once the driver has let go of it (:meth:`release`)."""
        if not self.whole_rounds:
            self._pool.give(records)
            return
        self._lent[key] = records
        self._releases.append(RoundRelease(*key))
        self.may_send = True

    def release(self, key: Key) -> None:
        """The driver holds nothing more of message ``key`` (whole rounds)."""
        records = self._lent.pop(key, None)
        if records is not None:
            self._pool.give(records)

    def _remember_ended(self, key: Key) -> None:
        # (one memory for all peers, as big as a receiver's: bounded however many
        # peers there are; with two ranks it covers what the receiver remembers)
        self._ended[key] = None
        while len(self._ended) > self.config.completed_memory:
            self._ended.popitem(last=False)

    # ------------------------------------------------------------------ control

    def on_feedback(self, feedback: RateFeedback, *, now: float) -> None:
        peer = self.peers.get(feedback.src)
        if peer is not None:
            peer.pacer.on_feedback(float(feedback.bytes_per_s), now=now, shared=feedback.shared,
                                   window=feedback.interval_us * 1e-6)  # fmt: skip

    def on_control(self, key: Key, ctrl: ControlMessage, *, now: float) -> None:
        """STOP, NACK or ABORT from the receiver of message ``key``."""
        out = self.peers[key[0]].outgoing.get(key) if key[0] in self.peers else None
        if out is None:
            self.stats.stale_control += 1
        elif isinstance(ctrl, Stop):
            if ctrl.received_elems > out.table.msg_elems:  # (not this message's STOP)
                self.stats.reject("geometry")
                return
            if out.recovery.phase is SendPhase.AWAITING and out.recovery.round == 0:
                table = out.table
                missed = table.msg_elems - min(ctrl.received_elems, table.msg_elems)
                lost = missed / table.msg_elems
                queue = False
                if missed:  # (the usual round lost nothing: no classes to count)
                    # completing short of every element needs every protected chunk:
                    # what a first round's STOP says is missing was drop-eligible
                    eligible = int(table.chunk_len(np.flatnonzero(table.drop)).sum())
                    queue = queue_signal(min(1.0, missed / max(1, eligible)), 0.0)
                self._round_lost(key[0], out, lost, table.n_chunks, queue=queue, now=now)
            out.recovery.on_stop(ctrl.received_elems)
            self._finish_outgoing(key, out, now=now)
        elif isinstance(ctrl, Nack):
            self._on_nack(key, out, ctrl, now=now)
        elif isinstance(ctrl, Abort):
            if ctrl.reason is AbortReason.DATA_SILENT:
                why = (
                    f"rank {key[0]} gets this rank's control messages but none of its data "
                    "datagrams: the UDP data path to it drops everything (a firewall, or a "
                    "wrong data address or port?)"
                )
            elif ctrl.reason is AbortReason.UNCLAIMED_LIMIT:
                why = (
                    f"rank {key[0]} refused the message (unclaimed_limit): nobody there had "
                    "asked for it, and it would take its unclaimed messages past its "
                    "max_unexpected_bytes (post the receive first, or raise the limit)"
                )
            else:
                why = f"receiver aborted the message ({ctrl.reason.name.lower()})"
            out.recovery.on_abort(why)
            self._finish_outgoing(key, out, now=now)

    def _on_nack(self, key: Key, out: OutgoingMessage, nack: Nack, *, now: float) -> None:
        rec = out.recovery
        if nack.more or out.nack_parts:
            # a NACK in parts: gather the ranges of this round, act on the last part
            if out.nack_parts and out.nack_parts[0].round != nack.round:
                out.nack_parts.clear()
            out.nack_parts.append(nack)
            if nack.more and len(out.nack_parts) < MAX_NACK_PARTS:
                return  # (a peer that never ends its parts is answered after MAX_NACK_PARTS)
            ranges = tuple(r for part in out.nack_parts for r in part.ranges)
            out.nack_parts.clear()
            nack = dataclasses.replace(nack, ranges=ranges, more=False)
        if rec.phase is SendPhase.AWAITING and nack.round == rec.round:
            ranges = nack.ranges
            if len(ranges) >= MAX_NACK_RANGES * MAX_NACK_PARTS:
                # the receiver merged its gaps: the ranges name chunks that arrived
                # too; only each range's first and last chunk surely did not
                ranges = tuple((f, 1) for first, n in ranges for f in (first, first + n - 1))
            missing = chunks_in_ranges(ranges, out.table.n_chunks)
            this_round = np.flatnonzero(out.round_of_seq == rec.round)
            missing = missing[out.round_of_seq[missing] == rec.round]
            if self.config.n_paths == 1:  # (the per-path counts of the only path)
                sent, lost = np.array([len(this_round)]), np.array([len(missing)])
            else:
                sent, lost = path_loss_from_nack(
                    out.path_of_seq[this_round],
                    np.searchsorted(this_round, missing),
                    self.config.n_paths,
                )
            self.peers[key[0]].paths.on_loss_report(sent, lost)
            self.peers[key[0]].replan()
            self._round_lost(key[0], out, len(missing) / max(1, len(this_round)),
                             len(this_round), queue=out.queue_lost(this_round, missing),
                             now=now)  # fmt: skip
        seqs = rec.on_nack(nack, now=now)
        if rec.phase is SendPhase.FAILED:
            self._queue(key[0], Abort(key[1], key[2], self.rank, reason=AbortReason.GAVE_UP))
            self._finish_outgoing(key, out, now=now)
            return
        if seqs is None:
            self.stats.stale_control += 1
            return
        out.run = build_records(
            out.first.records,
            out.table,
            seqs,
            out.ident,
            authenticate=self.keys is not None,
            retransmit=True,
            source_rows=out.row_of_seq,
            source_stride=out.first.records.shape[1],
            payload=out.first.payload,
        )
        out.cursor = 0
        self.may_send = True
        rec.retransmitted_packets += len(seqs)
        if len(seqs) == 0:
            self._round_sent(key, out, now=now)

    def _round_lost(
        self, dst: int, out: OutgoingMessage, lost: float, chunks: int, *, queue: bool,
        now: float,
    ) -> None:
        """A round of ``chunks`` chunks to ``dst`` lost this fraction of them on the
        way (``queue``: a switch's queue lost them, :func:`~.pacing.queue_signal`):
        congestion, for the pacer, if the round was long enough to say."""
        if chunks >= LOSS_SIGNAL_CHUNKS and out.round_rate > 0:
            self.peers[dst].pacer.on_loss(lost, out.round_rate, now=now, queue=queue)

    def _finish_outgoing(self, key: Key, out: OutgoingMessage, *, now: float) -> None:
        rec = out.recovery
        del self.peers[key[0]].outgoing[key]
        self._remember_ended(key)
        self._give_back(key, out.first.records)
        if rec.phase is SendPhase.DONE:
            report = SendReport(
                msg_elems=out.table.msg_elems,
                chunks=out.table.n_chunks,
                sent_packets=rec.sent_packets,
                retransmitted_packets=rec.retransmitted_packets,
                rounds=rec.round,
                acknowledged_elems=rec.received_elems,
                duration=now - rec.started,
            )
            self._events.append(MessageDelivered(key[0], key[1], key[2], report))
        else:
            failure = rec.failure
            assert failure is not None
            self._events.append(
                MessageFailed(
                    key[0],
                    key[1],
                    key[2],
                    True,
                    f"sending to rank {key[0]}: {failure.message}",
                    failure.peer_timeout,
                )
            )

    # ------------------------------------------------------------------ output

    def batches(self, out: list[Transmit], *, now: float, max_batches: int) -> None:
        """Append up to ``max_batches`` data batches the pacers allow to ``out``,
        one destination after another (for each, see
        :meth:`~dlcp.proto.outgoing.Destination.first_to_send`);
        with whole rounds, every round that has records to send, whole, after
        the releases of messages that ended."""
        if self._releases:
            out.extend(self._releases)
            self._releases.clear()
        if not self.may_send:
            return
        if self.whole_rounds:
            self.may_send = False
            for dst, peer in self.peers.items():
                for key, o in peer.outgoing.items():
                    if o.pending:
                        out.append(self._post_round(dst, peer, key, o))
            return
        dsts = [
            d
            for d, p in self.peers.items()
            if p.outgoing and any(o.pending for o in p.outgoing.values())
        ]
        if not dsts:
            self.may_send = False
            return
        start = self._next_peer % len(dsts)
        self._next_peer += 1
        budget = max_batches
        active = dsts[start:] + dsts[:start]
        while active and budget > 0:
            still = []
            for dst in active:  # one batch per destination in turn
                if budget > 0 and self._next_batch(dst, out, now=now):
                    budget -= 1
                    still.append(dst)
            active = still

    def _next_batch(self, dst: int, out: list[Transmit], *, now: float) -> bool:
        peer = self.peers[dst]
        first = peer.first_to_send()
        if first is None:
            return False
        key, o = first
        run, start = o.run, o.cursor
        stop = peer.batch_end(o, self.config.batch_packets)
        nbytes = run.batch_nbytes(start, stop)
        if peer.pacer.next_send_time(nbytes, now=now) > now:
            return False
        if start == 0:
            o.round_began = (now, peer.sent_bytes)
        o.round_last = (now, peer.sent_bytes)
        seqs = run.seq[start:stop]
        o.round_of_seq[seqs] = o.recovery.round
        # a resent chunk is one the bound needs: it travels protected whatever its
        # class (its header keeps the class, which the receiver counts by)
        tos = self.config.tos.tos(
            int(run.prio[start]), bool(run.drop[start]) and o.recovery.round == 0
        )
        spray = self.config.spray_packets
        # one path per spray batch: stamped and recorded for the whole run at once
        paths = [peer.next_path() for _ in range(start, stop, spray)]
        if len(paths) == 1 or peer.paths.n_paths == 1:
            per_record: int | npt.NDArray[np.uint8] = paths[0]
        else:
            per_record = np.repeat(np.asarray(paths, np.uint8), spray)[: stop - start]
        if peer.paths.n_paths > 1:
            o.path_of_seq[seqs] = per_record
        if peer.paths.n_paths > 1 or self.keys is not None:  # one path: every stamp is 0
            keys = self.keys
            tag_key = keys.to(dst) if keys is not None else None
            nonces = keys.data_nonces if keys is not None else None
            seal(run, start, stop, path=per_record, key=tag_key, nonces=nonces)
        stride = run.stride
        if len(set(paths)) == 1:  # one path (the usual case with one): one batch for all
            out.append(DataBatch(dst, paths[0], tos, stride, stop - start, run.view(start, stop)))
        else:
            for path, (count, data) in zip(
                paths, run.spray_batches(start, stop, spray), strict=True
            ):
                out.append(DataBatch(dst, path, tos, stride, count, data))
        peer.pacer.on_sent(nbytes, now=now)
        peer.sent_bytes += nbytes
        self.stats.packets_out += stop - start
        self.stats.bytes_out += nbytes
        o.recovery.sent_packets += stop - start
        o.cursor = stop
        if stop == len(run):
            self._round_sent(key, o, now=now)
        return True

    def _post_round(self, dst: int, peer: Destination, key: Key, o: OutgoingMessage) -> RoundPost:
        """The whole round of ``o`` for the driver to pace and send (see the
        module docstring): what :meth:`_next_batch` does per batch, for all of
        its records at once."""
        run, rec = o.run, o.recovery
        n = len(run)
        o.round_of_seq[run.seq] = rec.round
        # a resent chunk travels protected whatever its class (as in _next_batch)
        drop = run.drop if rec.round == 0 else np.zeros(n, bool)
        tos = self._tos_table[run.prio.astype(np.intp) * 2 + drop]
        if peer.paths.n_paths == 1:
            path = np.zeros(n, np.uint8)
        else:  # one path per spray_packets records, as in _next_batch
            spray = self.config.spray_packets
            paths = np.asarray([peer.next_path() for _ in range(0, n, spray)], np.uint8)
            path = np.repeat(paths, spray)[:n]
            o.path_of_seq[run.seq] = path
        if peer.paths.n_paths > 1:  # (the driver seals each batch as it sends it)
            seal(run, 0, n, path=path, key=None)
        nbytes = run.batch_nbytes(0, n)
        self.stats.packets_out += n
        self.stats.bytes_out += nbytes
        rec.sent_packets += n
        o.cursor = n
        short = run.short
        tail = o.round_tail() if self.ordered_rounds else ()
        raw = self._encode(
            dst, rec.finish_message(step=key[1], msg=key[2], src=self.rank, tail=tail)
        )
        o.posted_finish = (raw, tail)
        return RoundPost(
            dst, key[1], key[2], rec.round, o.order, run.records, run.stride, n, short,
            int(run.lengths[short]) if short >= 0 else 0, tos, path, run.prio, run.breaks,
            self.keys.to(dst) if self.keys is not None else None,
            self.keys.data_nonces.cell if self.keys is not None else None,
            run.payload, run.seq, o.table.chunk_elems * o.table.dtype.itemsize, raw,
        )  # fmt: skip

    def round_sent(
        self,
        key: Key,
        *,
        began: tuple[float, int],
        last: tuple[float, int],
        now: float,
        finish_sent: bool = False,
    ) -> None:
        """The driver sent the last record of message ``key``'s round (whole
        rounds): ``began`` and ``last`` are (time, bytes sent to the peer before
        it) of its first and last batch; ``finish_sent``: it wrote the round's
        FINISH too, at ``now``. A message that ended meanwhile is ignored."""
        peer = self.peers.get(key[0])
        o = peer.outgoing.get(key) if peer is not None else None
        if o is None or o.recovery.phase is not SendPhase.SENDING or o.cursor < len(o.run):
            return
        o.round_began, o.round_last = began, last
        self._round_sent(key, o, now=now, finish_sent=finish_sent)

    def _round_sent(
        self, key: Key, o: OutgoingMessage, *, now: float, finish_sent: bool = False
    ) -> None:
        rate = self.peers[key[0]].pacer.rate
        raw, tail = o.round_went(rate if math.isfinite(rate) else 0.0, ordered=self.ordered_rounds)
        o.recovery.round_sent(now=now, tail=tail)
        if finish_sent:
            return
        if raw is not None:  # (encoded when the round was posted whole)
            self._queue_encoded(key[0], raw)
        else:
            self._queue(key[0], o.recovery.finish_message(step=key[1], msg=key[2], src=self.rank))

    # ------------------------------------------------------------------ timers

    def next_timer(self, *, now: float) -> float | None:
        """When the send side next needs :meth:`handle_timer` (None: never):
        recovery timers, and when each pacer lets the next batch go. A driver
        asks every turn of its loop: a running minimum, no lists."""
        best: float | None = None
        for peer in self.peers.values():
            if not peer.outgoing:
                continue
            some_pending = False
            for o in peer.outgoing.values():
                t = o.recovery.timer
                if t is not None and (best is None or t < best):
                    best = t
                some_pending = some_pending or o.pending
            if some_pending and self.whole_rounds:  # (the driver paces: post it now)
                return now
            first = peer.first_to_send() if some_pending else None
            if first is not None:  # the batch _next_batch would send, not another one
                o = first[1]
                stop = peer.batch_end(o, self.config.batch_packets)
                t = peer.pacer.next_send_time(o.run.batch_nbytes(o.cursor, stop), now=now)
                if best is None or t < best:
                    best = t
        return best

    def handle_timer(self, *, now: float) -> None:
        for dst, peer in list(self.peers.items()):
            for key, o in list(peer.outgoing.items()):
                if o.recovery.on_timer(now=now):
                    self._queue(
                        dst, o.recovery.finish_message(step=key[1], msg=key[2], src=self.rank)
                    )
                elif o.recovery.phase is SendPhase.FAILED:
                    # the receiver stopped answering: tell it (spec §8), so that it
                    # does not NACK a sender that has given up until its idle timeout
                    self._queue(
                        dst, Abort(key[1], key[2], self.rank, reason=AbortReason.PEER_TIMEOUT)
                    )
                    self._finish_outgoing(key, o, now=now)

    # ------------------------------------------------------------------ helpers

    def path_shares(self, dst: int) -> npt.NDArray[np.float64]:
        """The share of batches each path to ``dst`` gets now (loss-aware)."""
        return self.peer(dst).paths.effective_weights

    def peer(self, dst: int) -> Destination:
        peer = self.peers.get(dst)
        if peer is None:
            cfg = self.config
            pacer = (
                self._pacer_factory(dst)
                if self._pacer_factory is not None
                else make_pacer(cfg.pacer, **cfg.pacer_kwargs())
            )
            peer = Destination(
                pacer,
                PathScheduler(cfg.n_paths, cfg.path_weights),
            )
            self.peers[dst] = peer
        return peer
