"""The receive side of a session: messages coming in from peers.

:class:`Inbox` holds every message this rank is receiving or expecting: the
reassembler and recovery state of each, what the application said about messages
that have not arrived yet, and a memory of ended ones (so that late packets and
repeated FINISHes are recognised). The session dispatches FINISH and ABORT for
incoming messages here and runs its timers (NACKs, completion after the reorder
grace, orphan FINISHes, rate feedback). The paths that read data datagrams into
the reassemblers are its base class, :class:`~dlcp.proto.receive_paths.ReceivePaths`;
the rules they answer to, and the state they read, are here.

Admission: how data datagrams get into a reassembler
-----------------------------------------------------

:meth:`ReceivePaths.receive` takes a buffer of datagrams (one GRO read, or a run
of them) by one of three paths, run, first and general, or the native receive
loop takes it in C (:mod:`dlcp.proto.receive_paths` says which takes what). The
inbox registers with that loop every message it opens, and every message whose
receive was posted with its buffer before any of its data came
(:meth:`Inbox.expect`: in the geometry the sender most likely gives it, so that
the loop takes even its first datagrams), and removes it on every way it
leaves ``_incoming`` or the expected messages. What the loop took is accounted
for by the run path's rules (:meth:`ReceivePaths.receive_taken`).

Whatever the path, a datagram lands in one of these cases, by the message it names:

========================  =====================================================
case                      what happens
========================  =====================================================
rejected on the wire      counted under its reason (general path only); so is
                          authenticated data replayed (dlcp.proto.replay)
from an unknown peer      rejected ``unknown_peer``; nothing else is touched
first of an awaited       the message opens with the geometry of its header and
message                   the ``out=``/``p``/``fill`` the application gave
                          (:meth:`Inbox.expect`); with ``out=`` it is not
                          charged (rule 4), and if it fits the geometry it was
                          registered in, the native loop took it
first of an unexpected    the message opens with the session's default fill and
message                   is charged against ``max_unexpected_bytes``; past the
                          limit it is refused (rule 4); in a kept buffer if any
of a message under way    written at its offset
a duplicate               (a chunk already here) counted by the reassembler,
                          not written again; no completion check
of an ended message       (completed, failed, cancelled or refused) counted as
                          a late packet; nothing is opened again
that does not fit         rejected ``geometry``, alone: datagrams batched with
                          it are kept
========================  =====================================================

and every path accounts for it by the same rules, each applied by one method of
the pipeline that all three paths call:

1. **count** (:meth:`Inbox._count_in`): every datagram the inbox is handed
   counts once in ``datagrams_in`` and its bytes once in ``bytes_in``, whether
   accepted or not (``datagrams_fast`` also counts those the run path took);
2. **peer** (:meth:`Inbox._admit_peer`): a datagram from a rank outside
   ``peers`` is rejected ``unknown_peer`` before anything else looks at it; one
   from a peer notes when that peer's data last arrived (the silent-path verdict
   of orphan FINISHes reads it), even for a late or misfit datagram;
3. **ended** (:meth:`Inbox._message_for`): a datagram of an ended message
   counts in ``late_packets``, starts nothing and is not metered;
4. **open** (:meth:`Inbox._message_for`, :meth:`Inbox._open`): the first
   datagrams of a message not under way open it with the geometry their header
   gives (rejected ``geometry`` if it gives none; those the native loop took
   into a posted receive's guess, :meth:`Inbox._open_posted`, with the bound
   it reports). A message nobody gave
   ``out=`` for is charged its buffer plus :data:`OPEN_MESSAGE_BYTES` against
   ``max_unexpected_bytes``; over the limit its datagrams are rejected
   ``unexpected_overflow`` and, if nobody asked for it, it is refused (it fails
   here and its sender hears ABORT(UNCLAIMED_LIMIT)). An orphan FINISH that
   came ahead of the data is applied once the message is open;
5. **land** (:meth:`Inbox._landed`): every datagram written (fresh or
   duplicate) counts its wire bytes, header and payload, in the rate meter of
   its source; one that added data runs the completion check
   (:meth:`Inbox._check_complete`).

A message's charge ends when it is handed over (expected), when it is released
by the driver after being parked (unexpected, :meth:`Inbox.release`), or when it
fails or is cancelled. ``tests/proto/test_admission.py`` checks each rule on
every path that can meet it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set
from typing import Final

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from .buffer_pool import BufferPool
from .config import FillPolicy
from .context import Key, SessionContext
from .control import Abort, AbortReason, Finish, RateFeedback, Stop
from .ended import ABORT_OF, Ended, Outcome
from .events import MessageFailed, MessageReceived
from .expectation import Expectation
from .incoming import OPEN_MESSAGE_BYTES, IncomingMessage
from .orphans import SILENT_WHY, OrphanFinishes
from .progress import receive_progress
from .rate_meter import RateMeter
from .reassembler import GeometryError, Reassembler, check_accumulate
from .receive_paths import Geometry, ReceivePaths
from .recovery import ReceivePhase, ReceiverRecovery
from .wire import DType, allowed_loss, bound_from_wire, bound_to_wire, check_message_key

__all__ = ["OPEN_MESSAGE_BYTES", "Inbox"]


#: (every completed message names it: a module constant costs less than an Enum
#: class attribute)
_COMPLETED: Final = Outcome.COMPLETED


#: the most kept of early messages' buffers (two a size; max_unexpected_bytes if less)
SPARE_BYTES: Final = 128 << 20


class Inbox(ReceivePaths[IncomingMessage]):
    """Receive state of one rank: every message coming in, from any peer."""

    def __init__(self, ctx: SessionContext, peers: Set[int] | None) -> None:
        super().__init__(ctx)
        #: the ranks data may come from (None: any)
        self.peers = peers
        self._incoming: dict[Key, IncomingMessage] = {}
        self._expected: dict[Key, Expectation] = {}
        #: the messages that ended here, oldest first (``completed_memory`` of them)
        self._ended: OrderedDict[Key, Ended] = OrderedDict()
        self._orphan_finish = OrphanFinishes(self.config, self.rank)
        self._unexpected_bytes = 0
        #: early messages' own buffers, kept once their receive has the values, for
        #: the next early message of that size (a new bucket-sized buffer costs page
        #: faults that zero it); as ``uint8`` rows of the elements, BufferPool's keys
        self._spares = BufferPool(max_bytes=min(self.config.max_unexpected_bytes, SPARE_BYTES))
        #: completed messages nobody asked for yet -> the bytes they still hold
        #: (charged until the driver hands them over: :meth:`release`)
        self._parked: dict[Key, int] = {}
        cfg = self.config
        self._meter = RateMeter(cfg.rate_interval, lone_interval=cfg.lone_rate_interval)
        #: messages under way per source (the meter shares a window only between
        #: sources that had some under way at once)
        self._under_way: dict[int, int] = {}
        #: the driver waited (Session.note_idle, every turn: the meter's own method)
        self.meter_idle = self._meter.on_idle
        self._last_data: dict[int, float] = {}  # source rank -> time its data last arrived

    # ------------------------------------------------------------------ application

    def expect(
        self,
        key: Key,
        *,
        out: npt.NDArray[np.generic] | None,
        p: float | None,
        fill: FillPolicy | None,
        accumulate: bool = False,
    ) -> None:
        """Where message ``key`` goes and how strict to be (``Session.expect_message``)."""
        src, step, msg = key
        check_message_key(step, msg)
        what = f"message (step {step}, msg {msg}) from rank {src}"
        if out is not None and not out.flags.writeable:
            raise UsageError(f"out for {what} is read-only")
        ended = self._ended.get(key)
        if ended is not None:
            raise UsageError(f"{what} already {ended.outcome.value}")
        if p is not None:
            bound_to_wire(p)  # validates the range
        fill = fill or self.config.default_fill
        if fill is FillPolicy.PREVIOUS and out is None:
            raise UsageError("fill='previous' needs out= holding the previous values")
        state = self._incoming.get(key)
        if accumulate:
            r_dtype = DType.FLOAT32 if state is None else state.reassembler.dtype
            check_accumulate(r_dtype, fill, out)
        if state is None:
            self._drop_expected(key)  # (posted again)
            want = self._expected[key] = Expectation(out, p, fill, accumulate)
            # registered with the native loop before any of it came, in the geometry the sender
            # most likely gives it (Expectation.post): the loop takes its first datagrams too,
            # those that do not fit open it as they say (_open); src is a peer (expect_message)
            if self._native is not None and (r := want.post(self.config.chunk_bytes)) is not None:
                self._register_native(key, r)
            return
        r = state.reassembler  # (every check first: a refused receive changes nothing)
        if fill is FillPolicy.RESCALE and r.dtype is DType.UINT8:
            raise UsageError("fill='rescale' needs a floating-point message, not uint8")
        if out is not None:
            r.check_output(out)
        state.expected = True
        r.fill = fill
        if p is not None and p < r.bound:
            r.bound = p
            r.allowed_loss = allowed_loss(p, r.msg_elems)
            # (one waiting out the grace for the looser bound now needs what is missing)
            state.recovery.on_bound_tightened()
        own = r.out if out is not None and r.owns_buffer else None
        if out is not None:
            r.replace_output(out, accumulate=accumulate)
            self._unexpected_bytes -= state.unexpected_bytes
            state.unexpected_bytes = 0
        if self._native is not None:  # (a new buffer, or a bound that needs more)
            self._register_native(key, r)
        if own is not None:  # (the native table was given the caller's buffer above)
            self.keep_spare(own)

    def _drop_expected(self, key: Key) -> Expectation | None:
        """Forget that ``key`` is expected: the native loop writes nothing more to its buffer."""
        want = self._expected.pop(key, None)
        if want is not None and want.posted is not None and self._native is not None:
            want.posted = None
            self._native.unregister(key)
        return want

    def _open_posted(self, key: Key, bound: int, *, now: float) -> IncomingMessage:
        return self._start(key, self._expected.pop(key).opened(bound, now=now), 0, now=now)

    def progress(self, key: Key, *, now: float) -> str:
        """What this rank had of message ``key`` (:func:`.progress.receive_progress`)."""
        state, want = self._incoming.get(key), self._expected.get(key)
        first, nacked = self._orphan_finish.heard(key)
        return receive_progress(
            None if state is None else state.reassembler, finish_first=first,
            nacked_round=nacked, last_data=self._last_data.get(key[0]), now=now,
            misfit=want.misfit if want else None, misfits=want.misfits if want else 0,
        )  # fmt: skip

    def cancel(self, key: Key, *, now: float | None = None) -> bool:
        """Forget message ``key`` (cancelled here, at ``now``); True if it was known."""
        state = self._leave(key, now=now)
        expected = self._drop_expected(key)
        self._orphan_finish.pop(key)
        if state is None and expected is None:
            return False
        if state is not None:
            state.recovery.on_cancel()
            self._unexpected_bytes -= state.unexpected_bytes
        self._remember(key, Ended(Outcome.CANCELLED))
        return True

    # ------------------------------------------------------------------ data

    # the admission pipeline: a method per rule of the module docstring (for the receive paths)

    def _count_in(self, n: int, nbytes: int, *, fast: bool = False) -> None:
        """Rule 1: ``n`` datagrams of ``nbytes`` bytes in all were handed over."""
        self.stats.datagrams_in += n
        self.stats.bytes_in += nbytes
        if fast:
            self.stats.datagrams_fast += n

    def _admit_peer(self, src: int, n: int, *, now: float) -> bool:
        """Rule 2: False (``n`` datagrams rejected) if ``src`` is not a peer."""
        if self.peers is not None and src not in self.peers:
            self.stats.reject("unknown_peer", n)
            return False
        self._last_data[src] = now
        return True

    def _message_for(
        self,
        key: Key,
        n: int,
        *,
        now: float,
        geometry: Geometry | None = None,
        headers: npt.NDArray[np.void] | None = None,
    ) -> IncomingMessage | None:
        """Rules 3 and 4: the message ``n`` admitted datagrams of ``key`` go to,
        opened if it is not under way with the ``geometry`` (dtype, elements,
        chunk elements, wire bound) their header gave, or, for a group of parsed
        ``headers``, the geometry found in them (looked for only then); None if
        they go nowhere (late, no geometry, refused), having been accounted for."""
        state = self._incoming.get(key)
        if state is not None:
            return state
        if key in self._ended:  # (never both: a message ends by leaving _incoming)
            self.stats.late_packets += n
            return None
        if headers is not None:
            geometry = Reassembler.geometry_of(headers)
        if geometry is None:
            self.stats.reject("geometry", n)
            return None
        return self._open(key, *geometry, n, now=now)

    def _landed(self, key: Key, state: IncomingMessage, wire_bytes: int, fresh: int, *,
                now: float, native: bool = False) -> None:  # fmt: skip
        """Rule 5: datagrams of ``wire_bytes`` bytes were written to ``state``,
        ``fresh`` of them new data (``native``: by the native receive loop, which
        counted them in its copies of the counts itself)."""
        self._meter.count(key[0], wire_bytes, now=now)
        if fresh:
            self._check_complete(key, state, now=now)
            if key in self._incoming:
                state.recovery.on_data(now=now)  # (the FINISH's tail may be in now)
                if self._native is not None and not native:
                    self._native.sync(key, state.reassembler)

    def _open(
        self,
        key: Key,
        dtype: DType,
        msg_elems: int,
        chunk_elems: int,
        bound: int,
        n_packets: int,
        *,
        now: float,
    ) -> IncomingMessage | None:
        """Start receiving message ``key`` with the geometry its first ``n_packets``
        packets gave (and their wire ``bound``); None if it cannot be received
        (then those packets are counted as rejected)."""
        want = self._expected.pop(key, None)
        sender_p = bound_from_wire(bound)
        p = sender_p if want is None or want.p is None else min(sender_p, want.p)
        charged = 0
        if want is None or want.out is None:
            # its buffer, and what the state of an open message costs besides (a
            # stream of tiny messages must not pass for free)
            charged = msg_elems * dtype.itemsize + OPEN_MESSAGE_BYTES
            if self._unexpected_bytes + charged > self.config.max_unexpected_bytes:
                self.stats.reject("unexpected_overflow", n_packets)
                if want is not None:
                    self._expected[key] = want
                else:  # nobody asked for it: refused, and its sender told so
                    self._refuse(key, charged)
                return None
        out = None if want is None else want.out
        spare = None
        if out is None and (rows := self._spares.take((msg_elems, dtype.itemsize))) is not None:
            spare = rows.reshape(-1).view(dtype.numpy())
        try:
            r = Reassembler(
                dtype=dtype,
                msg_elems=msg_elems,
                chunk_elems=chunk_elems,
                out=out,
                bound=p,
                fill=self.config.default_fill if want is None else want.fill,
                now=now,
                spare=spare,
                accumulate=want is not None and want.accumulate,
            )
        except (GeometryError, ValueError) as exc:
            if spare is not None:
                self.keep_spare(spare)
            self.stats.reject("geometry", n_packets)
            if want is not None:
                # a stray or forged datagram must not decide the message: wait for
                # packets that fit; the sender's FINISH settles it (on_finish)
                want.note_misfit(str(exc), n_packets)
                self._expected[key] = want
            return None
        if want is not None and want.posted is not None and self._native is not None:
            self._native.unregister(key)  # (its guess did not fit: r is registered below)
        self._unexpected_bytes += charged
        return self._start(key, r, charged, expected=want is not None, now=now, register=True)

    def _start(self, key: Key, r: Reassembler, charged: int, *, now: float, expected: bool = True,
               register: bool = False) -> IncomingMessage:  # fmt: skip
        """Message ``key`` is under way in ``r`` (charged ``charged`` bytes;
        ``register``: with the native loop, if any, which had not got ``r``)."""
        # (a message NACKed whole as an orphan FINISH waited its grace then)
        orphan, nacked_round = self._orphan_finish.claim(key)
        recovery = ReceiverRecovery(r, self.config, nacked_round=nacked_round)
        state = IncomingMessage(r, recovery, charged, expected)
        self._incoming[key] = state
        src = key[0]
        if src in self._under_way:
            self._under_way[src] += 1
        else:  # (the meter hears when the number of sources changes)
            self._under_way[src] = 1
            self._meter.senders_under_way(len(self._under_way), now=now)
        if register and self._native is not None:
            self._register_native(key, r)
        if orphan is not None:
            self._apply_finish(key, state, orphan, now=now)
        return state

    def _check_complete(self, key: Key, state: IncomingMessage, *, now: float) -> None:
        r = state.reassembler
        if not r.is_complete() or not state.recovery.on_complete(now=now):
            return  # (complete by the bound: SETTLING, data still in flight may land)
        report = r.complete(now=now)
        self._leave(key, now=now)
        if state.expected or not state.unexpected_bytes:
            self._unexpected_bytes -= state.unexpected_bytes
        else:  # parked until the application claims it: still charged
            self._parked[key] = state.unexpected_bytes
        self._remember(key, Ended(_COMPLETED, r.received_elems, now))
        self._queue(key[0], Stop(key[1], key[2], self.rank, received_elems=r.received_elems))
        self._events.append(MessageReceived(key[0], key[1], key[2], r.out, report))

    def _leave(self, key: Key, *, now: float | None = None) -> IncomingMessage | None:
        """Message ``key`` is no longer under way (whatever ended it, at ``now`` if
        known): its state, if it was. The native receive loop writes nothing more
        into it."""
        state = self._incoming.pop(key, None)
        if state is not None:
            src = key[0]
            if self._under_way[src] > 1:
                self._under_way[src] -= 1
            else:
                del self._under_way[src]
                self._meter.senders_under_way(len(self._under_way), now=now)
            if self._native is not None:
                self._native.unregister(key)
        return state

    def _remember(self, key: Key, ended: Ended) -> None:
        self._ended[key] = ended
        if self._native is not None:  # (its waits may drop a FINISH that crossed the STOP)
            self._native.ended(key, ended.at if ended.outcome is _COMPLETED else None)
        if self._replay is not None:  # (the end it forgets below raises a floor)
            self._replay.ended(key[0])
        while len(self._ended) > self.config.completed_memory:
            self._ended.popitem(last=False)

    def _apply_finish(
        self, key: Key, state: IncomingMessage, finish: Finish, *, now: float
    ) -> None:
        if not state.reassembler.on_finish(finish):
            self.stats.reject("geometry")
            return
        if self._native is not None:  # (the bound's completion rule applies now)
            self._native.sync(key, state.reassembler)
        self._check_complete(key, state, now=now)
        if key in self._incoming:
            state.recovery.on_finish(finish.round, now=now)

    def keep_spare(self, data: npt.NDArray[np.generic]) -> None:
        """Keep ``data``, an early message's own buffer nothing holds any more."""
        if data.ndim == 1 and data.flags.c_contiguous and data.nbytes:
            self._spares.give(data.view(np.uint8).reshape(len(data), data.itemsize))

    def release(self, key: Key) -> None:
        """The driver handed completed message ``key`` over (or dropped it): the
        bytes it held no longer count against ``max_unexpected_bytes``."""
        self._unexpected_bytes -= self._parked.pop(key, 0)

    def _refuse(self, key: Key, nbytes: int) -> None:
        """Refuse unexpected message ``key`` (``nbytes`` would pass the limit): it
        fails here (a receive posted later hears why) and at its sender (ABORT)."""
        limit = self.config.max_unexpected_bytes
        self.fail(key, None, (
            f"refused: its {nbytes} bytes would take the messages nobody has asked for "
            f"yet ({self._unexpected_bytes} bytes) past max_unexpected_bytes={limit}"
        ))  # fmt: skip
        self._ended[key] = Ended(Outcome.REFUSED)  # a repeated FINISH hears the same
        refusal = Abort(key[1], key[2], self.rank, AbortReason.UNCLAIMED_LIMIT, by_receiver=True)
        self._queue(key[0], refusal)

    def fail(
        self, key: Key, state: IncomingMessage | None, why: str, peer_timeout: bool = False
    ) -> None:
        if state is not None:
            self._unexpected_bytes -= state.unexpected_bytes
        self._remember(key, Ended(Outcome.FAILED))
        self._events.append(
            MessageFailed(
                key[0], key[1], key[2], False, f"receiving from rank {key[0]}: {why}", peer_timeout
            )
        )

    # ------------------------------------------------------------------ control

    def on_finish(self, key: Key, finish: Finish, *, now: float) -> None:
        if finish.total_chunks == 0:  # no message has zero chunks (and NACK(0, 0) is invalid)
            self.stats.reject("geometry")
            return
        want = self._expected.get(key)
        why = None if want is None else want.disagreement(finish, self.config.chunk_bytes)
        if why is not None:
            # the sender is done with a round, none of its packets fitted out=, and
            # its FINISH does not either: the two sides disagree on the message
            # (answered below with an ABORT). (A FINISH that fits may have overtaken
            # its data: the message waits for that, as an orphan FINISH does.)
            self._drop_expected(key)
            self._orphan_finish.pop(key)
            self.fail(key, None, why)
        ended = self._ended.get(key)
        if ended is not None:
            if ended.outcome is not Outcome.COMPLETED:
                reason = ABORT_OF[ended.outcome]
                self._queue(
                    key[0], Abort(key[1], key[2], self.rank, reason=reason, by_receiver=True)
                )
            elif now - ended.at >= self.config.finish_timeout / 2:
                # a FINISH repeated on the sender's timer: our STOP did not arrive
                stop = Stop(key[1], key[2], self.rank, received_elems=ended.received_elems)
                self._queue(key[0], stop)
            # else it crossed our STOP (the data alone completed the message): the
            # STOP is on its way, a second one would be stale (docs/spec.md §7)
            return
        state = self._incoming.get(key)
        if state is None:
            # no data seen yet: FINISH may have overtaken it, or all of it was lost
            self._orphan_finish.add(key, finish, now=now)
            return
        self._apply_finish(key, state, finish, now=now)

    def on_abort(self, key: Key, abort: Abort, *, now: float | None = None) -> bool:
        """The sender aborted message ``key``: fail it, whether it is under way,
        only expected (the application waiting for it must hear of it too), or
        not yet known here (a receive posted later fails at once). False for a
        message that already ended here (a stale ABORT)."""
        why = f"sender aborted the message ({abort.reason.name.lower()})"
        if abort.reason is AbortReason.GAVE_UP and self._orphan_finish.unheard(key):
            why += "; none of its data had arrived here (is the UDP data path blocked?)"
        state = self._leave(key, now=now)
        if state is not None:
            state.recovery.on_abort()
            self.fail(key, state, why)
            return True
        self._orphan_finish.pop(key)  # (only its FINISH came, ahead of its data?)
        want = self._drop_expected(key)
        if want is not None:  # aborted before any of its data arrived (or fitted out=)
            self.fail(key, None, why if want.misfit is None else f"{want.misfit}; {why}")
            return True
        if key in self._ended:  # a message that ended here: a stale or repeated ABORT
            return False
        # aborted before anything of it came and before it was asked for (the
        # sender's call failed while this rank had not reached it): a receive
        # posted later hears why at once, instead of waiting out its timeout for
        # data that will never come; and data still on the way must not start it
        self.fail(key, None, why)
        return True

    def expects(self, key: Key) -> bool:
        """Whether message ``key`` is expected and none of its data arrived yet."""
        return key in self._expected

    # ------------------------------------------------------------------ timers

    def next_timer(self) -> float | None:
        """When the receive side next needs :meth:`handle_timer` (None: never).
        A driver asks every turn of its loop: a running minimum, no lists."""
        best = self._meter.deadline
        if self._incoming:  # (none under way: no call at all)
            for state in self._incoming.values():
                t = state.recovery.timer
                if best is None or t < best:
                    best = t
        deadline = self._orphan_finish.next_deadline()
        if deadline is not None and (best is None or deadline < best):
            best = deadline
        return best

    def handle_timer(self, *, now: float, data_pending: bool = False) -> None:
        """Timers due by ``now``. ``data_pending``: the driver runs them while
        datagrams still wait unread in its socket (it has not caught up): any of
        them may be the data a NACK or a verdict would call missing, so every
        sender counts as active now, a NACK waits longer
        (:func:`~dlcp.proto.recovery.sender_quiet`), and no data path is judged
        silent."""
        for key, state in list(self._incoming.items()):
            if state.reassembler.is_complete():
                self._check_complete(key, state, now=now)
                continue
            nacks = state.recovery.on_timer(
                now=now,
                step=key[1],
                msg=key[2],
                src=self.rank,
                source_active=now if data_pending else self._last_data.get(key[0], float("-inf")),
                data_pending=data_pending,
            )
            if nacks:
                self._meter.withhold_claim(key[0], now=now)  # (its data goes missing)
                for part in nacks:
                    self._queue(key[0], part)
            elif state.recovery.phase is ReceivePhase.FAILED:
                self._leave(key, now=now)
                timeout = AbortReason.PEER_TIMEOUT
                self._queue(key[0], Abort(key[1], key[2], self.rank, timeout, by_receiver=True))
                f = state.recovery.failure
                assert f is not None  # (set with the FAILED phase)
                self.fail(key, state, f.message, f.peer_timeout)
        silent = [] if data_pending else self._orphan_finish.silent(
            now=now, last_data=self._last_data
        )
        for key, abort in silent:
            self._queue(key[0], abort)
            self._drop_expected(key)
            self.fail(key, None, SILENT_WHY.format(timeout=self.config.silent_path_timeout))
        for src, nack in self._orphan_finish.due(
            now=now, last_data=self._last_data, data_pending=data_pending
        ):
            self._meter.withhold_claim(src, now=now)
            self._queue(src, nack)
        if self._meter.due(now=now):  # (the window it measured over: u32 microseconds)
            rates, shared = self._meter.sample(now=now), self._meter.shared
            interval_us = min(round(self._meter.measured * 1e6), 0xFFFFFFFF)
            for src, rate in rates.items():
                self._queue(src, RateFeedback(0, 0, self.rank, bytes_per_s=int(rate),
                                              interval_us=interval_us, shared=shared))  # fmt: skip
