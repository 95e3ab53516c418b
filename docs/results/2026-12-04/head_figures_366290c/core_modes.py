"""One process of ``dlcp.bench.core``'s transfer: the median of 8 timed 64 MiB
transfers (the benchmark's ``one_transfer``, its Receiver and sessions) and one
numpy copy of the same bytes, printed on one line; with ``--step-sizes``, the
transfers in turns with receive steps of 32, 64 and 256 KB instead.

    python core_modes.py                    # repeat, and under taskset -c 0 / 1
    python core_modes.py --step-sizes
"""

import sys
import time

import numpy as np

import dlcp.bench.core as bc
from dlcp.io.native_receive import MessageRuns
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import Session

n = 64 * (1 << 20) // 4
data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
out = np.zeros_like(data)
cfg = ProtocolConfig(pacer="unpaced")
tx = Session(rank=0, job=1, config=cfg, key=None, whole_rounds=True)
rx = Session(rank=1, job=1, config=cfg, key=None)
receiver = bc.Receiver(rx, MessageRuns(1))
if "--step-sizes" in sys.argv:
    sizes = [32 << 10, 64 << 10, 256 << 10]
    by_size: dict[int, list[float]] = {s: [] for s in sizes}
    for i in range(18):
        s = sizes[i % 3]
        bc._as_received.__defaults__ = (s,)  # the harness's step: its runs' limit
        by_size[s].append(bc.one_transfer(tx, receiver, data, out, step=i))
    lines = [f"{s >> 10:4d} KB steps {np.median(v) * 1e3:5.1f} ms" for s, v in by_size.items()]
    print("  ".join(lines))
else:
    times = [bc.one_transfer(tx, receiver, data, out, step=i) for i in range(8)]
    t0 = time.perf_counter()
    np.copyto(out, data)
    copy = time.perf_counter() - t0
    print(f"core {np.median(times) * 1e3:.1f} ms  memcpy {copy * 1e3:.1f} ms")
