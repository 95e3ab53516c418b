"""The dlcp process group's tensors and handles: the ``Work`` it returns, host
staging of each tensor (CPU copy, or pinned memory for CUDA), argument checks,
the cutting of raw bytes into messages, and the reductions of exact
all-reduces. :mod:`.process_group` builds on these.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch._C._distributed_c10d import ReduceOp, Work

from dlcp.collectives import CollectiveReport
from dlcp.errors import ArgumentTypeError, UsageError

from .pg_serve import result_of
from .pg_timeouts import DLCPTimeout

__all__ = [
    "FOLDS",
    "MAX_PARTS",
    "MAX_PART_BYTES",
    "ROLE_STRIDE",
    "DLCPWork",
    "HostTensor",
    "Job",
    "TensorList",
    "check_tensors",
    "flatten",
    "parts",
]

TensorList = list[torch.Tensor]

#: largest message; bigger tensors travel in several parts
MAX_PART_BYTES = 1 << 30
#: message roles of one operation: tensor index + part * ROLE_STRIDE (roles are 12 bits)
ROLE_STRIDE = 256
MAX_PARTS = 16


class DLCPWork(Work):
    """The handle of one queued operation: ``wait()`` raises what the operation
    raised (a failed collective is never silent), ``get_future()`` is completed
    by a transport thread with the operation's output tensors.

    One moment of completion for every view: the operation is done when the
    future that ``get_future()`` hands out is, and ``is_completed()``,
    ``is_success()``, ``wait()`` and ``exception()`` all read that moment (the
    inner future completes first, then the handed-out one, in the same thread:
    reading the inner one made ``is_completed()`` False right after ``wait()``)."""

    def __init__(self, name: str, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self.name = name
        #: the rank a receive got its message from (``recv`` from any source)
        self.received_from: int | None = None
        self._future = future
        # what get_future() hands out: an exception set on a Python future is only
        # a value to C++ callers (DDP's reducer took it for the result and crashed
        # the process); raised again in a callback, it fails the chained future
        self._chained = future.then(result_of)
        self._done = threading.Event()  # (for wait(timeout): set once _chained is done)
        self._chained.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout: timedelta | None = None) -> bool:
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        if seconds > 0 and not self._done.wait(seconds):
            raise _timeout(self.name, seconds)
        with contextlib.suppress(Exception):  # (its error is the inner one, rewrapped)
            self._chained.wait()
        self._future.wait()  # raises the operation's own error (done before the chained)
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._chained

    def is_completed(self) -> bool:
        return self._chained.done()

    def is_success(self) -> bool:
        return self._chained.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The operation's error once it is completed (None: none, or not yet)."""
        if not self._chained.done():
            return None
        try:
            self._future.value()
        except Exception as exc:
            return exc
        return None

    def result(self) -> Any:
        self.wait()
        return self._future.value()

    def _source_rank(self) -> int:
        """The source of a completed receive (torch's ``recv`` from any source)."""
        if self.received_from is None:
            raise UsageError(f"dlcp {self.name}: no source rank (only a completed receive has one)")
        return self.received_from

    def source_rank(self) -> int:
        """:meth:`_source_rank`, under torch's public name for it."""
        return self._source_rank()


def _timeout(name: str, seconds: float) -> Exception:
    return DLCPTimeout(
        f"Timed out: dlcp {name} did not complete within the {seconds:g} s timeout given to wait()"
    )


@dataclass(slots=True)
class Job:
    name: str
    #: what the operation cost: one report, one per collective it ran, or none
    run: Callable[[], CollectiveReport | list[CollectiveReport] | None]
    result: TensorList
    future: torch.futures.Future[Any]
    ready: Any = None  # CUDA event recorded on the caller's stream
    #: call numbers the operation takes (one per collective it runs)
    calls: int = 1


class HostTensor:
    """A tensor as a contiguous 1-D CPU tensor (``flat``), a copy ("staged") when
    the tensor is not already one of ``dtype``; :meth:`write_back` copies results
    back into the tensor."""

    __slots__ = ("flat", "staged", "tensor")

    def __init__(self, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> None:
        t = tensor.detach()
        want = t.dtype if dtype is None else dtype
        self.tensor = tensor
        if t.device.type == "cpu" and t.is_contiguous() and t.dtype == want:
            self.flat = t.reshape(-1)
            self.staged = False
        else:
            self.flat = torch.empty(t.numel(), dtype=want, pin_memory=t.is_cuda)
            self.flat.view(t.shape).copy_(t)
            self.staged = True

    def numpy(self) -> npt.NDArray[Any]:
        return self.flat.numpy()

    def bytes(self) -> npt.NDArray[np.uint8]:
        return self.flat.view(torch.uint8).numpy()

    def write_back(self) -> None:
        if not self.staged:
            return
        with torch.no_grad():
            self.tensor.copy_(self.flat.view(self.tensor.shape))
        if self.tensor.is_cuda:  # pragma: no cover - no GPU here
            torch.cuda.current_stream(self.tensor.device).synchronize()


def parts(buf: npt.NDArray[np.uint8], index: int) -> list[tuple[int, npt.NDArray[np.uint8]]]:
    if buf.size == 0:
        return []
    n = -(-buf.size // MAX_PART_BYTES)
    if n > MAX_PARTS or index >= ROLE_STRIDE:
        raise UsageError(
            f"message of {buf.size} bytes (tensor {index}) exceeds "
            f"{MAX_PARTS} x {MAX_PART_BYTES} bytes"
        )
    return [
        (index + k * ROLE_STRIDE, buf[k * MAX_PART_BYTES : (k + 1) * MAX_PART_BYTES])
        for k in range(n)
    ]


def flatten(lists: list[TensorList]) -> TensorList:
    return [t for ts in lists for t in ts]


def check_tensors(tensors: TensorList, op: str) -> None:
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{op}: expected tensors, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise UsageError(f"{op}: dlcp handles dense (strided) tensors, got {t.layout}")
        if t.device.type not in ("cpu", "cuda"):
            raise UsageError(f"{op}: dlcp handles cpu and cuda tensors, got {t.device}")


FOLDS: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    ReduceOp.SUM: lambda a, b: torch.logical_or(a, b) if a.dtype == torch.bool else a + b,
    ReduceOp.AVG: lambda a, b: a + b,  # divided by the world size after the fold
    ReduceOp.PRODUCT: lambda a, b: torch.logical_and(a, b) if a.dtype == torch.bool else a * b,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.BAND: torch.bitwise_and,
    ReduceOp.BOR: torch.bitwise_or,
    ReduceOp.BXOR: torch.bitwise_xor,
}
