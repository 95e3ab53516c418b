"""Transport demo: gradient buckets over an *emulated* lossy multipath link.

Two protocol sessions (rank 0 sends, rank 1 receives) exchange the gradient
buckets of a small layered model over :class:`dlcp.linkemu.LossyLink`: four
equal-cost paths, one of them lossy. The same buckets go once with a loss bound
(``p``, bounded-loss completion) and once with ``p = 0`` (everything
retransmitted until it arrives), so the output shows what the bound buys: far
fewer retransmitted packets, at the cost of a reported, bounded fraction of
zero-filled gradient (front layers, the highest priority classes, lose least).

Times are the emulator's virtual clock (per-path delay, timers; no bandwidth
model), not wall-clock time: ``received ms`` is when the receiver had each
bucket, after the sender began it. Without a bandwidth model a retransmission
costs only its path delay, so the bound buys no time here; on a loaded link it
does (the benchmarks in ``dlcp/bench/`` measure speed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from .errors import TransferFailed
from .linkemu import LossyLink
from .proto.config import ProtocolConfig
from .proto.session import MessageDelivered, MessageFailed, MessageReceived, Session

__all__ = ["DemoResult", "run_demo"]

#: parameter counts of a small CNN-like model, front (input side) first
LAYER_SIZES = (864, 32, 18432, 64, 73728, 128, 294912, 256, 131072, 512, 5120, 10)


@dataclass(frozen=True, slots=True)
class DemoResult:
    p: float
    steps: int
    #: virtual milliseconds from a bucket's send to the receiver having it: mean, max
    received_ms_mean: float
    received_ms_max: float
    rounds: int
    retransmitted_packets: int
    sent_packets: int
    lost_fraction_max: float
    relative_error_max: float
    lost_chunks_by_priority: tuple[int, ...]
    path_shares: tuple[float, ...]


def _gradients(rng: np.random.Generator) -> np.ndarray:
    # heavy-tailed values with a per-layer scale, like real gradients
    parts = [
        rng.standard_t(3, n).astype(np.float32) * 10.0 ** -rng.uniform(1, 4) for n in LAYER_SIZES
    ]
    return np.concatenate(parts)


def _segments() -> list[tuple[int, int, int]]:
    offsets = np.concatenate(([0], np.cumsum(LAYER_SIZES)[:-1]))
    return [(int(o), n, i) for i, (o, n) in enumerate(zip(offsets, LAYER_SIZES, strict=True))]


def run_demo(*, p: float, loss: float, steps: int, seed: int) -> DemoResult:
    # (the emulated link reorders each path's datagrams: a FINISH's tail says nothing)
    cfg = ProtocolConfig(n_paths=4, ordered_paths=False)
    tx = Session(rank=0, job=7, config=cfg)
    rx = Session(rank=1, job=7, config=cfg)
    link = LossyLink([tx, rx], loss=[0.0, 0.0, loss, 0.0], reorder=True, seed=seed)
    rng = np.random.default_rng(seed)
    now = 0.0
    rounds = retrans = sent = 0
    lost_max = err_max = 0.0
    lost_by_prio = np.zeros(8, dtype=np.int64)
    received_ms = []

    def ended(link: LossyLink) -> bool:
        return any(isinstance(ev, (MessageReceived, MessageFailed)) for _, ev in link.events)

    for step in range(steps):
        grad = _gradients(rng)
        tx.send_message(1, grad, step=step, msg=0, now=now, segments=_segments(), p=p)
        link.events.clear()
        start = now
        now = link.run(start=now, until=now + 30.0, stop_when=ended)
        received_ms.append((now - start) * 1e3)
        now = link.run(start=now, until=now + 30.0)  # the STOP, and every timer settled
        for _, ev in link.events:
            if isinstance(ev, MessageReceived):
                lost_max = max(lost_max, ev.report.lost_fraction)
                err = float(np.linalg.norm(ev.data - grad) / np.linalg.norm(grad))
                err_max = max(err_max, err)
                lost_by_prio += np.asarray(ev.report.lost_chunks).reshape(8, 2).sum(axis=1)
            elif isinstance(ev, MessageDelivered):
                rounds += ev.report.rounds
                retrans += ev.report.retransmitted_packets
                sent += ev.report.sent_packets
            elif isinstance(ev, MessageFailed):
                raise TransferFailed(ev.reason)
    shares = tx.path_shares(1)
    return DemoResult(
        p,
        steps,
        float(np.mean(received_ms)),
        float(np.max(received_ms)),
        rounds,
        retrans,
        sent,
        lost_max,
        err_max,
        tuple(int(x) for x in lost_by_prio),
        tuple(round(float(x), 3) for x in shares),
    )


def main(*, p: float, loss: float, steps: int, seed: int, as_json: bool) -> int:
    print(
        f"DLCP transport demo (EMULATED link, in-process): {steps} gradient buckets of "
        f"{sum(LAYER_SIZES)} float32 in {len(LAYER_SIZES)} layers, 4 paths, "
        f"path 2 drops {loss:.0%} of packets"
    )
    results = [
        run_demo(p=p, loss=loss, steps=steps, seed=seed),
        run_demo(p=0.0, loss=loss, steps=steps, seed=seed),
    ]
    head = (
        f"{'bound p':>8} {'received ms':>12} {'rounds':>7} {'resent':>7} {'sent':>7} "
        f"{'max lost':>9} {'max rel err':>12}  path shares"
    )
    print(head)
    for r in results:
        print(
            f"{r.p:8.3f} {r.received_ms_mean:12.3f} {r.rounds:7d} {r.retransmitted_packets:7d} "
            f"{r.sent_packets:7d} {r.lost_fraction_max:9.4f} {r.relative_error_max:12.2e}  "
            f"{list(r.path_shares)}"
        )
    bounded = results[0]
    print(
        f"lost chunks by priority class (7 = front layers) with p={p}: "
        f"{list(bounded.lost_chunks_by_priority)}"
    )
    if as_json:
        print(json.dumps({"emulated": True, "results": [asdict(r) for r in results]}))
    return 0
