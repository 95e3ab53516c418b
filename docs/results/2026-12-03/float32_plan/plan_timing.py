"""Warm time of one plan_message call, as the outbox makes it, for three message sizes.

Run from a checkout: ``python plan_timing.py``; prints the minimum over 30 repetitions
of the mean of a batch of calls, per size, in microseconds."""

import json
import sys
import time

import numpy as np

from dlcp.proto.classify import make_classifier
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.packetizer import plan_message
from dlcp.proto.wire import DType


def per_call_us(data: np.ndarray, classifier, config, segments, calls: int) -> float:
    dtype = DType.of(data)
    best = float("inf")
    for _ in range(30):
        t0 = time.perf_counter()
        for _ in range(calls):
            plan_message(
                data,
                dtype,
                chunk_bytes=config.chunk_bytes,
                classifier=classifier,
                segments=segments,
                magnitude_sample=config.magnitude_sample,
                loss_bound=0.05,
            )
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    config = ProtocolConfig()
    classifier = make_classifier(config.classifier, **config.classifier_kwargs())
    rng = np.random.default_rng(1)
    out = {}
    for n, calls in ((1, 2000), (65_536, 500), (1_562_500, 20)):
        data = rng.standard_normal(n).astype(np.float32)
        segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)] if n > 1 else None
        out[n] = round(per_call_us(data, classifier, config, segments, calls), 2)
    json.dump({"plan_message_us": out}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
