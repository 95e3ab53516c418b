"""The ring all-reduce (4 ranks, p = 0.05, two layers) on the default leaf-spine testbed
at RATE_MBIT links, 8 paths, with the receive loop's naps off (TRIAL_TRICKLE=0, with
trial_switch.diff applied) and on, in calls alternating ABBA within one job. Per call:
each rank's I/O turns, the four I/O threads' CPU and the four processes' CPU (each
rank's own, summed), the machine's busy time (/proc/stat, routers included), rank 0's
wall time. As root, from the repository's root:

    PYTHONPATH=$PWD python docs/results/2026-11-30/trickle_naps/testbed_ring_ab.py 50 540362 40

(540,362 float32: the testbed's wide model, 2.16 MB.) ``TRIAL_VAR`` names another
switch to alternate instead (``TRIAL_VAR=TRIAL_CLAIM``: see
../ring_50mbit_pacing/trial_claim.diff). Raw rows: out_*.json (per rank,
per call)."""

import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path


def worker():
    import threading

    import numpy as np
    import torch.distributed as dist

    import dlcp.io.io_loop as io_loop
    from dlcp.bench.allreduce import _busy_jiffies
    from dlcp.collectives import Communicator
    from dlcp.collectives.ring import ring_allreduce
    from dlcp.rendezvous import connect

    turns = [0]
    orig = io_loop.IOLoop._take_input

    def take(self, *a, **k):
        turns[0] += 1
        return orig(self, *a, **k)

    io_loop.IOLoop._take_input = take
    dist.init_process_group("gloo")
    endpoint, job = connect(group="trickle")
    comm = Communicator(endpoint, job.world_size, channel=1)
    n = int(os.environ["ELEMS"])
    calls = int(os.environ["CALLS"])
    data = np.random.default_rng(job.rank).standard_normal(n).astype(np.float32)
    segs = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
    io_t = next(t for t in threading.enumerate() if t.name.startswith("dlcp-io"))
    stat = Path(f"/proc/self/task/{io_t.native_id}/stat")

    def tcpu():
        f = stat.read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / 100

    def pcpu():
        t = os.times()
        return t.user + t.system

    rows = []
    for i in range(calls + 2):
        trial = (0, 1, 1, 0)[i % 4]
        os.environ[os.environ.get("TRIAL_VAR", "TRIAL_TRICKLE")] = str(trial)
        dist.barrier()
        b0, t0, c0, p0, w0 = _busy_jiffies(), turns[0], tcpu(), pcpu(), time.perf_counter()
        rep = ring_allreduce(comm, data, segments=segs, p=0.05, average=True)
        w1 = time.perf_counter()
        dist.barrier()
        if i >= 2:
            rows.append(
                dict(
                    trial=trial,
                    wall=w1 - w0,
                    turns=turns[0] - t0,
                    io_cpu=tcpu() - c0,
                    proc_cpu=pcpu() - p0,
                    busy=(_busy_jiffies() - b0) / 100,
                    lost=rep.lost_fraction,
                )
            )
    allrows = [None] * job.world_size
    dist.all_gather_object(allrows, rows)
    if job.rank == 0:
        Path(os.environ["OUT"]).write_text(json.dumps(allrows))
    endpoint.close()
    dist.destroy_process_group()


def main():
    rate, elems, calls = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    from dlcp.launch import launch
    from testbed.experiments import MASTER_PORT, switch_policy
    from testbed.impairments import apply_profile
    from testbed.topology import Topology, build

    out = str(Path(__file__).resolve().parent / f"out_{int(time.time())}.json")
    t = dataclasses.replace(Topology.default(), link_rate_mbit=rate)
    with build(t) as net:
        apply_profile(net, switch_policy(t, rate))
        master = net.host_addr(t.host_names[0])
        cmds = {}
        for rank, host in enumerate(t.host_names):
            argv = [
                "env",
                f"MASTER_ADDR={master}",
                f"MASTER_PORT={MASTER_PORT}",
                f"RANK={rank}",
                f"WORLD_SIZE={len(t.host_names)}",
                "LOCAL_RANK=0",
                f"GLOO_SOCKET_IFNAME={t.leaf_of(host)}",
                "DLCP_N_PATHS=8",
                f"ELEMS={elems}",
                f"CALLS={calls}",
                f"OUT={out}",
                f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
                sys.executable,
                "-u",
                __file__,
                "--worker",
            ]
            cmds[rank] = net.exec_argv(host, argv)
        log = io.StringIO()
        res = launch(
            cmds[0],
            len(t.host_names),
            rank_cmd=cmds,
            master_port=MASTER_PORT,
            stdout=log,
            stderr=log,
            timeout=1200,
        )
        if res.returncode != 0:
            print(log.getvalue()[-3000:])
            return 1
    allrows = json.loads(Path(out).read_text())
    import statistics as st

    for trial in (0, 1):
        per = [[r for r in rows if r["trial"] == trial] for rows in allrows]
        wall = st.median(r["wall"] for r in per[0])
        turns = [st.mean(r["turns"] for r in p) for p in per]
        io_cpu = sum(st.mean(r["io_cpu"] for r in p) for p in per) * 1e3
        proc = sum(st.mean(r["proc_cpu"] for r in p) for p in per) * 1e3
        busy = st.mean(r["busy"] for r in per[0]) * 1e3
        lost = st.mean(r["lost"] for r in per[0])
        print(
            f"trial {trial}: wall {wall * 1e3:.1f} ms, "
            f"turns/call/rank {[round(x) for x in turns]}, io cpu {io_cpu:.1f} ms (4 ranks), "
            f"procs {proc:.1f} ms, machine busy {busy:.1f} ms, lost {lost:.4f}"
        )
    print(out)


if __name__ == "__main__":
    sys.exit(worker() if "--worker" in sys.argv else main())
