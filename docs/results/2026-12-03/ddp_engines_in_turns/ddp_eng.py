"""DDP lossless on the loopback: Gloo, DLCP native, DLCP python, in turns."""
import json
import sys

from dlcp.bench import ddp

args = ddp._parser().parse_args(sys.argv[1:])
args.notes = {}
out = {"gloo": [], "native": [], "python": []}
for n in range(args.rounds):
    order = ["gloo", "native", "python"]
    if n % 2:
        order.reverse()
    for what in order:
        if what == "gloo":
            fig = ddp.run_job(args, "gloo")
        else:
            fig = ddp.run_job(args, "dlcp", env_extra={"DLCP_ENGINE": what})
        out[what].append(round(fig["iter_s"] * 1e3, 1))
        print(what, out[what][-1], flush=True)
print(json.dumps(out))
