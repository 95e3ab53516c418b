"""Which route each of an endpoint's paths takes to a peer, found by TTL probes.

DLCP sprays a message over ``n_paths`` send sockets, each with a source port of
its own, and leaves it to the switches' ECMP hash to put the ports on different
routes. The hash falls as it falls: 8 ports over 2 spines split 4/4 only 27 %
of the time, 6/2 or worse 29 % of the time, and one testbed run put 84 % of a
leaf's traffic on one spine. Sprayed evenly over the ports, the traffic loads
the routes as unevenly as the hash did. Knowing which ports share a route, the
sender can give every route the same share instead
(:func:`~dlcp.proto.paths.weights_for_routes`).

How a route is found (as ``traceroute`` does, with the path's own 5-tuple so
that ECMP hashes the probe as it hashes the path's data):

1. **The distance.** Datagrams with TTL 1, 2, ... go from a socket of their own
   to the peer's control port, where no UDP socket listens: each router on the
   way that drops one for its TTL answers ICMP "time exceeded", and the peer's
   kernel answers "port unreachable". The TTL it answered at is the number of
   hops to the peer. A peer that never answers (ICMP filtered) leaves the
   distance unknown, and the routes too: nothing is probed further.
2. **Each path's hops.** For every path, a probe socket is bound to the path's
   own address and port (``SO_REUSEPORT``, which the path sockets are bound
   with: :class:`~dlcp.io.udp.DataSockets`) and connected to the peer's data
   port, so that the ICMP errors of the path's 5-tuple come back to it (the
   kernel prefers a connected member of a port's group). The probes themselves
   leave from a third socket of the port, unconnected as the path socket is
   (:class:`_Probe` says why): a one-byte datagram (the TTL) for each TTL below
   the distance, so that none reaches the peer. The answering routers'
   addresses are read off the error queue (``IP_RECVERR``); a path's route is
   the tuple of them.

Routers limit the ICMP they send (Linux: a burst of 6 to a destination, then
one a second), so probes left unanswered are sent again, ``retry_pause`` apart,
up to ``attempts`` times in all: 8 for the distance, and for the paths' hops 8
or, where there are more paths, one per path, since each hop is asked for one
answer per path (on the testbed's three-router routes, 8 traced 12 of 16 paths,
16 traced all in 26-30 s: docs/results/2026-12-04/route_probe_attempts/).
A path with a hop that never answered has no known route and keeps an equal
path's share. Nothing here sends to the peer's data port with a TTL that reaches
it: the peer sees no probe.

The routes are found once per peer, when this endpoint first sends to it. A
route that changes later (a link down, the hash reseeded) is not seen again;
the loss-aware shares (:class:`~dlcp.proto.paths.PathScheduler`) still move
traffic off a path that loses.
"""

from __future__ import annotations

import collections
import errno
import functools
import ipaddress
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .peers import PeerAddress

__all__ = ["ProbeResult", "RouteProber", "default_attempts", "probe_routes"]

log = logging.getLogger(__name__)

Route = tuple[str, ...]

#: <linux/in.h>, <linux/errqueue.h> (Python 3.11's socket module lacks them)
_IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
_SO_EE_ORIGIN_ICMP = 2
_ICMP_DEST_UNREACH = 3
_ICMP_TIME_EXCEEDED = 11
#: struct sock_extended_err, then the offender's struct sockaddr_in
_EXTENDED_ERR = struct.Struct("=IBBBBII")
_OFFENDER_ADDR = slice(_EXTENDED_ERR.size + 4, _EXTENDED_ERR.size + 8)

#: the most hops a distance is looked for over (traceroute's default is 30;
#: a data centre's fabric has a handful)
MAX_HOPS = 16

#: the fewest times a hop is asked (:func:`default_attempts`)
MIN_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What probing the paths to one peer found."""

    #: hops to the peer (the TTL its kernel answered at); None: it never answered
    distance: int | None
    #: per path, the routers' addresses hop by hop (None: not all of them answered)
    routes: tuple[Route | None, ...]
    #: probe datagrams sent, all TTLs and attempts
    probes: int


class _Probe:
    """Sends TTL-limited datagrams from ``local`` to ``remote`` and reads who
    answered from the error queue of a socket connected to ``remote``.

    With ``share`` (``local`` is a path's address and port) the datagrams leave
    from an unconnected socket of their own, bound there too, as the path's do:
    a connected socket's packets carry the random flow hash the kernel gave the
    socket (``sk_txhash``), and a Linux router that receives them over a veth
    pair (a container's, the testbed's) hashes ECMP on that instead of the
    5-tuple: they would take another route than the path's data. The connected
    socket only receives: the kernel hands a port group's ICMP errors to its
    connected member."""

    def __init__(self, local: tuple[str, int], remote: tuple[str, int], *, share: bool) -> None:
        self.remote = remote
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if share else self.sock
        try:
            if share:
                for s in (self.sock, self.out):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                    s.bind(local)
            else:
                self.sock.bind(local)
            self.sock.connect(remote)
            self.sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
            self.sock.setblocking(False)
        except BaseException:
            self.close()
            raise
        #: (ttl, router address, ICMP type) of every answer read so far
        self.answers: list[tuple[int, str, int]] = []

    def send(self, ttl: int) -> None:
        self.out.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        try:
            self.out.sendto(bytes((ttl,)), self.remote)
        except OSError as exc:  # an error an earlier probe left on the socket: once more
            if exc.errno not in (errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENETUNREACH):
                raise
            self.out.sendto(bytes((ttl,)), self.remote)

    def read(self) -> None:
        """Every answer queued, into :attr:`answers`."""
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(16, 256, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                break
            for level, kind, raw in ancillary:
                if level != socket.IPPROTO_IP or kind != _IP_RECVERR:
                    continue
                if len(raw) < _OFFENDER_ADDR.stop or not data:
                    continue
                _, origin, icmp_type, _, _, _, _ = _EXTENDED_ERR.unpack_from(raw)
                if origin == _SO_EE_ORIGIN_ICMP:
                    self.answers.append((data[0], socket.inet_ntoa(raw[_OFFENDER_ADDR]), icmp_type))
        # (the error the answers left pending would fail the next send)
        self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)

    def answer(self, ttl: int) -> tuple[str, int] | None:
        for t, addr, icmp_type in self.answers:
            if t == ttl:
                return addr, icmp_type
        return None

    def close(self) -> None:
        self.out.close()
        self.sock.close()


def _await(probes: list[_Probe], ttl: int, wait: float, stop: threading.Event) -> None:
    """Read answers for ``ttl`` until every probe has one or ``wait`` passed."""
    poller = select.poll()
    by_fd = {p.sock.fileno(): p for p in probes}
    for fd in by_fd:
        poller.register(fd, select.POLLERR)
    waiting = set(by_fd)
    until = time.monotonic() + wait
    while waiting and not stop.is_set():
        left = until - time.monotonic()
        if left <= 0:
            break
        for fd, _ in poller.poll(min(left, 0.05) * 1e3):
            probe = by_fd[fd]
            probe.read()
            if probe.answer(ttl) is not None:
                waiting.discard(fd)
                poller.unregister(fd)


def _ask(
    probes: list[_Probe],
    ttl: int,
    *,
    wait: float,
    attempts: int,
    retry_pause: float,
    stop: threading.Event,
) -> int:
    """Send each probe's datagram of ``ttl``, and again to those left
    unanswered, up to ``attempts`` times. Returns the datagrams sent."""
    sent = 0
    todo = probes
    for attempt in range(attempts):
        if attempt and stop.wait(retry_pause):
            break
        for p in todo:
            p.send(ttl)
        sent += len(todo)
        _await(todo, ttl, wait, stop)
        todo = [p for p in todo if p.answer(ttl) is None]
        if not todo or stop.is_set():
            break
    return sent


def default_attempts(paths: int) -> int:
    """How many times a hop is asked before a path is left untraced: 8, or once
    per path where there are more (a rate-limited router answers about one a
    second once its burst is spent)."""
    return max(MIN_ATTEMPTS, paths)


def probe_routes(
    host: str,
    ports: list[int],
    peer: PeerAddress,
    *,
    wait: float = 0.1,
    attempts: int | None = None,
    retry_pause: float = 1.0,
    stop: threading.Event | None = None,
) -> ProbeResult:
    """The route from each of the path ports ``ports`` (bound to ``host``) to
    ``peer`` (module docstring). ``attempts``: how many times in all a probe is
    sent; None: :data:`MIN_ATTEMPTS` for the distance (one probe a hop) and
    :func:`default_attempts` for the paths' hops. Socket errors propagate
    (OSError)."""
    stop = stop if stop is not None else threading.Event()
    ask = functools.partial(_ask, wait=wait, retry_pause=retry_pause, stop=stop)
    unknown: tuple[Route | None, ...] = (None,) * len(ports)
    distance, sent = None, 0
    ranger = _Probe((host, 0), (peer.host, peer.control_port), share=False)
    try:
        for ttl in range(1, MAX_HOPS + 1):
            sent += ask([ranger], ttl, attempts=attempts or MIN_ATTEMPTS)
            got = ranger.answer(ttl)
            if got is not None and got[1] == _ICMP_DEST_UNREACH and got[0] == peer.host:
                distance = ttl
                break
            if stop.is_set() or got is None or got[1] != _ICMP_TIME_EXCEEDED:
                break  # (a silent hop: no route can be complete; an "unreachable")
    finally:
        ranger.close()
    if distance is None or distance < 3:  # (one router or none: no choice of route)
        return ProbeResult(distance, unknown, sent)
    probes: list[_Probe] = []
    try:
        for port in ports:
            probes.append(_Probe((host, port), (peer.host, peer.data_port), share=True))
        for ttl in range(1, distance):
            sent += ask(probes, ttl, attempts=attempts or default_attempts(len(ports)))
            if stop.is_set():
                return ProbeResult(distance, unknown, sent)
    finally:
        for p in probes:
            p.close()
    routes: list[Route | None] = []
    for p in probes:
        hops = [p.answer(ttl) for ttl in range(1, distance)]
        routes.append(None if None in hops else tuple(h[0] for h in hops if h is not None))
    return ProbeResult(distance, tuple(routes), sent)


class RouteProber:
    """Probes the routes to each peer once, when :meth:`request` is first called
    for it, and hands the result to ``found(peer, result)``. One thread
    (``dlcp-routes-<rank>``) probes the requested peers one after the other, and
    ends when none is left: a rank that starts sending to many peers at once
    (an all-to-all) keeps one thread and asks the routers for one peer's
    answers at a time, within the ICMP they allow. Peers on this host (a
    loopback address, or ``host`` itself) are not probed: their datagrams cross
    no router."""

    def __init__(
        self,
        host: str,
        ports: list[int],
        *,
        rank: int,
        found: Callable[[int, ProbeResult], None],
    ) -> None:
        self.host, self.ports, self.rank = host, ports, rank
        self._found = found
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._asked: set[int] = set()
        self._queue: collections.deque[tuple[int, PeerAddress]] = collections.deque()
        #: the thread last started, and whether it still takes peers off the queue
        self._thread: threading.Thread | None = None
        self._running = False

    def request(self, peer: int, address: PeerAddress) -> None:
        if address.host == self.host or ipaddress.IPv4Address(address.host).is_loopback:
            return
        with self._lock:
            if peer in self._asked or self._stop.is_set():
                return
            self._asked.add(peer)
            self._queue.append((peer, address))
            if self._running:
                return  # (it takes this one next)
            self._running = True
            self._thread = threading.Thread(
                target=self._run, name=f"dlcp-routes-{self.rank}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._stop.is_set():
                    self._running = False
                    return
                peer, address = self._queue.popleft()
            self._probe(peer, address)

    def _probe(self, peer: int, address: PeerAddress) -> None:
        try:
            result = probe_routes(self.host, self.ports, address, stop=self._stop)
        except OSError as exc:
            log.warning(
                "rank %d: probing the routes to rank %d (%s) failed: %s; its paths keep "
                "equal shares", self.rank, peer, address.host, exc,
            )  # fmt: skip
            return
        if not self._stop.is_set():
            self._found(peer, result)

    def close(self, timeout: float) -> None:
        """Stop probing; wait up to ``timeout`` for the thread to end."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
