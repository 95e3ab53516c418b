"""The UDP floor of the DDP benchmark: a ring all-reduce over bare UDP datagrams.

What the cheapest UDP transport of DLCP's shape would cost in the same DDP job:
the gradient of every bucket goes around the ring exactly as DLCP's ring moves
it (``n - 1`` reduce-scatter steps, each a chunk to the right neighbour while
the left neighbour's chunk is added in; ``n - 1`` all-gather steps), in
datagrams of DLCP's size (its MTU, 32-byte header, its payload per datagram)
sent and read through DLCP's own UDP layer
(:class:`~dlcp.io.udp.DataSockets`: ``sendmmsg`` with GSO, each datagram
gathered from its header and the bucket as DLCP's native engine sends,
``recvmmsg`` with GRO, in C), each payload copied to its place with DLCP's row
copy (streaming stores where DLCP's receive path streams:
:func:`dlcp.proto.kernels.streams_received`), from a transport thread that
overlaps backward as DLCP's hook does.

Everything above that is left out: no classification, pacing, control
channel, acknowledgement, loss recovery or validation beyond a header of
(bucket step, byte offset). Each datagram is sent once; a receiver waits until
every byte of its step is there. It therefore runs without loss only (a lost
datagram fails the job after ``FLOOR_TIMEOUT_S``) and is a yardstick, not a
transport: no transport that sends each byte once in such datagrams, through
the same kernel path, can average the gradients for less in this job.

A rank's two receive sockets alternate by bucket (the left neighbour may start
the next bucket while this rank finishes the current one; the kernel holds
those datagrams on the other socket until this rank gets to them), so nothing
is copied aside. Datagrams of the current bucket that belong to a later step
(a left neighbour one step ahead) are placed at once: every step's destination
is known when the bucket starts.
"""

from __future__ import annotations

import itertools
import queue
import select
import socket
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from dlcp.errors import ArgumentTypeError, DLCPError, UsageError
from dlcp.proto.kernels import copy_rows, streams_received

#: seconds a step may wait for its datagrams before the job fails (nothing is
#: retransmitted: a missing datagram never comes)
FLOOR_TIMEOUT_S = 30.0
#: bytes sent between two looks at the receive socket
_SEND_SLICE = 256 << 10
#: the header's fields (the rest of DLCP's 32 header bytes is zeros)
_HEADER = np.dtype([("tag", "<u4"), ("offset", "<u4")])
_RCVBUF = 64 << 20


class FloorError(DLCPError, RuntimeError):
    """The floor ring could not finish a step (a datagram was lost or misrouted)."""


class UdpRingFloor:
    """The floor's comm-hook state for one rank: its sockets and transport thread.

    ``addresses`` come from every rank (``all_gather_object`` of
    :attr:`addresses` in the worker); ``connect`` takes them before training."""

    def __init__(self, rank: int, world: int, *, host: str = "127.0.0.1") -> None:
        from dlcp.io import EndpointConfig
        from dlcp.io.path_mtu import sized_for_interface
        from dlcp.io.udp import DataSockets
        from dlcp.proto.wire import DATA_HEADER_LEN

        # (DLCP's datagram size as its endpoints resolve it: DLCP_MTU=auto too)
        cfg = sized_for_interface(EndpointConfig.from_env(host=host))
        self.rank, self.world = rank, world
        self.header = DATA_HEADER_LEN
        self.payload = cfg.protocol.chunk_bytes
        self.segment = self.header + self.payload
        # one per bucket parity: see the module docstring
        self._socks = [
            DataSockets(host, 0, 1, gso=cfg.gso, gro=cfg.gro, rcvbuf=_RCVBUF, sndbuf=cfg.sndbuf)
            for _ in range(2)
        ]
        self.addresses = [s.address for s in self._socks]
        self._right: list[tuple[str, int]] = []
        self._bucket = 0
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="floor-ring", daemon=True)
        # reused datagram headers (the payload is read from the bucket)
        self._heads = np.zeros((0, self.header), np.uint8)
        # the reduce-scatter's scratch, reused from call to call as DLCP's ring
        # reuses its communicator's (new pages every call would charge the floor
        # page faults and zeroing that the ring does not pay)
        self._scratch = np.empty(0, np.float32)

    def buffers_granted(self) -> bool:
        """Whether the kernel gave every receive socket the buffer asked for: a
        smaller one (no CAP_NET_ADMIN, as root in many containers) drops datagrams
        in a burst, and the floor resends nothing."""
        return all(
            s.recv_sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= _RCVBUF
            for s in self._socks
        )

    def connect(self, every: list[list[tuple[str, int]]]) -> None:
        self._right = every[(self.rank + 1) % self.world]
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(FLOOR_TIMEOUT_S)
        for s in self._socks:
            s.close()

    # ------------------------------------------------------------------ the hook

    def submit(self, tensor: Any) -> Any:
        import torch

        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._jobs.put((tensor, fut))
        # re-raised in a callback, an error reaches the training loop with its own
        # message (set on the hook's future, DDP's reducer only says "Unable to cast")
        return fut.then(_unwrap)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            tensor, fut = job
            try:
                self.allreduce(tensor.detach().numpy())
            except Exception as exc:  # the training loop sees it through the future
                fut.set_exception(exc)
                continue
            fut.set_result(tensor)

    # ------------------------------------------------------------------ the ring

    def allreduce(self, data: npt.NDArray[np.float32]) -> None:
        """Average ``data`` (1-D float32) over the ring, in place."""
        if data.dtype != np.float32:
            raise ArgumentTypeError(f"the UDP floor averages float32 buckets, got {data.dtype}")
        n, r = self.world, self.rank
        if 2 * (n - 1) > 0xFF:  # a step must fit the tag's low byte
            raise UsageError(f"the UDP floor's ring takes at most 128 ranks, got {n}")
        parity = self._bucket % 2
        base_tag = (self._bucket & 0xFFFFFF) << 8  # step in the low byte
        self._bucket += 1
        bounds = [len(data) * i // n for i in range(n + 1)]
        byte_view = data.view(np.uint8)

        def chunk_bytes(i: int) -> npt.NDArray[np.uint8]:
            return byte_view[bounds[i] * 4 : bounds[i + 1] * 4]

        # every step's destination, known now: reduce-scatter steps land in their
        # own scratch chunks (added in at their turn), all-gather steps in place
        dest: dict[int, npt.NDArray[np.uint8]] = {}
        widest = max(b - a for a, b in itertools.pairwise(bounds))
        if len(self._scratch) < (n - 1) * widest:
            self._scratch = np.empty((n - 1) * widest, np.float32)
        scratch: list[npt.NDArray[np.float32]] = []
        for s in range(n - 1):
            i = (r - s - 1) % n
            scratch.append(self._scratch[s * widest : s * widest + bounds[i + 1] - bounds[i]])
            dest[base_tag | s] = scratch[-1].view(np.uint8)
        for s in range(n - 1):
            dest[base_tag | (n - 1 + s)] = chunk_bytes((r - s) % n)
        inbox = _Inbox(dest, self.header, self._socks[parity])
        to = self._right[parity]
        for s in range(n - 1):  # reduce-scatter
            self._send(chunk_bytes((r - s) % n), base_tag | s, to, inbox)
            inbox.wait_for(base_tag | s)
            i = (r - s - 1) % n
            data[bounds[i] : bounds[i + 1]] += scratch[s]
        own = (r + 1) % n
        data[bounds[own] : bounds[own + 1]] /= np.float32(n)
        for s in range(n - 1):  # all-gather
            self._send(chunk_bytes((r + 1 - s) % n), base_tag | (n - 1 + s), to, inbox)
            inbox.wait_for(base_tag | (n - 1 + s))
        inbox.check_done()

    def _send(
        self, payload: npt.NDArray[np.uint8], tag: int, to: tuple[str, int], inbox: _Inbox
    ) -> None:
        """``payload`` in DLCP-sized datagrams to ``to``, reading between slices:
        each datagram gathered by the kernel from its header and its chunk of
        ``payload`` (no copy into a send buffer, as DLCP's native engine sends)."""
        size, step = len(payload), self.payload
        count = -(-size // step)
        if count == 0:
            return
        if len(self._heads) < count:
            self._heads = np.zeros((count, self.header), np.uint8)
        heads = self._heads[:count]
        fields = heads[:, : _HEADER.itemsize].view(_HEADER).reshape(count)
        fields["tag"] = tag
        fields["offset"] = np.arange(count, dtype=np.uint32) * step
        per_slice = max(1, _SEND_SLICE // self.segment)
        sock = inbox.sockets
        for first in range(0, count, per_slice):
            last = min(count, first + per_slice)
            part = payload[first * step : min(size, last * step)]
            sock.send_gathered(heads[first:last], part, step, path=0, tos=0, addr=to)
            inbox.poll()


def _unwrap(fut: Any) -> Any:
    return fut.wait()


class _Inbox:
    """One bucket's receiving side: places each datagram at its step's offset
    and counts the bytes each step still misses."""

    def __init__(self, dest: dict[int, npt.NDArray[np.uint8]], header: int, sockets: Any) -> None:
        self.dest = dest
        self.header = header
        self.sockets = sockets
        self.missing = {tag: len(buf) for tag, buf in dest.items()}

    def poll(self) -> None:
        self.sockets.receive(self._deliver)

    def wait_for(self, tag: int) -> None:
        fd = self.sockets.recv_sock.fileno()
        while self.missing[tag] > 0:
            self.poll()
            if self.missing[tag] > 0:
                ready, _, _ = select.select([fd], [], [], FLOOR_TIMEOUT_S)
                if not ready:
                    raise FloorError(
                        f"floor ring: step {tag & 0xFF} still misses {self.missing[tag]} bytes "
                        f"after {FLOOR_TIMEOUT_S:g} s (a datagram was lost: the floor "
                        "runs without loss only)"
                    )

    def check_done(self) -> None:
        left = {tag & 0xFF: n for tag, n in self.missing.items() if n}
        if left:
            raise FloorError(f"floor ring: steps end with bytes missing: {left}")

    def _deliver(self, buf: npt.NDArray[np.uint8], segment: int) -> None:
        full = len(buf) // segment
        if full:
            self._place(buf[: full * segment].reshape(full, segment))
        if len(buf) > full * segment:  # a short last datagram
            self._place(buf[full * segment :].reshape(1, -1))

    def _place(self, rows: npt.NDArray[np.uint8]) -> None:
        """Copy each datagram's payload to its step's offset: one copy per run of
        one step's datagrams at consecutive offsets (a sender's datagrams arrive
        in order on these paths), one per datagram otherwise. Nothing is ever
        sent twice here, so each datagram's bytes count once toward its step."""
        heads = np.ascontiguousarray(rows[:, : _HEADER.itemsize]).view(_HEADER).reshape(-1)
        tags, offsets = heads["tag"], heads["offset"].astype(np.int64)
        step = rows.shape[1] - self.header
        # where the step changes (a chunk that ends in a full datagram runs on
        # into the next step's datagrams in the same read)
        cuts = [0, *(np.flatnonzero(tags[1:] != tags[:-1]) + 1).tolist(), len(rows)]
        for first, last in itertools.pairwise(cuts):
            tag = int(tags[first])
            expect = offsets[first] + step * np.arange(last - first, dtype=np.int64)
            if np.array_equal(offsets[first:last], expect):
                self._copy(tag, int(offsets[first]), rows[first:last])
            else:
                for k in range(first, last):
                    self._copy(tag, int(offsets[k]), rows[k : k + 1])

    def _copy(self, tag: int, offset: int, rows: npt.NDArray[np.uint8]) -> None:
        """Payloads of ``rows`` (consecutive datagrams of step ``tag``) to ``offset``."""
        buf = self.dest.get(tag)
        if buf is None:
            raise FloorError(f"floor ring: a datagram of unknown step {tag:#x}")
        step = rows.shape[1] - self.header
        hi = offset + len(rows) * step
        if hi > len(buf):
            raise FloorError(f"floor ring: a datagram past step {tag & 0xFF}'s end")
        # (DLCP's copy: streaming stores into a destination as large as its
        # receive path streams into, dlcp.proto.kernels.streams_received)
        copy_rows(buf, offset, step, None, rows.reshape(-1), self.header, rows.shape[1], None,
                  len(rows), step, stream=streams_received(len(buf)))  # fmt: skip
        self.missing[tag] -= hi - offset
