"""The layer of each chunk of a message, from the message's layer segments.

A sender names its message's layers as ``(offset, length, layer)`` segments in
elements; :func:`chunk_layers` gives each chunk the layer that covers most of its
elements, which is what the data header carries and what the classifiers rank by.
Part of the sans-I/O core: pure functions of their inputs, vectorised with numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from ..errors import UsageError

__all__ = ["MAX_LAYERS", "ChunkLayers", "chunk_layers"]

#: layers a data header can carry (16-bit field)
MAX_LAYERS: Final = 0x10000


class ChunkLayers(NamedTuple):
    """The layer of each chunk and the number of layers of the message."""

    layers: NDArray[np.uint16]
    n_layers: int


def chunk_layers(
    segments: Sequence[tuple[int, int, int]] | None,
    n_chunks: int,
    chunk_elems: int,
    msg_elems: int,
) -> ChunkLayers:
    """The layer of each chunk from the message's layer segments.

    ``segments`` are ``(offset, length, layer)`` in elements, in any order; they
    must tile ``[0, msg_elems)`` exactly (no overlap, no gap, nothing beyond the
    end); zero-length segments are ignored. Chunk ``i`` covers elements
    ``[i * chunk_elems, min((i + 1) * chunk_elems, msg_elems))`` and gets the
    layer covering most of its elements (summed over all of that layer's
    segments in the chunk); a tie goes to the lowest layer number.
    ``n_layers`` is the largest layer number of any segment plus one.

    With ``segments`` None or empty, every chunk is layer 0 and ``n_layers`` 1.
    """
    if chunk_elems < 1:
        raise UsageError(f"chunk_elems={chunk_elems} must be at least 1")
    if msg_elems < 0:
        raise UsageError(f"msg_elems={msg_elems} must not be negative")
    expected = -(-msg_elems // chunk_elems)
    if n_chunks != expected:
        raise UsageError(
            f"n_chunks={n_chunks} does not match msg_elems={msg_elems} in chunks of "
            f"{chunk_elems} elements (expected {expected})"
        )
    if not segments:
        return ChunkLayers(np.zeros(n_chunks, dtype=np.uint16), 1)
    seg = np.asarray(segments, dtype=np.int64)
    if seg.ndim != 2 or seg.shape[1] != 3:
        raise UsageError(
            f"segments must be (offset, length, layer) triples, got an array of shape {seg.shape}"
        )
    off, length, layer = seg[:, 0], seg[:, 1], seg[:, 2]
    top_layer = int(layer.max())
    if int(seg.min()) < 0 or top_layer >= MAX_LAYERS:
        _check_segment_fields(off, length, layer)  # raises, naming the first bad one
    n_layers = top_layer + 1
    keep = length > 0
    if not keep.all():
        off, length, layer = off[keep], length[keep], layer[keep]
    order = np.argsort(off, kind="stable")
    starts, ends, lay = off[order], (off + length)[order], layer[order]
    if not (
        len(starts)
        and starts[0] == 0
        and ends[-1] == msg_elems
        and bool((starts[1:] == ends[:-1]).all())
    ):
        _check_tiling(starts, ends, msg_elems)  # raises unless nothing is to be covered
    if n_chunks == 0:
        return ChunkLayers(np.zeros(0, dtype=np.uint16), n_layers)

    # a chunk whose first and last elements lie in one segment takes its layer;
    # only the few chunks that straddle a segment boundary need the majority rule
    chunk_starts = np.arange(n_chunks, dtype=np.int64) * chunk_elems
    chunk_ends = np.minimum(chunk_starts + chunk_elems, msg_elems)
    first_seg = np.searchsorted(starts, chunk_starts, side="right") - 1
    last_seg = np.searchsorted(starts, chunk_ends - 1, side="right") - 1
    out = lay[first_seg].astype(np.uint16)
    cut = np.flatnonzero(first_seg != last_seg)
    if 0 < len(cut) <= _FEW_STRADDLERS:
        # a few chunks straddle a boundary (the usual case): one at a time
        for c in cut.tolist():
            segs = slice(int(first_seg[c]), int(last_seg[c]) + 1)
            lo, hi = int(chunk_starts[c]), int(chunk_ends[c])
            covered = np.minimum(ends[segs], hi) - np.maximum(starts[segs], lo)
            per_layer = np.bincount(lay[segs], weights=covered)
            out[c] = int(np.argmax(per_layer))  # the first maximum: ties go to the lowest layer
    elif len(cut):
        # one piece per (straddling chunk, segment in it): sum the elements per
        # (chunk, layer) and take the largest per chunk, the lowest layer on a tie
        count = last_seg[cut] - first_seg[cut] + 1
        piece_chunk = np.repeat(cut, count)
        piece_seg = np.repeat(first_seg[cut] - np.cumsum(count) + count, count) + np.arange(
            int(count.sum())
        )
        piece_len = np.minimum(ends[piece_seg], chunk_ends[piece_chunk]) - np.maximum(
            starts[piece_seg], chunk_starts[piece_chunk]
        )
        groups, inverse = np.unique(piece_chunk * n_layers + lay[piece_seg], return_inverse=True)
        covered = np.bincount(inverse.reshape(-1), weights=piece_len)
        g_chunk, g_layer = groups // n_layers, groups % n_layers
        best = np.lexsort((g_layer, -covered, g_chunk))
        first = best[np.flatnonzero(np.diff(g_chunk[best], prepend=-1))]
        out[g_chunk[first]] = g_layer[first]
    return ChunkLayers(out, n_layers)


#: up to this many chunks straddling a segment boundary are resolved one by one
_FEW_STRADDLERS = 16


def _check_segment_fields(
    off: NDArray[np.int64], length: NDArray[np.int64], layer: NDArray[np.int64]
) -> None:
    checks = (
        ("offset", off < 0, ">= 0"),
        ("length", length < 0, ">= 0"),
        ("layer", (layer < 0) | (layer >= MAX_LAYERS), f"0..{MAX_LAYERS - 1}"),
    )
    for name, bad_mask, limit in checks:
        bad = np.flatnonzero(bad_mask)
        if bad.size:
            i = int(bad[0])
            raise UsageError(
                f"segment {i} (offset={int(off[i])}, length={int(length[i])}, "
                f"layer={int(layer[i])}): {name} must be {limit}"
            )


def _check_tiling(starts: NDArray[np.int64], ends: NDArray[np.int64], msg_elems: int) -> None:
    if starts.size == 0:
        if msg_elems:
            raise UsageError(f"segments leave a gap: elements [0, {msg_elems}) are not covered")
        return
    if int(ends.max()) > msg_elems:
        i = int(np.argmax(ends))
        raise UsageError(
            f"segment [{int(starts[i])}, {int(ends[i])}) goes beyond the message "
            f"(msg_elems={msg_elems})"
        )
    prev_end = np.concatenate(([0], ends[:-1]))
    overlap = np.flatnonzero(starts < prev_end)
    if overlap.size:
        i = int(overlap[0])
        raise UsageError(
            f"segments overlap: [{int(starts[i - 1])}, {int(ends[i - 1])}) and "
            f"[{int(starts[i])}, {int(ends[i])})"
        )
    gap = np.flatnonzero(starts > prev_end)
    if gap.size:
        i = int(gap[0])
        raise UsageError(
            f"segments leave a gap: elements [{int(prev_end[i])}, {int(starts[i])}) are not covered"
        )
    if ends[-1] < msg_elems:
        raise UsageError(
            f"segments leave a gap: elements [{int(ends[-1])}, {msg_elems}) are not covered"
        )
