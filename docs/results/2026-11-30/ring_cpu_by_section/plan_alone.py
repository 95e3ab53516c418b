"""What planning one 6.25 MB message (1,562,500 float32, two layers, the default
classifier, p = 0.05) costs on an idle core, CPU per call:

    python plan_alone.py"""

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dlcp.proto.classify import _magnitude_drop, make_classifier
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.packetizer import plan_message
from dlcp.proto.wire import DType


def cpu_us(call: Callable[[], Any], n: int) -> float:
    for _ in range(n // 10):
        call()
    start = time.thread_time()
    for _ in range(n):
        call()
    return (time.thread_time() - start) / n * 1e6


cfg = ProtocolConfig()
classifier = make_classifier(cfg.classifier, **cfg.classifier_kwargs())
data = np.random.default_rng(0).standard_normal(1_562_500).astype(np.float32)
segments = [(0, 781_250, 0), (781_250, 781_250, 1)]
options: dict[str, Any] = {
    "chunk_bytes": cfg.chunk_bytes, "classifier": classifier, "segments": segments,
    "magnitude_sample": cfg.magnitude_sample, "loss_bound": 0.05,
}  # fmt: skip
plan = cpu_us(lambda: plan_message(data, DType.FLOAT32, **options), 200)
table = plan_message(data, DType.FLOAT32, **options)
layers = table.layer.astype(np.int64)
classes = cpu_us(lambda: classifier.classify(layers, table.magnitude, n_layers=2), 2000)
drop = cpu_us(lambda: _magnitude_drop(table.magnitude, None, 0.1, None), 2000)
print(f"plan_message {plan:.0f} us; of it classify {classes:.0f} us, its drop mask {drop:.0f} us")
