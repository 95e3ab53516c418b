"""Lossless loopback DDP jobs of two checkouts in turns (the driver of this folder's
lossless_turns.jsonl): python ddp_pairs.py BEFORE_TREE AFTER_TREE OUT PAIRS."""

import json
import subprocess
import sys

CODE = (
    "import json; from dlcp.bench.ddp import _parser, run_job; "
    "a = _parser().parse_args([]); print(json.dumps(run_job(a, 'dlcp')))"
)


def main() -> None:
    trees = {"before": sys.argv[1], "after": sys.argv[2]}
    with open(sys.argv[3], "a") as out:
        for pair in range(int(sys.argv[4])):
            order = ["before", "after"] if pair % 2 == 0 else ["after", "before"]
            for variant in order:
                with open("/proc/loadavg") as f:
                    load = f.read().split()[:3]
                run = subprocess.run(
                    [trees[variant] + "/.venv/bin/python", "-c", CODE],
                    cwd=trees[variant],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                fig = (
                    json.loads(run.stdout.strip().splitlines()[-1])
                    if run.returncode == 0
                    else {"error": run.stderr[-2000:]}
                )
                rec = {"pair": pair + 1, "variant": variant, "loadavg": " ".join(load), "fig": fig}
                out.write(json.dumps(rec) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
