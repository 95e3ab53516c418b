"""Thread CPU time of ``Outbox.send`` per message, as the native engine's path calls
it (whole rounds, the tensor lent): planning, classification, send order and the
first round's headers of a float32 message of two layers.

    python send_cpu.py [messages]     # default 200 per size, after 20 warm-up ones

Prints one JSON line: the median milliseconds per message for a 6.25 MB message
(a 25 MB bucket's ring step on 4 ranks) and a 64 MiB one (the transport
benchmark's), and the commit's tree it ran from (``dlcp.__file__``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

import dlcp
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.context import SessionContext
from dlcp.proto.outbox import Outbox


def per_message_ms(n_elems: int, messages: int) -> float:
    outbox = Outbox(SessionContext(config=ProtocolConfig(), rank=0, job=1, keys=None),
                    whole_rounds=True)  # fmt: skip
    data = np.random.default_rng(0).standard_normal(n_elems).astype(np.float32)
    segments = [(0, n_elems // 3, 0), (n_elems // 3, n_elems - n_elems // 3, 1)]
    spent = []
    for step in range(messages + 20):
        start = time.thread_time()
        outbox.send(1, data, step=step, msg=0, now=0.0, p=0.05, borrow=True, segments=segments)
        spent.append(time.thread_time() - start)
        outbox.cancel((1, step, 0))  # its buffers back to the pool, as a finished message's
        outbox.release((1, step, 0))
    return statistics.median(spent[20:]) * 1e3


messages = int(sys.argv[1]) if len(sys.argv) > 1 else 200
print(json.dumps({
    "tree": dlcp.__file__,
    "send_ms_6.25MB": round(per_message_ms(1_562_500, messages), 3),
    "send_ms_64MiB": round(per_message_ms(16 << 20, messages // 4), 3),
}))  # fmt: skip
