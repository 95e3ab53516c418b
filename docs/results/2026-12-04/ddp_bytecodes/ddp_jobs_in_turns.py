"""Lossless DDP jobs of dlcp.bench.ddp (its defaults), Gloo then DLCP, JOBS times; one
JSON line a job (the job's figures, and the VM's CPU steal over it).

    python ddp_jobs_in_turns.py JOBS [ITERS]
"""

import json
import sys

from dlcp.bench import ddp
from dlcp.bench.machine import cpu_times, describe

jobs = int(sys.argv[1])
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
args = ddp._parser().parse_args(["--iters", str(iters)])
for job in range(jobs):
    for transport in ("gloo", "dlcp"):
        start = cpu_times()
        fig = ddp.run_job(args, transport)
        fig["steal"] = describe(start, cpu_times()).get("cpu_steal_fraction")
        rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in fig.items()}
        print(json.dumps({"job": job, "t": transport, **rounded}), flush=True)
