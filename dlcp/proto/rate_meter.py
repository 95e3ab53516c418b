"""The receiver's side of rate control: how fast each sender's data arrives.

:class:`RateMeter` measures it; the receiver reports it to the sender in a
``RateFeedback`` control message, and the sender's pacer
(:mod:`dlcp.proto.pacing`) follows it. The rules of :mod:`dlcp.proto.pacing`
hold here too: no I/O, no clock (``now`` is passed in), rates in bytes per
second, bad input a :class:`~dlcp.errors.UsageError` naming the argument.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import NDArray

from ..errors import UsageError
from .pacing import _check_nbytes, _check_now

__all__ = ["RateMeter"]

#: the weight of a window's aggregate rate in the smoothed one a shared report's
#: step is decided by, and how much the highest smoothed rate decays per window
_SMOOTHING: Final = 0.25
_PEAK_DECAY: Final = 0.002


class RateMeter:
    """Receive rate per source, measured over consecutive intervals.

    A window opens with the first bytes after an idle spell and is due
    ``interval`` seconds later; :meth:`sample` reports bytes/s per source over
    the time elapsed since the window opened (only sources that sent in it) and
    opens the next window at once if anything arrived, so a steady stream is
    measured without gaps. With nothing received, no window is open and
    :meth:`next_deadline` is None.

    What is reported is the rate the receiver could take, not only the rate it
    saw: a driver that knows how long its receive loop sat idle (waiting for
    datagrams) says so with :meth:`on_idle`, and the rate is measured over the
    busy time only. A receiver that is busy all the time reports what arrived; one
    that waits half the time could take twice that, and says so, so that a sender
    is not held to the rate its own pacing produced. ``min_busy`` caps the claim
    (at most ``1 / min_busy`` times the rate seen, twice by default): a receiver
    process that was descheduled while it waited counts that time as idle too, so
    the claim must stay modest.

    The claim says nothing of the path, though: a receiver idle because the link
    in front of it is slow would invite its sender to twice that link's rate, lose
    a third of a round there, and do it again after every cut. So a source whose
    data the receiver found missing (it sent a NACK: :meth:`withhold_claim`) is
    told what arrived, without the claim, for ``claim_hold`` seconds after.

    Several sources in one window share whatever lies in front of the receiver
    (its switch port, in an incast), and a receiver that waits then says nothing
    about that: each is reported an equal share of what all of them brought,
    over the whole window, without the idle claim, and the senders take it as a
    cap (RATE's ``SHARED`` flag; :attr:`shared` says whether the last
    :meth:`sample` was of such a window). A sender its pacer had cut below its
    share is told it may climb to it, one above it that it is ahead. The share
    moves by a step: what all sources brought, smoothed over windows, is compared
    with the highest such rate the receiver has seen (which decays by a fifth of a
    percent a window): below ``saturated`` times that, the port in front had room
    and the shares are ``1 + share_probe`` times what they brought, so together
    the senders probe for more; at or above it, the port is full and they are
    ``1 - share_drain`` times it, so its queue drains instead of growing until it
    drops. (Shares of exactly what they brought drifted down: a window that
    measured less lowered every cap, and none measured more than the port.)

    A driver that knows which sources have messages under way says how many do,
    and when (:meth:`senders_under_way`), and then a window is shared only if two
    or more did for at least ``together`` (a fraction) of the window's time in
    which any did: sources that came one after the other (a halving-doubling
    all-reduce hears from one partner, and once that message has completed, from
    the next) share nothing in front of the receiver. What they brought over the
    window is mostly the gap between their messages, and as a cap it held them
    there: on the loopback, small halving-doubling all-reduces were paced at 3-30
    MB/s and took 3.7 times as long as unpaced. Each source of such a window is
    told its own rate, as a lone source is. A partner one step ahead overlaps the
    other's message only briefly (its message opens as the other's completes), and
    a window with any overlap at all was shared as often as not: small
    halving-doubling calls still took twice their unpaced time. (The arrival times
    of the datagrams cannot tell: the receive loop hands them over a call at a
    time, and at 50 Mbit/s the pushes of an incast's workers then look one after
    the other; the messages under way, which last as long as the pushes, can.)

    Such a driver may also give a steady lone source a longer window
    (``lone_interval``): a window lasts ``lone_interval`` when at most one source
    has messages under way and the last window's report to it moved less than
    ``steady`` (a fraction) from the one before, and ``interval`` otherwise: while
    several sources share the receiver (their shares move a step a window, and an
    incast's port fills within a few), and while a lone source's rate moves (a
    sender climbs a step a report, and follows the receiver down a report at a
    time: told four times less often, a ring under 1 % loss at 50 Mbit/s took
    4-18 % longer an iteration, an incast 2-5 %). A long window is cut to ``interval`` from its
    start when a second source's message comes under way. Each window's deadline
    wakes the receiver's driver, whose turns cost the receiver's CPU whether or
    not the rate moved. Without ``lone_interval`` every window lasts ``interval``.
    """

    __slots__ = (
        "_any_time",
        "_both_time",
        "_bytes",
        "_heard",
        "_idle",
        "_mark",
        "_peak",
        "_plain_until",
        "_smooth",
        "_start",
        "_steady",
        "_told",
        "_under_way",
        "claim_hold",
        "deadline",
        "interval",
        "lone_interval",
        "measured",
        "min_busy",
        "saturated",
        "share_drain",
        "share_probe",
        "shared",
        "steady",
        "together",
    )

    def __init__(
        self,
        interval: float = 100e-6,
        *,
        min_busy: float = 0.5,
        claim_hold: float = 1.0,
        share_probe: float = 0.05,
        share_drain: float = 0.01,
        saturated: float = 0.97,
        lone_interval: float | None = None,
        steady: float = 0.1,
        together: float = 0.5,
    ) -> None:
        if not (math.isfinite(interval) and interval > 0):
            raise UsageError(f"interval={interval} must be a finite duration > 0 seconds")
        lone = interval if lone_interval is None else lone_interval
        if not (math.isfinite(lone) and lone >= interval):
            raise UsageError(
                f"lone_interval={lone_interval} must be a finite duration >= "
                f"interval ({interval} s)"
            )
        if not 0.0 < min_busy <= 1.0:
            raise UsageError(f"min_busy={min_busy} outside (0, 1]")
        if not (math.isfinite(claim_hold) and claim_hold >= 0):
            raise UsageError(f"claim_hold={claim_hold} must be a finite duration >= 0 seconds")
        self.interval = float(interval)
        self.lone_interval = float(lone)
        if not 0.0 <= steady < 1.0:
            raise UsageError(f"steady={steady} outside [0, 1)")
        self.steady = float(steady)
        if not 0.0 < together <= 1.0:
            raise UsageError(f"together={together} outside (0, 1]")
        self.together = float(together)
        #: whether the last window was lone and its report moved less than steady
        self._steady = False
        #: the lone source last reported and its rate then (None: none yet)
        self._told: tuple[int, float] | None = None
        #: seconds the window :meth:`sample` measured last lasted (0: none yet)
        self.measured = 0.0
        self.min_busy = float(min_busy)
        self.claim_hold = float(claim_hold)
        steps = (("share_probe", share_probe), ("share_drain", share_drain),
                 ("saturated", saturated))  # fmt: skip
        for name, value in steps:
            if not 0.0 <= value < 1.0:
                raise UsageError(f"{name}={value} outside [0, 1)")
        self.share_probe = float(share_probe)
        self.share_drain = float(share_drain)
        self.saturated = float(saturated)
        #: source -> until when its reports carry no idle claim (withhold_claim)
        self._plain_until: dict[int, float] = {}
        self._start: float | None = None
        #: when the current window is due (None: none is open); what
        #: :meth:`next_deadline` says, for a caller that asks every turn
        self.deadline: float | None = None
        self._bytes: dict[int, int] = {}
        self._idle = 0.0
        self._peak = 0.0
        self._smooth: float | None = None
        #: whether the window :meth:`sample` measured last had several sources
        self.shared = False
        #: how many sources have messages under way, as the driver last said
        #: (None: it never says, and every window with several sources is shared)
        self._under_way: int | None = None
        #: seconds of this window in which one source or more had messages under
        #: way, and two or more, up to the time of the last change (_mark)
        self._any_time = 0.0
        self._both_time = 0.0
        self._mark = -math.inf
        #: the latest time a call said (a change without a time is taken as then)
        self._heard = -math.inf

    def __repr__(self) -> str:
        return f"RateMeter(interval={self.interval}, window_start={self._start})"

    def _window(self) -> float:
        """How long the window opening now lasts: ``lone_interval`` while at most
        one source has messages under way and its rate was steady, else ``interval``."""
        if self._under_way is None or self._under_way > 1 or not self._steady:
            return self.interval
        return self.lone_interval

    def _open(self, now: float) -> None:
        if self._start is None:
            self._start = now
            self.deadline = now + self._window()

    def on_bytes(self, src: int, nbytes: int, *, now: float) -> None:
        """``nbytes`` arrived from ``src`` at ``now``."""
        if isinstance(src, bool) or not isinstance(src, int | np.integer) or src < 0:
            raise UsageError(f"src={src!r} must be a non-negative integer")
        self.count(int(src), _check_nbytes(nbytes), now=_check_now(now))

    def count(self, src: int, nbytes: int, *, now: float) -> None:
        """:meth:`on_bytes` for a caller whose arguments are checked already (the
        receive side: a rank and a byte count of its own, the driver's finite
        time), without checking them again (once per message per receive step)."""
        self._open(now)
        if now > self._heard:
            self._heard = now
        try:
            self._bytes[src] += nbytes
        except KeyError:  # (its first bytes in this window)
            self._bytes[src] = nbytes

    def on_batch(
        self, srcs: NDArray[np.integer], nbytes: NDArray[np.integer], *, now: float
    ) -> None:
        """A batch of datagrams arrived at ``now``: ``nbytes[i]`` from ``srcs[i]``."""
        s = np.asarray(srcs)
        b = np.asarray(nbytes)
        if s.shape != b.shape or s.ndim != 1:
            raise UsageError(
                f"srcs and nbytes must be 1-D of equal length, got shapes {s.shape} and {b.shape}"
            )
        now = _check_now(now)
        if s.size == 0:
            return
        if not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(b.dtype, np.integer)):
            raise UsageError(f"srcs and nbytes must be integers, got {s.dtype} and {b.dtype}")
        if int(s.min()) < 0 or int(b.min()) < 0:
            raise UsageError("srcs and nbytes must be non-negative")
        uniq, inverse = np.unique(s, return_inverse=True)
        totals = np.bincount(inverse.reshape(-1), weights=b, minlength=len(uniq))
        self._open(now)
        if now > self._heard:
            self._heard = now
        for src, total in zip(uniq.tolist(), totals.tolist(), strict=True):
            self._bytes[src] = self._bytes.get(src, 0) + int(total)

    def on_idle(self, seconds: float, *, now: float) -> None:
        """The receiver waited the ``seconds`` up to ``now`` for datagrams; only the
        part inside the current window counts."""
        # (plain comparisons, false for NaN: a driver calls this every turn)
        if not 0.0 <= seconds < math.inf:
            raise UsageError(f"seconds={seconds} must be a finite duration >= 0")
        if not -math.inf < now < math.inf:
            raise UsageError(f"now={now} must be a finite time in seconds")
        if now > self._heard:
            self._heard = now
        if self._start is not None:
            inside = now - self._start
            if seconds < inside:
                inside = seconds
            if inside > 0.0:
                self._idle += inside

    def senders_under_way(self, n: int, *, now: float | None = None) -> None:
        """``n`` sources have messages under way from ``now`` on (the driver says so
        whenever the number changes; None: the latest time any call said): a window
        is shared only if two or more did for ``together`` of the time any did
        (class doc)."""
        if now is not None and not -math.inf < now < math.inf:
            raise UsageError(f"now={now} must be a finite time in seconds")
        self._accrue(self._heard if now is None else now)
        self._under_way = n
        if n > 1 and self._start is not None:  # (a lone window: cut to a shared one's length)
            due = self._start + self.interval
            if self.deadline is None or due < self.deadline:
                self.deadline = due

    def _accrue(self, now: float) -> None:
        """The time since the last change, at the number under way then, counted
        for the window (from its start, if it opened since)."""
        start, n = self._start, self._under_way
        if start is not None and n:
            since = self._mark if self._mark > start else start
            if now > since:
                self._any_time += now - since
                if n > 1:
                    self._both_time += now - since
        if now > self._mark:
            self._mark = now
        if now > self._heard:
            self._heard = now

    def withhold_claim(self, src: int, *, now: float) -> None:
        """Data from ``src`` went missing (the receiver NACKs it): report to it what
        arrives, without the idle claim, until ``claim_hold`` seconds from ``now``."""
        self._plain_until[src] = now + self.claim_hold

    def _busy(self, src: int, elapsed: float, now: float) -> float:
        """The time a lone ``src``'s bytes are measured over: the window's busy
        part (the idle claim, at most ``1 / min_busy``), or all of it while its
        claim is withheld."""
        plain = self._plain_until.get(src)
        if plain is not None and now >= plain:
            del self._plain_until[src]
            plain = None
        if plain is not None:
            return elapsed
        return max(elapsed - self._idle, self.min_busy * elapsed)

    def due(self, *, now: float) -> bool:
        """Whether the current window has lasted ``interval``."""
        deadline = self.next_deadline()
        return deadline is not None and _check_now(now) >= deadline

    def next_deadline(self) -> float | None:
        """When the current window is due; None when nothing is being measured."""
        return self.deadline

    def _note_steady(self, rates: dict[int, float]) -> None:
        """Whether the window :meth:`sample` measured says the next may be long: one
        source, not shared, reported within ``steady`` of what it was told last."""
        if self.shared or len(rates) != 1:
            self._steady, self._told = False, None
            return
        ((src, rate),) = rates.items()
        told = self._told
        self._steady = (
            told is not None and told[0] == src and abs(rate - told[1]) < self.steady * told[1]
        )
        self._told = (src, rate)

    def sample(self, *, now: float) -> dict[int, float]:
        """Bytes/s per source since the window opened, and start the next window.

        Sampling before any time has elapsed returns ``{}`` and keeps the window.
        """
        now = _check_now(now)
        if self._start is None:
            return {}
        elapsed = now - self._start
        if elapsed <= 0:
            return {}
        self._accrue(now)
        together = self._both_time > 0.0 and self._both_time >= self.together * self._any_time
        self.shared = len(self._bytes) > 1 and (self._under_way is None or together)
        rates: dict[int, float] = {}
        if self._bytes:
            total = sum(self._bytes.values()) / elapsed
            smooth = total if self._smooth is None else self._smooth
            smooth += _SMOOTHING * (total - smooth)
            self._smooth = smooth
            self._peak = max(smooth, self._peak * (1.0 - _PEAK_DECAY))
            if self.shared:
                full = smooth >= self.saturated * self._peak
                step = 1.0 - self.share_drain if full else 1.0 + self.share_probe
                rates = dict.fromkeys(self._bytes, total / len(self._bytes) * step)
            else:  # (one source, or several one after the other)
                rates = {src: n / self._busy(src, elapsed, now) for src, n in self._bytes.items()}
        self._note_steady(rates)
        self.measured = elapsed
        self._start = now if self._bytes else None
        self.deadline = None if self._start is None else now + self._window()
        self._bytes = {}
        self._idle = 0.0
        self._any_time = self._both_time = 0.0
        # (counted from here on: a time said earlier from another clock cannot hold it)
        self._mark = self._heard = now
        return rates


# --------------------------------------------------------------------------- registry

