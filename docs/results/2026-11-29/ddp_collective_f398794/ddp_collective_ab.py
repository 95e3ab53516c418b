"""The DDP benchmark's lossless loopback job with the hook's ring all-reduce, its
halving-doubling all-reduce, and Gloo, in turns (the order reversed every other
round).

    cd docs/results/2026-11-29/ddp_collective_f398794
    ROUNDS=3 ITERS=15 python ddp_collective_ab.py OUT.jsonl

The job is ``dlcp.bench.ddp.run_job`` with the benchmark's defaults (4 ranks on the
loopback, ~10M parameters in two DDP buckets, p = 0.05). One JSON line per job.
"""

import argparse
import json
import os
import sys

import dlcp.bench.ddp as ddp

FIELDS = ("iter_s", "iter_s_p90", "comm_s", "lost_fraction")


def job_args(collective: str) -> argparse.Namespace:
    return argparse.Namespace(
        nproc=4, iters=int(os.environ.get("ITERS", "15")), warmup=3, width=1664, depth=4,
        inputs=1024, batch=32, collective=collective, p=0.05, timeout=900,
    )  # fmt: skip


with open(sys.argv[1], "a") as out:
    for n in range(int(os.environ.get("ROUNDS", "3"))):
        order = [("dlcp", "ring"), ("dlcp", "halving-doubling"), ("gloo", "ring")]
        for transport, collective in order if n % 2 == 0 else order[::-1]:
            fig = ddp.run_job(job_args(collective), transport)
            rec = {
                "round": n,
                "transport": transport,
                "collective": collective if transport == "dlcp" else "-",
                "load": os.getloadavg()[0],
                **{k: fig.get(k) for k in FIELDS},
            }
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
