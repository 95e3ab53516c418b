"""What planning one 6.25 MB message (1,562,500 float32, two layers, the default
classifier, p = 0.05, 1,440-byte chunks: 4,341 of them) costs on the calling
thread, alone: the minimum over 15 rounds of the CPU per call of 100 calls. Run
it with PYTHONPATH set to each tree in turn:

    PYTHONPATH=TREE python plan_cpu.py LABEL"""

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
data = np.random.default_rng(0).standard_normal(1_562_500).astype(np.float32)
segments = [(0, 781_250, 0), (781_250, 781_250, 1)]


def plan(p: float) -> Any:
    return plan_message(
        data, DType.FLOAT32, chunk_bytes=1440, classifier=classifier, segments=segments,
        magnitude_sample=16, loss_bound=p,
    )  # fmt: skip


table = plan(0.05)
ident = MessageId(job=1, step=1, msg=1, src=0, bound=50)
headers = np.empty((table.n_chunks, 32), np.uint8)
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
best = {name: min(cpu_us(call, 100) for _ in range(15)) for name, call in calls.items()}
print(sys.argv[1], "  ".join(f"{name} {us:.1f} us" for name, us in best.items()))
