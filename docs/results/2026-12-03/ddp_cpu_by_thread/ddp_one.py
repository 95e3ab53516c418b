"""One DDP job (transport from argv[1]) with bench.ddp's defaults."""
import sys

from dlcp.bench import ddp

args = ddp._parser().parse_args(sys.argv[2:])
fig = ddp.run_job(args, sys.argv[1])
print(sys.argv[1], round(fig["iter_s"] * 1e3, 1), flush=True)
