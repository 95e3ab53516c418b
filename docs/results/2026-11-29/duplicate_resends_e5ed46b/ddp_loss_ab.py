"""The DDP benchmark's job under 1 % nftables loss, DLCP resending a small
retransmission round's chunks twice (``DLCP_DUPLICATE_RESENDS=0.02``, the default)
and once (``0``), and Gloo, in turns.

    cd docs/results/2026-11-29/duplicate_resends_e5ed46b
    ROUNDS=3 ITERS=15 python ddp_loss_ab.py OUT.jsonl

The place is ``dlcp.bench.ddp``'s own: a network namespace whose loopback has MTU
1500 and offloads off, TCP timers like DLCP's, an nftables rule dropping 1 % of the
packets delivered on it; the job is ``dlcp.bench.ddp.run_job`` with the benchmark's
defaults (4 ranks, ~10M parameters, ring all-reduce, p = 0.05). One JSON line per job.
"""

import argparse
import json
import os
import sys

import dlcp.bench.ddp as ddp

args = argparse.Namespace(
    nproc=4, iters=int(os.environ.get("ITERS", "15")), warmup=3, width=1664, depth=4,
    inputs=1024, batch=32, collective="ring", p=0.05, timeout=900, emulated=False, loss=1.0,
)  # fmt: skip
FIELDS = ("iter_s", "iter_s_p90", "comm_s", "lost_fraction", "retransmitted_per_iter")

with open(sys.argv[1], "a") as out, ddp._lossy_place(args) as box:
    ddp._tcp_timers_like_dlcp(box)
    prefix = box.exec_argv([])
    box.set_loss(1.0)
    for n in range(int(os.environ.get("ROUNDS", "3"))):
        order = [("dlcp", "0.02"), ("dlcp", "0"), ("gloo", "-")]
        for transport, duplicate in order if n % 2 == 0 else order[::-1]:
            env = {"DLCP_DUPLICATE_RESENDS": duplicate} if transport == "dlcp" else {}
            before = box.dropped()
            fig = ddp.run_job(args, transport, prefix=prefix, env_extra=env)
            rec = {
                "round": n,
                "transport": transport,
                "duplicate_resends": duplicate,
                "load": os.getloadavg()[0],
                **{k: fig.get(k) for k in FIELDS},
                "nft_dropped": box.dropped() - before,
            }
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
