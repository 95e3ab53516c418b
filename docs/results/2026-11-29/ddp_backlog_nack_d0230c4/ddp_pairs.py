import json, os, subprocess, sys
trees = {"before": "/work/wt-start", "after": "/work/main"}
code = ("import json,sys; from dlcp.bench.ddp import _parser, run_job; "
        "a=_parser().parse_args([]); print(json.dumps(run_job(a, 'dlcp')))")
out = open(sys.argv[1], "a")
for pair in range(int(sys.argv[2])):
    order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
    for v in order:
        load = open("/proc/loadavg").read().split()[:3]
        r = subprocess.run([trees[v] + "/.venv/bin/python", "-c", code], cwd=trees[v],
                           capture_output=True, text=True, timeout=600)
        fig = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr[-2000:]}
        rec = {"pair": pair + 1, "variant": v, "loadavg": " ".join(load), "fig": fig}
        out.write(json.dumps(rec) + "\n"); out.flush()
        print(v, pair + 1, load, {k: fig.get(k) for k in ("iter_s", "retransmitted_per_iter", "lost_fraction")}, flush=True)
