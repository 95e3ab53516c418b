"""The protocol's own time for one lossy message over the in-memory link (virtual
clock, 50 us delay per datagram, 1 % loss, 10 seeds), with the FINISH's tail
trusted (``ordered_paths=True``) and not: what the reorder grace costs a message
whose data all arrived or was lost. Not a measurement of a real network.

    python docs/results/2026-11-29/finish_tail_virtual/virtual_link.py
"""

import statistics

import numpy as np

from dlcp.linkemu import LossyLink
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import MessageReceived, Session


def run(ordered: bool, seed: int, p: float, loss: float) -> tuple[float, int]:
    cfg = ProtocolConfig(ordered_paths=ordered, pacer_options={"initial_rate": 1.25e9})
    a, b = (Session(rank=r, job=7, config=cfg) for r in range(2))
    x = np.random.default_rng(seed).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    b.expect_message(0, step=1, msg=0, p=p)
    a.send_message(1, x, step=1, msg=0, now=0.0, p=p)
    link = LossyLink([a, b], loss=loss, seed=seed)
    link.run()
    (ev,) = [e for _, e in link.events if isinstance(e, MessageReceived)]
    return ev.report.duration, ev.report.nack_rounds


for p in (0.0, 0.05):
    for ordered in (False, True):
        res = [run(ordered, s, p, 0.01) for s in range(10)]
        ms = [r[0] * 1e3 for r in res]
        rounds = statistics.fmean(r[1] for r in res)
        print(
            f"p={p} ordered_paths={ordered}: receive duration ms median "
            f"{statistics.median(ms):.3f} min {min(ms):.3f} max {max(ms):.3f}; "
            f"NACK rounds mean {rounds:.2f}"
        )
