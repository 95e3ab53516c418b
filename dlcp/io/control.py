"""The reliable control channel: one TCP connection per ordered pair of ranks.

Control messages (STOP, FINISH, NACK, RATE, ABORT) are small and must not be
lost, so they travel over TCP: each rank *sends* on a connection it opened to
the peer and *receives* on the connections peers opened to it. A connection
starts with a hello (``b"DLCP"``, job, rank; when the job uses a key, then a
fresh nonce and a tag proving the key, refused if it fails or repeats a nonce)
and then carries frames: a 4-byte big-endian length and one control datagram
exactly as ``docs/spec.md`` defines it (authenticated by its own tag when the
job uses a key).

A connection that resets or closes does not by itself mark its peer gone: a
rank whose connection to a peer was reset (``ss -K``, a middlebox) opens a new
one when it next sends (once per send); a rank whose connection *from* a peer
ended checks whether the peer's control port still accepts a connection (its
process is alive: it reconnects when it next sends) and marks the peer gone
only when it does not. The endpoint then fails what it was waiting for from
that peer, and only that. A peer that is alive but silent is found by the
endpoint's timeouts.

The connections a rank opened are watched for their end too (a peer only
reads them, so one that turns readable has ended:
:meth:`ControlChannel.watch_ends`), and an end is checked the same way. That is
what makes the check sound: a dying process closes its sockets one at a time,
its listener not necessarily first, so the end of its connection can be
checked while the kernel still accepts connections for the listener about to
close. The check then says "alive", but the checking connection (or the one it
kept) is reset when that listener closes; that end is checked again, and the
port refuses.

Loss on the control path: a control message is one small segment with nothing
behind it, so when the network drops it TCP cannot recover by duplicate ACKs;
it waits for its tail-loss probe or retransmission timer, which Linux bounds
below by 200 ms (``tcp_rto_min``, and the delayed-ACK maximum in the probe's
timeout). One lost STOP or NACK would then stall a whole transfer or training
step for 200 ms. Where the kernel has the per-socket options (``TCP_RTO_MIN_US``,
``TCP_DELACK_MAX_US``, Linux 6.15+), every control socket lowers both to
``rto_min`` (the endpoint's ``control_rto_min``; the kernel rounds up to whole
jiffies and refuses less than two); elsewhere the kernel's defaults stay, said
once in the log.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import logging
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..proto.context import PairKeys
from .nonblocking import recv_now, send_now
from .udp import bind

__all__ = ["HELLO", "ControlChannel", "Inbound", "LostPeer", "hello_proof", "set_fast_timers"]

log = logging.getLogger("dlcp.io")

HELLO = struct.Struct(">4sHH")
#: with a key the hello goes on with a fresh nonce and a tag over the hello, the
#: rank it is for and the nonce: it proves the opener holds the key, and a
#: nonce seen before (a replayed connection) is refused
HELLO_NONCE_LEN = 16
HELLO_TAG_LEN = 16
_HELLO_PROOF = HELLO_NONCE_LEN + HELLO_TAG_LEN
_MAGIC = b"DLCP"
_FRAME = struct.Struct(">I")
_MAX_FRAME = 1 << 16
#: Linux's per-socket TCP timer options (include/uapi/linux/tcp.h, 6.15+)
TCP_RTO_MIN_US = 45
TCP_DELACK_MAX_US = 46
#: what the kernel accepts for both (its own default is the upper end)
_TIMER_MAX_US = 200_000
_TIMER_NAMES = {TCP_RTO_MIN_US: "TCP_RTO_MIN_US", TCP_DELACK_MAX_US: "TCP_DELACK_MAX_US"}
#: options this process already said it cannot set (said once each)
_timer_warned: set[int] = set()
#: errors of a connection that was reset or aborted (a new one is tried once)
_RESET = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def frame(data: bytes) -> bytes:
    """A control datagram as a connection carries it: its length, then it."""
    return _FRAME.pack(len(data)) + data


class SharedWrites(Protocol):
    """Another writer of the outbound connections (the native engine's send
    threads write each round's FINISH: rule 9 of ``dlcp/io/_engine.c``), with
    whom every frame goes through one lock a connection."""

    def adopt_control(self, dst: int, fd: int) -> None: ...

    def release_control(self, dst: int) -> None: ...

    def control_send(self, dst: int, data: bytes) -> None: ...


def _proof_input(hello: bytes, to_rank: int, nonce: bytes) -> bytes:
    """What an authenticated hello's tag covers: the hello, the rank it opens a
    connection to (a hello for one rank is no use at another) and the nonce."""
    return b"dlcp-hello" + hello + struct.pack(">H", to_rank) + nonce


def hello_proof(key: bytes, covered: bytes) -> bytes:
    """The tag of an authenticated hello (spec §5.8): keyed BLAKE2b-128 under the
    pair's key. One per connection, and its nonce is random, so it needs none of
    the per-datagram nonce bookkeeping of the datagrams' AES-GMAC (spec §3)."""
    return hashlib.blake2b(covered, key=key, digest_size=HELLO_TAG_LEN).digest()


def set_fast_timers(sock: socket.socket, rto_min: float) -> int | None:
    """Lower ``sock``'s minimum retransmission timeout and delayed-ACK maximum to
    ``rto_min`` seconds (0: leave the kernel's). Returns the minimum
    retransmission timeout the socket now has, in microseconds as the kernel
    reports it (rounded up to whole jiffies), or None where the kernel lacks the
    option (said once per process in the log). The kernel refuses less than two
    jiffies: a refused value is doubled until accepted. Each option is set on its
    own, so a kernel with only one of them still gets that one. Accepted sockets
    inherit both from their listener."""
    if rto_min <= 0:
        return None
    usec = max(1, round(rto_min * 1e6))
    rto = _set_timer(sock, TCP_RTO_MIN_US, usec)
    _set_timer(sock, TCP_DELACK_MAX_US, usec)
    return rto


def _set_timer(sock: socket.socket, option: int, usec: int) -> int | None:
    while True:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, usec)
            return int(sock.getsockopt(socket.IPPROTO_TCP, option))
        except OSError as exc:
            if exc.errno == errno.EINVAL and usec < _TIMER_MAX_US:
                usec = min(2 * usec, _TIMER_MAX_US)
                continue
            if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL, errno.EOPNOTSUPP):
                raise  # not "this kernel lacks it": a real error on this socket
            if option not in _timer_warned:
                _timer_warned.add(option)
                log.info(
                    "dlcp: this kernel cannot set %s per socket (%s): %s",
                    _TIMER_NAMES[option],
                    exc,
                    "a lost control segment waits for TCP's default timeout (~200 ms)"
                    if option == TCP_RTO_MIN_US
                    else "ACKs of control segments keep the default delay",
                )
            return None


def _ended(sock: socket.socket) -> bool:
    """Whether outbound ``sock`` was closed or reset by its peer (or aborted here)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


@dataclass(frozen=True, slots=True)
class LostPeer:
    """A record, not an exception: the control connection to peer ``rank`` is
    lost (``why`` says how, for the failures of its transfers). The send and
    close paths return one for the endpoint to act on."""

    rank: int
    why: str


@dataclass(slots=True)
class Inbound:
    sock: socket.socket
    #: time.monotonic() when it was accepted (one that never says hello is dropped)
    opened: float = 0.0
    rank: int | None = None  # known after the hello
    buf: bytearray = field(default_factory=bytearray)
    #: set once a frame on it passed the session's checks (with authentication:
    #: its tag); only the end of a trusted connection says the peer is gone, so a
    #: stranger who says hello as rank r and hangs up cannot cut rank r off
    trusted: bool = False


class ControlChannel:
    """Listening socket, inbound connections and lazily opened outbound ones."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        rank: int,
        job: int,
        connect_timeout: float,
        tos: int = 0,
        rto_min: float = 0.0,
        keys: PairKeys | None = None,
        address_of: Callable[[int], tuple[str, int] | None] | None = None,
    ) -> None:
        self.rank = rank
        #: a peer's control address (host, port) if known, without waiting: where
        #: a connection from it ended, whether it is alive is asked there
        self.address_of = address_of
        self.job = job
        #: this rank's keys when the job authenticates: hellos then carry a proof,
        #: tagged with the key of the pair (opener -> the rank it opens to)
        self.keys = keys
        #: nonces of the authenticated hellos accepted so far (one per connection)
        self._nonces: set[bytes] = set()
        #: inbound connections closed at their hello (another job, no valid proof
        #: of the key, a replayed nonce): nothing they sent after it was read
        self.hellos_refused = 0
        self.connect_timeout = connect_timeout
        #: seconds: minimum retransmission timeout of every control socket (module doc)
        self.rto_min = rto_min
        #: IP TOS byte of every control packet, both directions (accepted
        #: connections inherit the listener's); for TCP the kernel keeps the ECN bits
        self.tos = tos
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            set_fast_timers(self.listener, rto_min)  # accepted connections inherit them
            bind(self.listener, host, port, port_setting="control_port")
            self.listener.listen(64)
        except BaseException:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.address: tuple[str, int] = self.listener.getsockname()
        self.inbound: dict[socket.socket, Inbound] = {}
        #: why the last accept failed (out of descriptors, ...), None once one works
        self.accept_error: str | None = None
        self.outbound: dict[int, socket.socket] = {}
        #: the selector that watches the outbound connections for their end (data
        #: ``"outbound"``), if one does (:meth:`watch_ends`)
        self._ends: selectors.BaseSelector | None = None
        self._read_buf = bytearray(1 << 18)
        #: told the descriptor of each inbound connection before it is closed (the
        #: receive loop may read control frames from it: dlcp.io.control_in_waits)
        self.closing_inbound: Callable[[int], None] | None = None
        #: who else writes on the outbound connections, if anyone: each is adopted
        #: once its hello went, written through it, released before it closes
        self.shared_writes: SharedWrites | None = None

    def close(self) -> None:
        """Close every socket (a selector watching them must be let go first:
        ``watch_ends(None)``)."""
        if self.closing_inbound is not None:
            for s in self.inbound:
                self.closing_inbound(s.fileno())
        if self.shared_writes is not None:
            for peer in self.outbound:
                self.shared_writes.release_control(peer)
        for s in [self.listener, *self.inbound, *self.outbound.values()]:
            s.close()
        self.inbound.clear()
        self.outbound.clear()

    def watch_ends(self, selector: selectors.BaseSelector | None) -> None:
        """Have ``selector`` watch every outbound connection for reading, with data
        ``"outbound"``: those open now and those opened later, each until it is
        dropped. A peer never writes on them, so one that turns readable has
        ended: hand it to :meth:`outbound_ended`. None lets the selector go
        (it stops watching them)."""
        old, self._ends = self._ends, selector
        for sock in self.outbound.values():
            if old is not None:
                old.unregister(sock)
            if selector is not None:
                selector.register(sock, selectors.EVENT_READ, "outbound")

    def _add_outbound(self, peer: int, sock: socket.socket) -> None:
        """``sock``, its hello sent, is the connection to ``peer`` from now on."""
        self.outbound[peer] = sock
        if self._ends is not None:
            self._ends.register(sock, selectors.EVENT_READ, "outbound")
        if self.shared_writes is not None:
            self.shared_writes.adopt_control(peer, sock.fileno())

    # ------------------------------------------------------------------ send

    def send(self, peer: int, addr: tuple[str, int], data: bytes) -> LostPeer | None:
        """Send one control datagram to ``peer``; a LostPeer if that failed. A
        connection that was reset is replaced by a new one, once: a peer that
        refuses that one is gone."""
        framed = frame(data)
        sock = self.outbound.get(peer)
        reset = ""
        if sock is not None:
            try:
                if self.shared_writes is not None:
                    self.shared_writes.control_send(peer, framed)
                else:
                    self._send_all(sock, framed)
                return None
            except _RESET as exc:  # (what was in flight on it may be lost: timers resend)
                self._drop_outbound(peer)
                reset = f" (reconnecting after: {exc})"
                log.warning("dlcp: control connection to rank %d: %s; reconnecting", peer, exc)
            except OSError as exc:
                self._drop_outbound(peer)
                return LostPeer(peer, f"control connection to rank {peer} at "
                                      f"{addr[0]}:{addr[1]} failed: {exc}")  # fmt: skip
        sock = None
        try:  # (adopted once its hello went: nothing may go on it before)
            sock = self._connect(addr)
            sock.setblocking(False)
            self._send_all(sock, self._hello(peer) + framed)
        except OSError as exc:
            if sock is not None:
                sock.close()
            return LostPeer(
                peer,
                f"control connection to rank {peer} at {addr[0]}:{addr[1]} failed: {exc}{reset}",
            )
        self._add_outbound(peer, sock)
        return None

    def _hello(self, peer: int) -> bytes:
        hello = HELLO.pack(_MAGIC, self.job, self.rank)
        if self.keys is None:
            return hello
        nonce = os.urandom(HELLO_NONCE_LEN)
        return hello + nonce + hello_proof(self.keys.to(peer), _proof_input(hello, peer, nonce))

    def _connect(self, addr: tuple[str, int]) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.tos)  # the SYN's too
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_fast_timers(sock, self.rto_min)
            sock.settimeout(self.connect_timeout)
            sock.connect(addr)
        except BaseException:
            sock.close()
            raise
        return sock

    def _send_all(self, sock: socket.socket, data: bytes) -> None:
        """``data`` onto a non-blocking outbound socket: at once if it fits the
        socket buffer (a socket with a timeout would poll() before every send);
        else wait for the peer to read, at most ``connect_timeout`` (a peer that
        stops reading must not stall this rank: the OSError names it gone)."""
        sent = send_now(sock, data)
        if sent < len(data):
            sock.settimeout(self.connect_timeout)
            try:
                sock.sendall(memoryview(data)[sent:])
            finally:
                sock.setblocking(False)

    def _drop_outbound(self, peer: int) -> None:
        sock = self.outbound.pop(peer, None)
        if sock is not None:
            if self.shared_writes is not None:  # (waits for a write in progress)
                self.shared_writes.release_control(peer)
            if self._ends is not None:  # (before its descriptor can be reused)
                self._ends.unregister(sock)
            sock.close()

    # ------------------------------------------------------------------ receive

    def accept(self, now: float | None = None) -> socket.socket | None:
        """A new inbound connection (accepted at ``now``, default the monotonic
        clock's now), or None: none pending, or the kernel refused (then
        :attr:`accept_error` says why, until the next accept that works)."""
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:  # e.g. out of file descriptors: refuse, keep running
            if self.accept_error is None:
                log.warning("dlcp: cannot accept a control connection: %s", exc)
            self.accept_error = str(exc)
            return None
        self.accept_error = None
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inbound[sock] = Inbound(sock, opened=time.monotonic() if now is None else now)
        return sock

    def silent_since(self, before: float) -> list[socket.socket]:
        """Inbound connections accepted before ``before`` that have not said hello."""
        return [c.sock for c in self.inbound.values() if c.rank is None and c.opened < before]

    def hello_waits(self) -> float | None:
        """When the oldest inbound connection that has not said hello yet was
        accepted (None: every one has)."""
        return min((c.opened for c in self.inbound.values() if c.rank is None), default=None)

    def drop(self, sock: socket.socket, why: str) -> None:
        """Close inbound ``sock`` (the caller has stopped watching it)."""
        conn = self.inbound.get(sock)
        if conn is not None:
            log.info("dlcp: dropped a control connection that %s", why)
            self._close_inbound(conn, why)

    def read(self, sock: socket.socket) -> tuple[list[tuple[int, bytes]], str | None]:
        """Frames that arrived on inbound ``sock`` as (peer, datagram), and why the
        connection ended if it did (then ``sock`` is closed and forgotten; ask
        :meth:`ended` whether that means its peer is gone)."""
        conn = self.inbound[sock]
        try:
            # into one buffer kept for every read: recv(n) would allocate n bytes
            # each time (256 KB: an mmap and munmap per control read)
            n = recv_now(sock, self._read_buf)
        except OSError as exc:
            return [], self._close_inbound(conn, f"connection error: {exc}")
        if n is None:
            return [], None
        if not n:
            return [], self._close_inbound(conn, "closed its control connection")
        conn.buf += memoryview(self._read_buf)[:n]
        frames: list[tuple[int, bytes]] = []
        if conn.rank is None:
            size = HELLO.size + (_HELLO_PROOF if self.keys is not None else 0)
            if len(conn.buf) < size:
                return [], None
            magic, job, rank = HELLO.unpack_from(conn.buf)
            if magic != _MAGIC or job != self.job:
                why = f"sent a bad hello (magic {magic!r}, job {job}; this is job {self.job})"
                self.hellos_refused += 1
                return [], self._close_inbound(conn, why)
            if self.keys is not None:
                refused = self._check_proof(bytes(conn.buf[:size]), rank)
                if refused is not None:
                    self.hellos_refused += 1
                    return [], self._close_inbound(conn, refused)
            conn.rank = rank
            del conn.buf[:size]
        while len(conn.buf) >= _FRAME.size:
            (length,) = _FRAME.unpack_from(conn.buf)
            if length > _MAX_FRAME:
                why = f"sent a control frame of {length} bytes (limit {_MAX_FRAME})"
                return frames, self._close_inbound(conn, why)
            if len(conn.buf) < _FRAME.size + length:
                break
            frames.append((conn.rank, bytes(conn.buf[_FRAME.size : _FRAME.size + length])))
            del conn.buf[: _FRAME.size + length]
        return frames, None

    def _check_proof(self, hello: bytes, rank: int) -> str | None:
        """Why an authenticated hello (as rank ``rank``) is refused, or None."""
        assert self.keys is not None
        nonce = hello[HELLO.size : HELLO.size + HELLO_NONCE_LEN]
        tag = hello[HELLO.size + HELLO_NONCE_LEN :]
        key = self.keys.of(rank)  # the pair (rank -> this rank); None: no such rank
        covered = _proof_input(hello[: HELLO.size], self.rank, nonce)
        want = b"" if key is None else hello_proof(key, covered)
        if not want or not hmac.compare_digest(tag, want):
            return f"sent a hello as rank {rank} without a valid proof of the job's key"
        if nonce in self._nonces:
            return f"replayed a hello of rank {rank} (its nonce was seen before)"
        self._nonces.add(nonce)
        return None

    def _close_inbound(self, conn: Inbound, why: str) -> str:
        self.inbound.pop(conn.sock, None)
        if self.closing_inbound is not None:
            self.closing_inbound(conn.sock.fileno())
        conn.sock.close()
        return why

    def ended(self, conn: Inbound, why: str) -> LostPeer | None:
        """The end of inbound ``conn`` (its frames already handled): a LostPeer if
        it was a trusted connection of a known rank, else nothing but a log line."""
        if conn.rank is None or not conn.trusted:
            log.warning(
                "dlcp: dropped a control connection (hello as rank %s) that never "
                "carried a valid message: %s",
                conn.rank,
                why,
            )
            return None
        if any(
            c.rank == conn.rank and c.trusted and c is not conn for c in self.inbound.values()
        ):
            # the rank still talks to us on another connection that carried a valid
            # message (it reconnected, or this one was a stranger replaying its
            # messages): not gone
            log.warning("dlcp: a control connection from rank %s ended: %s", conn.rank, why)
            return None
        if self._answers(conn.rank):
            # reset between two live ranks (ss -K, a middlebox): it opens a new
            # connection when it next sends; a dead process's port refuses
            log.warning(
                "dlcp rank %d (control port %d): the control connection from rank %s "
                "ended (%s), but rank %s still accepts connections: not gone, it "
                "reconnects when it next sends",
                self.rank, self.address[1], conn.rank, why, conn.rank,
            )  # fmt: skip
            return None
        self._drop_outbound(conn.rank)
        return LostPeer(conn.rank, f"rank {conn.rank} {why}")

    def outbound_ended(self, sock: socket.socket) -> LostPeer | None:
        """Outbound ``sock`` turned readable (see :meth:`watch_ends`): if its peer
        closed or reset it, and the peer's control port no longer accepts a
        connection, a LostPeer. None if it has not ended (what the peer wrongly
        sent on it is read and dropped), if it is no longer this rank's
        connection (dropped or replaced since), or if the peer answers (alive:
        the checking connection replaces it, watched in turn)."""
        peer = next((r for r, s in self.outbound.items() if s is sock), None)
        if peer is None:
            return None
        try:
            n = sock.recv_into(self._read_buf, len(self._read_buf), socket.MSG_DONTWAIT)
            ended = None if n else "closed"
        except (BlockingIOError, InterruptedError):
            ended = None
        except OSError as exc:
            ended = str(exc)
        if ended is None:
            return None
        self._drop_outbound(peer)
        if self._answers(peer):
            log.warning(
                "dlcp rank %d (control port %d): the control connection to rank %s "
                "ended (%s), but rank %s still accepts connections: not gone",
                self.rank, self.address[1], peer, ended, peer,
            )  # fmt: skip
            return None
        return LostPeer(
            peer,
            f"control connection to rank {peer} ended ({ended}) and rank {peer} "
            "no longer accepts control connections",
        )

    def _answers(self, rank: int) -> bool:
        """Whether ``rank``'s control port accepts a connection now (its process
        is alive). The check opens a connection and says hello on it: it becomes
        this rank's connection to ``rank`` if there is none, else it is closed."""
        addr = self.address_of(rank) if self.address_of is not None else None
        if addr is None:
            return False
        try:
            sock = self._connect(addr)
        except OSError:
            return False
        try:
            sock.setblocking(False)
            self._send_all(sock, self._hello(rank))
        except OSError:
            sock.close()
            return False
        old = self.outbound.get(rank)
        if old is not None and _ended(old):
            self._drop_outbound(rank)  # (reset too: replaced now, not at the next send)
        if rank in self.outbound:
            sock.close()
        else:
            self._add_outbound(rank, sock)
        return True
