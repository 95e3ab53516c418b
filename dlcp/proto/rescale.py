"""RESCALE's step: a message's received values scaled up by what it lost."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .wire import DType

__all__ = ["rescale"]


def rescale(out: npt.NDArray[np.generic], dtype: DType, scale: float) -> None:
    """``out *= scale`` for a message of ``dtype`` (RESCALE's received values):
    in float32, rounded once (float16 gets no biased factor; bfloat16 words are
    rounded to nearest even)."""
    if dtype is DType.BFLOAT16:
        as_f32 = (out.astype(np.uint32) << 16).view(np.float32) * np.float32(scale)
        bits = as_f32.view(np.uint32)
        # round to nearest even when dropping the low 16 bits
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)
        out[...] = (rounded >> 16).astype(np.uint16)
    else:
        scaled = out.astype(np.float32) * np.float32(scale)
        out[...] = scaled.astype(out.dtype)
