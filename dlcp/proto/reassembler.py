"""Packets -> tensor: scatter in any order, bounded-loss completion, fill policy.

One :class:`Reassembler` per incoming message. It owns (or borrows) the output
buffer, learns the chunk geometry from the first packet and then holds every
later packet to it, writes payloads at their offsets, ignores duplicates, and
tracks which chunks arrived and of which class.

Completion rule (``docs/spec.md``, "Completion"):

* every element arrived; or
* the sender's FINISH was seen, at least ``msg_elems - allowed_loss`` elements
  arrived, and every protected chunk FINISH announced arrived, where
  ``allowed_loss = floor(bound * msg_elems / 1000)`` (``bound``: ``p`` in thousandths).

At completion the missing elements are filled (zeros, previous values, or
zeros plus an unbiased rescale of what arrived) and a :class:`LossReport`
says exactly what was lost, where and of which class.

A message received with ``accumulate`` (float32, fill zero) adds each chunk's
values to what the buffer holds there instead of writing them, once per chunk
(duplicates are never added again): a reduction's step received straight into
its sum. A lost element then adds nothing, which is the zero fill.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ..errors import DLCPError, UsageError
from .batch import SHARED_HEADER_MASK
from .config import FillPolicy
from .control import Finish
from .kernels import add_f32, copy_rows, flat_rows, scatter_run, streams_received
from .loss_report import N_CLASSES, LossReport
from .rescale import rescale
from .wire import DATA_HEADER_LEN, HEADER_DTYPE, DType, Flags, allowed_loss

__all__ = ["RUN_LAYOUT", "GeometryError", "Reassembler", "RunTarget"]

Int64Array = npt.NDArray[np.int64]
UInt8Array = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]
_NO_CHUNKS = (0,) * N_CLASSES


_LAST = int(Flags.LAST)
_RETRANSMIT = int(Flags.RETRANSMIT)


def _run_layout() -> bytes:
    """Where the fast path finds the per-packet fields (see ``scatter_run``)."""
    fields = HEADER_DTYPE.fields
    assert fields is not None
    sizes = {"flags": 1, "seq": 4, "offset": 4, "payload_len": 2, "tclass": 1}
    offsets = []
    for name, size in sizes.items():
        dtype, offset = fields[name][:2]
        assert dtype.itemsize == size, f"the fast path reads {name} as {size} bytes"
        offsets.append(offset)
    return bytes([*offsets, _LAST, _RETRANSMIT, _DROP_BIT])


#: tclass bit of a drop-eligible packet (tclass's high nibble is prio * 2 + drop)
_DROP_BIT = 0x10
_RUN_LAYOUT = _run_layout()
#: where ``scatter_run`` finds the per-packet fields (public for the native receive
#: path, which runs the same kernel: dlcp.io.native_receive)
RUN_LAYOUT = _RUN_LAYOUT


class RunTarget(NamedTuple):
    """What the run kernel writes into for a message (:meth:`Reassembler.run_target`)."""

    out: UInt8Array
    received: BoolArray
    received_class: UInt8Array
    chunk_elems: int
    msg_elems: int
    itemsize: int
    dtype_byte: int
    stream: bool
    add: bool


class GeometryError(DLCPError, ValueError):
    """A packet disagrees with the message it claims to belong to."""


class Reassembler:
    """Receive state of one message."""

    def __init__(
        self,
        *,
        dtype: DType,
        msg_elems: int,
        chunk_elems: int,
        out: npt.NDArray[np.generic] | None,
        bound: float,
        fill: FillPolicy,
        now: float,
        spare: npt.NDArray[np.generic] | None = None,
        accumulate: bool = False,
    ) -> None:
        #: whether :attr:`out` is the message's own (``spare``, or new), not a caller's
        self.owns_buffer = out is None
        if out is None:
            out = np.empty(msg_elems, dtype=dtype.numpy()) if spare is None else spare
            if fill is FillPolicy.PREVIOUS:
                # no previous values in a buffer of our own: lost elements are zeroed and
                # the report says so (a receive bringing its buffer later sets the fill)
                fill = FillPolicy.ZERO
        if out.dtype != dtype.numpy() or out.shape != (msg_elems,) or not out.flags.c_contiguous:
            raise GeometryError(
                f"output buffer is {out.dtype}{list(out.shape)}, message is "
                f"{dtype.name.lower()}[{msg_elems}] (contiguous)"
            )
        if fill is FillPolicy.RESCALE and dtype is DType.UINT8:
            raise UsageError("fill='rescale' needs a floating-point message, not uint8")
        if accumulate:
            check_accumulate(dtype, fill, None if self.owns_buffer else out)
        self.dtype = dtype
        self.msg_elems = msg_elems
        self.chunk_elems = chunk_elems
        self.n_chunks = -(-msg_elems // chunk_elems)
        self.out = out
        self.bound = bound
        self.allowed_loss = allowed_loss(bound, msg_elems)
        self.fill = fill
        self.started = now
        self.last_activity = now
        self._bytes = out.view(np.uint8)
        self._stream = streams_received(len(self._bytes))
        self._dtype_byte = int(dtype) << 4
        self._itemsize = dtype.itemsize
        self.chunk_bytes = chunk_elems * self._itemsize
        self.received = np.zeros(self.n_chunks, dtype=np.bool_)
        self.received_class = np.zeros(self.n_chunks, dtype=np.uint8)
        self.received_elems = 0
        self.received_protected = 0
        self.retransmitted = 0
        self.duplicates = 0
        self.nack_rounds = 0
        self.finish: Finish | None = None
        #: chunks are added to what :attr:`out` holds (see the module docstring)
        self.accumulate = accumulate

    # ------------------------------------------------------------------ geometry

    @staticmethod
    def chunk_elems_of(
        *, seq: int, offset: int, payload_elems: int, last: bool, msg_elems: int
    ) -> int:
        """The message's chunk size as one packet reveals it."""
        if not last:
            return payload_elems
        if seq == 0:
            return msg_elems
        if offset == 0 or offset % seq:
            raise GeometryError(f"offset {offset} is not a positive multiple of seq {seq}")
        return offset // seq

    @classmethod
    def geometry_of(cls, headers: npt.NDArray[np.void]) -> tuple[DType, int, int, int] | None:
        """(dtype, msg_elems, chunk_elems, wire bound) as the first of ``headers``
        (parsed data headers) whose geometry is consistent on its own gives them
        (the inconsistent ones before it are counted when they misfit); None if
        none of them is."""
        for h in headers:
            (_, flags, _, _, _, _, seq, offset, msg_elems, payload_len, _, _, code, bound, _) = (
                h.item()
            )
            try:
                dtype = DType(code >> 4)
                chunk_elems = cls.chunk_elems_of_header(seq, offset, payload_len, flags,
                                                        msg_elems, dtype)  # fmt: skip
            except GeometryError:
                continue
            return dtype, msg_elems, chunk_elems, bound
        return None

    @classmethod
    def chunk_elems_of_header(
        cls, seq: int, offset: int, payload_len: int, flags: int, msg_elems: int, dtype: DType
    ) -> int:
        """:meth:`chunk_elems_of` from a data header's fields as they are on the wire."""
        return cls.chunk_elems_of(
            seq=seq, offset=offset, payload_elems=payload_len // dtype.itemsize,
            last=bool(flags & _LAST), msg_elems=msg_elems,
        )  # fmt: skip

    def check_output(self, out: npt.NDArray[np.generic]) -> None:
        """GeometryError unless ``out`` can hold this message (type, shape, contiguous)."""
        if out.dtype != self.out.dtype or out.shape != self.out.shape or not out.flags.c_contiguous:
            raise GeometryError(
                f"output buffer is {out.dtype}{list(out.shape)}, message is "
                f"{self.out.dtype}{list(self.out.shape)} (contiguous)"
            )

    def replace_output(self, out: npt.NDArray[np.generic], *, accumulate: bool = False) -> None:
        """Move to a caller's buffer (the message arrived before it was asked for);
        with ``accumulate``, what arrived so far is added to it, and the rest will be."""
        self.check_output(out)
        if accumulate:
            check_accumulate(self.dtype, self.fill, out)
            full, tail = self._masks_for(self.received)
            self._copy_chunks(out, full, tail, add=True)
            self.accumulate = True
        elif self.fill is FillPolicy.PREVIOUS:
            # keep the caller's previous values where nothing arrived yet
            full, tail = self._masks_for(self.received)
            self._copy_chunks(out, full, tail, add=False)
        else:
            out[...] = self.out
        self.out = out
        self.owns_buffer = False
        self._bytes = out.view(np.uint8)
        self._stream = streams_received(len(self._bytes))

    def _copy_chunks(
        self, out: npt.NDArray[np.generic], full: BoolArray, tail: bool, *, add: bool
    ) -> None:
        """The chunks ``full`` (of the whole ones) and the last if ``tail`` from this
        buffer into ``out``: copied, or with ``add`` added (float32)."""
        end = self._n_full * self.chunk_bytes
        dst = out.view(np.uint8)
        dst2d = dst[:end].reshape(-1, self.chunk_bytes)
        src = self._bytes[:end].reshape(-1, self.chunk_bytes)[full]
        dst2d[full] = add_f32(dst2d[full], src) if add else src
        if tail:
            dst[end:] = add_f32(dst[end:], self._bytes[end:]) if add else self._bytes[end:]

    @property
    def _n_full(self) -> int:
        return self.msg_elems // self.chunk_elems

    def _masks_for(self, chunks: BoolArray) -> tuple[BoolArray, bool]:
        n_full = self._n_full
        return chunks[:n_full], bool(n_full < self.n_chunks and chunks[-1])

    # ------------------------------------------------------------------ receive

    def scatter(self, headers: npt.NDArray[np.void], payloads: UInt8Array, *, now: float) -> int:
        """Write the payloads of ``headers`` (all of this message, already valid on
        the wire) into the buffer. Returns how many new chunks arrived. Raises
        :class:`GeometryError` if any packet disagrees with the message geometry;
        then nothing of the batch is written.
        """
        if len(headers) == 1:  # (a short last datagram, a single one): plain integers
            h = headers[0]
            _, flags, _, _, _, _, seq_, offset, msg_elems, payload_len, _, tclass_, code, _, _ = (
                h.item()
            )
            if not self.fits(seq_, offset, msg_elems, payload_len, code, flags):
                raise GeometryError(self._geometry_message(h))
            return self.scatter_one(seq_, payloads[0, :payload_len], tclass_, flags, now=now)
        seq = headers["seq"].astype(np.int64)
        n = len(seq)
        start = seq * self.chunk_elems
        elems = np.minimum(start + self.chunk_elems, self.msg_elems) - start
        flags = headers["flags"]
        bad = self._misfits(headers, seq, start, elems)
        if bad.any():
            raise GeometryError(self._geometry_message(headers[bad][0]))
        self.last_activity = now
        fresh = ~self.received[seq]
        if n > 1 and not bool((seq[1:] > seq[:-1]).all()):  # maybe duplicates in the batch
            _, first = np.unique(seq, return_index=True)
            once = np.zeros(n, dtype=np.bool_)
            once[first] = True
            fresh &= once
        n_fresh = int(np.count_nonzero(fresh))
        self.duplicates += n - n_fresh
        if n_fresh == 0:
            return 0
        if n_fresh < n:
            seq, headers, payloads, elems = (
                seq[fresh],
                headers[fresh],
                payloads[fresh],
                elems[fresh],
            )
            flags = headers["flags"]
        self._write(seq, payloads)
        tclass = headers["tclass"]
        self.received[seq] = True
        self.received_class[seq] = tclass >> 4  # prio * 2 + drop: tclass's high nibble
        self.received_elems += int(elems.sum())
        self.received_protected += n_fresh - int(np.count_nonzero(tclass & _DROP_BIT))
        self.retransmitted += int(np.count_nonzero(flags & _RETRANSMIT))
        return n_fresh

    def scatter_run(
        self,
        buf: UInt8Array,
        segment_size: int,
        *,
        dtype_byte: int,
        msg_elems: int,
        now: float,
        trailer: int = 0,
    ) -> tuple[int, int, int]:
        """The fast path for a run of this message's datagrams straight off the
        wire (``segment_size`` apart): checks and writes them in one pass, up to the
        first one that is not a well-formed packet of this message with the same
        message-wide header bytes as the first. ``dtype_byte`` and ``msg_elems``
        are the first datagram's; the caller checked its version, type, job and
        flags. ``trailer``: the authentication trailer's bytes after each payload
        (the caller verified the tags). Returns ``(taken, fresh, payload_bytes)``:
        the leading datagrams handled (the caller passes the rest to :meth:`scatter`
        by way of ``parse_batch``), how many were new, and the payload bytes of the
        taken ones.
        Takes nothing without the C accelerator.
        """
        if dtype_byte != self._dtype_byte or msg_elems != self.msg_elems:
            return 0, 0, 0
        taken, fresh, elems, droppable, retransmitted, payload_bytes = scatter_run(
            buf,
            segment_size,
            buf[:DATA_HEADER_LEN].tobytes(),
            SHARED_HEADER_MASK,
            _RUN_LAYOUT,
            self._bytes,
            self.chunk_elems,
            self.msg_elems,
            self._itemsize,
            self.received,
            self.received_class,
            stream=self._stream,
            trailer=trailer,
            add=self.accumulate,
        )
        if taken:
            self.count_taken(taken, fresh, elems, droppable, retransmitted, now=now)
        return taken, fresh, payload_bytes

    def count_taken(
        self, taken: int, fresh: int, elems: int, droppable: int, retransmitted: int, *, now: float
    ) -> None:
        """Counts what the run kernel wrote: ``taken`` datagrams, ``fresh`` of them
        new chunks of ``elems`` elements in all, ``droppable`` of those
        drop-eligible and ``retransmitted`` retransmissions (its buffers, chunk
        maps and classes it set itself: :meth:`scatter_run`, or the native
        receive path that runs the same kernel on :meth:`run_target`)."""
        self.last_activity = now
        self.received_elems += elems
        self.received_protected += fresh - droppable
        self.retransmitted += retransmitted
        self.duplicates += taken - fresh

    def run_target(self) -> RunTarget:
        """The buffers and geometry the run kernel writes a datagram of this message
        into (the same as :meth:`scatter_run` passes it; they change when
        :meth:`replace_output` moves the message to a caller's buffer)."""
        return RunTarget(
            self._bytes, self.received, self.received_class, self.chunk_elems,
            self.msg_elems, self._itemsize, self._dtype_byte, self._stream, self.accumulate,
        )  # fmt: skip

    def completion_counts(self) -> tuple[int, int, int, int]:
        """``(received_elems, received_protected, complete_elems, complete_protected)``:
        :meth:`is_complete` is true when every element arrived, or when
        ``received_elems >= complete_elems`` and ``received_protected >=
        complete_protected`` (once the sender's FINISH came: the bound's required
        elements and the protected chunks FINISH announced; before it, all
        elements)."""
        if self.finish is None:
            return self.received_elems, self.received_protected, self.msg_elems, 0
        return (
            self.received_elems, self.received_protected, self.required_elems,
            self.finish.protected_chunks,
        )  # fmt: skip

    def fits(
        self, seq: int, offset: int, msg_elems: int, payload_len: int, dtype_byte: int, flags: int
    ) -> bool:
        """Whether one packet with these header fields fits the message geometry
        (the packets :meth:`scatter` accepts, see :meth:`_misfits`)."""
        start = seq * self.chunk_elems
        elems = min(start + self.chunk_elems, self.msg_elems) - start
        return (
            offset == start
            and payload_len == elems * self._itemsize
            and msg_elems == self.msg_elems
            and dtype_byte == self._dtype_byte
            and bool(flags & _LAST) == (seq == self.n_chunks - 1)
        )

    def scatter_one(
        self, seq: int, payload: UInt8Array, tclass: int, flags: int, *, now: float
    ) -> int:
        """:meth:`scatter` for one packet that :meth:`fits`, given by its fields:
        writes ``payload`` (its bytes) unless chunk ``seq`` arrived already.
        Returns 1 if the chunk is new, else 0."""
        self.last_activity = now
        if self.received[seq]:
            self.duplicates += 1
            return 0
        at = seq * self.chunk_bytes
        place = self._bytes[at : at + len(payload)]
        place[...] = add_f32(place, payload) if self.accumulate else payload
        self.received[seq] = True
        self.received_class[seq] = tclass >> 4
        self.received_elems += len(payload) // self._itemsize
        if not tclass & _DROP_BIT:
            self.received_protected += 1
        if flags & _RETRANSMIT:
            self.retransmitted += 1
        return 1

    def misfits(self, headers: npt.NDArray[np.void]) -> BoolArray:
        """Which of ``headers`` disagree with the message geometry (the packets
        :meth:`scatter` refuses)."""
        seq = headers["seq"].astype(np.int64)
        start = seq * self.chunk_elems
        elems = np.minimum(start + self.chunk_elems, self.msg_elems) - start
        return self._misfits(headers, seq, start, elems)

    def _misfits(
        self, headers: npt.NDArray[np.void], seq: Int64Array, start: Int64Array, elems: Int64Array
    ) -> BoolArray:
        flags = headers["flags"]
        return (  # type: ignore[no-any-return]
            (headers["offset"] != start)
            | (headers["payload_len"] != elems * self.dtype.itemsize)
            | (headers["msg_elems"] != self.msg_elems)
            | (headers["dtype"] != self._dtype_byte)
            | (((flags & _LAST) != 0) != (seq == self.n_chunks - 1))
        )

    def _write(self, seq: Int64Array, payloads: UInt8Array) -> None:
        cb = self.chunk_bytes
        n_full = self._n_full
        src, src_stride = flat_rows(payloads)
        stream, add = self._stream, self.accumulate
        full = seq < n_full
        if bool(full.all()):
            first = int(seq[0])
            # in order (strictly increasing, no gap): one straight run. The ends alone
            # do not say so: a batch in send order can permute a contiguous range.
            if int(seq[-1]) - first == len(seq) - 1 and bool((seq[1:] > seq[:-1]).all()):
                copy_rows(
                    self._bytes,
                    first * cb,
                    cb,
                    None,
                    src,
                    0,
                    src_stride,
                    None,
                    len(seq),
                    cb,
                    stream=stream,
                    add=add,
                )
            else:
                copy_rows(
                    self._bytes, 0, cb, seq, src, 0, src_stride, None, len(seq), cb,
                    stream=stream, add=add,
                )  # fmt: skip
            return
        rows = np.flatnonzero(full)
        copy_rows(
            self._bytes, 0, cb, seq[rows], src, 0, src_stride, rows, len(rows), cb,
            stream=stream, add=add,
        )  # fmt: skip
        tail = self._bytes[n_full * cb :]
        last = payloads[int(np.argmin(full)), : len(tail)]
        tail[...] = add_f32(tail, last) if add else last

    def _geometry_message(self, h: np.void) -> str:
        seq = int(h["seq"])
        if int(h["msg_elems"]) != self.msg_elems or int(h["dtype"]) != self._dtype_byte:
            return (
                f"packet says {DType(int(h['dtype']) >> 4).name.lower()}[{int(h['msg_elems'])}], "
                f"its message is {self.dtype.name.lower()}[{self.msg_elems}]"
            )
        if int(h["offset"]) != seq * self.chunk_elems:
            return f"offset {int(h['offset'])} is not seq {seq} x chunk_elems {self.chunk_elems}"
        if bool(int(h["flags"]) & _LAST) != (seq == self.n_chunks - 1):
            return f"LAST flag disagrees with seq {seq} of {self.n_chunks} chunks"
        return f"payload_len {int(h['payload_len'])} does not fit chunk {seq} of this message"

    def on_finish(self, finish: Finish) -> bool:
        """Record the sender's FINISH; False if it contradicts the message (whose
        chunk counts every round's FINISH repeats)."""
        first, counts = self.finish, (finish.protected_chunks, finish.class_chunks)
        if finish.total_chunks != self.n_chunks or (
            first is not None and counts != (first.protected_chunks, first.class_chunks)
        ):
            return False
        if self.finish is None or finish.round >= self.finish.round:
            self.finish = finish
        return True

    # ------------------------------------------------------------------ completion

    @property
    def required_elems(self) -> int:
        return self.msg_elems - self.allowed_loss

    def is_complete(self) -> bool:
        if self.received_elems == self.msg_elems:
            return True
        if self.finish is None:
            return False
        return (
            self.received_elems >= self.required_elems
            and self.received_protected >= self.finish.protected_chunks
        )

    def needed_elems(self) -> int:
        return max(0, self.required_elems - self.received_elems)

    def missing_ranges(self, limit: int) -> tuple[tuple[int, int], ...]:
        """Missing chunks as (first_seq, count) ranges, at most ``limit`` of them.

        If there are more runs than ``limit``, the closest runs are merged: the
        request then also names some chunks that arrived, which the sender
        resends and the receiver ignores as duplicates. Nothing missing is left out.
        """
        starts, lengths = _runs(~self.received)
        if len(starts) > limit:
            gaps = starts[1:] - (starts[:-1] + lengths[:-1])
            keep = np.sort(np.argsort(gaps, kind="stable")[len(starts) - limit :])
            # a run starts after each kept gap
            new_starts = np.concatenate(([starts[0]], starts[keep + 1]))
            ends = np.concatenate((starts[keep] + lengths[keep], [starts[-1] + lengths[-1]]))
            starts, lengths = new_starts, ends - new_starts
        return tuple(zip(starts.tolist(), lengths.tolist(), strict=True))

    def complete(self, *, now: float) -> LossReport:
        """Fill what is missing and report it. Call once :meth:`is_complete` is true."""
        lost_elems = self.msg_elems - self.received_elems
        ranges = []
        if lost_elems:  # (the usual message lost nothing: no runs to look for)
            starts, lengths = _runs(~self.received)
            for s, n in zip(starts.tolist(), lengths.tolist(), strict=True):
                off = s * self.chunk_elems
                ranges.append((off, min((s + n) * self.chunk_elems, self.msg_elems) - off))
            self._fill(ranges)
        # (every chunk arrived when no element is lost)
        classes = self.received_class[self.received] if lost_elems else self.received_class
        received = np.bincount(classes, minlength=N_CLASSES).tolist()
        if self.finish is not None:
            sent = self.finish.class_chunks
            lost = tuple(max(s - r, 0) for s, r in zip(sent, received, strict=True))
        else:
            lost = _NO_CHUNKS
        return LossReport(
            msg_elems=self.msg_elems,
            received_elems=self.received_elems,
            lost_elems=lost_elems,
            lost_ranges=tuple(ranges),
            received_chunks=tuple(received),
            lost_chunks=lost,
            retransmitted_chunks=self.retransmitted,
            duplicate_chunks=self.duplicates,
            nack_rounds=self.nack_rounds,
            bound=self.bound,
            fill=self.fill,
            duration=now - self.started,
        )

    def _fill(self, ranges: list[tuple[int, int]]) -> None:
        if self.fill is FillPolicy.PREVIOUS or self.accumulate:
            return  # the buffer holds the previous values there (accumulate: + 0)
        for off, n in ranges:
            self.out[off : off + n] = 0
        if self.fill is FillPolicy.RESCALE and self.received_elems:
            rescale(self.out, self.dtype, self.msg_elems / self.received_elems)


def check_accumulate(
    dtype: DType, fill: FillPolicy, out: npt.NDArray[np.generic] | None
) -> None:
    """Raise :class:`~dlcp.errors.UsageError` unless a message of ``dtype`` with
    ``fill`` can be received with ``accumulate`` into ``out``."""
    if out is None:
        raise UsageError("accumulate=True needs out= holding the values to add to")
    if out.dtype != np.float32:
        raise UsageError(f"accumulate=True needs a float32 out, not {out.dtype}")
    if dtype is not DType.FLOAT32:
        raise UsageError(f"accumulate=True needs a float32 message, not {dtype.name.lower()}")
    if fill is not FillPolicy.ZERO:
        raise UsageError(
            f"accumulate=True adds nothing where elements are lost: it needs fill='zero', "
            f"not fill='{fill.value}'"
        )


def _runs(mask: BoolArray) -> tuple[Int64Array, Int64Array]:
    """Start and length of each run of True in ``mask``."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts = edges[0::2].astype(np.int64)
    return starts, (edges[1::2] - edges[0::2]).astype(np.int64)
