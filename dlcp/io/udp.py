"""UDP data sockets: one receive socket, one send socket per path, GSO and GRO.

* **Send**: a :class:`~dlcp.proto.session.DataBatch` is a contiguous run of
  equal-size datagrams (the last may be shorter). With UDP GSO
  (``UDP_SEGMENT``) it leaves as one GSO message per 64 KB, without GSO as
  single datagrams; either way up to 256 messages go in one ``sendmmsg``
  (``dlcp.io._udpio``; one ``sendmsg`` per message if that was not built).
  Measured over a veth path without offloads, GSO segmented in software still
  beats ``sendmmsg`` of single datagrams (0.19 vs 0.15 GB/s). The
  TOS byte (DSCP + ECN) rides along as ``IP_TOS`` ancillary data on every call,
  so one socket serves every packet class.
* **Paths**: each path has its own send socket and so its own source port; ECMP
  hashing on the UDP 5-tuple then spreads paths over equal-cost routes.
* **Receive**: with UDP GRO the kernel hands over up to 64 KB of same-size
  datagrams at once and says their size; reads with the same segment size are
  gathered back to back into one buffer, so the protocol core parses many
  reads in one vectorised call.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError
from ..proto.wire import Reason
from . import kernel_filter
from .extensions import load
from .native_receive import MessageRuns, TakenRuns, hand_over

# (not built: the same loop runs in Python)
_udpio: ModuleType | None = load("_udpio")

__all__ = [
    "UDP_GRO",
    "UDP_SEGMENT",
    "DataSockets",
    "bind",
    "datagrams_per_gso_message",
    "kernel_supports",
]

log = logging.getLogger("dlcp.io")

#: what receive() hands each run of datagrams to: (buffer, segment size)
Deliver = Callable[[npt.NDArray[np.uint8], int], None]

# Linux socket options (include/uapi/linux/udp.h); Python 3.11 does not name them
UDP_SEGMENT = 103
UDP_GRO = 104
_GSO_MAX_BYTES = 65000  # stay under the 64 KB IP datagram limit with headers
_GSO_MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS on older kernels
_READ_SIZE = 65536
_MAX_READS = 4096  # reads per receive() call, so that sending gets its turn
#: reads per receive() call with junk the pre-filter dropped (4 x _MAX_READS: some
#: 25 ms at 1.5 us a junk datagram, longer on a busy machine)
_MAX_ALL_READS = 4 * _MAX_READS
#: bytes of same-size datagrams gathered into one batch for the session at most
RECEIVE_BUFFER_BYTES = 8 << 20
#: bytes one step of the receive loop reads at most before its runs are taken
#: or handed over (then the next step reads into the start of the buffer again):
#: what the kernel copies into the buffer is still in the core's cache when the
#: run path reads it back to scatter it. Steps of the whole budget (4 MB through
#: an 8 MB buffer) cost the 25 MB ring ~13 % more CPU on the 2-vCPU AMD EPYC VM
#: (512 KB of L2 a core), most of it in the kernel's copy to the buffer
#: (docs/benchmarks.md, "Cache-sized receive steps")
RECEIVE_STEP_BYTES = 256 << 10
#: bytes one receive() call takes at most by default (its steps' runs are taken in
#: C; what they took reaches Python once, when the call ends)
RECEIVE_BUDGET_BYTES = 4 << 20


def kernel_supports(option: int) -> bool:
    """Whether this kernel accepts a UDP socket option (GSO, GRO)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(socket.SOL_UDP, option, 1400 if option == UDP_SEGMENT else 1)
        except OSError:
            return False
    return True


def _decide(name: str, mode: str, option: int) -> bool:
    have = kernel_supports(option)
    if mode == "on" and not have:
        raise ConfigError(f"{name}=on but this kernel does not support UDP {name.upper()}")
    return have and mode != "off"


class DataSockets:
    """The UDP sockets of one endpoint."""

    def __init__(
        self, host: str, port: int, n_paths: int, *, gso: str, gro: str, rcvbuf: int, sndbuf: int
    ) -> None:
        self.use_gso = _decide("gso", gso, UDP_SEGMENT)
        self.use_gro = _decide("gro", gro, UDP_GRO)
        self.recv_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.send_socks: list[socket.socket] = []
        try:
            _set_buffer(self.recv_sock, socket.SO_RCVBUF, rcvbuf)
            bind(self.recv_sock, host, port, port_setting="data_port")
            self.recv_sock.setblocking(False)
            if self.use_gro:
                self.recv_sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
            for _ in range(n_paths):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self.send_socks.append(s)
                _set_buffer(s, socket.SO_SNDBUF, sndbuf)
                # (shared with the probes that find its route: dlcp.io.path_probe)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                bind(s, host, 0, port_setting="data_port")  # own source port: own ECMP hash
        except BaseException:
            self.close()
            raise
        self.address: tuple[str, int] = self.recv_sock.getsockname()
        #: each path's source port, in path order
        self.path_ports: list[int] = [s.getsockname()[1] for s in self.send_socks]
        #: the receive socket's descriptor for the C loop (-1 once closed: a read fails)
        self._recv_fd = self.recv_sock.fileno()
        log.info(
            "dlcp data socket %s:%d, %d path(s), GSO %s, GRO %s",
            *self.address,
            n_paths,
            "on" if self.use_gso else "off",
            "on" if self.use_gro else "off",
        )
        self._buf = np.empty(RECEIVE_BUFFER_BYTES, dtype=np.uint8)
        self._tos_cache: dict[int, tuple[int, int, bytes]] = {}
        self.empty_datagrams = 0
        #: the last receive() stopped at its budget with datagrams still queued
        self.backlog = False
        #: seconds the last receive() waited for more data (its ``linger``)
        self.lingered = 0.0
        #: datagrams the pre-filter dropped, by reason code (dlcp.proto.wire.Reason;
        #: 16 slots, as _prefilter.h counts them), since take_screened() last took them
        self.screened = np.zeros(16, dtype=np.int64)
        #: the same counts as ints (builtin ``sum`` over 16 slots: a fifth of the time
        #: of numpy's, which the receive loop paid twice per step)
        self._screened_ints = self.screened.data
        #: their sum when the receive loop last looked (nothing else adds to them):
        #: 0 tells take_screened() there is nothing to take, without a reduction
        self.screened_total = 0
        self._screen: tuple[int, bool, int] | None = None
        #: whether the receive socket has the kernel filter (dlcp.io.kernel_filter)
        self.kernel_filter = False
        #: the socket's kernel drop counter (a u32: a new socket's is 0) when last
        #: read, and the drops counted up to then
        self._drops_read = self._drops = 0
        #: the messages the receive loop scatters itself (take_runs), if it does
        self.runs: MessageRuns | None = None

    def take_runs(self, job: int) -> MessageRuns:
        """The table of messages under way whose runs :meth:`receive` scatters
        itself, in C, from now on (when it is given ``taken``;
        :mod:`dlcp.io.native_receive`, which says when it is available)."""
        if self.runs is None:
            self.runs = MessageRuns(job)
        return self.runs

    def screen(self, *, job: int, require_auth: bool, tag_len: int, in_kernel: bool) -> bool:
        """Drop, from now on, the received datagrams that break a header rule of
        spec §6.1 for a receiver of ``job`` (``require_auth``: untagged ones too;
        ``tag_len``: the bytes a tag adds).

        With ``in_kernel`` the kernel drops them before they are queued (a BPF
        filter, :mod:`dlcp.io.kernel_filter`; a ConfigError if it cannot be
        attached), counted in :meth:`socket_drops`; what it lets through (the
        later datagrams of a GRO super-packet) is screened as without it. The C
        receive loop drops them before they are delivered, counting them in
        :attr:`screened`. Returns whether that loop screens: False if it was not
        built (the session's parser then rejects them, as it would)."""
        if in_kernel:
            program = kernel_filter.data_filter(
                job, require_auth=require_auth, tag_len=tag_len, gro=self.use_gro
            )
            kernel_filter.attach(
                self.recv_sock, program, setting="kernel_filter=False / DLCP_KERNEL_FILTER=0"
            )
            self.kernel_filter = True
        self._screen = (job, require_auth, tag_len)
        return _udpio is not None

    def socket_drops(self) -> int:
        """Datagrams the kernel dropped at the receive socket since it was opened:
        those the kernel filter dropped and those that found the receive buffer
        full (the kernel counts both in one counter). Exact if read at least once
        every 2**32 drops (the kernel's counter wraps there)."""
        now = kernel_filter.drop_count(self.recv_sock)
        self._drops += (now - self._drops_read) % (1 << 32)
        self._drops_read = now
        return self._drops

    def take_screened(self) -> dict[str, int]:
        """The pre-filter's drops since the last call, by reason name (as the
        session's ``rejected`` counters name them)."""
        if not self.screened_total:
            return {}
        counts = self.screened
        taken = {Reason(int(c)).name.lower(): int(counts[c]) for c in np.flatnonzero(counts)}
        counts[:] = 0
        self.screened_total = 0
        return taken

    def close(self) -> None:
        self._recv_fd = -1
        for s in [self.recv_sock, *self.send_socks]:
            s.close()

    # ------------------------------------------------------------------ send

    def send(
        self,
        data: memoryview,
        segment_size: int,
        count: int,
        *,
        path: int,
        tos: int,
        addr: tuple[str, int],
    ) -> int:
        """Send ``count`` datagrams of ``segment_size`` bytes (last may be shorter).
        Returns datagrams sent; a full socket buffer blocks until it drains, and a
        message the host's own queue dropped is lost (:func:`_send_message`)."""
        sock = self.send_socks[path % len(self.send_socks)]
        tos_msg = self._tos_cache.get(tos)
        if tos_msg is None:
            tos_msg = (socket.IPPROTO_IP, socket.IP_TOS, struct.pack("=i", tos))
            self._tos_cache[tos] = tos_msg
        # datagrams per message: a 64 KB GSO message, or one datagram without GSO
        per_message = datagrams_per_gso_message(segment_size) if self.use_gso else 1
        if _udpio is not None and count > 1:  # every message of the batch in few system calls
            host, port = addr
            fd = sock.fileno()
            return int(_udpio.send_batch(fd, data, segment_size, per_message, host, port, tos))
        step = per_message * segment_size
        seg = (socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", segment_size))
        sent = 0
        for start in range(0, len(data), step):
            chunk = data[start : start + step]
            cmsgs = [tos_msg] if len(chunk) <= segment_size else [tos_msg, seg]
            if _send_message(sock, [chunk], cmsgs, addr):
                sent += -(-len(chunk) // segment_size)
        return sent

    def send_gathered(
        self,
        heads: npt.NDArray[np.uint8],
        payload: npt.NDArray[np.uint8],
        chunk: int,
        *,
        path: int,
        tos: int,
        addr: tuple[str, int],
    ) -> int:
        """Send one datagram per row of ``heads`` (2-D uint8), row ``i`` followed
        by chunk ``i`` of ``payload`` (``chunk`` bytes; the last may be shorter),
        gathered by the kernel from both: nothing is copied into a send buffer.
        Returns datagrams sent; a full socket buffer blocks until it drains, and a
        datagram the host's own queue dropped is lost (:func:`_send_message`)."""
        count, head = int(heads.shape[0]), int(heads.shape[1])
        sock = self.send_socks[path % len(self.send_socks)]
        per_message = datagrams_per_gso_message(head + chunk) if self.use_gso else 1
        if _udpio is not None:
            host, port = addr
            sent: int = _udpio.send_gathered(
                sock.fileno(), heads, head, payload, chunk, per_message, host, port, tos
            )
            return sent
        tos_msg = [(socket.IPPROTO_IP, socket.IP_TOS, struct.pack("=i", tos))]
        sent = 0
        for i in range(count):  # (without the extension: a sendmsg a datagram)
            part = payload[i * chunk : (i + 1) * chunk]
            sent += _send_message(sock, [heads[i].data, part.data], tos_msg, addr)
        return sent

    # ------------------------------------------------------------------ receive

    def receive(
        self,
        deliver: Deliver,
        *,
        budget: int = RECEIVE_BUDGET_BYTES,
        accelerated: bool | None = None,
        taken: TakenRuns | None = None,
        linger: float = 0.0,
        watch: int = -1,
        nap: float = 0.0,
        trickle: float = 0.0,
    ) -> int:
        """Drain the receive socket (up to ``budget`` bytes) without blocking and
        hand runs of same-size datagrams to ``deliver(buf, segment_size)``, which
        must be done with ``buf`` when it returns (the memory is reused).

        Reads of the same segment size are gathered back to back, so one call of
        ``deliver`` covers many GRO reads; a read that ends in a short datagram
        closes its run. Returns the bytes read. The loop runs in C
        (``dlcp.io._udpio``) when that was built, else in Python (``accelerated``
        picks one, for tests).

        With ``taken`` and a table of messages (:meth:`take_runs`), the C loop
        scatters the runs of registered messages itself and hands ``deliver``
        only what they do not take, in arrival order: ``taken`` hears what they
        took (before any later run is handed over) and the datagrams after a
        taken prefix (:mod:`dlcp.io.native_receive`).

        ``linger`` (seconds; that table's loop only) lets the C loop wait that
        long for more data after the socket ran dry, once the runs it read were
        taken, unless a file of the epoll set ``watch`` (a descriptor; -1: none)
        other than this socket turns readable first (``dlcp/io/_linger.h``):
        one call instead of a call per burst. :attr:`lingered` says how long it
        waited.

        ``nap`` (seconds, with ``linger``): data that trickles in after a wait
        (less than 32 KB came) does not end the linger while the call's data
        comes slower than about 1 Gbit/s; the loop sleeps ``nap`` at a time, off
        the socket's wait queue, and takes what came, until ``trickle`` seconds
        from the call's start (never before the linger's end), or until another
        file of ``watch`` is ready."""
        self.lingered = 0.0
        use_c = _udpio is not None if accelerated is None else accelerated
        if use_c and _udpio is not None:
            if taken is None or self.runs is None:
                return self._receive_c(deliver, budget, None, 0, -1)
            return self._receive_c(
                deliver, budget, taken, int(linger * 1e9), watch, int(nap * 1e9), int(trickle * 1e9)
            )
        return self._receive_py(deliver, budget)

    def _receive_c(
        self,
        deliver: Deliver,
        budget: int,
        taken: TakenRuns | None,
        linger_ns: int,
        watch: int,
        nap_ns: int = 0,
        trickle_ns: int = 0,
    ) -> int:
        """The C loop. What counts against ``budget`` and :data:`_MAX_READS` is
        what was delivered: the datagrams the pre-filter dropped (and empty ones)
        cost a few microseconds each, and reading past them to the data queued
        behind keeps a FINISH from being judged before that data is read. They
        are bounded too, by :data:`_MAX_ALL_READS` reads a call. Each step of
        the loop reads at most :data:`RECEIVE_STEP_BYTES` (its runs are taken or handed
        over before the next step reads over them); the message table's loop takes
        its steps in C, returning to Python when a run needs it or the call ends."""
        assert _udpio is not None
        buf, fd = self._buf, self._recv_fd
        total = reads = 0  # everything read
        counted_bytes = counted_reads = 0  # what was delivered
        while True:
            byte_room = budget - counted_bytes
            read_room = _MAX_READS - counted_reads
            if _MAX_ALL_READS - reads < read_room:
                read_room = _MAX_ALL_READS - reads
            if taken is not None:
                # (the table's loop takes its steps itself, in C)
                assert self.runs is not None
                screen = None if self._screen is None else (*self._screen, self.screened)
                nbytes, n_reads, empty, err, kept, drained, waited = self.runs.table.receive(
                    fd, buf, byte_room, read_room, _READ_SIZE, RECEIVE_STEP_BYTES, screen,
                    linger_ns, watch, nap_ns, trickle_ns,
                )  # fmt: skip
                linger_ns = 0  # (one linger a call: a call after a handover reads what is queued)
                nap_ns = trickle_ns = 0
                self.lingered += waited * 1e-9
                counted_bytes += kept
                if kept:  # (something was staged, or taken with counts to report)
                    hand_over(self.runs.table, buf, deliver, taken)
                # (the pre-filter cuts what it drops out of the runs, and an empty
                # datagram is in none: with every byte read kept, it dropped nothing)
                may_have_screened = kept != nbytes
            else:
                byte_room = min(byte_room, RECEIVE_STEP_BYTES)
                runs, nbytes, n_reads, empty, more, err = _udpio.recv_runs(
                    fd, buf, byte_room, read_room, _READ_SIZE
                )
                drained = not more and n_reads < read_room and nbytes < byte_room
                if self._screen is not None:
                    runs = _udpio.filter_runs(buf, runs, *self._screen, self.screened)
                for start, end, seg in runs:
                    counted_bytes += end - start
                    deliver(buf[start:end], seg)
                may_have_screened = bool(n_reads)
            total += int(nbytes)
            reads += int(n_reads)
            self.empty_datagrams += int(empty)
            junk = int(empty)
            if self._screen is not None and may_have_screened:
                dropped = sum(self._screened_ints)
                junk += dropped - self.screened_total
                self.screened_total = dropped
            counted_reads += int(n_reads) - junk
            if err:
                raise OSError(err, os.strerror(err))
            if counted_bytes >= budget or counted_reads >= _MAX_READS or reads >= _MAX_ALL_READS:
                self.backlog = True
                return total
            if drained:
                self.backlog = False
                return total
            # a step was full (its runs are consumed), a run needed Python, or junk
            # used this call's room

    def _receive_py(self, deliver: Deliver, budget: int) -> int:
        buf = self._buf
        start = fill = seg_size = total = 0
        cmsg_space = socket.CMSG_SPACE(4)
        reads = 0
        self.backlog = True  # unless the socket runs dry first
        while total < budget and reads < _MAX_READS:
            # (a step ends as the C loop's do, or where the buffer has no room left)
            if fill >= RECEIVE_STEP_BYTES or len(buf) - fill < _READ_SIZE:
                if fill > start:
                    deliver(buf[start:fill], seg_size)
                start = fill = 0
            reads += 1
            view = memoryview(buf)[fill : fill + _READ_SIZE]  # type: ignore[arg-type]
            try:
                n, anc, _flags, _addr = self.recv_sock.recvmsg_into([view], cmsg_space)
            except (BlockingIOError, InterruptedError):
                self.backlog = False
                break
            total += n
            if n == 0:  # an empty datagram carries nothing; the session never sees it
                self.empty_datagrams += 1
                continue
            seg = n
            for level, kind, payload in anc:
                if level == socket.SOL_UDP and kind == UDP_GRO and len(payload) >= 4:
                    seg = struct.unpack("=i", payload[:4])[0]
            if seg <= 0:
                seg = n
            if fill > start and seg != seg_size:  # a different size starts a new run
                deliver(buf[start:fill], seg_size)
                start = fill
            seg_size = seg
            fill += n
            if n % seg:  # short last datagram: the run cannot continue after it
                deliver(buf[start:fill], seg_size)
                start = fill
        if fill > start:
            deliver(buf[start:fill], seg_size)
        return total


def _send_message(
    sock: socket.socket,
    buffers: list[Any],
    cmsgs: list[tuple[int, int, bytes]],
    addr: tuple[str, int],
) -> bool:
    """``sock.sendmsg``; False where the host's own egress queue dropped the
    message (ENOBUFS, which the kernel reports to a socket with ``IP_RECVERR``):
    a lost packet, as one the network drops, not a refused send (the C senders
    do the same: ``_sendmmsg.h``). Any other error raises."""
    try:
        sock.sendmsg(buffers, cmsgs, 0, addr)
    except OSError as exc:
        if exc.errno != errno.ENOBUFS:
            raise
        return False
    return True


def datagrams_per_gso_message(segment_size: int) -> int:
    """Datagrams of ``segment_size`` bytes that one GSO send carries (a 64 KB
    message): what one drop of an unsegmented GSO packet takes with it."""
    return max(1, min(_GSO_MAX_SEGMENTS, _GSO_MAX_BYTES // segment_size))


def bind(sock: socket.socket, host: str, port: int, *, port_setting: str) -> None:
    """``sock.bind((host, port))``, failing with a ConfigError that names the
    address and the settings behind it (``host``/``DLCP_HOST``, ``port_setting``)."""
    try:
        sock.bind((host, port))
    except OSError as exc:
        setting = port_setting.upper()
        raise ConfigError(
            f"cannot bind {host}:{port} (host / DLCP_HOST, {port_setting} / DLCP_{setting}): "
            f"{exc.strerror or exc}"
        ) from exc


def _set_buffer(sock: socket.socket, option: int, size: int) -> None:
    # SO_{RCV,SND}BUFFORCE (root) can exceed net.core.*mem_max
    force = {socket.SO_RCVBUF: 33, socket.SO_SNDBUF: 32}[option]
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, option, size)
