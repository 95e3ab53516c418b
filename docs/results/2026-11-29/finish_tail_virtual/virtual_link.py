"""Protocol time of a lossy message over the in-memory link (virtual clock), FINISH tail trusted or not."""
import statistics, sys
import numpy as np
from dlcp.linkemu import LossyLink
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import MessageReceived, MessageDelivered, Session
def run(ordered, seed, p, loss):
    cfg = ProtocolConfig(ordered_paths=ordered, pacer_options={"initial_rate": 1.25e9})
    a, b = (Session(rank=r, job=7, config=cfg) for r in range(2))
    x = np.random.default_rng(seed).standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    b.expect_message(0, step=1, msg=0, p=p)
    a.send_message(1, x, step=1, msg=0, now=0.0, p=p)
    link = LossyLink([a, b], loss=loss, seed=seed)
    link.run()
    (ev,) = [e for r, e in link.events if isinstance(e, MessageReceived)]
    (dl,) = [e for r, e in link.events if isinstance(e, MessageDelivered)]
    return ev.report.duration, ev.report.nack_rounds
for p in (0.0, 0.05):
    for ordered in (False, True):
        res = [run(ordered, s, p, 0.01) for s in range(10)]
        d = [r[0] * 1e3 for r in res]
        print(f"p={p} ordered_paths={ordered}: receive duration ms median {statistics.median(d):.3f} "
              f"min {min(d):.3f} max {max(d):.3f}; NACK rounds mean {statistics.fmean(r[1] for r in res):.2f}")
