"""Record buffers kept for reuse between messages of the same shape."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["BufferPool"]

UInt8Array = npt.NDArray[np.uint8]


class BufferPool:
    """Record buffers kept for reuse, by shape. Training sends the same bucket
    sizes every step, so after the first step packetizing touches no new pages."""

    def __init__(self, *, per_shape: int = 2, max_bytes: int = 1 << 30) -> None:
        self.per_shape = per_shape
        self.max_bytes = max_bytes
        self._free: dict[tuple[int, int], list[UInt8Array]] = {}
        self._bytes = 0

    def take(self, shape: tuple[int, int]) -> UInt8Array | None:
        free = self._free.get(shape)
        if not free:
            return None
        buf = free.pop()
        self._bytes -= buf.nbytes
        return buf

    def give(self, buf: UInt8Array) -> None:
        shape = (int(buf.shape[0]), int(buf.shape[1]))
        free = self._free.setdefault(shape, [])
        if len(free) < self.per_shape and self._bytes + buf.nbytes <= self.max_bytes:
            free.append(buf)
            self._bytes += buf.nbytes
