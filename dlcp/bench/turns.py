"""Python wake-ups per message: the I/O threads' turns and the control frames.

    python -m dlcp.bench.turns --json            # or: dlcp bench turns --json

An endpoint's Python runs when its I/O thread takes a turn: ``select`` woke it
for data, a control frame, a report of the native engine, a caller's command or
a timer. This counts, per message sent one way between two endpoints of one
process on loopback (lossless, no loss bound), for each size in ``--sizes``
(float32 elements), on the engine ``DLCP_ENGINE`` selects (as for every
benchmark; the JSON says which):

* ``sender_turns`` and ``receiver_turns``: the I/O threads' turns (the driver's
  ``receive_calls``: every turn reads the data socket once);
* ``control_to_receiver`` and ``control_to_sender``: control frames each way
  (FINISH; STOP, NACK and RATE);
* ``datagrams``: datagrams the receiver's session took in, for scale (the data,
  and the control datagrams that came in frames: each message's FINISH);
* ``cpu_us``: the process's CPU per message, microseconds: both endpoints'
  threads and the one that posts and waits (``time.process_time``). For small
  messages this is what a message's lifecycle costs on top of its datagrams
  (posting, waking the I/O threads, planning, opening, FINISH and STOP, the
  futures), the part ``docs/engine.md`` ("The rest of the lifecycle in C") moves;
* ``ms``: milliseconds per message, for scale only (the two endpoints share the
  machine's cores with everything else).

With ``--bytecodes``, a second pass of as many messages on a new pair of endpoints
counts the Python bytecodes each thread executes per message
(:mod:`dlcp.bench.bytecode_count`): ``bytecodes_caller`` (the thread that posts and
waits; the benchmark's own loop is not counted), ``bytecodes_sender_io`` and
``bytecodes_receiver_io`` (the two I/O threads), ``bytecodes_other`` (any other
thread). The native engine's send threads run no Python. The caller's and the sender's
counts move by a few percent between runs, the receiver's with its receive calls (which
the machine's load moves); how they grow with the message's size says whether Python
runs per message or per datagram. Tracing slows Python many times over: the first
pass's figures do not include it.

A turn serves whatever is ready at once, so these are counts of wake-ups, not
of messages handled: the figures say how often Python runs per message, on each
side, and how much of it the control channel causes. No target and no baseline:
a breakdown, for comparing versions and engines on one machine. The last stdout
line (``--json``) is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

import numpy as np

from dlcp.errors import BenchError, DLCPError
from dlcp.io import Endpoint, EndpointConfig

from . import Addresses, positive_counts
from .bytecode_count import BytecodeCounter
from .outcome import engine_of_run, finish

#: the job id of the two endpoints
JOB = 0x7A2
#: the figures of one size and engine, in the table's order
FIGURES = ("sender_turns", "receiver_turns", "control_to_receiver", "control_to_sender",
           "datagrams", "cpu_us", "ms")  # fmt: skip
#: the bytecode figures (``--bytecodes``), in the table's order
BYTECODE_FIGURES = ("bytecodes_caller", "bytecodes_sender_io", "bytecodes_receiver_io",
                    "bytecodes_other")  # fmt: skip
#: seconds one message may take before the run fails
_TIMEOUT = 60.0


def _transfer(tx: Endpoint, rx: Endpoint, data: np.ndarray, out: np.ndarray, msg: int) -> None:
    incoming = rx.recv(src=tx.rank, msg=msg, out=out)
    sent = tx.send(data, to=rx.rank, msg=msg, p=0.0)
    incoming.result(_TIMEOUT)
    sent.result(_TIMEOUT)


def measure(n_elems: int, *, engine: str, messages: int, warmup: int) -> dict[str, float]:
    """The :data:`FIGURES` per message, for ``messages`` messages of ``n_elems``
    float32 elements from rank 0 to rank 1 on ``engine``, after ``warmup``."""
    eps: list[Endpoint] = []
    try:
        tx, rx = _pair(eps, engine)
        data, out = _message(n_elems)
        for msg in range(warmup):
            _transfer(tx, rx, data, out, msg)
        before = [ep.stats() for ep in eps]
        t0, cpu0 = time.perf_counter(), time.process_time()
        for msg in range(warmup, warmup + messages):
            _transfer(tx, rx, data, out, msg)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        after = [ep.stats() for ep in eps]
    finally:
        for ep in eps:
            ep.close()
    _check_arrived(out, data, n_elems, engine)

    def delta(rank: int, name: str) -> float:
        return round(float(after[rank][name] - before[rank][name]) / messages, 2)

    return {
        "sender_turns": delta(0, "receive_calls"),
        "receiver_turns": delta(1, "receive_calls"),
        "control_to_receiver": delta(0, "control_out"),
        "control_to_sender": delta(1, "control_out"),
        "datagrams": delta(1, "datagrams_in"),
        "cpu_us": round(1e6 * cpu / messages, 1),
        "ms": round(1e3 * seconds / messages, 3),
    }


def _pair(eps: list[Endpoint], engine: str) -> tuple[Endpoint, Endpoint]:
    """Two endpoints of one process on ``engine``, appended to ``eps`` (the caller
    closes them)."""
    store = Addresses()
    config = EndpointConfig.from_env(timeout=_TIMEOUT, engine=engine)  # (DLCP_* apply)
    for rank in range(2):
        eps.append(Endpoint(rank, store=store, world_size=2, job=JOB, config=config))
    return eps[0], eps[1]


def _message(n_elems: int) -> tuple[np.ndarray, np.ndarray]:
    data = np.random.default_rng(n_elems).standard_normal(n_elems).astype(np.float32)
    return data, np.empty_like(data)


def _check_arrived(out: np.ndarray, data: np.ndarray, n_elems: int, engine: str) -> None:
    if not np.array_equal(out, data):
        raise BenchError(f"{n_elems} elements on {engine}: the last message arrived different")


def count_bytecodes(n_elems: int, *, engine: str, messages: int, warmup: int) -> dict[str, int]:
    """The :data:`BYTECODE_FIGURES` per message (rounded), for ``messages``
    messages of ``n_elems`` float32 elements from rank 0 to rank 1 on ``engine``,
    after ``warmup``, on endpoints of their own whose threads are traced."""
    counter = BytecodeCounter(skip=(__file__,))
    eps: list[Endpoint] = []
    with counter:  # (before the endpoints: their threads inherit the hook)
        try:
            tx, rx = _pair(eps, engine)
            data, out = _message(n_elems)
            for msg in range(warmup):
                _transfer(tx, rx, data, out, msg)
            counter.on = True
            for msg in range(warmup, warmup + messages):
                _transfer(tx, rx, data, out, msg)
            counter.on = False
        finally:
            for ep in eps:
                ep.close()
    _check_arrived(out, data, n_elems, engine)
    counts = counter.by_thread()
    caller = threading.current_thread().name
    named = {caller: "bytecodes_caller", f"dlcp-io-{tx.rank}": "bytecodes_sender_io",
             f"dlcp-io-{rx.rank}": "bytecodes_receiver_io"}  # fmt: skip
    figures = dict.fromkeys(BYTECODE_FIGURES, 0)
    for name, n in counts.items():
        figures[named.get(name, "bytecodes_other")] += n
    return {k: round(v / messages) for k, v in figures.items()}


def _table(result: dict[str, Any]) -> str:
    lines = [f"per message, rank 0 -> rank 1, loopback, lossless, {result['engine']} engine, "
             f"{result['messages']} messages:",
             f"  {'elements':>9}" + "".join(f"{f:>20}" for f in FIGURES)]  # fmt: skip
    for n, fig in result["sizes"].items():
        lines.append(f"  {n:>9}" + "".join(f"{fig[f]:20g}" for f in FIGURES))
    if result.get("bytecodes"):
        lines.append("  Python bytecodes per message, by thread (a traced pass of its own):")
        lines.append(f"  {'elements':>9}" + "".join(f"{f:>24}" for f in BYTECODE_FIGURES))
        for n, fig in result["sizes"].items():
            lines.append(f"  {n:>9}" + "".join(f"{fig[f]:24d}" for f in BYTECODE_FIGURES))
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.turns") -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument(
        "--sizes",
        type=positive_counts,
        default=[1, 262144, 6250000],
        help="float32 elements, comma-separated (default: 4 B, 1 MB, 25 MB)",
    )
    ap.add_argument(
        "--messages", type=int, default=40, help="measured messages of each size (default 40)"
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=5,
        help="messages of each size before the measured ones (default 5)",
    )
    ap.add_argument(
        "--bytecodes",
        action="store_true",
        help="also count each thread's Python bytecodes per message, in a traced pass",
    )
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.warmup < 0:
        ap.error(f"--messages={args.messages} --warmup={args.warmup}: at least 1 and 0")

    def run(args: argparse.Namespace) -> dict[str, Any]:
        engine = engine_of_run()  # (DLCP_ENGINE chooses, as for the other benchmarks)
        sizes = {str(n): measure(n, engine=engine, messages=args.messages, warmup=args.warmup)
                 for n in args.sizes}  # fmt: skip
        if args.bytecodes:
            for n in args.sizes:
                sizes[str(n)].update(count_bytecodes(n, engine=engine, messages=args.messages,
                                                     warmup=args.warmup))  # fmt: skip
        return {"bench": "turns", "engine": engine, "messages": args.messages,
                "bytecodes": args.bytecodes, "sizes": sizes}  # fmt: skip

    return finish("turns", run, _table, args, errors=(BenchError, DLCPError),
                  cleaned_up="both endpoints were closed")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
