"""The DDP benchmark's lossless loopback job with DLCP under two settings of an
environment variable (VAR, VALUES), and Gloo, in turns (order reversed every
other round).

    VAR=STREAM_MIN VALUES=1048576,8388608 ROUNDS=3 ITERS=15 python ddp_env_ab.py OUT.jsonl
"""

import argparse
import json
import os
import sys

import dlcp.bench.ddp as ddp

FIELDS = ("iter_s", "iter_s_p90", "comm_s", "lost_fraction")
VAR = os.environ["VAR"]
VALUES = os.environ["VALUES"].split(",")


def job_args() -> argparse.Namespace:
    return argparse.Namespace(
        nproc=4, iters=int(os.environ.get("ITERS", "15")), warmup=3, width=1664, depth=4,
        inputs=1024, batch=32, collective="ring", p=0.05, timeout=900,
    )  # fmt: skip


with open(sys.argv[1], "a") as out:
    for n in range(int(os.environ.get("ROUNDS", "3"))):
        order = [("dlcp", v) for v in VALUES] + [("gloo", "-")]
        for transport, value in order if n % 2 == 0 else order[::-1]:
            os.environ.pop(VAR, None)
            if value != "-":
                os.environ[VAR] = value
            fig = ddp.run_job(job_args(), transport)
            rec = {
                "round": n, "transport": transport, VAR: value,
                "load": os.getloadavg()[0], **{k: fig.get(k) for k in FIELDS},
            }  # fmt: skip
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
