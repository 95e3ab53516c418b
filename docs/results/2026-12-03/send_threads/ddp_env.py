"""DDP lossless on the loopback: Gloo and DLCP under environment variants, in turns.
   python ddp_env.py NAME=VAR=VALUE[,VAR=VALUE] ... -- [bench.ddp options]"""
import json
import sys

from dlcp.bench import ddp

cut = sys.argv.index("--")
variants = {}
for spec in sys.argv[1:cut]:
    name, _, env = spec.partition("=")
    variants[name] = dict(kv.split("=", 1) for kv in env.split(",") if kv)
args = ddp._parser().parse_args(sys.argv[cut + 1:])
args.notes = {}
names = ["gloo", *variants]
out = {n: [] for n in names}
comm = {n: [] for n in variants}
for n in range(args.rounds):
    for what in (names if n % 2 == 0 else names[::-1]):
        if what == "gloo":
            fig = ddp.run_job(args, "gloo")
        else:
            fig = ddp.run_job(args, "dlcp", env_extra=variants[what])
            comm[what].append(round(fig["comm_s"] * 1e3, 1))
        out[what].append((round(fig["iter_s"] * 1e3, 1), round(fig["iter_s_p90"] * 1e3, 1)))
        print(what, out[what][-1], flush=True)
print(json.dumps({"iter_ms": out, "comm_ms": comm}))
