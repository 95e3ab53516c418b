"""An in-memory lossy multipath link between sessions, for tests and demos.

This is *emulation*: packets never leave the process. It cuts each
:class:`~dlcp.proto.session.DataBatch` into its datagrams, drops them with a
seeded per-path probability, can duplicate and reorder them, and delivers them
after a per-path delay. Control datagrams are delivered reliably (as the real
driver's control channel does) after the control delay, unless
``control_loss`` is set to test the core's own control retries.

Everything is deterministic for a given seed, and time is whatever the caller
passes in: :meth:`LossyLink.run` drives two or more sessions with a virtual
clock, so a test of a 100 ms timeout takes microseconds.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .proto.session import (
    ControlDatagram,
    Event,
    RoundPost,
    RoundRelease,
    Session,
    Transmit,
)

__all__ = ["LinkStats", "LossyLink"]


@dataclass(slots=True)
class LinkStats:
    data_sent: int = 0
    data_dropped: int = 0
    data_duplicated: int = 0
    control_sent: int = 0
    control_dropped: int = 0
    per_path_sent: dict[int, int] = field(default_factory=dict)
    per_path_dropped: dict[int, int] = field(default_factory=dict)


class LossyLink:
    """Connects sessions by rank; ``loss`` is per path (one value: every path)."""

    def __init__(
        self,
        sessions: Sequence[Session],
        *,
        loss: float | Sequence[float] = 0.0,
        delay: float = 50e-6,
        jitter: float = 0.0,
        reorder: bool = False,
        duplicate: float = 0.0,
        control_delay: float = 50e-6,
        control_loss: float = 0.0,
        seed: int = 0,
        drop_filter: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.sessions = {s.rank: s for s in sessions}
        self.loss = loss
        self.delay = delay
        self.jitter = jitter
        self.reorder = reorder
        self.duplicate = duplicate
        self.control_delay = control_delay
        self.control_loss = control_loss
        self.rng = np.random.default_rng(seed)
        self.drop_filter = drop_filter
        self.stats = LinkStats()
        self._queue: list[tuple[float, int, int, bytes]] = []  # (time, order, dst, datagram)
        self._order = 0
        self.events: list[tuple[int, Event]] = []

    def _path_loss(self, path: int) -> float:
        if isinstance(self.loss, int | float):
            return float(self.loss)
        return float(self.loss[path % len(self.loss)])

    def _push(self, when: float, dst: int, data: bytes) -> None:
        self._order += 1
        heapq.heappush(self._queue, (when, self._order, dst, data))

    def transmit(self, src: int, item: Transmit, *, now: float) -> None:
        """Put one output of session ``src`` on the link. A whole round (a
        session made with ``whole_rounds=True``) goes at once, as an unpaced
        engine would send it, and is reported sent; its release is acted on."""
        if isinstance(item, RoundRelease):
            self.sessions[src].release_round(item.dst, step=item.step, msg=item.msg)
            return
        if isinstance(item, ControlDatagram):
            self.stats.control_sent += 1
            if self.control_loss and self.rng.random() < self.control_loss:
                self.stats.control_dropped += 1
                return
            self._push(now + self.control_delay, item.dst, item.data)
            return
        if isinstance(item, RoundPost):
            datagrams = [item.datagram(i) for i in range(item.count)]
            self._carry(item.dst, datagrams, item.path[: item.count].tolist(), now)
            self.sessions[src].round_sent(
                item.dst, step=item.step, msg=item.msg, began=(now, 0), last=(now, 0), now=now
            )
            return
        raw = item.data.tobytes()
        seg = item.segment_size
        datagrams = [raw[i : i + seg] for i in range(0, len(raw), seg)]
        self._carry(item.dst, datagrams, [item.path] * len(datagrams), now)

    def _carry(self, dst: int, datagrams: list[bytes], paths: list[int], now: float) -> None:
        """Data datagrams to ``dst``, each on its path: dropped, delayed,
        reordered and duplicated as the link is set up to."""
        drops = self.rng.random(len(datagrams)) < np.array([self._path_loss(p) for p in paths])
        if self.drop_filter is not None:
            drops |= np.array([self.drop_filter(d) for d in datagrams], dtype=np.bool_)
        self.stats.data_sent += len(datagrams)
        self.stats.data_dropped += int(drops.sum())
        ps, pd = self.stats.per_path_sent, self.stats.per_path_dropped
        for path, dropped in zip(paths, drops.tolist(), strict=True):
            ps[path] = ps.get(path, 0) + 1
            pd[path] = pd.get(path, 0) + int(dropped)
        for i, d in enumerate(datagrams):
            if drops[i]:
                continue
            # paths differ a little in delay
            when = now + self.delay * (1 + paths[i] * 0.1)
            if self.jitter:
                when += self.rng.random() * self.jitter
            if self.reorder:
                when += self.rng.random() * self.delay
            self._push(when, dst, d)
            if self.duplicate and self.rng.random() < self.duplicate:
                self.stats.data_duplicated += 1
                self._push(when + self.rng.random() * self.delay, dst, d)

    def pump(self, *, now: float) -> None:
        """Collect every session's output at ``now``."""
        for rank, s in self.sessions.items():
            for item in s.datagrams_to_send(now=now):
                self.transmit(rank, item, now=now)

    def next_time(self) -> float | None:
        times = [t for s in self.sessions.values() if (t := s.get_timer()) is not None]
        if self._queue:
            times.append(self._queue[0][0])
        return min(times) if times else None

    def run(
        self,
        *,
        start: float = 0.0,
        until: float = 60.0,
        stop_when: Callable[[LossyLink], bool] | None = None,
        max_steps: int = 10_000_000,
    ) -> float:
        """Drive all sessions on a virtual clock until nothing is pending, ``until``,
        or ``stop_when(link)`` is true. Returns the virtual time reached."""
        now = start
        for _ in range(max_steps):
            self.pump(now=now)
            self._collect()
            if stop_when is not None and stop_when(self):
                return now
            nxt = self.next_time()
            if nxt is None or nxt > until:
                return now
            now = max(now, nxt)
            while self._queue and self._queue[0][0] <= now:
                _, _, dst, data = heapq.heappop(self._queue)
                target = self.sessions.get(dst)
                if target is not None:
                    target.receive_datagram(data, now=now)
            for s in self.sessions.values():
                t = s.get_timer()
                if t is not None and t <= now:
                    s.handle_timer(now=now)
        raise RuntimeError(f"link did not settle in {max_steps} steps")

    def _collect(self) -> None:
        for rank, s in self.sessions.items():
            while (ev := s.next_event()) is not None:
                self.events.append((rank, ev))
