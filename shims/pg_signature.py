"""Signatures: every collective of the dlcp process group tells each rank it
exchanges data with what it is doing, so that cross-rank misuse is refused on
every rank instead of giving silently wrong results or a timeout.

A collective's messages are keyed by its call number and a role only: two
ranks that issue different collectives at one point (an all-reduce on one, an
all_gather on another), pass tensors of other dtypes of one byte size (int64
and float64), reduce with another op (MAX and SUM) or pass an empty tensor
where the others pass a full one would otherwise exchange bytes that fit, and
each go on with the other's data reinterpreted, or wait for a message that
never comes.

So each collective call sends one small message (its *signature*) to every
rank it sends data to, posted with the data, not before it (no round trip on
the hot path): the operation in torch.distributed's words (``all_reduce``,
``broadcast``, ...), its reduction and root where it has them, and per peer the
tensors (index, dtype, shape) it sends there and those it expects from there.
Every rank that receives data compares the sender's signature with its own:
the same operation, reduction and root, and what the sender sends matches
(dtype and number of elements) what this rank expects from it, and the other
way round. A mismatch raises :class:`CollectiveMismatch` (a
:class:`~dlcp.errors.UsageError`, so a ``ValueError``) naming both sides. It is
found as soon as the sender's signature arrives, and ends the receives this
rank waits for in that call: a rank that waits for data the peer never sends
is not held until the timeout. A rank that only sends (a broadcast's root)
waits for no signature, as its eager sends never waited for the receivers: its
receivers refuse. An empty tensor still sends its signature: an empty tensor
on every rank completes, on some ranks only it is a mismatch.

Signatures travel on a message channel of their own (:data:`SIGNATURE_CHANNEL`,
step = the call number), so they take no role from the data messages.

The check is off unless ``DLCP_CHECK_COLLECTIVES=1`` is set on every rank
(:func:`checking`): its small message per peer and call costs ~1 ms a call with
2 ranks and 3.5-6 ms with 4 on loopback (25 MB all-reduce: 20 ms, 60 ms), as
torch's own fingerprint checks are kept to ``TORCH_DISTRIBUTED_DEBUG=DETAIL``.
Off, a collective runs as before: such misuse goes unnoticed, as with Gloo.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dlcp.collectives import Communicator
from dlcp.errors import PeerTimeout, UsageError
from dlcp.io.endpoint import Received
from dlcp.proto.config import FillPolicy

__all__ = [
    "GRACE",
    "SIGNATURE_CHANNEL",
    "CollectiveMismatch",
    "Desc",
    "GroupCommunicator",
    "Op",
    "Plan",
    "Signatures",
    "checking",
    "desc",
    "everyone",
    "signed",
]

#: message-id channel of signatures (collectives 2, point-to-point 3, monitored barrier 4)
SIGNATURE_CHANNEL = 5
_MSG = SIGNATURE_CHANNEL << 12
#: seconds a collective that failed otherwise waits for the signatures it lacks, so
#: that it reports a mismatch that caused the failure (they were sent with the data)
GRACE = 2.0

#: a tensor as a signature names it: dtype (``"int64"``) and shape
Desc = tuple[str, tuple[int, ...]]
#: per peer: the tensors this rank sends there and those it expects from there,
#: as (index, Desc), in index order
Plan = Mapping[int, tuple[Sequence[tuple[int, Desc]], Sequence[tuple[int, Desc]]]]


def desc(t: torch.Tensor, shape: Sequence[int] | None = None) -> Desc:
    """``t``'s dtype and shape (or ``shape``: the part of it one peer gets)."""
    return str(t.dtype).removeprefix("torch."), tuple(t.shape if shape is None else shape)


def everyone(rank: int, size: int, d: Desc) -> Plan:
    """The plan of a call that sends ``d`` to every other rank and expects it back."""
    return {q: ([(0, d)], [(0, d)]) for q in range(size) if q != rank}


class CollectiveMismatch(UsageError):
    """Ranks issued different collectives, or passed tensors that do not match,
    at one point of a process group's call order (a ``ValueError``)."""


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _tensors(items: Sequence[tuple[int, Desc]]) -> str:
    if not items:
        return "nothing"
    words = [f"{dtype}{list(shape)}" for _, (dtype, shape) in items]
    return words[0] if len(words) == 1 else "[" + ", ".join(words) + "]"


def _agree(a: Sequence[tuple[int, Desc]], b: Sequence[tuple[int, Desc]]) -> bool:
    """The same tensors (index, dtype, number of elements): shapes may differ."""
    return len(a) == len(b) and all(
        i == j and da == db and _numel(sa) == _numel(sb)
        for (i, (da, sa)), (j, (db, sb)) in zip(a, b, strict=True)
    )


@dataclass(frozen=True, slots=True)
class Op:
    """A collective as the user called it: torch.distributed's name, the
    reduction (``"SUM"``) and root rank where it has them, ``form`` (``"sparse"``)."""

    name: str
    reduction: str | None = None
    root: int | None = None
    form: str = ""

    def words(self) -> str:
        """``all_reduce (SUM)``, ``broadcast (root rank 0)``, ``all_gather``."""
        root = f"root rank {self.root}" if self.root is not None else ""
        extra = ", ".join(w for w in (self.form, self.reduction or "", root) if w)
        return f"{self.name} ({extra})" if extra else self.name


@dataclass(frozen=True, slots=True)
class _Sig:
    op: Op
    sends: tuple[tuple[int, Desc], ...]
    expects: tuple[tuple[int, Desc], ...]

    def encode(self) -> npt.NDArray[np.uint8]:
        doc = [self.op.name, self.op.reduction, self.op.root, self.op.form,
               [[i, d, list(s)] for i, (d, s) in self.sends],
               [[i, d, list(s)] for i, (d, s) in self.expects]]  # fmt: skip
        return np.frombuffer(json.dumps(doc, separators=(",", ":")).encode(), np.uint8)

    @classmethod
    def decode(cls, data: npt.NDArray[Any]) -> _Sig:
        name, red, root, form, sends, expects = json.loads(bytes(data.view(np.uint8)))
        return cls(
            Op(name, red, root, form),
            tuple((i, (d, tuple(s))) for i, d, s in sends),
            tuple((i, (d, tuple(s))) for i, d, s in expects),
        )


def _compare(rank: int, mine: _Sig, peer: int, theirs: _Sig) -> CollectiveMismatch | None:
    """The error of a call whose signature ``mine`` met ``theirs`` from ``peer``."""
    op, other = mine.op, theirs.op
    if (op.name, op.form) != (other.name, other.form):
        return CollectiveMismatch(
            f"{op.words()} on rank {rank} met {other.words()} on rank {peer}: the ranks "
            f"issued different collectives at this point (rank {rank} passed "
            f"{_tensors(mine.sends or mine.expects)}, rank {peer} "
            f"{_tensors(theirs.sends or theirs.expects)}); every rank must issue the same "
            "collectives in the same order"
        )
    if op.reduction != other.reduction:
        return CollectiveMismatch(
            f"{op.name} on rank {rank} reduces with {op.reduction}, rank {peer} with "
            f"{other.reduction}: every rank must pass the same op"
        )
    if op.root != other.root:
        return CollectiveMismatch(
            f"{op.name} on rank {rank} names rank {op.root} as the root, rank {peer} names "
            f"rank {other.root}: every rank must name the same root"
        )
    if not _agree(theirs.sends, mine.expects):
        return CollectiveMismatch(
            f"{op.words()} on rank {rank} expects {_tensors(mine.expects)} from rank {peer}, "
            f"which sends {_tensors(theirs.sends)}: every rank must pass tensors of the same "
            "dtype and size"
        )
    if not _agree(mine.sends, theirs.expects):
        return CollectiveMismatch(
            f"{op.words()} on rank {rank} sends {_tensors(mine.sends)} to rank {peer}, which "
            f"expects {_tensors(theirs.expects)}: every rank must pass tensors of the same "
            "dtype and size"
        )
    return None


class Signatures:
    """The signature exchange of one collective call (see the module): posted
    at construction; :meth:`check` waits for the peers' signatures and raises a
    mismatch. A rank sends its signature where it sends data and receives one
    where it receives data (both, with a peer it names with neither: a
    barrier's): a rank that only sends (a broadcast's root, a gather's other
    ranks) waits for nobody, as its eager sends never did. A mismatch found
    when a signature arrives also cancels the data receives the call posted
    through a :class:`GroupCommunicator` watching it."""

    def __init__(self, comm: Communicator, call: int, op: Op, plan: Plan) -> None:
        self.comm, self.call = comm, call
        self._mine = {
            q: _Sig(op, tuple(sends), tuple(expects)) for q, (sends, expects) in plan.items()
        }
        self._lock = threading.Lock()
        self._receives: list[Future[Any]] = []  # data receives to end on a mismatch
        self.mismatch: CollectiveMismatch | None = None
        self._incoming: dict[Future[Any], int] = {}
        self._outgoing: list[Future[Any]] = []
        endpoint = comm.endpoint
        try:
            for q, sig in self._mine.items():
                if sig.expects or not sig.sends:
                    self._incoming[endpoint.recv(src=q, step=call, msg=_MSG, p=0.0)] = q
            for q, sig in self._mine.items():
                if sig.sends or not sig.expects:
                    self._outgoing.append(
                        endpoint.send(sig.encode(), to=q, step=call, msg=_MSG, p=0.0)
                    )
        except BaseException:
            self.cancel()
            raise
        for fut in self._incoming:
            fut.add_done_callback(self._arrived)

    def _arrived(self, fut: Future[Any]) -> None:
        """A peer's signature is in (the endpoint's thread: no waiting here)."""
        error = self._error(fut)
        if error is None:
            return
        with self._lock:
            if self.mismatch is not None:
                return
            self.mismatch = error
            receives, self._receives = self._receives, []
        for r in receives:  # the call's waits end now (CancelledError), not at the timeout
            r.cancel()

    def _error(self, fut: Future[Any]) -> CollectiveMismatch | None:
        if fut.cancelled() or fut.exception() is not None:
            return None
        q = self._incoming[fut]
        try:
            theirs = _Sig.decode(fut.result().data)
        except (ValueError, TypeError) as exc:  # (not a signature: an older peer?)
            return CollectiveMismatch(
                f"rank {self.comm.rank}: unreadable signature from rank {q}: {exc}"
            )
        return _compare(self.comm.rank, self._mine[q], q, theirs)

    def track(self, fut: Future[Any]) -> None:
        """A data receive of the call: cancelled on a mismatch."""
        with self._lock:
            if self.mismatch is None:
                self._receives.append(fut)
                return
        fut.cancel()

    def check(self) -> None:
        """Wait for every peer's signature (the communicator's timeout), raise
        the first mismatch or a signature's failure; then for this rank's own."""
        limit = self.comm.timeout + self.comm.BACKSTOP_MARGIN
        self._raise_mismatch(limit, strict=True)
        for fut in self._outgoing:
            self.comm.wait(fut)

    def mismatch_within(self, seconds: float) -> CollectiveMismatch | None:
        """The mismatch found by the signatures that arrive within ``seconds``."""
        try:
            self._raise_mismatch(seconds, strict=False)
        except CollectiveMismatch as exc:
            return exc
        return None

    def _raise_mismatch(self, seconds: float, *, strict: bool) -> None:
        deadline = time.monotonic() + seconds
        pending = set(self._incoming)
        while True:
            if self.mismatch is not None:
                raise self.mismatch
            if not pending:
                return
            done, pending = wait_futures(
                pending,
                timeout=max(deadline - time.monotonic(), 0.0),
                return_when="FIRST_COMPLETED",
            )
            for fut in done:  # (the callback may not have run yet: look here too)
                error = self._error(fut)
                if error is not None:
                    raise error
                if strict:
                    self.comm.wait(fut)  # a failed one raises its error (a timeout, say)
            if not done:
                if strict:  # (the endpoint fails them at its timeout: a backstop)
                    for fut in pending:
                        self.comm.wait(fut)
                return

    def cancel(self) -> None:
        """The call failed: stop waiting for signatures (this rank's own still go)."""
        for fut in self._incoming:
            fut.cancel()


class GroupCommunicator(Communicator):
    """The process group's communicator: its receives are tracked by the
    signature exchange it watches (:meth:`watching`), so that a mismatch ends
    them at once."""

    _watched: Signatures | None = None

    @contextlib.contextmanager
    def watching(self, signatures: Signatures) -> Iterator[None]:
        self._watched = signatures
        try:
            yield
        finally:
            self._watched = None

    def recv(
        self,
        out: npt.NDArray[Any],
        *,
        src: int,
        call: int,
        role: int,
        p: float,
        fill: FillPolicy,
        accumulate: bool = False,
    ) -> Future[Received]:
        fut = super().recv(
            out, src=src, call=call, role=role, p=p, fill=fill, accumulate=accumulate
        )
        watched = self._watched
        if watched is not None:
            watched.track(fut)
        return fut


def checking() -> bool:
    """Whether collectives exchange signatures: ``DLCP_CHECK_COLLECTIVES`` is
    ``1`` (it must be on every rank or none); any value but ``0``, ``1`` or
    nothing is refused by name."""
    raw = os.environ.get("DLCP_CHECK_COLLECTIVES", "").strip()
    if raw not in ("", "0", "1"):
        raise UsageError(f"DLCP_CHECK_COLLECTIVES={raw!r}: expected 1 (check) or 0 (do not)")
    return raw == "1"


@contextlib.contextmanager
def signed(comm: Communicator, call: int, op: Op, plan: Plan) -> Iterator[Signatures | None]:
    """Run a collective call's data exchange inside: with :func:`checking`, its
    signatures are posted before, checked after (a mismatch is raised instead of
    the error of the data it spoilt, and ends the waits of a
    :class:`GroupCommunicator`'s receives); else nothing is added."""
    if not checking():
        yield None
        return
    sigs = Signatures(comm, call, op, plan)
    watch = comm.watching(sigs) if isinstance(comm, GroupCommunicator) else contextlib.nullcontext()
    try:
        with watch:
            yield sigs
        sigs.check()
    except Exception as exc:
        sigs.cancel()
        if isinstance(exc, CollectiveMismatch):
            raise
        # (a timeout: the peer did not come, nor will its signature; look at those in)
        mismatch = sigs.mismatch_within(0.0 if isinstance(exc, PeerTimeout) else GRACE)
        if mismatch is not None:
            raise mismatch from exc
        raise
    except BaseException:
        sigs.cancel()
        raise
