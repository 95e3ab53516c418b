"""Rate control: the sender-side pacers (the receiver's meter: dlcp.proto.rate_meter).

DLCP's rate control is deliberately minimal (as in the MLT prototype): the
receiver measures how fast it receives from each sender
(:class:`~dlcp.proto.rate_meter.RateMeter`) every interval and feeds that back
in a ``RateFeedback`` control message; the
sender paces to a little more than the reported rate
(:class:`ReceiverDrivenPacer`), so it probes upward when the path has room and
follows the receiver down when it does not.

A reported rate is only trusted to *lower* the sending rate when the sender was
actually limited by the pacer during the reporting interval. A sender that was
idle (computing, or out of data) sends little, the receiver measures little,
and taking that as the path's capacity would collapse the rate for no reason.
The pacer therefore keeps, since the last feedback, the tokens it accrued and
how many of them it threw away because the bucket was full: a lower rate is
accepted only if the sender said it was backlogged and used at least
``used_fraction`` of what it was allowed. Higher rates are always accepted.

The reported rate measures the receiver, not the network: a receiver that
waits for datagrams says it could take more
(:meth:`~dlcp.proto.rate_meter.RateMeter.on_idle`), which
lets a sender fill a fast path whose receiver is the bottleneck but cannot see
a slower link between the two. Loss can: when a transmission round of a
message ends (FINISH answered by a NACK, or by a STOP after it), the sender
knows what fraction of the round's chunks never arrived, and tells its pacer
(:meth:`Pacer.on_loss`). More than ``loss_tolerance`` of them lost is
congestion: the pacer falls to what got through, a little less (``backoff``;
at most halving the rate the round was sent at), and from then on, idle spells
included, raises its rate by at most ``probe`` per ``probe_interval``,
only while it was held back by the pacer (a sender between messages says
nothing about the path: raised then, it sent the next message into the
switch's queue at up to twice what the path carried), and no higher than a
ceiling just below the rate that lost (which each round that is not congested
at the ceiling raises by ``ceiling_step``) or a ``probe`` step above the
receiver's report, whichever is more; held back above both, it falls to them.
A receiver several senders share reports each an equal share of what they
brought together (:class:`~dlcp.proto.rate_meter.RateMeter`), and says so: the
senders of an incast take their shares as caps while they share its port (at
the rate each had alone, or a probe step above its share, they filled the
port's queue until it dropped), and a message sent after an
idle spell starts at the rate the last one ended at rather than at
``initial_rate`` (docs/testbed.md, "incast at 50 Mbit/s"). Random loss of a
percent or two is not congestion and changes nothing.

A switch that drops selectively (``dlcp.switch.policy``: drop-eligible packets
once a class's queue holds more than its threshold, protected ones only when the
queue is full) says more: loss that falls on drop-eligible chunks far more than
on protected ones is its queue overflowing the threshold, where random loss hits
both classes alike. :func:`queue_signal` tells the two apart from each class's
lost fraction, and a round it calls a queue's (``on_loss(..., queue=True)``)
backs the pacer off however little it lost: a sender that only reacted above
``loss_tolerance`` ran at 1.1-1.9 times what the testbed's ports carried and
lost 1.2-1.8 % of its gradient values (docs/testbed.md, "Pacing against the
drop-eligible threshold"). What a round's STOP reports missing is all
drop-eligible (completing short of every element needs every protected chunk),
so with random loss alone a first round that completes says "drop-eligible
only" too: above :data:`QUEUE_TOLERANCE` of its drop-eligible chunks, random
loss backs the pacer off as well.

Rules of this module (it is part of the sans-I/O core):

* no I/O, no threads, and **no clock**: every method that depends on time
  takes a keyword-only ``now`` (seconds, any fixed origin, non-decreasing;
  a ``now`` earlier than one already seen is treated as no time passing);
* rates are bytes per second, sizes bytes;
* bad input raises :class:`ValueError` naming the argument and the value.
"""

from __future__ import annotations

import math
from typing import Final, Protocol

import numpy as np

from ..errors import UsageError

__all__ = [
    "MIN_BURST",
    "QUEUE_RATIO",
    "QUEUE_TOLERANCE",
    "UNLIMITED",
    "Pacer",
    "ReceiverDrivenPacer",
    "queue_signal",
]

#: what an unpaced sender is allowed to send at once (bytes)
UNLIMITED: Final = 2**62
#: the least burst (bytes) a congested pacer allows: eleven 1500-byte packets
MIN_BURST: Final = 16 * 1024
#: a round whose drop-eligible chunks lost more than this fraction, ...
QUEUE_TOLERANCE: Final = 0.02
#: ... and at least this many times the fraction of its protected chunks lost,
#: overflowed a switch's drop-eligible threshold (:func:`queue_signal`)
QUEUE_RATIO: Final = 4.0
#: least slack for floating-point rounding when comparing tokens with a size (bytes)
_EPS: Final = 1e-6
#: the most ``probe`` steps one report's raise takes (a report measured over several
#: ``probe_interval``: a receiver that hears from one sender reports less often)
MAX_PROBE_STEPS: Final = 8


class Pacer(Protocol):
    """Sender-side rate control (sans-I/O)."""

    @property
    def rate(self) -> float:
        """Bytes per second currently allowed (``math.inf`` = unpaced)."""
        ...

    @property
    def burst(self) -> int:
        """Bytes that may go back to back (a sender cuts its batches to this)."""
        ...

    def allowance(self, *, now: float) -> int:
        """Bytes that may be sent at ``now``."""
        ...

    def on_sent(self, nbytes: int, *, now: float) -> None:
        """``nbytes`` were sent at ``now``."""
        ...

    def next_send_time(self, nbytes: int, *, now: float) -> float:
        """Earliest time ``nbytes`` may be sent (``now`` when they may go now).

        Calling this says the sender has ``nbytes`` waiting.
        """
        ...

    def note_backlogged(self, *, now: float) -> None:
        """The sender has data waiting that the pacer holds back."""
        ...

    def on_feedback(
        self, bytes_per_s: float, *, now: float, shared: bool = False, window: float = 0.0
    ) -> None:
        """The receiver reported this receive rate; ``shared``: it is this sender's
        share of a window several senders sent in (a cap while they share);
        ``window``: the seconds it measured over (0: not known)."""
        ...

    def on_loss(
        self, lost_fraction: float, send_rate: float, *, now: float, queue: bool = False
    ) -> None:
        """A transmission round sent at ``send_rate`` bytes/s lost this fraction
        of its chunks on the way; ``queue``: the loss fell on the drop-eligible
        chunks (:func:`queue_signal`), a switch's queue overflowing its threshold."""
        ...


def queue_signal(eligible_lost: float, protected_lost: float) -> bool:
    """Whether a round that lost these fractions of its drop-eligible and of its
    protected chunks overflowed a selectively dropping switch's threshold: more
    than :data:`QUEUE_TOLERANCE` of the drop-eligible chunks lost, and at least
    :data:`QUEUE_RATIO` times the protected chunks' fraction. Random loss hits both
    classes alike and is not a queue's (a round without drop-eligible chunks, or
    sent protected as retransmissions are, has ``eligible_lost`` 0)."""
    for name, value in (("eligible_lost", eligible_lost), ("protected_lost", protected_lost)):
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"{name}={value} outside [0, 1]")
    return eligible_lost > QUEUE_TOLERANCE and eligible_lost >= QUEUE_RATIO * protected_lost


def _check_now(now: float) -> float:
    if not math.isfinite(now):
        raise UsageError(f"now={now} must be a finite time in seconds")
    return float(now)


def _check_nbytes(nbytes: int) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 0:
        raise UsageError(f"nbytes={nbytes!r} must be a non-negative integer")
    return int(nbytes)


def _check_reported(bytes_per_s: float) -> float:
    if not (math.isfinite(bytes_per_s) and bytes_per_s >= 0):
        raise UsageError(f"bytes_per_s={bytes_per_s} must be a finite rate >= 0")
    return float(bytes_per_s)


def _check_loss(lost_fraction: float, send_rate: float) -> tuple[float, float]:
    if not 0.0 <= lost_fraction <= 1.0:
        raise UsageError(f"lost_fraction={lost_fraction} outside [0, 1]")
    if not (math.isfinite(send_rate) and send_rate > 0):
        raise UsageError(f"send_rate={send_rate} must be a finite rate > 0")
    return float(lost_fraction), float(send_rate)


class ReceiverDrivenPacer:
    """Token bucket whose rate follows the receiver's measured receive rate.

    Tokens (bytes) accrue at :attr:`rate` up to ``burst_bytes``, so a sender is
    never more than one burst ahead of the rate; the bucket starts full. A send
    may overdraw the bucket (a batch larger than the allowance): the debt is
    paid before anything else may go, so the long-run rate holds.

    :meth:`on_feedback` sets ``rate = clamp(gain * reported, min_rate, max_rate)``
    when that raises the rate, and when it lowers it only if the sender was
    backlogged (:meth:`note_backlogged`, a :meth:`next_send_time` that had to
    wait, or an :meth:`on_sent` that left less than another such send) *and*
    used at least ``used_fraction`` of the tokens it accrued since the previous
    feedback. After ``idle_reset`` seconds without sending or waiting, the rate
    of a pacer that has not met congestion returns to ``initial_rate``.

    A sender told by :meth:`next_send_time` to wait until ``t`` that comes back
    late (a driver's timer fires on a millisecond grid: ``epoll`` rounds its
    timeout up to whole milliseconds) keeps the tokens earned after ``t``, for up
    to ``max_lateness`` seconds (later than that, it was idle): the bucket may
    then hold one burst plus the lateness times the rate. Otherwise a
    rate whose burst lasts less than the timer's resolution would be capped at
    one burst per wake-up (512 KB per millisecond is 0.5 GB/s), whatever the
    receiver reported.

    :meth:`on_loss` (module doc): a round that lost more than ``loss_tolerance``
    of its chunks, or any that a switch's queue lost (``queue``) however little,
    sets ``rate = send_rate * max(max_cut, backoff * (1 - lost))`` if that is
    lower, and a ceiling: ``rate_before * max(max_cut, backoff * (1 - lost))``
    (the rate the pacer allowed, not the round's measured one, which a sender
    slowed by its CPU keeps below it while its bursts still go at it), at least
    the new rate and never higher than the ceiling before. Once there is a
    ceiling, a queue's loss cuts ``rate_before`` too, for the same reason. A
    round that was not congested (it lost no more than ``loss_tolerance``, and
    not to a queue) while the rate was at the ceiling raises the ceiling by
    ``ceiling_step``. From then on, through idle spells too, a raise is at most
    ``1 + probe`` times the rate and at most the ceiling or ``1 + probe`` times
    the reported rate, whichever is more (the limit), once per
    ``probe_interval`` seconds (a report measured over a window of several, from
    a receiver that hears from one sender, raises by a step for each interval
    the window spans since the last raise, at most :data:`MAX_PROBE_STEPS`), and
    only when the sender was held back by the
    pacer since the previous feedback (as for lowering the rate), a burst
    (:attr:`burst`) holds only
    ``cautious_burst`` seconds at the rate (and a late wake-up adds at most half
    of that), and feedback lowers the rate only to the limit, when the sender was
    held back above it (a window of the receiver's that caught the start or the
    end of a message reports less than the path carries, but the sender was not
    held back through it, and the limit is never below the ceiling).

    A shared report (``on_feedback(..., shared=True)``: the receiver's window had
    several senders, and this is each one's share of what they brought, a step
    above or below it as the receiver's port has room or not:
    :class:`~dlcp.proto.rate_meter.RateMeter`) caps the rate at it while they
    share, whatever the gain, the probe or the ceiling would allow, and whether or
    not the sender was held back: senders that meet at one receiver, each at the
    rate it had alone, fill its port at the sum of their rates until they slow
    down. The rate the cap replaced is held and comes back (or what feedback made
    of it since, if more) with the next report that is not shared, ``share_hold``
    seconds after the last shared one, or when the sender goes idle; loss drops
    it. A shared report above the rate brings a held rate back up to it at most,
    and otherwise raises as a report does, never above it.

    ``burst_time`` (seconds, 0 = off) caps a burst at that long at the rate (at
    least ``MIN_BURST``, at most ``burst_bytes``) at all times: a driver that
    wakes when told (the native engine) sends a slow path short bursts that
    its switch queues absorb, and a fast one bursts long enough to keep its
    wake-ups few. A driver that wakes on a millisecond grid needs the long
    burst of ``burst_bytes`` instead.
    """

    __slots__ = (
        "_backlogged",
        "_budget",
        "_cautious",
        "_ceiling",
        "_due",
        "_held",
        "_held_at",
        "_last",
        "_last_active",
        "_raised_at",
        "_rate",
        "_tokens",
        "_wasted",
        "backoff",
        "burst_bytes",
        "burst_time",
        "cautious_burst",
        "ceiling_step",
        "gain",
        "idle_reset",
        "initial_rate",
        "loss_tolerance",
        "max_cut",
        "max_lateness",
        "max_rate",
        "min_rate",
        "probe",
        "probe_interval",
        "share_hold",
        "used_fraction",
    )

    def __init__(
        self,
        initial_rate: float,
        min_rate: float,
        max_rate: float = math.inf,
        burst_bytes: int = 64 * 1024,
        *,
        gain: float = 1.25,
        idle_reset: float = 1.0,
        used_fraction: float = 0.9,
        max_lateness: float = 0.005,
        loss_tolerance: float = 0.05,
        backoff: float = 0.9,
        max_cut: float = 0.5,
        probe: float = 0.05,
        probe_interval: float = 0.005,
        cautious_burst: float = 0.002,
        burst_time: float = 0.0,
        ceiling_step: float = 0.005,
        share_hold: float = 0.02,
    ) -> None:
        if not (math.isfinite(min_rate) and min_rate > 0):
            raise UsageError(f"min_rate={min_rate} must be a finite rate > 0")
        if not max_rate >= min_rate:
            raise UsageError(f"max_rate={max_rate} must be >= min_rate={min_rate}")
        if not (math.isfinite(initial_rate) and min_rate <= initial_rate <= max_rate):
            raise UsageError(
                f"initial_rate={initial_rate} must be finite and within "
                f"[min_rate={min_rate}, max_rate={max_rate}]"
            )
        if isinstance(burst_bytes, bool) or not isinstance(burst_bytes, int) or burst_bytes < 1:
            raise UsageError(f"burst_bytes={burst_bytes!r} must be a positive integer")
        if not (math.isfinite(gain) and gain > 0):
            raise UsageError(f"gain={gain} must be a finite factor > 0")
        if not idle_reset > 0:
            raise UsageError(f"idle_reset={idle_reset} must be > 0 seconds (math.inf: never)")
        if not 0.0 <= used_fraction <= 1.0:
            raise UsageError(f"used_fraction={used_fraction} outside [0, 1]")
        if not (math.isfinite(max_lateness) and max_lateness >= 0):
            raise UsageError(f"max_lateness={max_lateness} must be a finite duration >= 0")
        for name, value in (("loss_tolerance", loss_tolerance), ("backoff", backoff),
                            ("max_cut", max_cut)):  # fmt: skip
            if not 0.0 < value < 1.0:
                raise UsageError(f"{name}={value} outside (0, 1)")
        if not (math.isfinite(probe) and probe > 0):
            raise UsageError(f"probe={probe} must be a finite fraction > 0")
        if not (math.isfinite(ceiling_step) and ceiling_step >= 0):
            raise UsageError(f"ceiling_step={ceiling_step} must be a finite fraction >= 0")
        for name, value in (("probe_interval", probe_interval),
                            ("cautious_burst", cautious_burst),
                            ("burst_time", burst_time),
                            ("share_hold", share_hold)):  # fmt: skip
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name}={value} must be a finite duration >= 0")
        self.initial_rate = float(initial_rate)
        self.min_rate = float(min_rate)
        self.max_rate = float(max_rate)
        self.burst_bytes = burst_bytes
        self.gain = float(gain)
        self.idle_reset = float(idle_reset)
        self.used_fraction = float(used_fraction)
        self.max_lateness = float(max_lateness)
        self.loss_tolerance = float(loss_tolerance)
        self.backoff = float(backoff)
        self.max_cut = float(max_cut)
        self.probe = float(probe)
        self.probe_interval = float(probe_interval)
        self.cautious_burst = float(cautious_burst)
        self.burst_time = float(burst_time)
        self.ceiling_step = float(ceiling_step)
        self.share_hold = float(share_hold)
        self._rate = self.initial_rate
        self._cautious = False  # congestion seen since the sender was last idle
        self._ceiling = math.inf  # what got through the last congested round
        self._raised_at = 0.0  # when a cautious raise was last taken
        self._tokens = float(self.burst)  # (the bucket starts full)
        self._last: float | None = None  # time the bucket was last brought up to date
        self._last_active: float | None = None  # last send or wait
        self._backlogged = False  # since the last feedback
        self._budget = 0.0  # tokens accrued since the last feedback
        self._wasted = 0.0  # of those, thrown away by a full bucket
        self._due: float | None = None  # when next_send_time last told the sender to send
        self._held: float | None = None  # the rate a shared report's cap replaced
        self._held_at = 0.0  # when the last shared report capped it

    def __repr__(self) -> str:
        return (
            f"ReceiverDrivenPacer(rate={self._rate:.6g}, tokens={self._tokens:.6g}, "
            f"burst_bytes={self.burst_bytes})"
        )

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> int:
        """``burst_bytes`` (or ``burst_time`` seconds at the rate, if set); after
        congestion, at most ``cautious_burst`` seconds at the rate (at least
        ``MIN_BURST``, at most ``burst_bytes``): a burst longer than a switch's
        queue is lost in part however slow the average."""
        cap = self.burst_bytes
        if self.burst_time > 0:
            cap = int(min(cap, max(MIN_BURST, self._rate * self.burst_time)))
        if not self._cautious:
            return cap
        return int(min(cap, max(MIN_BURST, self._rate * self.cautious_burst)))

    @property
    def tokens(self) -> float:
        """Bytes in the bucket as of the last call (negative while in debt)."""
        return self._tokens

    def _advance(self, now: float) -> None:
        now = _check_now(now)
        if self._last is None:
            self._last = now
            return
        dt = now - self._last
        if dt <= 0:
            return
        earned = self._rate * dt
        cap = float(self.burst)
        if self._due is not None and now > self._due:
            if now - self._due <= self.max_lateness:  # a late wake-up keeps its tokens
                # (after congestion, half a burst's worth at most: a late turn must
                # not send the queue-sized burst the caution is there to avoid)
                late = now - self._due
                cap += self._rate * (min(late, self.cautious_burst / 2) if self._cautious else late)
            else:  # not late but idle: back to one burst
                self._due = None
        room = max(0.0, cap - self._tokens)
        self._budget += earned
        if earned > room:
            self._wasted += earned - room
            self._tokens = max(self._tokens, cap)
        else:
            self._tokens += earned
        self._last = now
        if self._held is not None and now - self._held_at > self.share_hold:
            self._release()
        if self._last_active is not None and now - self._last_active > self.idle_reset:
            self._last_active = None
            self._backlogged = False
            # a pacer that met congestion keeps its rate, its caution and its
            # ceiling: back at initial_rate, every sender of an incast put its whole
            # next message into its host's queue before the first report came
            self._release()
            if not self._cautious:
                self._rate = self.initial_rate

    def _release(self) -> None:
        """The cap of a shared report ends: the held rate comes back (or the rate,
        if feedback raised it above)."""
        if self._held is not None:
            self._rate = max(self._rate, self._held)
            self._held = None

    def _slack(self) -> float:
        """Rounding slack in bytes: times near ``now`` are only exact to an ulp."""
        return _EPS + 4.0 * self._rate * math.ulp(self._last or 0.0)

    def allowance(self, *, now: float) -> int:
        self._advance(now)
        return max(0, math.floor(self._tokens + self._slack()))

    def on_sent(self, nbytes: int, *, now: float) -> None:
        nbytes = _check_nbytes(nbytes)
        self._advance(now)
        self._tokens -= nbytes
        self._due = None
        self._last_active = self._last
        if self._tokens + self._slack() < min(max(nbytes, 1), self.burst):
            self._backlogged = True

    def next_send_time(self, nbytes: int, *, now: float) -> float:
        nbytes = _check_nbytes(nbytes)
        now = _check_now(now)
        self._advance(now)
        need = min(nbytes, self.burst)
        if self._tokens + self._slack() >= need:
            return now
        self._backlogged = True
        self._last_active = self._last
        self._due = now + (need - self._tokens) / self._rate
        return self._due

    def note_backlogged(self, *, now: float) -> None:
        self._advance(now)
        self._backlogged = True
        self._last_active = self._last

    def on_feedback(
        self, bytes_per_s: float, *, now: float, shared: bool = False, window: float = 0.0
    ) -> None:
        """A receiver's report; ``window``: the seconds it measured over (RATE's
        ``interval_us``; 0: not known), which a cautious raise spans (class doc)."""
        reported = _check_reported(bytes_per_s)
        if not 0.0 <= window < math.inf:
            raise UsageError(f"window={window} must be a finite duration >= 0 seconds")
        self._advance(now)
        if shared:
            self._on_share(reported)
        else:
            self._release()
            self._follow(reported, window=window)
        self._backlogged = False
        self._budget = 0.0
        self._wasted = 0.0

    def _on_share(self, reported: float) -> None:
        """A shared report: the rate capped at it (class doc)."""
        cap = min(max(reported, self.min_rate), self.max_rate)
        assert self._last is not None  # (set by _advance)
        if self._rate > cap:
            if self._held is None:
                self._held = self._rate
            self._rate = cap
            self._held_at = self._last
            # what the bucket saved at the old rate goes too (as after a loss)
            self._tokens = min(self._tokens, float(self.burst))
        elif self._held is not None:  # the share grew: the held rate back up to it
            self._rate = min(self._held, cap)
            self._held_at = self._last
            if self._rate >= self._held:
                self._held = None
        else:
            self._follow(reported, cap)

    def _follow(self, reported: float, cap: float = math.inf, window: float = 0.0) -> None:
        """A report's rules (class doc), never above ``cap``; a report measured over
        ``window`` seconds."""
        target = min(max(self.gain * reported, self.min_rate), self.max_rate, cap)
        pacer_limited = (
            self._backlogged
            and self._budget > 0
            and self._wasted <= (1.0 - self.used_fraction) * self._budget
        )
        at = self._last  # (now, as _advance took it)
        assert at is not None
        if self._cautious:  # after congestion: loss lowers the rate, raises are small steps
            # (feedback comes about every probe_interval, a little early or late:
            # a step may come a fifth of an interval early), taken only while the
            # rate held the sender back: one that sent less said nothing of the path;
            # never above the ceiling or a step above what the receiver reports,
            # whichever is more; and a sender the pacer held back above both falls to
            # them (a shared report caps instead: _on_share)
            limit = min(max(self._ceiling, reported * (1.0 + self.probe)), cap)
            raised = self._rate * (1.0 + self.probe)
            if window > self.probe_interval:  # a step per probe_interval it spans
                span = min(window, at - self._raised_at) / self.probe_interval
                for _ in range(1, MAX_PROBE_STEPS if span >= MAX_PROBE_STEPS else int(span)):
                    raised *= 1.0 + self.probe
            raised = min(target, raised, limit)
            if pacer_limited and self._rate > limit:
                self._rate = limit
            elif (
                pacer_limited
                and raised > self._rate
                and at - self._raised_at >= 0.8 * self.probe_interval
            ):
                self._rate = raised
                self._raised_at = at
        elif target >= self._rate or pacer_limited:
            self._rate = target

    def on_loss(
        self, lost_fraction: float, send_rate: float, *, now: float, queue: bool = False
    ) -> None:
        lost, sent_at = _check_loss(lost_fraction, send_rate)
        self._advance(now)
        if lost <= self.loss_tolerance and not queue:
            # a round that was not congested while the rate was at the ceiling:
            # the ceiling may go up a little (random loss below the tolerance
            # must not hold it down: it would only ever fall)
            if self._rate >= self._ceiling:
                self._ceiling *= 1.0 + self.ceiling_step
            return
        # (once a ceiling is known, a queue's loss is of the pacer's own rate: that
        # rate was near the path's, and a round its sender's CPU held below it still
        # went in bursts at it)
        factor = max(self.max_cut, self.backoff * (1.0 - lost))
        basis = self._rate if queue and self._ceiling < math.inf else sent_at
        fallback = max(basis * factor, self.min_rate)
        # the ceiling: what got through of the rate the pacer allowed, a little less
        # (a sender its CPU held below that rate sent bursts at it: the round's
        # own rate says less), and never below where the rate falls to
        self._ceiling = min(self._ceiling, max(self._rate * factor, fallback))
        self._cautious = True
        self._held = None  # (a shared report's cap ends: loss says more)
        if fallback < self._rate:  # (a round sent before an earlier cut may say more)
            assert self._last is not None  # (set by _advance)
            self._rate = fallback
            self._raised_at = self._last
        # what the bucket saved at the old rate goes too: it would leave in one burst
        self._tokens = min(self._tokens, float(self.burst))
        self._due = None
