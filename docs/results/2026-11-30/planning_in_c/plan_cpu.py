"""What planning one message costs on the calling thread, alone: by default the 25 MB
ring's 6.25 MB message (1,562,500 float32, two layers, the default classifier,
p = 0.05, 1,440-byte chunks: 4,341 of them). Each figure is the minimum over 15
rounds of the CPU per call of 100 calls (7 rounds of 10 for a message of 4 million
elements or more). Run it with PYTHONPATH set to each tree in turn:

    PYTHONPATH=TREE python plan_cpu.py LABEL [ELEMENTS]

ELEMENTS 16777216 is the transport benchmark's 64 MiB message (46,604 chunks).
Where the tree has the C pass (classify_chunks), it also times the classifier's
numpy classify against the C pass on the same magnitudes, in the same process."""

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dlcp.proto.classify import make_classifier
from dlcp.proto.first_round import first_round
from dlcp.proto.packetizer import MessageId, plan_message
from dlcp.proto.wire import DType


def cpu_us(call: Callable[[], Any], n: int) -> float:
    start = time.thread_time()
    for _ in range(n):
        call()
    return (time.thread_time() - start) / n * 1e6


classifier = make_classifier("combined", drop_fraction=0.8)  # (the default's options)
elems = int(sys.argv[2]) if len(sys.argv) > 2 else 1_562_500
data = np.random.default_rng(0).standard_normal(elems).astype(np.float32)
segments = [(0, elems // 2, 0), (elems // 2, elems - elems // 2, 1)]


def plan(p: float) -> Any:
    return plan_message(
        data, DType.FLOAT32, chunk_bytes=1440, classifier=classifier, segments=segments,
        magnitude_sample=16, loss_bound=p,
    )  # fmt: skip


table = plan(0.05)
ident = MessageId(job=1, step=1, msg=1, src=0, bound=50)
headers = np.empty((table.n_chunks, 32), np.uint8)
rounds, per_round = (15, 100) if elems < 4_000_000 else (7, 10)
source = data.view(np.uint8)
calls: dict[str, Callable[[], Any]] = {
    "plan_message p=0.05": lambda: plan(0.05),
    "plan_message p=0": lambda: plan(0.0),
    "first_round (headers only)": lambda: first_round(
        source, table, ident, authenticate=False, buffer=headers, lend=True
    ),
}
try:
    from dlcp.proto.classify import classify_chunks
except ImportError:  # (before e9269da)
    pass
else:
    layers, magnitude = table.layer, table.magnitude
    calls["classify (numpy reference)"] = lambda: classifier.classify(layers, magnitude, n_layers=2)
    calls["classify_chunks (C pass)"] = lambda: classify_chunks(
        classifier, layers, magnitude, n_layers=2
    )
    calls["classify_chunks, nothing may drop"] = lambda: classify_chunks(
        classifier, layers, magnitude, n_layers=2, may_drop=False
    )
best = {name: min(cpu_us(call, per_round) for _ in range(rounds)) for name, call in calls.items()}
figures = "  ".join(f"{name} {us:.1f} us" for name, us in best.items())
print(sys.argv[1], f"{table.n_chunks} chunks:", figures)
