"""DDP lossless on the loopback: Gloo, DLCP ring, DLCP halving-doubling, in turns."""
import json
import sys

from dlcp.bench import ddp

args = ddp._parser().parse_args(sys.argv[1:])
args.notes = {}
out = {"gloo": [], "ring": [], "halving-doubling": []}
for n in range(args.rounds):
    order = ["gloo", "ring", "halving-doubling"]
    if n % 2:
        order.reverse()
    for what in order:
        if what == "gloo":
            fig = ddp.run_job(args, "gloo")
        else:
            args.collective = what
            fig = ddp.run_job(args, "dlcp")
        out[what].append(round(fig["iter_s"] * 1e3, 1))
        print(what, out[what][-1], flush=True)
print(json.dumps(out))
