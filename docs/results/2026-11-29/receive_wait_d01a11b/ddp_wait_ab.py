"""The DDP benchmark's lossless loopback job: DLCP's ring with the receive wait on
and off (DLCP_RECEIVE_WAIT), and Gloo, in turns (order reversed every other round).

    ROUNDS=3 ITERS=15 python ddp_wait_ab.py OUT.jsonl
"""

import argparse
import json
import os
import sys

import dlcp.bench.ddp as ddp

FIELDS = ("iter_s", "iter_s_p90", "comm_s", "lost_fraction")


def job_args() -> argparse.Namespace:
    return argparse.Namespace(
        nproc=4, iters=int(os.environ.get("ITERS", "15")), warmup=3, width=1664, depth=4,
        inputs=1024, batch=32, collective="ring", p=0.05, timeout=900,
    )  # fmt: skip


with open(sys.argv[1], "a") as out:
    for n in range(int(os.environ.get("ROUNDS", "3"))):
        order = [("dlcp", "1"), ("dlcp", "0"), ("gloo", "-")]
        for transport, wait in order if n % 2 == 0 else order[::-1]:
            os.environ["DLCP_RECEIVE_WAIT"] = wait if wait != "-" else "1"
            fig = ddp.run_job(job_args(), transport)
            rec = {
                "round": n, "transport": transport, "receive_wait": wait,
                "load": os.getloadavg()[0], **{k: fig.get(k) for k in FIELDS},
            }  # fmt: skip
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
