"""Core throughput: packetize + reassemble a tensor through two sessions, in memory.

What is timed: ``Session.send_message`` (chunking, classification, building the
records) on the sending session, every ``datagrams_to_send`` batch handed
straight to the receiving session's ``receive_batch`` (parsing, validation,
scatter into the output buffer), control messages both ways, until the receiver
reports the message complete. No sockets, no loss, no pacing (``pacer=unpaced``:
pacing is policy, this measures the CPU cost of the core). The baseline is a
numpy copy of the same bytes in the same process, so the ratio says how close to
memory speed the protocol work runs.

    python -m bench.core --json           # last line: one JSON object
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import ControlDatagram, DataBatch, MessageReceived, Session


def one_transfer(tx: Session, rx: Session, data: np.ndarray, out: np.ndarray, step: int) -> float:
    rx.expect_message(0, step=step, msg=0, out=out)
    t0 = time.perf_counter()
    now = 0.0
    tx.send_message(1, data, step=step, msg=0, now=now)
    done = None
    while done is None:
        items = tx.datagrams_to_send(now=now, max_batches=1 << 20)
        if not items:
            raise RuntimeError("sender went idle before the message completed")
        for item in items:
            if isinstance(item, DataBatch):
                rx.receive_batch(np.frombuffer(item.data, np.uint8), item.segment_size, now=now)
            elif isinstance(item, ControlDatagram):
                rx.receive_datagram(item.data, now=now)
        for item in rx.datagrams_to_send(now=now):
            assert isinstance(item, ControlDatagram)
            tx.receive_datagram(item.data, now=now)
        while (ev := rx.next_event()) is not None:
            if isinstance(ev, MessageReceived):
                done = ev
    elapsed = time.perf_counter() - t0
    if done.report.lost_elems or not np.array_equal(out, data):
        raise RuntimeError("core benchmark transfer was not bit-exact")
    return elapsed


def memcpy_time(data: np.ndarray, out: np.ndarray) -> float:
    t0 = time.perf_counter()
    np.copyto(out, data)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batch-packets", type=int, default=44)
    ap.add_argument("--authenticate", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    args = ap.parse_args(argv)

    n = args.size_mib * (1 << 20) // 4
    data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.empty_like(data)
    cfg = ProtocolConfig(
        pacer="unpaced", batch_packets=args.batch_packets, authenticate=args.authenticate
    )
    key = b"k" * 32 if args.authenticate else None
    # one pair of sessions for all repeats, as a training job keeps its endpoints
    tx = Session(rank=0, job=1, config=cfg, key=key)
    rx = Session(rank=1, job=1, config=cfg, key=key)
    one_transfer(tx, rx, data, out, step=0)  # warm-up: first-touch page faults, imports
    core, copy = [], []
    for i in range(1, args.repeat + 1):
        out[...] = 0
        copy.append(memcpy_time(data, out))
        out[...] = 0
        core.append(one_transfer(tx, rx, data, out, step=i))
    nbytes = data.nbytes
    core_s, copy_s = statistics.median(core), statistics.median(copy)
    result = {
        "size_bytes": nbytes,
        "repeat": args.repeat,
        "batch_packets": args.batch_packets,
        "payload_bytes": cfg.chunk_bytes,
        "authenticate": args.authenticate,
        "core_s": round(core_s, 4),
        "memcpy_s": round(copy_s, 4),
        "core_gbps": round(nbytes / core_s / 1e9, 3),
        "memcpy_gbps": round(nbytes / copy_s / 1e9, 3),
        "ratio": round(copy_s / core_s, 3),
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
