"""The receive paths: how a buffer of data datagrams reaches the reassemblers.

:class:`ReceivePaths` is the part of the receive side that reads data datagrams.
:meth:`ReceivePaths.receive` hands each buffer (one GRO read, or a run of
datagrams) to one of three paths, by what the buffer starts with:

* the run path (:meth:`ReceivePaths._receive_run`): a message under way, checked
  and written in one pass by the C kernel ``scatter_run``; authenticated, only
  the leading datagrams whose tags verify (one :func:`~dlcp.proto.auth.verified_prefix`
  call);
* the first path (:meth:`ReceivePaths._receive_first`): the first datagram of a
  new message, unauthenticated and valid as it stands, read with plain integers
  (a parsed batch costs more than a small message's transfer);
* the general path (:meth:`ReceivePaths._receive_parsed`): everything else (the
  first datagram of an authenticated message, bad or foreign ones, batches that
  mix messages), parsed by :func:`~dlcp.proto.batch.parse_batch`, which gives each
  its exact reason, and grouped by message.

A fast path that cannot take a datagram as it is declines it, having done
nothing, and the general path takes it.

With a :class:`NativeRuns` attached (:meth:`ReceivePaths.take_runs_natively`:
the endpoint's receive loop, ``dlcp.io.native_receive``), the run path of the
messages under way runs in the receive loop itself, in C: the inbox registers
each message it opens (authenticating, with the key its source's tags verify
with), and each whose receive was posted with its buffer before its data came,
and removes it when it ends, and the loop applies the run path's checks,
tag verification and kernel to every run it reads whose head is one of them. What it
took comes back per message and call (:meth:`ReceivePaths.receive_taken`), what
it did not take comes here as before, in arrival order (the datagrams after a
taken prefix straight to the general path: :meth:`ReceivePaths.receive_rest`).
The accounting is the run path's (:meth:`ReceivePaths._took`).

The paths decide nothing about admission. What a datagram is counted as,
whether its message opens, is late or is refused: the rule header of
:mod:`dlcp.proto.inbox` says it, and every path defers to the admission
pipeline, one method per rule, that :class:`~dlcp.proto.inbox.Inbox` (the
subclass) implements with the state the paths read: the messages under way, the
ended ones, the peers.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Container, Set
from typing import Generic, Protocol, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from .auth import AUTH_TRAILER_LEN, verified_prefix
from .batch import PER_PACKET_FLAGS, open_head, parse_batch, run_head
from .context import Key, SessionContext, SessionSide
from .reassembler import GeometryError, Reassembler
from .replay import ReplayFloor, group_nonces
from .wire import DATA_HEADER_LEN, DType, Flags, Reason

__all__ = ["Geometry", "MessageUnderWay", "NativeRuns", "ReceivePaths", "Taken"]

_AUTH_FLAG = int(Flags.AUTH)

#: a message's geometry as its first datagrams give it: dtype, elements, chunk
#: elements, wire bound
Geometry: TypeAlias = tuple[DType, int, int, int]


class MessageUnderWay(Protocol):
    """What the paths need of a message under way: the reassembler they write to."""

    @property
    def reassembler(self) -> Reassembler: ...


#: the inbox's record of a message under way
MessageT = TypeVar("MessageT", bound=MessageUnderWay)

#: what a native receive loop took into one message since it last said:
#: (src, step, msg, datagrams, bytes, fresh, fresh elements, fresh drop-eligible,
#: fresh retransmitted, payload bytes, the wire bound of the first run it took: -1 if none,
#: one above the highest nonce it took since it was registered: 0 if none)
Taken: TypeAlias = tuple[int, int, int, int, int, int, int, int, int, int, int, int]


class NativeRuns(Protocol):
    """A receive loop that runs the run path itself for registered messages (the
    endpoint's, in C: ``dlcp.io.native_receive``). Between two of these calls it
    writes only into registered messages' buffers, and none after ``unregister``
    returned."""

    @property
    def verifies_tags(self) -> bool:
        """Whether it verifies tags (spec §3) before it writes a datagram, so
        that an authenticating session may use it."""

    def register(self, key: Key, reassembler: Reassembler, tag_key: bytes | None = None,
                 nonce_floor: int = 0) -> None:  # fmt: skip
        """Take the runs of message ``key`` from now on (again, with its current
        buffers, if it was registered); with ``tag_key``, only the leading
        datagrams of a run whose tags verify under it (the run path's
        :func:`~dlcp.proto.auth.verified_prefix`) and whose nonces are at least
        ``nonce_floor`` (:class:`~dlcp.proto.replay.ReplayFloor`), written without
        their trailers. The key given last for a source rank is the one its
        datagrams verify with."""

    def sync(self, key: Key, reassembler: Reassembler) -> None:
        """Its counts changed here (data on another path, a FINISH, a bound):
        the loop's copies of :meth:`Reassembler.completion_counts` follow."""

    def unregister(self, key: Key) -> None:
        """It ended: nothing more is written to its buffers."""

    def ended(self, key: Key, completed_at: float | None) -> None:
        """Message ``key`` ended here (``completed_at``: when it completed; None:
        another way), registered or not, as the inbox remembers it: a FINISH that
        comes after its completion (it crossed the STOP) may be dropped unread."""


class ReceivePaths(SessionSide, Generic[MessageT]):
    """The three receive paths, over an admission pipeline a subclass provides."""

    #: the ranks data may come from (None: any)
    peers: Set[int] | None
    #: the messages under way
    _incoming: dict[Key, MessageT]
    #: the messages that ended here
    _ended: Container[Key]

    #: the native receive loop that takes the runs of the messages under way, if any
    _native: NativeRuns | None = None

    def __init__(self, ctx: SessionContext) -> None:
        super().__init__(ctx)
        #: authenticating: the nonces below which data is refused as replayed
        self._replay = ReplayFloor(self.config.completed_memory) if self.keys else None

    def take_runs_natively(self, native: NativeRuns) -> None:
        """From now on ``native`` runs the run path of the messages opened here,
        as the module docstring says (authenticating, only if it verifies tags:
        :attr:`NativeRuns.verifies_tags`). Set before any message opens."""
        authenticating = self.keys is not None or self.config.authenticate
        if not authenticating or (self.keys is not None and native.verifies_tags):
            self._native = native

    def _register_native(self, key: Key, reassembler: Reassembler) -> None:
        """Register message ``key`` with the native loop, with the key its source's
        tags verify with when authenticating (:meth:`_receive_run` checks the same
        key), so that the loop never verifies under a key this side no longer gives."""
        assert self._native is not None
        tag_key = self.keys.of(key[0]) if self.keys is not None else None
        if self.keys is not None and tag_key is None:
            return  # (a rank outside the peers: no key, nothing for the loop to take)
        floor = self._replay.floor(key[0]) if self._replay is not None else 0
        self._native.register(key, reassembler, tag_key, floor)

    def receive_taken(self, taken: list[Taken], *, now: float) -> None:
        """What the native receive loop took into the registered messages since it
        last said, per message: accounted for as the run path accounts for what it
        takes (each message is still under way: one that ends is unregistered)."""
        for (src, step, msg, n, nbytes, fresh, elems, droppable, retx, payload_bytes, bound,
             nonce_next) in taken:  # fmt: skip
            key = (src, step, msg)
            if nonce_next and self._replay is not None:
                self._replay.took(src, nonce_next - 1)
            state = self._incoming.get(key)
            opened = state is None
            if state is None:  # (registered when its receive was posted: these open it)
                state = self._open_posted(key, bound, now=now)
            state.reassembler.count_taken(n, fresh, elems, droppable, retx, now=now)
            if opened and self._native is not None:
                # (opening applied a FINISH that came first, whose sync gave the table
                # the counts without these: it holds them again)
                self._native.sync(key, state.reassembler)
            self._took(key, state, n, nbytes, payload_bytes, fresh, now=now, native=True)

    def receive_rest(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> None:
        """The datagrams of a run after the prefix the native loop took: the general
        path takes them, as after the run path in :meth:`receive`."""
        self._receive_parsed(buf, segment_size, now=now)

    def receive(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> None:
        """Data datagrams of ``segment_size`` bytes back to back (one UDP GRO read,
        or a run of them), the last one possibly shorter. This module's docstring
        says which path takes what; the rule header of :mod:`dlcp.proto.inbox`,
        how each accounts for it."""
        if segment_size >= DATA_HEADER_LEN:
            taken = self._receive_run(buf, segment_size, now=now)
            if not taken and self._opens_message(buf):
                # the first datagram of a message starts it (which checks it and
                # learns the geometry); the rest can then take the run path,
                # however long the run that arrived in one read. Authenticated,
                # the general path takes the first alone (it verifies its tag)
                if self.config.authenticate or not self._receive_first(buf, segment_size, now=now):
                    self._receive_parsed(buf[:segment_size], segment_size, now=now)
                taken = 1 + self._receive_run(buf[segment_size:], segment_size, now=now)
            if taken:
                if taken * segment_size >= len(buf):
                    return
                buf = buf[taken * segment_size :]
        self._receive_parsed(buf, segment_size, now=now)

    # the admission pipeline the paths defer to (rules 1, 2, 3-4 and 5 of the
    # rule header in dlcp.proto.inbox)

    @abstractmethod
    def _count_in(self, n: int, nbytes: int, *, fast: bool = False) -> None: ...

    @abstractmethod
    def _admit_peer(self, src: int, n: int, *, now: float) -> bool: ...

    @abstractmethod
    def _message_for(
        self,
        key: Key,
        n: int,
        *,
        now: float,
        geometry: Geometry | None = None,
        headers: npt.NDArray[np.void] | None = None,
    ) -> MessageT | None: ...

    @abstractmethod
    def _open_posted(self, key: Key, bound: int, *, now: float) -> MessageT:
        """Open message ``key``, registered with the native loop when its receive
        was posted, whose first datagrams (of wire bound ``bound``) the loop took."""

    @abstractmethod
    def _landed(
        self, key: Key, state: MessageT, wire_bytes: int, fresh: int, *, now: float,
        native: bool = False,
    ) -> None: ...

    # the three paths

    def _receive_parsed(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> None:
        """The general path: parse and validate every datagram (each gets its
        exact reason), group them by message and admit each group."""
        tail = len(buf) % segment_size if segment_size > 0 else 0
        if tail and len(buf) > segment_size:
            # a short last datagram: parse the full ones in place and the short one
            # on its own, rather than copying the whole run into a padded array
            self._receive_parsed(buf[: len(buf) - tail], segment_size, now=now)
            self._receive_parsed(buf[len(buf) - tail :], segment_size, now=now)
            return
        parsed = parse_batch(
            buf,
            segment_size,
            job=self.job,
            key=self.keys.of if self.keys is not None else None,
            require_auth=self.config.authenticate,
        )
        self._count_in(len(parsed.reasons), len(buf))
        ok = parsed.ok
        if not ok.all():
            counts = np.bincount(parsed.reasons[~ok], minlength=len(Reason))
            for code in np.flatnonzero(counts):
                self.stats.reject(Reason(int(code)).name.lower(), int(counts[code]))
            rows = np.flatnonzero(ok)
            if len(rows) == 0:
                return
            headers, payloads = parsed.headers[rows], parsed.payloads[rows]
        else:
            headers, payloads = parsed.headers, parsed.payloads
        src, step, msg = headers["src"], headers["step"], headers["msg"]
        if len(headers) == 1 or (
            (src == src[0]).all() and (step == step[0]).all() and (msg == msg[0]).all()
        ):
            self._receive_group(
                (int(src[0]), int(step[0]), int(msg[0])), headers, payloads, now=now
            )
            return
        composite = (src.astype(np.uint64) << 48) | (step.astype(np.uint64) << 16) | msg
        keys, inverse = np.unique(composite, return_inverse=True)
        for i, k in enumerate(keys.tolist()):
            sel = inverse == i
            key = (k >> 48, (k >> 16) & 0xFFFFFFFF, k & 0xFFFF)
            self._receive_group(key, headers[sel], payloads[sel], now=now)

    def _receive_group(
        self,
        key: Key,
        headers: npt.NDArray[np.void],
        payloads: npt.NDArray[np.uint8],
        *,
        now: float,
    ) -> None:
        """The general path for the accepted datagrams of one message."""
        if self._replay is not None:  # (authenticated, every one of them)
            nonces = group_nonces(headers, payloads)
            replayed = nonces < self._replay.floor(key[0])
            if replayed.any():
                self.stats.reject("replayed", int(np.count_nonzero(replayed)))
                if replayed.all():
                    return
                keep = ~replayed
                headers, payloads, nonces = headers[keep], payloads[keep], nonces[keep]
            self._replay.took(key[0], int(nonces.max()))
        n = len(headers)
        if not self._admit_peer(key[0], n, now=now):
            return
        state = self._message_for(key, n, now=now, headers=headers)
        if state is None:
            return
        try:
            fresh = state.reassembler.scatter(headers, payloads, now=now)
        except GeometryError:
            # only the packets that do not fit are dropped: a forged one batched
            # with genuine packets (same GRO read) must not take them down with it
            bad = state.reassembler.misfits(headers)
            self.stats.reject("geometry", int(np.count_nonzero(bad)))
            if bad.all():
                return
            headers, payloads = headers[~bad], payloads[~bad]
            n = len(headers)
            fresh = state.reassembler.scatter(headers, payloads, now=now)
        wire_bytes = int(headers["payload_len"].astype(np.int64).sum()) + n * DATA_HEADER_LEN
        self._landed(key, state, wire_bytes, fresh, now=now)

    def _opens_message(self, buf: npt.NDArray[np.uint8]) -> bool:
        """Whether ``buf`` starts with a datagram of a message not under way and not
        ended, one that a longer run may follow."""
        head = run_head(buf, self.job)
        return head is not None and head.key not in self._incoming and (
            head.key not in self._ended
        )  # fmt: skip

    def _receive_first(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> bool:
        """The first path: the first datagram of ``buf``, a valid datagram of a
        new message, with plain integers instead of a parsed batch. False, having
        done nothing, for a datagram :func:`parse_batch` would not accept as it
        is: the general path then gives it its exact reason."""
        head = open_head(buf, segment_size, self.job)
        if head is None:
            return False
        key, flags, seq, offset, elems, payload_len, tclass, code, bound, dtype = head
        length = DATA_HEADER_LEN + payload_len
        self._count_in(1, length)
        if not self._admit_peer(key[0], 1, now=now):
            return True

        try:  # (a new message, by the run's head: its geometry is needed)
            chunk_elems = Reassembler.chunk_elems_of_header(
                seq, offset, payload_len, flags, elems, dtype
            )
            geometry: Geometry | None = (dtype, elems, chunk_elems, bound)
        except GeometryError:
            geometry = None
        state = self._message_for(key, 1, now=now, geometry=geometry)
        if state is None:
            return True
        r = state.reassembler
        if not r.fits(seq, offset, elems, payload_len, code, flags):
            self.stats.reject("geometry")
            return True
        fresh = r.scatter_one(seq, buf[DATA_HEADER_LEN:length], tclass, flags, now=now)
        self._landed(key, state, length, fresh, now=now)
        return True

    def _receive_run(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> int:
        """The run path: the leading datagrams of ``buf`` that belong to a message
        under way and fit it, checked and written in one pass (the C kernel's
        ``scatter_run``). Returns how many it took; it declines (0) anything
        unusual (a new message, a bad or foreign datagram, a tag that does not
        verify), which the general path then takes. Authenticating, only the
        leading datagrams whose tags verify (one batch call) are offered."""
        head = run_head(buf, self.job)
        if head is None or head.flags & ~(PER_PACKET_FLAGS | _AUTH_FLAG):
            return 0
        key = head.key
        src = key[0]
        state = self._incoming.get(key)
        if state is None or (self.peers is not None and src not in self.peers):
            return 0  # (the general path rejects a foreign datagram: rule 2)
        trailer = 0
        if self.keys is not None or head.flags & _AUTH_FLAG:
            tag_key = self.keys.of(src) if self.keys is not None else None
            if tag_key is None or not head.flags & _AUTH_FLAG:
                return 0
            # (below the source's floor, the general path refuses it)
            floor = self._replay.floor(src) if self._replay is not None else 0
            verified, nonce_next = verified_prefix(buf, segment_size, tag_key, floor)
            if not verified:
                return 0
            buf = buf[: verified * segment_size]
            trailer = AUTH_TRAILER_LEN
        taken, fresh, payload_bytes = state.reassembler.scatter_run(
            buf, segment_size, dtype_byte=head.dtype_byte, msg_elems=head.msg_elems, now=now,
            trailer=trailer,
        )  # fmt: skip
        if not taken:
            return 0
        if trailer and self._replay is not None:  # (verified: its nonces are the sender's)
            self._replay.took(src, nonce_next - 1)
        nbytes = min(len(buf), taken * segment_size)
        self._took(key, state, taken, nbytes, payload_bytes, fresh, now=now)
        return taken

    def _took(self, key: Key, state: MessageT, taken: int, nbytes: int, payload_bytes: int,
              fresh: int, *, now: float, native: bool = False) -> None:  # fmt: skip
        """The admission pipeline for ``taken`` datagrams (``nbytes`` bytes, their
        payloads ``payload_bytes``, ``fresh`` new) that the run kernel wrote into
        ``state``: rules 1, 2 and 5 (the message is under way and the peer was
        checked: rules 3 and 4 have nothing to do). ``native``: the native receive
        loop wrote them, and counted them in its own copies already."""
        self._count_in(taken, nbytes, fast=True)
        self._admit_peer(key[0], taken, now=now)
        self._landed(
            key, state, payload_bytes + taken * DATA_HEADER_LEN, fresh, now=now, native=native
        )
