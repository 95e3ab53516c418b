"""Row copies between strided byte buffers: the packetizer's gather (tensor rows
into records, in send order) and the reassembler's scatter (record payloads into
the tensor, in arrival order), and the receive fast path that checks a run of
one message's datagrams and scatters it in the same pass (:func:`scatter_run`).

Two implementations give the same bytes: the C accelerator ``dlcp.proto._kernels``
(built by ``pip install`` when a C compiler is there; it copies each row with one
``memmove`` and releases the GIL while it does) and a numpy fallback (a fancy-index
gather or scatter, which goes through a temporary when both sides are indexed).
:data:`ACCELERATED` says which one is in use; ``tests/proto/test_kernels.py`` checks
that they agree.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..builds import alternate_build
from ..errors import ArgumentTypeError, UsageError

__all__ = [
    "ACCELERATED",
    "block_abs_mean",
    "classify_chunks",
    "copy_rows",
    "flat_rows",
    "gather_records",
    "magnitude_class_f32",
    "plan_round",
    "plan_send",
    "scatter_run",
    "streams",
    "streams_received",
    "unpack_records",
    "unpack_uniform",
]

#: the environment variable that names another build of the accelerator to load
#: (``make sanitize``: the same source with AddressSanitizer and UBSan)
BUILD_VARIABLE = "DLCP_KERNELS_BUILD"

_accel: ModuleType | None = alternate_build("dlcp.proto._kernels", BUILD_VARIABLE)
if _accel is None:
    try:
        from . import _kernels as _c  # type: ignore[attr-defined]

        _accel = _c
    except ImportError:  # not built: numpy does the same work, slower
        _accel = None

#: True when the C accelerator is loaded
ACCELERATED: bool = _accel is not None

UInt8Array = npt.NDArray[np.uint8]
Int64Array = npt.NDArray[np.int64]


def copy_rows(
    dst: UInt8Array,
    dst_start: int,
    dst_stride: int,
    dst_rows: Int64Array | None,
    src: UInt8Array,
    src_start: int,
    src_stride: int,
    src_rows: Int64Array | None,
    n: int,
    nbytes: int,
    *,
    stream: bool = False,
    add: bool = False,
    accelerated: bool | None = None,
) -> None:
    """For ``i < n``: ``dst[dst_start + D(i) * dst_stride :][:nbytes] =
    src[src_start + S(i) * src_stride :][:nbytes]`` with ``D(i) = dst_rows[i]``
    (``i`` when None) and likewise ``S``. ``dst`` and ``src`` are flat, contiguous
    uint8 arrays and must not overlap. Raises ``IndexError`` (nothing written) when a
    row falls outside its buffer. ``stream``: the destination is much larger than
    the cache (see :func:`streams`), so the C copy bypasses the cache as it writes.
    ``add``: the rows are float32 values (``nbytes`` a multiple of 4), added to
    those of ``dst`` (``+=`` instead of ``=``; ``dst_rows`` must not repeat a row).
    ``accelerated`` picks an implementation (default: the C one when built).
    """
    if add and nbytes % 4:
        raise ValueError(f"add: rows of {nbytes} bytes are not float32 values")
    use_c = ACCELERATED if accelerated is None else accelerated
    if use_c and _accel is not None:
        _accel.copy_rows(
            dst,
            dst_start,
            dst_stride,
            _rows(dst_rows),
            src,
            src_start,
            src_stride,
            _rows(src_rows),
            n,
            nbytes,
            stream,
            add,
        )
        return
    if n == 0:
        return
    d = _row_view(dst, "dst", dst_start, dst_stride, dst_rows, n, nbytes, writable=True)
    s = _row_view(src, "src", src_start, src_stride, src_rows, n, nbytes, writable=False)
    # blocks of rows: a fancy-index gather's temporary then stays in cache
    for a in range(0, n, _BLOCK):
        b = min(a + _BLOCK, n)
        rows = s[a:b] if src_rows is None else s[src_rows[a:b]]
        at = slice(a, b) if dst_rows is None else dst_rows[a:b]
        if add:
            d[at] = add_f32(d[at], rows)
        else:
            d[at] = rows


def add_f32(dst: UInt8Array, src: UInt8Array) -> UInt8Array:
    """The bytes of ``dst`` + ``src``, both read as float32 values (same shape,
    rows of a multiple of 4 bytes): the numpy side of :func:`copy_rows`' ``add``."""
    total = np.ascontiguousarray(dst).view(np.float32) + np.ascontiguousarray(src).view(np.float32)
    return total.view(np.uint8)


#: rows per step of the numpy fallback
_BLOCK = 1024


def block_abs_mean(
    full: npt.NDArray[np.float32],
    starts: Int64Array,
    block: int,
    *,
    accelerated: bool | None = None,
) -> npt.NDArray[np.float32]:
    """Per row of ``full`` (chunks x values, float32): the mean ``|value|`` over the
    blocks ``[b, b + block)`` for ``b`` in ``starts``, summed in float64. The C and
    numpy versions agree to float32 rounding (their summation orders differ)."""
    n, width = full.shape
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    if len(starts) == 0 or int(starts.min()) < 0 or int(starts.max()) + block > width:
        raise IndexError(f"sample blocks {starts.tolist()} of {block} leave rows of {width}")
    use_c = ACCELERATED if accelerated is None else accelerated
    out = np.empty(n, dtype=np.float32)
    if use_c and _accel is not None and full.flags.c_contiguous and full.flags.aligned:
        _accel.block_abs_mean_f32(full, width, n, starts, block, out)
        return out
    total = np.zeros(n, dtype=np.float64)
    for b in starts.tolist():
        total += np.abs(full[:, b : b + block]).sum(axis=1, dtype=np.float64)
    out[...] = total / (len(starts) * block)
    return out


def abs_means_f32(
    data: npt.NDArray[np.float32],
    chunk_elems: int,
    n_chunks: int,
    starts: Int64Array,
    block: int,
    out: npt.NDArray[np.float32],
) -> None:
    """:func:`block_abs_mean` of the first ``n_chunks`` chunks of ``data`` (1-D
    float32, contiguous) into ``out``, without its checks in Python: the C
    kernel checks the sizes and the sample blocks itself (ValueError,
    IndexError). For :func:`dlcp.proto.packetizer.plan_message`, whose arrays are
    of those types already; only with :data:`ACCELERATED`."""
    if _accel is None:
        raise RuntimeError("abs_means_f32 needs the C accelerator (dlcp.proto._kernels)")
    _accel.block_abs_mean_f32(data, chunk_elems, n_chunks, starts, block, out)


def gather_records(
    records: UInt8Array,
    wire: np.dtype[np.void],
    template: npt.NDArray[np.void],
    fields: dict[str, npt.NDArray[np.integer]],
    dst_rows: Int64Array | None,
    src: UInt8Array,
    src_stride: int,
    src_rows: Int64Array | None,
    n: int,
    nbytes: int,
    *,
    stream: bool = False,
    accelerated: bool | None = None,
) -> None:
    """Build ``n`` records of ``records`` (2-D uint8, one record per row) in one
    pass: record ``r = dst_rows[i]`` gets a ``wire``-layout header, ``template``
    (a 0-d native-order array of ``wire``'s fields) with ``fields[name][r]`` put
    in, then ``nbytes`` payload bytes from ``src`` row ``src_rows[i]`` (rows
    ``src_stride`` apart). Rows left out of ``dst_rows`` are not touched."""
    head = wire.itemsize
    stride = records.shape[1]
    flat = records.reshape(-1)
    use_c = ACCELERATED if accelerated is None else accelerated
    if use_c and _accel is not None:
        layout = _field_layout(wire, tuple(fields))
        spec = [
            (offset, size, _c_ints(values))
            for (offset, size), values in zip(layout, fields.values(), strict=True)
        ]
        _accel.gather_records(
            flat,
            stride,
            head,
            _rows(dst_rows),
            src,
            src_stride,
            _rows(src_rows),
            n,
            nbytes,
            template.astype(wire).tobytes(),
            spec,
            stream,
        )
        return
    rows = np.arange(n, dtype=np.int64) if dst_rows is None else dst_rows[:n]
    h = np.empty(len(rows), dtype=_native(wire))
    h.view(np.uint64).reshape(len(rows), -1)[...] = template.reshape(1).view(np.uint64)
    for name, values in fields.items():
        h[name] = values[rows]
    records[rows, :head] = h.astype(wire).view(np.uint8).reshape(-1, head)
    copy_rows(
        flat,
        head,
        stride,
        dst_rows,
        src,
        0,
        src_stride,
        src_rows,
        n,
        nbytes,
        stream=stream,
        accelerated=False,
    )


def scatter_run(
    buf: UInt8Array,
    segment_size: int,
    template: bytes,
    mask: bytes,
    layout: bytes,
    out: UInt8Array,
    chunk_elems: int,
    msg_elems: int,
    itemsize: int,
    received: npt.NDArray[np.bool_],
    received_class: UInt8Array,
    *,
    stream: bool,
    trailer: int = 0,
    add: bool = False,
) -> tuple[int, int, int, int, int, int]:
    """The receive fast path over the datagrams of ``buf`` (``segment_size`` apart,
    the last possibly shorter): check each against the message and copy the new
    ones into ``out``, in one pass, up to the first record that does not fit (see
    ``scatter_run`` in ``_kernels.c``). ``trailer``: bytes each datagram carries
    after its payload (the authentication trailer, whose tags the caller
    verified). ``add``: the payloads are float32 values, added to those ``out``
    holds where they go instead of copied there (a chunk that arrived already is
    never written again). Returns ``(taken, fresh, fresh_elems, fresh_droppable,
    fresh_retransmitted, payload_bytes)``.

    Without the C accelerator nothing is taken (``taken == 0``): the general path
    (:func:`dlcp.proto.batch.parse_batch` and ``Reassembler.scatter``) then does
    the same work with numpy, and ``tests/proto/test_receive_run.py`` checks that
    both paths end in the same state.
    """
    if _accel is None or not ACCELERATED:
        return 0, 0, 0, 0, 0, 0
    n = -(-len(buf) // segment_size)
    result: tuple[int, int, int, int, int, int] = _accel.scatter_run(
        buf,
        n,
        segment_size,
        len(buf),
        template,
        mask,
        layout,
        out,
        chunk_elems,
        msg_elems,
        itemsize,
        received,
        received_class,
        stream,
        trailer,
        add,
    )
    return result


def _aligned(values: npt.NDArray[Any], dtype: type) -> npt.NDArray[Any]:
    """``values`` as ``dtype``, contiguous and aligned as the C kernels read them
    (copied only where it is not already)."""
    want = _DTYPES.get(dtype) or np.dtype(dtype)
    if type(values) is np.ndarray and values.dtype == want:
        flags = values.flags  # (what np.require checks, without its cost of ~2 us)
        if flags.c_contiguous and flags.aligned:
            return values
    return np.require(values, dtype, ["C", "A"])


#: the dtypes the C kernels read, made once
_DTYPES: dict[type, np.dtype[Any]] = {
    t: np.dtype(t) for t in (np.uint8, np.uint16, np.int64, np.float32, np.bool_)
}


def classify_chunks(
    layers: npt.NDArray[np.uint16],
    n_layers: int,
    magnitudes: npt.NDArray[np.float32],
    layer_prio: UInt8Array,
    layer_eligible: UInt8Array | None,
    fraction: float,
    threshold: float,
    may_drop: bool,
    bias: int,
    top: int,
    *,
    convert: bool = True,
) -> tuple[UInt8Array, npt.NDArray[np.bool_], UInt8Array] | None:
    """A built-in classifier's tags (prio, drop, mag) for each chunk, in one pass of
    the C kernel (see ``classify_chunks`` in ``_kernels.c``); None if a layer is not
    below ``n_layers``. Only with :data:`ACCELERATED`:
    :func:`dlcp.proto.classify.classify_chunks` falls back to the classifier's
    ``classify`` otherwise. ``convert=False``: the arrays are contiguous, aligned
    and of the kernel's types already (a caller that made them so), and are
    passed as they are; the kernel checks their sizes and alignment (ValueError)."""
    if _accel is None:
        raise RuntimeError("classify_chunks needs the C accelerator (dlcp.proto._kernels)")
    if convert:
        layers, magnitudes = _aligned(layers, np.uint16), _aligned(magnitudes, np.float32)
        layer_prio = _aligned(layer_prio, np.uint8)
        if layer_eligible is not None:
            layer_eligible = _aligned(layer_eligible, np.uint8)
    n = len(layers)
    prio = np.empty(n, np.uint8)
    drop = np.empty(n, np.bool_)
    mag = np.empty(n, np.uint8)
    bad = _accel.classify_chunks(
        layers, n_layers, magnitudes, layer_prio, layer_eligible, fraction, threshold,
        may_drop, bias, top, prio, drop.view(np.uint8), mag,
    )  # fmt: skip
    return None if bad >= 0 else (prio, drop, mag)


def magnitude_class_f32(magnitudes: npt.NDArray[np.float32], bias: int, top: int) -> UInt8Array:
    """``clamp(floor(log2(|m|)) + bias, 0, top)`` of float32 magnitudes, ``top`` for
    infinities and NaN, read off the exponent bits in C (only with :data:`ACCELERATED`:
    :func:`dlcp.proto.classify.magnitude_class` does the same in numpy otherwise)."""
    if _accel is None:
        raise RuntimeError("magnitude_class_f32 needs the C accelerator (dlcp.proto._kernels)")
    out = np.empty(len(magnitudes), np.uint8)
    _accel.magnitude_class_f32(_aligned(magnitudes, np.float32), bias, top, out)
    return out


def plan_round(
    records: UInt8Array,
    template: bytes,
    layout: bytes,
    prio: UInt8Array,
    drop: npt.NDArray[np.bool_],
    mag: UInt8Array,
    layer: npt.NDArray[np.uint16],
    chunk_elems: int,
    msg_elems: int,
    itemsize: int,
    flags: int,
    last_flag: int,
    source: UInt8Array | None,
    *,
    stream: bool = False,
) -> tuple[Int64Array, Int64Array, UInt8Array, npt.NDArray[np.bool_], tuple[int, ...]]:
    """A message's first round in one pass of the C accelerator (see ``plan_round``
    in ``_kernels.c``): records (2-D, one per row) in send order, each a
    ``template`` header with the chunk's fields put in at ``layout``'s offsets,
    and its payload from ``source`` (None: headers only). Returns the send order,
    the record of each chunk, the class of each record (prio, drop) and how many
    records each of the 16 send-order keys has. Only with :data:`ACCELERATED`:
    :func:`dlcp.proto.first_round.first_round` does the same in numpy otherwise."""
    if _accel is None:
        raise RuntimeError("plan_round needs the C accelerator (dlcp.proto._kernels)")
    n = len(prio)
    order = np.empty(n, np.int64)
    row_of_seq = np.empty(n, np.int64)
    sent_prio = np.empty(n, np.uint8)
    sent_drop = np.empty(n, np.bool_)
    counts = _accel.plan_round(
        records.reshape(-1), records.shape[1], template, layout, _aligned(prio, np.uint8),
        _aligned(drop, np.bool_).view(np.uint8), _aligned(mag, np.uint8),
        _aligned(layer, np.uint16),
        chunk_elems, msg_elems, itemsize, flags, last_flag, source, order, row_of_seq,
        sent_prio, sent_drop.view(np.uint8), stream,
    )  # fmt: skip
    return order, row_of_seq, sent_prio, sent_drop, counts


def plan_send(
    data: npt.NDArray[np.float32], chunk_elems: int, starts: Int64Array, block: int,
    tail_magnitude: float, layer: npt.NDArray[np.uint16], n_layers: int,
    rule: tuple[UInt8Array, UInt8Array | None, float, float, int, int], may_drop: bool,
    records: UInt8Array, template: bytes, layout: bytes, flags: int, last_flag: int, *,
    lend: bool, stream: bool, magnitude: npt.NDArray[np.float32], classes: UInt8Array,
    order: Int64Array,
) -> tuple[int, ...] | None:  # fmt: skip
    """A float32 message sampled (:func:`block_abs_mean`), classified by a
    built-in classifier's ``rule`` (:func:`classify_chunks`: layer_prio,
    layer_eligible, fraction, threshold, bias, top) and its first round laid
    out (:func:`plan_round`, its source ``data`` itself) in one call of the C
    accelerator (see ``plan_send`` in ``_kernels.c``): ``magnitude`` gets each
    chunk's, ``classes`` (5 n bytes) prio, drop, mag, then each record's prio
    and drop, ``order`` (2 n) the send order, then the record of each chunk.
    Returns plan_round's 16 counts; None if a layer is not below ``n_layers``
    (nothing laid out). The arrays are passed as they are: the kernel checks
    their sizes and alignment (ValueError). Only with :data:`ACCELERATED`."""
    if _accel is None:
        raise RuntimeError("plan_send needs the C accelerator (dlcp.proto._kernels)")
    layer_prio, eligible, fraction, threshold, bias, top = rule
    counts = _accel.plan_send(
        data, chunk_elems, starts, block, tail_magnitude, layer, n_layers, layer_prio, eligible,
        fraction, threshold, may_drop, bias, top, records.reshape(-1), records.shape[1],
        template, layout, flags, last_flag, lend, stream, magnitude, classes, order,
    )  # fmt: skip
    return None if type(counts) is int else counts


@functools.lru_cache(maxsize=16)
def _field_layout(wire: np.dtype[np.void], names: tuple[str, ...]) -> list[tuple[int, int]]:
    """(offset, size) in ``wire`` of each field of ``names``."""
    return [(wire.fields[n][1], wire[n].itemsize) for n in names]  # type: ignore[index]


def _c_ints(values: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]:
    """An integer array as the C kernel reads it: contiguous, 1-8 byte items."""
    if values.dtype == np.bool_:
        return values.view(np.uint8)
    return np.ascontiguousarray(values)


def unpack_records(
    rows: UInt8Array, wire: np.dtype[np.void], *, accelerated: bool | None = None
) -> npt.NDArray[np.void]:
    """The first ``wire.itemsize`` bytes of each row of ``rows`` (2-D uint8, rows
    contiguous, e.g. the headers of a batch of datagrams) as a compact array of
    ``wire`` records in native byte order: what ``rows.view(wire).astype(native)``
    gives, in one pass instead of numpy's field-by-field conversion."""
    return _unpack(rows, wire, None, accelerated)[0]


def unpack_uniform(
    rows: UInt8Array,
    wire: np.dtype[np.void],
    mask: bytes,
    *,
    accelerated: bool | None = None,
) -> tuple[npt.NDArray[np.void], bool]:
    """:func:`unpack_records`, and whether every row agrees with the first in the
    header bits ``mask`` sets (``wire.itemsize`` bytes), found in the same pass."""
    if len(mask) != wire.itemsize:
        raise UsageError(f"mask has {len(mask)} bytes, the header {wire.itemsize}")
    return _unpack(rows, wire, mask, accelerated)


def _unpack(
    rows: UInt8Array, wire: np.dtype[np.void], mask: bytes | None, accelerated: bool | None
) -> tuple[npt.NDArray[np.void], bool]:
    native, n = _native(wire), len(rows)
    use_c = ACCELERATED if accelerated is None else accelerated
    if use_c and _accel is not None and n:
        out = np.empty(n, dtype=native)
        flat, stride = flat_rows(rows)
        same = _accel.swap_records(
            out, native.itemsize, flat, stride, n, wire.itemsize, _swapped(wire), mask
        )
        return out, same is None or bool(same)
    out = np.ascontiguousarray(rows[:, : wire.itemsize]).view(wire)[:, 0].astype(native)
    if mask is None or n == 0:
        return out, True
    words = out.view(np.uint8).reshape(n, -1) & np.frombuffer(mask, np.uint8)
    return out, bool((words == words[0]).all())


@functools.cache
def _native(wire: np.dtype[np.void]) -> np.dtype[np.void]:
    return wire.newbyteorder("=")


@functools.cache
def _swapped(wire: np.dtype[np.void]) -> bytes:
    """(offset, size) byte pairs of the multi-byte fields of ``wire``, whose byte
    order differs from the native one (all of them on a little-endian machine)."""
    pairs = bytearray()
    for name in wire.names or ():
        field, offset = wire.fields[name][:2]  # type: ignore[index]
        if field.itemsize > 1 and field.byteorder not in ("=", "|", _NATIVE):
            pairs += bytes([offset, field.itemsize])
    return bytes(pairs)


#: the byte-order character numpy uses for native multi-byte fields on this machine
_NATIVE = "<" if np.little_endian else ">"


def flat_rows(rows: UInt8Array) -> tuple[UInt8Array, int]:
    """A 2-D uint8 array whose rows are contiguous (e.g. the payload columns of a
    record batch) as ``(flat, stride)``: a flat view from its first byte to its
    last, and the distance between rows, as :func:`copy_rows` takes them."""
    if rows.ndim != 2 or rows.dtype != np.uint8 or (rows.shape[1] > 1 and rows.strides[1] != 1):
        raise ArgumentTypeError("rows must be a 2-D uint8 array with contiguous rows")
    n, width = rows.shape
    stride = int(rows.strides[0]) if n > 1 else width
    if n == 0:
        return np.empty(0, np.uint8), max(stride, 0)
    size = (n - 1) * stride + width
    flat = np.lib.stride_tricks.as_strided(rows, shape=(size,), strides=(1,), writeable=False)
    return flat, stride


#: destinations of at least this many bytes are written with streaming stores
STREAM_MIN_BYTES = 8 << 20


def streams(dst_bytes: int) -> bool:
    """Whether copies into a destination of ``dst_bytes`` should stream (bypass the
    cache): when it is several times a typical last-level cache, its first rows are
    evicted before anyone reads them anyway."""
    return dst_bytes >= STREAM_MIN_BYTES


#: received messages of at least this many bytes are placed with streaming stores
PLACE_STREAM_MIN_BYTES = 2 << 20


def streams_received(msg_bytes: int) -> bool:
    """Whether the datagrams of a received message of ``msg_bytes`` are placed in
    its buffer with streaming stores: from a little over a core's L2 cache on.
    Such a buffer has not been touched since the last message went through it
    (another collective step, another bucket), so an ordinary store reads every
    line from memory before writing it; streaming writes it without. On the 2-core
    VM (docs/benchmarks.md, "Streaming the placement"): rows of 1,440 bytes from a
    hot staging buffer into a cold destination, then read once, cost 0.69 of the
    ordinary stores' time from 1 MB on (0.83 at 256 KB); the 4-rank 25 MB ring
    all-reduce's CPU fell by 9-12 % (its 6.25 MB messages were below the 8 MB of
    :data:`STREAM_MIN_BYTES`). Into a destination still in the cache streaming
    costs 1.7-2.2x, which is why the smallest messages do not stream."""
    return msg_bytes >= PLACE_STREAM_MIN_BYTES


def _rows(rows: Int64Array | None) -> Int64Array | None:
    if rows is None or (rows.dtype == np.int64 and rows.flags.c_contiguous):
        return rows
    return np.ascontiguousarray(rows, dtype=np.int64)


def _row_view(
    buf: UInt8Array,
    name: str,
    start: int,
    stride: int,
    rows: Int64Array | None,
    n: int,
    nbytes: int,
    *,
    writable: bool,
) -> UInt8Array:
    """``buf`` seen as rows of ``nbytes`` bytes, ``stride`` apart from ``start``,
    after checking every row ``copy_rows`` will touch lies inside it."""
    if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ArgumentTypeError(f"{name} must be a flat contiguous uint8 array")
    top = n - 1 if rows is None else int(rows[:n].max())
    low = 0 if rows is None else int(rows[:n].min())
    if low < 0 or start < 0 or start + top * stride + nbytes > len(buf):
        bad = low if low < 0 else top
        raise IndexError(f"{name} row {bad} is outside a buffer of {len(buf)} bytes")
    view = np.lib.stride_tricks.as_strided(
        buf[start:], shape=(top + 1, nbytes), strides=(stride, 1), writeable=writable
    )
    return view
