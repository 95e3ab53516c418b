"""Rows of 1,440 bytes copied from a hot staging buffer into a destination of S
bytes (the receive path's placement), then the destination read once as float32
(the reduction that follows), streaming stores against ordinary ones; CPU
nanoseconds per byte, best of 7. A fresh destination region per pass (cycling
through 256 MB) so that it starts cold; WARM=1 copies into the same region every
pass instead (it stays cached)."""

import os
import time

import numpy as np

from dlcp.proto.kernels import copy_rows

ROW, HDR, RUN = 1440, 32, 45  # payload, header, datagrams per staged run
stage = np.random.default_rng(0).integers(0, 255, RUN * (ROW + HDR), dtype=np.uint8)
pool = np.zeros(256 << 20, np.uint8)
pool[::4096] = 1  # (faulted in)
for size in (256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20):
    n_rows = size // ROW
    passes = max(1, (128 << 20) // size)
    res = {}
    for stream in (False, True):
        best = []
        for _ in range(7):
            c0 = time.process_time()
            for p in range(passes):
                base = 0 if os.environ.get("WARM") else (p * size) % ((256 << 20) - size)
                dst = pool[base : base + n_rows * ROW]
                for first in range(0, n_rows, RUN):
                    k = min(RUN, n_rows - first)
                    copy_rows(dst, first * ROW, ROW, None, stage, HDR, ROW + HDR, None, k, ROW,
                              stream=stream)  # fmt: skip
                dst.view(np.float32).sum()  # the read that follows
            best.append((time.process_time() - c0) / (passes * n_rows * ROW) * 1e9)
        res[stream] = min(best)
    ratio = res[True] / res[False]
    print(f"dest {size >> 10:6d} KB: ordinary {res[False]:.3f} ns/B, "
          f"streaming {res[True]:.3f} ns/B ({ratio:.2f})")  # fmt: skip
