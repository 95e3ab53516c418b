"""Core throughput: packetize + reassemble a tensor through two sessions, in memory.

What is timed is the time spent inside the two sessions' calls:
``Session.send_message`` (chunking, classification, building the records) on the
sending session, every ``datagrams_to_send`` batch handed to the receiving
session's ``receive_batch`` (parsing, validation, scatter into the output
buffer), control messages both ways, until the receiver reports the message
complete. No sockets, no loss, no pacing (``pacer=unpaced``:
pacing is policy, this measures the CPU cost of the core). The baseline is a
numpy copy of the same bytes in the same process, so the ratio says how close to
memory speed the protocol work runs.

The receiver gets what the endpoint would hand it: the endpoint's UDP driver
reads GRO batches back to back into its receive buffer, ``RECEIVE_STEP_BYTES``
(256 KB) a step, as runs of same-size datagrams, and takes each step's runs
while they are still in the core's cache. Here the sender's consecutive data
batches already lie back to back in its record buffer, so a run is a view of
them, up to that size, which the harness copies into a step buffer of its own
before the receiving session takes it from there (that copy is the kernel's into
the receive buffer: not core work, not timed; the transport benchmark measures it
with everything else). Taken from the record buffer itself, every run came from
memory, 64 MiB after it was written; the endpoint's loop reads a step it just
read. The receiving session takes the runs by the path the endpoint takes them by
(``--receive-path``, in the JSON ``receive_path``):

* ``native`` (the default where ``dlcp.io.native_receive`` was built, on either
  engine, as the endpoint's default ``native_receive``): each step's run is staged
  in the C table of the messages under way and taken there, and the session applies
  what the table took once a receive call's worth (``RECEIVE_BUDGET_BYTES``, 4 MB),
  each message's counts added up over the call's steps in the table, as in the
  endpoint's receive call, and also before a control datagram and before each run the
  table hands over (one that may complete its message, one it does not take);
  the receive is posted with its buffer before the data, so the table takes the
  first run too, as in the endpoint (a run it does not take goes to
  ``receive_batch``);
* ``python`` (the endpoint with ``native_receive`` off, or without the
  extension): one ``receive_batch`` call per run.

On the native engine (the default where it was built; ``DLCP_ENGINE`` picks,
as for every benchmark) the sending session is driven as that engine drives
it: made with ``whole_rounds``, lent the tensor (``borrow=True``, as the
collectives lend their sends), it builds each round's headers, and the
datagrams are each header followed by its chunk of the tensor, which the
engine hands the kernel as two iovecs: that gather is the kernel's copy, not
core work, and the harness does it untimed, like the receive side's. The
session's ``round_sent`` and ``release_round`` calls are timed. On the Python
engine the sender copies every chunk into its record (timed): the sessions as
the Python engine drives them.

    python -m dlcp.bench.core --json           # last line: one JSON object
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from dlcp.errors import ArgumentTypeError, BenchError
from dlcp.io import native_receive
from dlcp.io.native_receive import TAKE_REST, TAKE_WHOLE, MessageRuns
from dlcp.io.udp import RECEIVE_BUDGET_BYTES, RECEIVE_STEP_BYTES
from dlcp.proto import kernels
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import (
    ControlDatagram,
    DataBatch,
    MessageReceived,
    RoundPost,
    RoundRelease,
    Session,
    Transmit,
)
from dlcp.proto.wire import DATA_HEADER_LEN

from .machine import cpu_times, describe
from .outcome import engine_of_run


def as_control(item: Transmit) -> ControlDatagram:
    """``item``, a control datagram: what a session sends besides data batches when it
    was not made to hand whole rounds to a native engine (``whole_rounds``)."""
    if not isinstance(item, ControlDatagram):
        raise ArgumentTypeError(f"a {type(item).__name__} from a session without whole rounds")
    return item


class Receiver:
    """The receiving session and the path its data runs take (module doc). Each run
    is first read into the receive buffer's step, as the endpoint's loop reads it
    (:meth:`land`: the kernel's copy, not timed), and taken from there while it is
    in the cache: with ``table``, a ``MessageRuns`` the session registers its
    messages with, by the C table, step by step, the session applying what it
    took once a receive call's worth (:meth:`apply`); without, by
    ``receive_batch``."""

    def __init__(self, session: Session, table: MessageRuns | None) -> None:
        self.session = session
        self.table = table
        self.now = 0.0
        #: the start of the receive buffer: every step is read to it
        self._step = np.empty(RECEIVE_STEP_BYTES, np.uint8)
        #: the bytes of the steps taken since the last apply (a receive call's)
        self._call_bytes = 0
        if table is not None:
            session.take_runs_natively(table)

    def land(self, buf: np.ndarray) -> np.ndarray:
        """Run ``buf`` read into the receive buffer's step (the harness's work)."""
        if len(buf) > len(self._step):
            self._step = np.empty(len(buf), np.uint8)
        step = self._step[: len(buf)]
        np.copyto(step, buf)
        return step

    def must_apply_before(self, buf: np.ndarray) -> bool:
        """Whether what was taken is a receive call's worth without the run in
        ``buf``: the session applies it before that run is taken."""
        return self._call_bytes > 0 and self._call_bytes + len(buf) > RECEIVE_BUDGET_BYTES

    def take(self, step: np.ndarray, segment_size: int) -> None:
        """One step's run, taken in C as the receive loop takes it: the table keeps
        each message's counts over the steps of a call, as the receive call does,
        and reports them with a run it hands over (those counts go to the session
        first) or when the call ends (:meth:`apply`)."""
        assert self.table is not None
        table = self.table.table
        table.stage(step, [(0, len(step), segment_size)])
        self._call_bytes += len(step)
        while True:
            handover, took = table.next(step, False)
            if handover is None:
                return
            if took:  # (a run that may have completed its message: TAKE_CHECK)
                self.session.receive_taken(took, now=self.now)
            start, end, seg, kind = handover
            if kind == TAKE_WHOLE:
                self.session.receive_batch(step[start:end], seg, now=self.now)
            elif kind == TAKE_REST:
                self.session.receive_rest(step[start:end], seg, now=self.now)

    def apply(self) -> None:
        """The receive call ends (its budget spent, or a control datagram next):
        what the table took since the last report, applied by the session once."""
        if self.table is not None and self._call_bytes:
            _, took = self.table.table.next(self._step)  # (nothing staged is left)
            if took:
                self.session.receive_taken(took, now=self.now)
        self._call_bytes = 0


def one_transfer(tx: Session, receiver: Receiver, data: np.ndarray, out: np.ndarray,
                 step: int) -> float:  # fmt: skip
    """One message from ``tx`` to ``receiver``'s session; returns the seconds spent
    inside the two sessions' calls (the harness that carries datagrams between them
    is not timed). A ``tx`` made with ``whole_rounds`` is lent ``data`` and hands
    out rounds."""
    rx = receiver.session
    rx.expect_message(0, step=step, msg=0, out=out)
    clock = time.perf_counter
    now = receiver.now
    t0 = clock()
    tx.send_message(1, data, step=step, msg=0, now=now, borrow=True)
    core = clock() - t0
    done = None
    while done is None:
        t0 = clock()
        items = tx.datagrams_to_send(now=now, max_batches=1 << 20)
        core += clock() - t0
        if not items:
            raise BenchError("sender went idle before the message completed")
        for item in _as_received(items):
            if type(item) is tuple:
                buf, seg = item
                t0 = clock()
                if receiver.must_apply_before(buf):
                    receiver.apply()
                core += clock() - t0
                landed = receiver.land(buf)
                t0 = clock()
                if receiver.table is None:
                    rx.receive_batch(landed, seg, now=now)
                else:
                    receiver.take(landed, seg)
                core += clock() - t0
                continue
            t0 = clock()
            receiver.apply()  # (the data before it first, as the endpoint takes it)
            if isinstance(item, ControlDatagram):
                rx.receive_datagram(item.data, now=now)
            elif isinstance(item, RoundPost):  # its datagrams went (the runs before it)
                tx.round_sent(item.dst, step=item.step, msg=item.msg, began=(now, 0),
                              last=(now, 0), now=now)  # fmt: skip
                for reply in tx.datagrams_to_send(now=now):  # its FINISH
                    rx.receive_datagram(as_control(reply).data, now=now)
            elif isinstance(item, RoundRelease):
                tx.release_round(item.dst, step=item.step, msg=item.msg)
            core += clock() - t0
        t0 = clock()
        receiver.apply()
        for reply in rx.datagrams_to_send(now=now):
            tx.receive_datagram(as_control(reply).data, now=now)
        while (ev := rx.next_event()) is not None:
            if isinstance(ev, MessageReceived):
                done = ev
        for left in tx.datagrams_to_send(now=now):  # a RoundRelease once the STOP came
            if not isinstance(left, RoundRelease):
                raise BenchError(f"the sender handed out a {type(left).__name__} after the STOP")
            tx.release_round(left.dst, step=left.step, msg=left.msg)
        core += clock() - t0
    if done.report.lost_elems or not np.array_equal(out, data):
        raise BenchError("core benchmark transfer was not bit-exact")
    return core


def _wire_runs(post: RoundPost, limit: int) -> list[tuple[np.ndarray, int]]:
    """The datagrams of lent round ``post`` as the receiver's GRO reads give them:
    runs of back-to-back datagrams of ``post.stride`` bytes, at most ``limit``
    bytes each, a short datagram ending its run. Each datagram is its header and
    its chunk of the lent tensor: what the kernel gathers from the engine's two
    iovecs (not core work, not timed)."""
    if post.payload is None or post.seqs is None or post.key is not None:
        raise BenchError("a round that is not lent, or sealed: the harness carries lent rounds")
    count, stride, chunk = post.count, post.stride, post.chunk_bytes
    wire = np.zeros((count, stride), np.uint8)
    wire[:, :DATA_HEADER_LEN] = post.records[:, :DATA_HEADER_LEN]
    full = np.arange(count) != post.short
    whole = len(post.payload) // chunk  # chunks that are full
    rows = post.payload[: whole * chunk].reshape(whole, chunk)
    wire[full, DATA_HEADER_LEN:] = rows[post.seqs[full]]
    flat = wire.reshape(-1)
    ends = [count] if post.short < 0 else [post.short + 1, count]
    runs: list[tuple[np.ndarray, int]] = []
    start = 0
    for end in ends:
        if post.short >= 0 and end == post.short + 1:
            at = int(post.seqs[post.short]) * chunk
            tail = post.payload[at:]
            size = DATA_HEADER_LEN + len(tail)
            flat[post.short * stride + DATA_HEADER_LEN : post.short * stride + size] = tail
            stop = post.short * stride + size
        else:
            stop = end * stride
        step = max(stride, limit // stride * stride)
        for a in range(start * stride, stop, step):
            runs.append((flat[a : min(a + step, stop)], stride))
        start = end
    return runs


def _owner(a: np.ndarray) -> np.ndarray:
    """The array that owns the memory ``a`` views (through memoryviews too)."""
    obj: object = a
    owner = a
    while True:
        if isinstance(obj, np.ndarray):
            owner, obj = obj, obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            return owner


def _as_received(
    items: list[Transmit], limit: int = RECEIVE_STEP_BYTES
) -> list[ControlDatagram | RoundPost | RoundRelease | tuple[np.ndarray, int]]:
    """``items`` as the endpoint's receive side delivers them: runs of data batches
    that lie back to back (same segment size, all but the last datagram full),
    at most ``limit`` bytes each, as one array; control datagrams as they are; a
    round's datagrams (:func:`_wire_runs`), then the round itself (its report is
    due once they went); a round's release as it is."""
    out: list[ControlDatagram | RoundPost | RoundRelease | tuple[np.ndarray, int]] = []
    run: list[np.ndarray] = []
    seg = 0

    def close() -> None:
        if run:
            first, last = run[0], run[-1]
            owner = _owner(first).reshape(-1).view(np.uint8)
            at = first.ctypes.data - owner.ctypes.data
            out.append((owner[at : at + last.ctypes.data + len(last) - first.ctypes.data], seg))
            run.clear()

    for item in items:
        if isinstance(item, RoundPost):
            close()
            out.extend(_wire_runs(item, limit))
            out.append(item)
            continue
        if isinstance(item, RoundRelease):
            close()
            out.append(item)
            continue
        if not isinstance(item, DataBatch):
            close()
            out.append(as_control(item))
            continue
        arr = np.frombuffer(item.data, np.uint8)
        if run and not (
            item.segment_size == seg
            and len(run[-1]) % seg == 0
            and run[-1].ctypes.data + len(run[-1]) == arr.ctypes.data
            and _owner(run[-1]) is _owner(arr)
            and arr.ctypes.data + len(arr) - run[0].ctypes.data <= limit
        ):
            close()
        run.append(arr)
        seg = item.segment_size
    close()
    return out


def memcpy_time(data: np.ndarray, out: np.ndarray) -> float:
    t0 = time.perf_counter()
    np.copyto(out, data)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.core") -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--size-mib", type=int, default=64,
                    help="float32 tensor sent through the sessions, MiB (default 64)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="timed transfers and copies after the warm-up one; medians (default 5)")
    ap.add_argument("--batch-packets", type=int, default=ProtocolConfig().batch_packets,
                    help="datagrams the sender takes per pacing decision (default: the "
                    "protocol's, %(default)s)")
    ap.add_argument("--spray-packets", type=int, default=ProtocolConfig().spray_packets,
                    help="datagrams per path choice (default: the protocol's, %(default)s)")
    ap.add_argument("--authenticate", action="store_true",
                    help="the sessions seal and verify every datagram (default: not)")
    ap.add_argument("--receive-path", choices=["native", "python"],
                    help="how the receiving session takes the data runs (module doc; "
                    "default: native where dlcp.io.native_receive was built, as the "
                    "endpoint's default)")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args(argv)

    engine = engine_of_run()
    if engine == "native" and args.authenticate:
        ap.error("--authenticate runs on the Python engine's path only (DLCP_ENGINE=python): "
                 "the native engine seals in its own thread, which this harness does not run")
    # (an authenticating session takes the C table only where it verifies tags)
    native_ok = native_receive.verifies_tags() if args.authenticate else native_receive.available()
    receive_path = args.receive_path or ("native" if native_ok else "python")
    if receive_path == "native" and not native_ok:
        ap.error("--receive-path native: dlcp.io.native_receive is not built here"
                 + (" with libcrypto (it cannot verify tags)" if args.authenticate else ""))
    n = args.size_mib * (1 << 20) // 4
    start = cpu_times()
    data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.empty_like(data)
    cfg = ProtocolConfig(
        pacer="unpaced",
        batch_packets=args.batch_packets,
        spray_packets=args.spray_packets,
        authenticate=args.authenticate
    )
    key = b"k" * 32 if args.authenticate else None
    # one pair of sessions for all repeats, as a training job keeps its endpoints
    tx = Session(rank=0, job=1, config=cfg, key=key, whole_rounds=engine == "native")
    rx = Session(rank=1, job=1, config=cfg, key=key)
    receiver = Receiver(rx, MessageRuns(1) if receive_path == "native" else None)
    one_transfer(tx, receiver, data, out, step=0)  # warm-up: first-touch page faults, imports
    core, copy = [], []
    for i in range(1, args.repeat + 1):
        out[...] = 0
        copy.append(memcpy_time(data, out))
        out[...] = 0
        core.append(one_transfer(tx, receiver, data, out, step=i))
    nbytes = data.nbytes
    core_s, copy_s = statistics.median(core), statistics.median(copy)
    result = {
        "size_bytes": nbytes,
        "repeat": args.repeat,
        "batch_packets": args.batch_packets,
        "spray_packets": args.spray_packets,
        "payload_bytes": cfg.chunk_bytes,
        "authenticate": args.authenticate,
        # the C kernels (dlcp.proto._kernels) or their numpy fallbacks
        "accelerated": kernels.ACCELERATED,
        # the sending session as that engine drives it (module doc)
        "engine": engine,
        "engine_threads": None,  # (no send thread: the harness carries the datagrams)
        "receive_path": receive_path,
        "core_s": round(core_s, 4),
        "memcpy_s": round(copy_s, 4),
        "core_gbps": round(nbytes / core_s / 1e9, 3),
        "memcpy_gbps": round(nbytes / copy_s / 1e9, 3),
        "ratio": round(copy_s / core_s, 3),
        "machine": describe(start, cpu_times()),
    }
    print(f"{'':14}{'median s':>10}{'GB/s':>8}")
    print(f"{'dlcp core':14}{core_s:10.4f}{result['core_gbps']:8.2f}")
    print(f"{'numpy memcpy':14}{copy_s:10.4f}{result['memcpy_gbps']:8.2f}")
    print(f"ratio core/memcpy = {result['ratio']}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
