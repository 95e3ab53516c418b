"""Junk-flood benchmark: DLCP transfers with and without a flood at the receiver.

    python -m dlcp.bench.flood --json

Two endpoints (loopback), the receiver in a process of its own, move
``--size``-byte float32 messages back to back, each checked bit for bit by the
receiver, which confirms it over a pipe before the next is sent. Phases
alternate, ``--rounds`` times: ``--seconds`` unflooded, then ``--seconds``
while the C flooder (``dlcp/bench/flooder.c``, a process of its own) sends junk of
``--kind`` to the receiver's data port at ``--rate`` datagrams a second (0: as
fast as its core goes). The first ``--settle`` seconds of each flood, when the
receiver's socket buffer fills with junk and the pacer meets the loss that
causes, are not timed (transfers go on). ``ratio`` is the flooded throughput
over the unflooded one (bytes moved over the phases' summed time), both
measured in the same run, alternating so that drift on a shared machine hits
both alike; the target is at least 0.5. A third phase sends the same flood
to a socket nobody reads (``decoy``): the flooder's load on the machine without
junk at the receiver. ``ratio_decoy`` (decoy over unflooded) is what the
flooder's use of the CPUs costs by itself, ``ratio_to_decoy`` (flooded over
decoy) what the junk costs the receiver beyond that. The flooder's rate, the receiver's
rejection counts and its data socket's kernel drops (``socket_drops``: junk its kernel
filter dropped, ``DLCP_KERNEL_FILTER``, and datagrams that found the buffer full) say how
much junk the receiver saw and dropped, and where.

A second figure isolates the receive path's cost of one junk datagram:
``--junk`` datagrams of the flood's kind are queued in a data socket, then
drained by ``DataSockets.receive`` into a session, once with the C pre-filter
(``reject_us_prefilter``) and once without, every datagram parsed by the session
(``reject_us_parser``), alternately ``--rounds`` times, the median of each, both without
the kernel filter (which would drop the junk before it could be read). It
is the draining thread's CPU time (system calls included) per datagram, not
wall time, so that other processes on a shared machine do not inflate it.

The flood needs a core of its own: on a machine with fewer cores than the two
ranks and the flooder, the ratio measures the machine's contention as much as
the receiver. ``cpus`` in the output is the machine's count. The last
stdout line (``--json``) is one JSON object with every figure and ``engine``.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import CancelledError, Future
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from dlcp.errors import BenchError
from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.peers import PeerAddress
from dlcp.io.records import Received
from dlcp.io.udp import DataSockets
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import Session
from dlcp.proto.wire import AUTH_TRAILER_LEN

from . import Addresses
from .flooder import KINDS, Flooder, FlooderError
from .outcome import finish

JOB = 0x2A7
#: the throughput phases of a round: no flood, the flood sent to a socket nobody
#: reads (the flooder's load on the machine without junk at the receiver), the
#: flood sent to the receiver
PHASES = ("unflooded", "decoy", "flooded")
KEY = bytes(range(100, 132))


def _receiver(conn: Connection, cfg: EndpointConfig, sender: PeerAddress, size: int) -> None:
    """The receiving rank, in a process of its own: receives messages 0, 1, ...
    from rank 0, checks each against the sender's data and answers its step on
    ``conn``; on ``None`` from ``conn`` answers its stats and ends."""
    store = Addresses()
    store.set(f"dlcp/{JOB}/addr/0", f"{sender.host} {sender.data_port} {sender.control_port}")
    key = KEY if cfg.protocol.authenticate else None
    rx = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg, key=key)
    pending: list[Future[Received]] = []
    ending = threading.Event()

    def watch() -> None:  # the parent's None ends the loop: the pending receive is cancelled
        if conn.recv() is None:
            ending.set()
            if pending:
                pending[-1].cancel()

    try:
        conn.send(rx.address)
        threading.Thread(target=watch, daemon=True).start()
        x = _message(size)
        step = 0
        while not ending.is_set():
            pending.append(rx.recv(src=0, msg=1, step=step))
            if ending.is_set():
                break
            try:
                data = pending[-1].result().data
            except CancelledError:
                break
            if not np.array_equal(data, x):
                conn.send(f"message {step} arrived different from what was sent")
                return
            conn.send(step)
            step += 1
        conn.send(rx.stats())
    except Exception as exc:  # the parent names it
        conn.send(f"the receiving rank failed: {exc!r}")
    finally:
        rx.close()


def _message(size: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(size // 4).astype(np.float32)


def _transfers(tx: Endpoint, conn: Connection, x: np.ndarray, seconds: float, step: int) -> int:
    """Messages moved in ``seconds`` (each checked by the receiver), from ``step``."""
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tx.send(x, to=1, msg=1, step=step + n).result(timeout=60)
        answer = _answer(conn, f"message {step + n}")
        if answer != step + n:
            raise BenchError(f"the receiving rank answered {answer!r} for message {step + n}")
        n += 1
    return n


def _answer(conn: Connection, what: str) -> Any:
    """The receiving rank's next answer (about ``what``), within 60 s."""
    if not conn.poll(60):
        raise BenchError(f"the receiving rank did not answer for {what} in 60 s")
    answer = conn.recv()
    if isinstance(answer, str):  # (what went wrong there)
        raise BenchError(answer)
    return answer


def _throughput(args: argparse.Namespace) -> dict[str, Any]:
    cfg = EndpointConfig.from_env()  # (DLCP_ENGINE picks the engine)
    if args.auth:
        cfg = dataclasses.replace(
            cfg, protocol=dataclasses.replace(cfg.protocol, authenticate=True)
        )
    store = Addresses()
    tx = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg, key=KEY if args.auth else None)
    x = _message(args.size)
    moved = dict.fromkeys(PHASES, 0)
    spent = dict.fromkeys(PHASES, 0.0)
    # the decoy phase's target: a socket nobody reads (the flooder's work, no junk at
    # the receiver)
    decoy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    decoy.bind(("127.0.0.1", 0))
    rates: list[float] = []
    step = 0
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(
        target=_receiver, args=(theirs, cfg, tx.address, args.size), name="dlcp-flood-rx"
    )
    child.start()
    try:
        rx_address = _answer(ours, "its address")
        store.set(
            f"dlcp/{JOB}/addr/1",
            f"{rx_address.host} {rx_address.data_port} {rx_address.control_port}",
        )
        step += _transfers(tx, ours, x, 0.5, step)  # warm-up, not counted
        for _ in range(args.rounds):
            for phase in PHASES:
                if phase == "unflooded":
                    start = time.monotonic()
                    n = _transfers(tx, ours, x, args.seconds, step)
                    elapsed = time.monotonic() - start
                else:  # the junk goes to the receiver, or to the decoy
                    receiver = (rx_address.host, rx_address.data_port)
                    target = decoy.getsockname() if phase == "decoy" else receiver
                    with Flooder(target, kind=args.kind, job=JOB, rate=args.rate) as flood:
                        step += _transfers(tx, ours, x, args.settle, step)  # (not counted)
                        start = time.monotonic()
                        n = _transfers(tx, ours, x, args.seconds, step)
                        elapsed = time.monotonic() - start
                    if flood.result is not None and phase == "flooded":
                        rates.append(flood.result["rate"])
                step += n
                moved[phase] += n * x.nbytes
                spent[phase] += elapsed
        ours.send(None)
        stats = _answer(ours, "its stats")
        while isinstance(stats, int):  # (a confirmation still on its way)
            stats = _answer(ours, "its stats")
        if not isinstance(stats, dict):
            raise BenchError(f"the receiving rank answered {stats!r} for its stats")
        engine = tx.engine
    finally:
        tx.close()
        decoy.close()
        child.join(timeout=30)
        if child.is_alive():  # (our own child, by its handle)
            child.terminate()
            child.join()
    gbps = {phase: moved[phase] / spent[phase] / 1e9 for phase in moved}
    return {
        "engine": engine,
        "unflooded_gbps": round(gbps["unflooded"], 4),
        "flooded_gbps": round(gbps["flooded"], 4),
        "decoy_gbps": round(gbps["decoy"], 4),
        "ratio": round(gbps["flooded"] / gbps["unflooded"], 3),
        "ratio_decoy": round(gbps["decoy"] / gbps["unflooded"], 3),
        "ratio_to_decoy": round(gbps["flooded"] / gbps["decoy"], 3),
        "flood_rate": round(statistics.median(rates)) if rates else None,
        "kernel_filter": stats["kernel_filter"],
        "rejected": stats["rejected"],
        "socket_drops": stats["socket_drops"],
        "peers_gone": stats["peers_gone"],
    }


def _junk(kind: str, n: int, rng: np.random.Generator) -> list[bytes]:
    """``n`` datagrams as the flooder draws them (dlcp/bench/flooder.c)."""
    out = []
    for _ in range(n):
        if kind == "header":
            d = bytearray(rng.integers(0, 256, int(rng.integers(32, 1473)), dtype=np.uint8))
            d[0], d[2:4] = 0x11, JOB.to_bytes(2, "big")
        else:
            d = bytearray(rng.integers(0, 256, int(rng.integers(1, 1473)), dtype=np.uint8))
        out.append(bytes(d))
    return out


def _reject_cost(args: argparse.Namespace) -> dict[str, float]:
    """Microseconds per junk datagram to receive and reject it, with and without
    the C pre-filter (the module docstring)."""
    junk = _junk(args.kind, args.junk, np.random.default_rng(1))
    rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="auto", rcvbuf=64 << 20, sndbuf=1 << 20)
    session = Session(
        rank=1,
        job=JOB,
        config=ProtocolConfig(authenticate=args.auth),
        key=KEY if args.auth else None,
        peers=(0, 1),
    )

    def deliver(buf: Any, seg: int) -> None:
        session.receive_batch(buf, seg, now=time.monotonic())

    def drain(screened: bool) -> float:
        rx._screen = None  # (the parser's turn: every datagram reaches the session)
        if screened:
            # the user-space pre-filter's cost: the kernel filter would drop the junk
            # before it could be read
            rx.screen(job=JOB, require_auth=args.auth, tag_len=AUTH_TRAILER_LEN, in_kernel=False)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for d in junk:  # (loopback: queued once sendto returns)
                s.sendto(d, rx.address)
        start = time.thread_time()
        got = 0
        while got < sum(map(len, junk)):
            got += rx.receive(deliver, budget=1 << 30)
        return (time.thread_time() - start) / len(junk) * 1e6

    costs: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(args.rounds):
            for screened in (True, False):
                costs[screened].append(drain(screened))
    finally:
        rx.close()
    pre, parser = statistics.median(costs[True]), statistics.median(costs[False])
    return {
        "reject_us_prefilter": round(pre, 3),
        "reject_us_parser": round(parser, 3),
        "reject_speedup": round(parser / pre, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "size": args.size,
        "kind": args.kind,
        "auth": args.auth,
        "rate": args.rate,
        "seconds": args.seconds,
        "settle": args.settle,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }
    result.update(_throughput(args))
    result.update(_reject_cost(args))
    return result


def table(r: dict[str, Any]) -> str:
    rate = "max" if not r["rate"] else f"{r['rate']:g}/s"
    return "\n".join(
        [
            f"junk flood ({r['kind']}, asked {rate}, sent {r['flood_rate']}/s), "
            f"{r['size']} B messages, engine {r['engine']}, "
            f"auth {'on' if r['auth'] else 'off'}, kernel filter "
            f"{'on' if r['kernel_filter'] else 'off'}, {r['cpus']} cpus",
            f"  unflooded {r['unflooded_gbps']:.3f} GB/s  flooded {r['flooded_gbps']:.3f} GB/s  "
            f"ratio {r['ratio']:.2f} (target >= 0.5)",
            f"  flooding a decoy socket instead {r['decoy_gbps']:.3f} GB/s: ratio "
            f"{r['ratio_decoy']:.2f} (the flooder's share of the machine); flooded / decoy "
            f"{r['ratio_to_decoy']:.2f} (the junk's cost at the receiver)",
            f"  receiver: {sum(r['rejected'].values())} rejected in user space, "
            f"{r['socket_drops']} dropped by the kernel (its filter, or a full buffer)",
            f"  one junk datagram: {r['reject_us_prefilter']:.2f} us CPU with the pre-filter, "
            f"{r['reject_us_parser']:.2f} us through the parser ({r['reject_speedup']}x)",
        ]
    )


def _parser(prog: str = "python -m dlcp.bench.flood") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1 << 20, help="message bytes (default 1 MiB)")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds per phase (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (default 3)")
    p.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds of flood before a flooded phase is timed (default 0.5)",
    )
    p.add_argument("--kind", choices=KINDS, default="header", help="junk (default header)")
    p.add_argument("--rate", type=float, default=0, help="junk datagrams/s (default 0: max)")
    p.add_argument("--junk", type=int, default=20_000, help="datagrams of the cost figure")
    p.add_argument("--auth", action="store_true", help="authenticated endpoints")
    p.add_argument("--json", action="store_true", help="print the result as JSON last")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.flood") -> int:
    args = _parser(prog).parse_args(argv)
    if args.size <= 0 or args.size % 4:
        _parser(prog).error(f"--size {args.size}: a positive multiple of 4 bytes (float32)")
    return finish(
        "flood",
        run,
        table,
        args,
        errors=(BenchError, FlooderError, TimeoutError),
        cleaned_up="the flooder and the endpoints were stopped",
    )


if __name__ == "__main__":
    sys.exit(main())
