"""Per-message cost of the protocol core: small messages through two sessions.

    python -m dlcp.bench.messages --json        # or: dlcp bench messages --json

Training with small buckets sends many small messages, and then what a
message costs regardless of its size decides the iteration (see
``dlcp.bench.allreduce``). This times, per message, what two in-process
:class:`~dlcp.proto.session.Session` objects do, with no sockets, no loss and
no pacing limit, for each size in ``--sizes`` (float32 elements; two layers,
8 paths as in the testbed, loss bound ``--p``):

* ``send_us``: the sender's ``send_message`` (plan, classify, pack);
* ``hand_out_us``: its ``datagrams_to_send`` (the data batches and FINISH);
* ``receive_us``: the receiver's ``receive_batch`` of every batch, through
  completion (STOP queued, the message's event);
* ``control_us``: FINISH into the receiver, its STOP back into the sender, and
  both sessions' events.

Each figure is the mean over ``--messages`` messages after ``--warmup``. No
target and no baseline: a breakdown, for comparing versions of the core on one
machine. The last stdout line (``--json``) is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from dlcp.errors import BenchError
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.events import DataBatch
from dlcp.proto.session import MessageDelivered, MessageReceived, Session

from .core import as_control

PHASES = ("send_us", "hand_out_us", "receive_us", "control_us")


def measure(n_elems: int, *, p: float, messages: int, warmup: int) -> dict[str, float]:
    """Mean microseconds per message of each phase, for messages of ``n_elems``."""
    config = ProtocolConfig(n_paths=8, pacer="unpaced")  # no pacing limit (module doc)
    sender = Session(config=config, rank=0, job=7)
    receiver = Session(config=config, rank=1, job=7)
    data = np.random.default_rng(0).standard_normal(n_elems).astype(np.float32)
    out = np.empty_like(data)
    half = n_elems // 2
    segments = [(0, half, 0), (half, n_elems - half, 1)] if half else None
    totals = dict.fromkeys(PHASES, 0.0)
    now = 0.0
    clock = time.perf_counter
    for i in range(warmup + messages):
        now += 0.01  # past every pacing and timer horizon of the previous message
        receiver.expect_message(0, step=i, msg=1, out=out, p=p)
        t0 = clock()
        sender.send_message(1, data, step=i, msg=1, now=now, segments=segments, p=p)
        t1 = clock()
        items = sender.datagrams_to_send(now=now, max_batches=64)
        t2 = clock()
        controls = []
        for item in items:
            if isinstance(item, DataBatch):
                buf = np.frombuffer(item.data, dtype=np.uint8)
                receiver.receive_batch(buf, item.segment_size, now=now)
            else:
                controls.append(item)
        t3 = clock()
        for item in controls:
            receiver.receive_datagram(as_control(item).data, now=now)
        received = delivered = False
        while (ev := receiver.next_event()) is not None:
            received = received or isinstance(ev, MessageReceived)
        for item in receiver.datagrams_to_send(now=now, max_batches=64):
            sender.receive_datagram(as_control(item).data, now=now)
        while (ev := sender.next_event()) is not None:
            delivered = delivered or isinstance(ev, MessageDelivered)
        t4 = clock()
        if not (received and delivered):  # a figure for a message that never arrived
            raise BenchError(
                f"{n_elems} elements: message {i} did not complete in one exchange "
                f"(received {received}, delivered {delivered}): raise max_batches"
            )
        if i >= warmup:
            for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                totals[phase] += dt
    # (nothing is dropped here, so whatever the bound the whole message arrives)
    if not np.array_equal(out, data):
        raise BenchError(f"{n_elems} elements: the received message differs from the sent one")
    return {phase: round(1e6 * total / messages, 1) for phase, total in totals.items()}


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.messages") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,9570,38282", help="float32 elements, comma-separated")
    ap.add_argument("--p", type=float, default=0.05, help="loss bound of the messages")
    ap.add_argument("--messages", type=int, default=2000,
                    help="measured messages of each size (default 2000)")
    ap.add_argument("--warmup", type=int, default=200,
                    help="messages of each size before the measured ones (default 200)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--sizes={args.sizes!r}: positive element counts")
    rows: dict[str, Any] = {}
    print(f"us per message, two in-process sessions, p={args.p:g}, 8 paths:")
    print(f"  {'elements':>9}" + "".join(f"{ph[:-3]:>10}" for ph in PHASES) + f"{'total':>10}")
    for n in sizes:
        fig = measure(n, p=args.p, messages=args.messages, warmup=args.warmup)
        fig["total_us"] = round(sum(fig[ph] for ph in PHASES), 1)
        rows[str(n)] = fig
        print(
            f"  {n:>9}" + "".join(f"{fig[ph]:10.1f}" for ph in PHASES) + f"{fig['total_us']:10.1f}"
        )
    if args.json:
        print(
            # (sessions driven in-process: they pace and cut batches themselves)
            json.dumps({"bench": "messages", "engine": "python", "engine_threads": None,
                        "p": args.p, "messages": args.messages, "sizes": rows})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
