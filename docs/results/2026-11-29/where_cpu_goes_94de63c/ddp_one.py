"""One lossless loopback DDP job of the benchmark (dlcp.bench.ddp.run_job) with its
defaults and ITERS iterations, transport dlcp or gloo, for perf to watch:

    ITERS=200 python ddp_one.py dlcp
"""

import argparse
import json
import os
import sys

import dlcp.bench.ddp as ddp

args = argparse.Namespace(
    nproc=4, iters=int(os.environ.get("ITERS", "60")), warmup=3, width=1664, depth=4,
    inputs=1024, batch=32, collective="ring", p=0.05, timeout=900,
)  # fmt: skip
fig = ddp.run_job(args, sys.argv[1])
print(json.dumps({k: fig.get(k) for k in ("iter_s", "comm_s")}))
