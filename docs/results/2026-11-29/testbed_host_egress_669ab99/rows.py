import glob, json, os, sys
sys.path.insert(0, "/tmp/egress")
def delivered(r):
    n = 0
    for router, devs in r["router_link_packets"].items():
        if router.startswith("leaf"):
            for dev, classes in devs.items():
                if dev.startswith("h"):
                    n += sum(v for k, v in classes.items() if k[:2] in ("c1","c2","c3","c4","c5","c6"))
    return n
dl, gl = [], []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    r = json.load(open(f)); rd = os.path.basename(f).split("-")[0]
    eps = r["train"]["epochs"]; cls = r["router_classes"]
    de = sum(v["drops"] for k, v in cls.items() if k.endswith("-drop"))
    pr = sum(v["drops"] for k, v in cls.items() if not k.endswith("-drop"))
    hosts = r["setup"].get("host_egress") or "unshaped"
    per = ", ".join("%.0f" % (1e3 * e["iter_s"]) for e in eps)
    ms = "%.1f (%s)" % (r["median_ms_per_iter"], per)
    if r["transport"] == "dlcp":
        lost = "%.3f (%s)" % (100 * r["lost_fraction"], ", ".join("%.3f" % (100 * e["loss_fraction"]) for e in eps))
        res = f"{r['retransmissions']:,} ({100*r['retransmissions']/delivered(r):.2f})"
        dl.append((r["scenario"], rd, hosts, f"| {r['scenario']} | {rd} | {hosts} | {lost} | {res} | {de:,} / {pr:,} | {ms} |"))
    else:
        gl.append((r["scenario"], rd, hosts, f"| {r['scenario']}, Gloo | {rd} | {hosts} | {de+pr:,} | {ms} |"))
print("\n".join(x[-1] for x in sorted(dl)))
print("---")
print("\n".join(x[-1] for x in sorted(gl)))
