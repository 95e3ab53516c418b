"""One incast run's JSON in a few lines: time per iteration, values lost, packets
resent, router drops, and how busy h1's port and h1's own egress were.

    python summarise_run.py RUN.json ...

h1's port (leaf1 -> h1) is counted busy for each data packet it forwarded (classes 0-6)
at a full 1,514-byte frame and each control packet (class 7) at 100 bytes, over the
training time (the sum of the iterations); h1's egress from its host queue's bytes.
"""

import json
import sys

for path in sys.argv[1:]:
    with open(path) as f:
        d = json.load(f)
    eps = d["train"]["epochs"]
    train_s = sum(sum(e["iteration_s"]) for e in eps)
    port = d["router_link_packets"]["leaf1"]["h1"]
    drops = d["router_link_drops"].get("leaf1", {}).get("h1", {})
    data = sum(v for k, v in port.items() if not k.startswith("c7"))
    ctrl = sum(v for k, v in port.items() if k.startswith("c7"))
    rate = d["link_rate_mbit"] * 1e6 / 8
    busy = (data * 1514 + ctrl * 100) / rate / train_s
    egress = d["host_queues"]["h1"]["bytes"]
    per_epoch = [round(e["iter_s"] * 1000) for e in eps]
    lost = [round(100 * e["loss_fraction"], 3) for e in eps]
    print(path)
    print(f"  ms/iter median {d['median_ms_per_iter']:.1f}, per epoch {per_epoch}")
    print(f"  lost % per epoch {lost}, resent {d['retransmissions']}")
    print(f"  load {d['load_avg_1m']}, CPU idle {d['cpu_idle_pct']} %")
    print(f"  router drops {d['router_drops']}")
    print(f"  leaf1 -> h1: {data} data + {ctrl} control packets forwarded, dropped {drops}")
    print(f"  leaf1 -> h1 busy {100 * busy:.1f} % of the training time")
    print(f"  h1's egress {egress / 1e6:.1f} MB: {100 * egress / rate / train_s:.1f} %")
