"""The DDP benchmark's 1 % loss job (its namespace: loopback MTU 1500, offloads off,
nftables dropping 1 % of the packets) on a build with linger_nap.diff applied, with
the nap off (TRIAL_LINGER_NAP_NS=0) and at 150 us, and Gloo, in turns (order reversed
every other round). Run as root:

    ROUNDS=4 python linger_nap_ddp_loss.py OUT.jsonl
"""

import argparse
import json
import os
import sys

import dlcp.bench.ddp as ddp

args = argparse.Namespace(
    nproc=4, iters=20, warmup=3, width=1664, depth=4, inputs=1024, batch=32,
    collective="ring", p=0.05, timeout=900, emulated=False, loss=1.0,
)  # fmt: skip
with open(sys.argv[1], "a") as out, ddp._lossy_place(args) as box:
    ddp._tcp_timers_like_dlcp(box)
    prefix = box.exec_argv([])
    box.set_loss(args.loss)
    for n in range(int(os.environ.get("ROUNDS", "3"))):
        order = [("dlcp", "0"), ("dlcp", "150000"), ("gloo", "-")]
        for transport, linger in order if n % 2 == 0 else order[::-1]:
            env = {"TRIAL_LINGER_NAP_NS": linger}
            os.environ.pop("DLCP_RECEIVE_LINGER", None)
            fig = ddp.run_job(args, transport, prefix=prefix, env_extra=env)
            rec = {
                "round": n, "transport": transport, "nap_ns": linger,
                "load": os.getloadavg()[0], "iter_s": fig["iter_s"],
                "lost_fraction": fig.get("lost_fraction"),
                "retransmitted_per_iter": fig.get("retransmitted_per_iter"),
            }  # fmt: skip
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
