"""Receive CPU of one 25 MB message with reads placed into it, and without.

Run from a checkout of ``trial/place-ahead`` (``5e87d83``, where
``EndpointConfig.place_ahead`` exists), as root, two ranks on the loopback:

    python -c "import sys; from dlcp.launch import launch; \\
        launch([sys.executable, 'place_ab.py'], 2, stdout=sys.stdout, stderr=sys.stderr)"

Rank 0 sends the same message to rank 1 over two endpoints of one job, one placing
reads (``place_ahead=True``) and one not, taking turns ``ROUNDS`` times; rank 1
prints its process CPU and its I/O thread's CPU per transfer for each.
"""

import dataclasses
import os
import statistics
import time

import numpy as np
import torch.distributed as dist

from dlcp.rendezvous import connect

ROUNDS = int(os.environ.get("ROUNDS", "60"))
ELEMS = 6_250_000


def thread_cpu(prefix: str) -> float:
    """CPU seconds of this process's threads whose names start with ``prefix``."""
    ticks = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith(prefix):
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    dist.init_process_group("gloo")
    placing, job = connect(group="place-on")
    plain, _ = connect(
        group="place-off", config=dataclasses.replace(placing.config, place_ahead=False)
    )
    data = np.random.default_rng(0).standard_normal(ELEMS).astype(np.float32)
    out = np.empty_like(data)
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    io: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(ROUNDS):
        for name, ep in (("on", placing), ("off", plain)):
            dist.barrier()
            c0, t0 = time.process_time(), thread_cpu("dlcp-io")
            if job.rank == 0:
                ep.send(data, to=1, step=r, msg=0, p=0.0).result(timeout=60)
            else:
                ep.recv(out=out, src=0, step=r, msg=0, p=0.0).result(timeout=60)
            c1, t1 = time.process_time(), thread_cpu("dlcp-io")
            dist.barrier()
            if r >= 2:  # (two rounds of warm-up)
                cpu[name].append(c1 - c0)
                io[name].append(t1 - t0)
    if job.rank == 1:
        assert np.array_equal(out, data)
        st = placing.stats()
        print(
            f"recv cpu ms/transfer: on {1e3 * statistics.median(cpu['on']):.2f} "
            f"off {1e3 * statistics.median(cpu['off']):.2f} "
            f"io-thread mean on {1e3 * statistics.mean(io['on']):.2f} "
            f"off {1e3 * statistics.mean(io['off']):.2f} "
            f"process mean on {1e3 * statistics.mean(cpu['on']):.2f} "
            f"off {1e3 * statistics.mean(cpu['off']):.2f} "
            f"placed {st['datagrams_placed']} of {st['datagrams_fast']} "
            f"missed {st['placed_reads_missed']}",
            flush=True,
        )
    placing.close()
    plain.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
