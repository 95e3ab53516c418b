"""Each chunk's magnitude statistic: the mean ``|g|`` over an evenly spaced sample
of its values (:func:`chunk_magnitudes`), the statistic the classifiers rank chunks
by. A sample is blocks of :data:`SAMPLE_BLOCK` neighbouring values (one cache
line of float32) at evenly spaced places, so that it touches a few lines per
chunk; the short last chunk is measured over all its values.

:func:`float32_sampling` says where the C kernels may sample a message as they
find it (float32 values, contiguous, a sample smaller than a chunk), and gives
them what they cannot work out alike: the blocks' places and the last chunk's
magnitude, summed as numpy sums it."""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

from . import kernels
from .kernels import block_abs_mean
from .wire import DType

__all__ = ["SAMPLE_BLOCK", "chunk_magnitudes", "float32_sampling", "sample_starts"]

SAMPLE_BLOCK = 16  # values per sampled block


def _as_float32(values: npt.NDArray[np.generic], dtype: DType) -> npt.NDArray[np.float32]:
    if dtype is DType.BFLOAT16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32, copy=False)


def chunk_magnitudes(
    data: npt.NDArray[np.generic], dtype: DType, chunk_elems: int, sample: int
) -> npt.NDArray[np.float32]:
    """The magnitude of each chunk of ``data`` (``sample`` values of each whole
    chunk, rounded up to whole blocks; all of them where ``sample`` is 0 or at
    least a chunk)."""
    n_elems = len(data)
    n_full = n_elems // chunk_elems
    out = np.empty(-(-n_elems // chunk_elems), dtype=np.float32)
    if n_full:
        full = data[: n_full * chunk_elems].reshape(n_full, chunk_elems)
        if 0 < sample < chunk_elems:
            starts = sample_starts(chunk_elems, sample)
            if dtype is DType.FLOAT32 and chunk_elems >= SAMPLE_BLOCK:
                out[:n_full] = block_abs_mean(full.view(np.float32), starts, SAMPLE_BLOCK)
                return _tail_magnitude(data, dtype, n_full * chunk_elems, out)
            total = np.zeros(n_full, dtype=np.float64)
            count = 0
            for b in starts.tolist():
                part = full[:, b : b + min(SAMPLE_BLOCK, chunk_elems - b)]
                total += np.abs(_as_float32(part, dtype)).sum(axis=1, dtype=np.float64)
                count += part.shape[1]
            out[:n_full] = total / count
        else:
            out[:n_full] = np.abs(_as_float32(full, dtype)).mean(axis=1, dtype=np.float64)
    return _tail_magnitude(data, dtype, n_full * chunk_elems, out)


def sample_starts(chunk_elems: int, sample: int) -> npt.NDArray[np.int64]:
    """Where the sampled blocks of a chunk start, for a sample of ``sample``
    values (read-only: shared between calls)."""
    return _block_starts(chunk_elems, -(-sample // SAMPLE_BLOCK))


@functools.lru_cache(maxsize=64)
def _block_starts(chunk_elems: int, blocks: int) -> npt.NDArray[np.int64]:
    starts = np.linspace(0, chunk_elems - SAMPLE_BLOCK, blocks).astype(np.int64)
    starts.flags.writeable = False
    return starts


def _tail_magnitude(
    data: npt.NDArray[np.generic], dtype: DType, tail_start: int, out: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Fill in the short last chunk's magnitude (all its values), if there is one."""
    if tail_start < len(data):
        tail = _as_float32(data[tail_start:], dtype)
        out[-1] = np.abs(tail).sum(dtype=np.float64) / len(tail)
    return out


def float32_sampling(
    data: npt.NDArray[np.generic], chunk_elems: int, sample: int
) -> tuple[npt.NDArray[np.int64], float] | None:
    """Where the C kernels sample ``data`` as it is (float32 values, C-contiguous
    and aligned, a sample smaller than a chunk of at least a block, the
    accelerator built):
    the sample blocks' starts and the short last chunk's magnitude (0.0: the
    last chunk is whole), which :func:`chunk_magnitudes` gives too. None
    elsewhere: :func:`chunk_magnitudes` then samples it."""
    if (
        not 0 < sample < chunk_elems
        or chunk_elems < SAMPLE_BLOCK
        or data.dtype != np.float32
        or not data.flags.c_contiguous
        or not data.flags.aligned
        or not kernels.ACCELERATED
    ):
        return None
    tail_start = len(data) - len(data) % chunk_elems
    if tail_start == len(data):
        return sample_starts(chunk_elems, sample), 0.0
    # (as _tail_magnitude: a float64 sum over the float32 |values|, numpy's order)
    tail = np.abs(data[tail_start:]).sum(dtype=np.float64) / (len(data) - tail_start)
    return sample_starts(chunk_elems, sample), float(tail)
