"""DLCP's and the UDP floor's lossless 64 MiB transfers with the veths' offloads off,
on dlcp.bench.transport's namespace line (root), N of each, one block after the
other; with PERF=1 each block runs under `perf record -a -F 1999` into
$OUT/perf_{dlcp,floor}.data.

    N=8 PERF=1 OUT=/tmp/offloads_off python offloads_off_perf.py
"""

import os
import signal
import subprocess
import time

import dlcp.bench.transport as bench_transport
from dlcp.bench.transport_worker import KEY_ENV

args = bench_transport._parser().parse_args(["--no-progress"])
args.size_bytes = int(args.size_mib * 2**20) // 4 * 4
N = int(os.environ.get("N", "6"))
OUT = os.environ.get("OUT", "/tmp/offloads_off")
env = {**os.environ, KEY_ENV: os.urandom(32).hex()}


def perf(tag: str) -> subprocess.Popen[bytes]:
    os.makedirs(OUT, exist_ok=True)
    return subprocess.Popen(
        ["perf", "record", "-a", "-F", "1999", "-o", f"{OUT}/perf_{tag}.data"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait()


with bench_transport._placement(args) as (path, pair):
    env.setdefault("DLCP_MTU", "auto")
    hosts, bases = (pair.addr_a, pair.addr_b), (41000, 41010)
    workers = []
    try:
        for role, ns in (("send", "ns_a"), ("recv", "ns_b")):
            worker_argv = bench_transport._worker_argv(args, role, hosts, bases, 0.0)
            argv = pair.exec_argv(getattr(pair, ns), worker_argv)
            workers.append(bench_transport.WorkerProc.start(role, argv, env))
        bench_transport.collect(workers, {"send": 1, "recv": 1}, 60, "ready")
        bench = bench_transport.Bench(args, workers, bench_transport.Progress(1000, False))
        bench.connect()
        pair.set_offloads(on=True)
        bench.rep("dlcp", "plain", 0.0, "warm-up")
        pair.set_offloads(on=False)
        bench.floor_rep(0.0, "warm-up floor")
        bench.rep("dlcp", "plain", 0.0, "warm-up")
        for tag in ("dlcp", "floor"):
            recorder = perf(tag) if os.environ.get("PERF") else None
            t0 = time.monotonic()
            if tag == "dlcp":
                reps = [bench.rep("dlcp", "plain", 0.0, "offloads off") for _ in range(N)]
            else:
                reps = [bench.floor_rep(0.0, "offloads off") for _ in range(N)]
            block = time.monotonic() - t0
            if recorder is not None:
                stop(recorder)
            seconds = [round(r.seconds, 4) for r in reps]
            print(tag, "block s", round(block, 3), "transfers s", seconds, flush=True)
    finally:
        for w in workers:
            w.stop()
