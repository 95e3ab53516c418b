"""DDP under 1 % nftables loss in bench.ddp's namespace (MTU 1500, offloads off):
Gloo and DLCP under environment variants, in turns.
   python ddp_loss_ab.py NAME=VAR=VALUE[,VAR=VALUE] ... -- [bench.ddp options]"""
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
extra = {n: [] for n in variants}
with ddp._lossy_place(args) as box:
    ddp._tcp_timers_like_dlcp(box)
    prefix = box.exec_argv([])
    box.set_loss(args.loss)
    for n in range(args.rounds):
        for what in (names if n % 2 == 0 else names[::-1]):
            if what == "gloo":
                fig = ddp.run_job(args, "gloo", prefix=prefix)
            else:
                fig = ddp.run_job(args, "dlcp", prefix=prefix, env_extra=variants[what])
                extra[what].append((round(fig["retransmitted_per_iter"], 1),
                                    round(fig["lost_fraction"], 5), round(fig["comm_s"] * 1e3, 1)))
            out[what].append((round(fig["iter_s"] * 1e3, 1), round(fig["iter_s_p90"] * 1e3, 1)))
            print(what, out[what][-1], extra.get(what, [None])[-1], flush=True)
print(json.dumps({"iter_ms_median_p90": out, "resent_lost_comm": extra}))
