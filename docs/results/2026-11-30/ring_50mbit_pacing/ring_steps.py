"""The 2.16 MB ring all-reduce (4 ranks, p = 0.05, 8 paths) on the testbed at 50 Mbit/s
links: CALLS calls, then CALLS more with 1 % loss on leaf1-spine1 (the testbed's `loss`
scenario). Per call and rank: the call's wall time, each exchange's, NACK rounds and
packets resent (the call's report), the reduce-scatter's lost fraction, FINISHes sent
again and NACKs sent (first or repeated) by the recovery timers, and every RATE report
and loss report the sender's pacer got (``events``: time, peer, reported rate or lost
fraction, the pacer's rate before and after). As root, from the repository's root:

    PYTHONPATH=$PWD python docs/results/2026-11-30/ring_50mbit_pacing/ring_steps.py CALLS
"""

import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path


def worker() -> None:
    import numpy as np
    import torch.distributed as dist

    import dlcp.collectives.ring as ring
    from dlcp.collectives import Communicator
    from dlcp.rendezvous import connect

    steps: list[float] = []
    orig = ring.exchange

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            steps.append(time.perf_counter() - t0)

    ring.exchange = timed
    import dlcp.proto.recovery as rec

    counts = {"finish_repeat": 0, "nack_sent": 0, "nack_repeat": 0}
    s_on = rec.SenderRecovery.on_timer

    def s_timer(self, *, now):
        out = s_on(self, now=now)
        counts["finish_repeat"] += bool(out)
        return out

    rec.SenderRecovery.on_timer = s_timer
    r_on = rec.ReceiverRecovery.on_timer

    def r_timer(self, **kw):
        f = self.reassembler.finish
        repeat = f is not None and self._nacked(f.round)
        out = r_on(self, **kw)
        if out:
            counts["nack_sent"] += 1
            counts["nack_repeat"] += repeat
        return out

    rec.ReceiverRecovery.on_timer = r_timer
    import dlcp.proto.outbox as ob

    events: list = []
    f_on = ob.Outbox.on_feedback

    def feedback(self, fb, *, now):
        p = self.peers.get(fb.src)
        before = p.pacer.rate if p is not None else None
        f_on(self, fb, now=now)
        if p is not None:
            events.append(("rate", now, fb.src, fb.bytes_per_s, before, p.pacer.rate))

    ob.Outbox.on_feedback = feedback
    l_on = ob.Outbox._round_lost

    def lost(self, dst, out, lost_fraction, chunks, *, queue, now):
        p = self.peers[dst]
        before = p.pacer.rate
        l_on(self, dst, out, lost_fraction, chunks, queue=queue, now=now)
        events.append(
            ("loss", now, dst, lost_fraction, chunks, queue, out.round_rate, before, p.pacer.rate)
        )

    ob.Outbox._round_lost = lost
    dist.init_process_group("gloo")
    endpoint, job = connect(group="lossx")
    comm = Communicator(endpoint, job.world_size, channel=1)
    n, calls = int(os.environ["ELEMS"]), int(os.environ["CALLS"])
    data = np.random.default_rng(job.rank).standard_normal(n).astype(np.float32)
    segs = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
    rows = []
    flag = Path(os.environ["FLAG"])
    for i in range(2 * calls + 2):
        if i == calls + 2 and job.rank == 0:
            flag.write_text("want-loss")
        if i == calls + 2:
            dist.barrier()
            while job.rank == 0 and flag.read_text() != "loss-on":
                time.sleep(0.05)
            dist.barrier()
        steps.clear()
        events.clear()
        for key in counts:
            counts[key] = 0
        dist.barrier()
        t0 = time.perf_counter()
        rep = ring.ring_allreduce(comm, data, segments=segs, p=0.05, average=True)
        w = time.perf_counter() - t0
        if i >= 2:
            rows.append(
                dict(
                    loss=i >= calls + 2,
                    wall=w,
                    steps=list(steps),
                    nack=rep.nack_rounds,
                    retx=rep.retransmitted_packets,
                    lost=rep.lost_fraction,
                    events=list(events),
                    **counts,
                )
            )
    allrows = [None] * job.world_size
    dist.all_gather_object(allrows, rows)
    if job.rank == 0:
        Path(os.environ["OUT"]).write_text(json.dumps(allrows))
    endpoint.close()
    dist.destroy_process_group()


def main() -> int:
    import threading

    from dlcp.launch import launch
    from testbed.experiments import MASTER_PORT, switch_policy
    from testbed.impairments import apply_profile, link_loss
    from testbed.topology import Topology, build

    calls = sys.argv[1]
    out = str(Path(__file__).resolve().parent / f"out_{int(time.time())}.json")
    flag = Path(out).with_suffix(".flag")
    flag.write_text("")
    t = dataclasses.replace(Topology.default(), link_rate_mbit=50.0)
    with build(t) as net:
        apply_profile(net, switch_policy(t, 50.0))
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
                "ELEMS=540362",
                f"CALLS={calls}",
                f"OUT={out}",
                f"FLAG={flag}",
                f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}",
                sys.executable,
                "-u",
                __file__,
                "--worker",
            ]
            cmds[rank] = net.exec_argv(host, argv)

        def watch() -> None:
            while flag.read_text() != "want-loss":
                time.sleep(0.05)
            link_loss(net, "leaf1", "spine1", 1.0)
            flag.write_text("loss-on")

        threading.Thread(target=watch, daemon=True).start()
        log = io.StringIO()
        res = launch(
            cmds[0], 4, rank_cmd=cmds, master_port=MASTER_PORT, stdout=log, stderr=log, timeout=1500
        )
        if res.returncode != 0:
            print(log.getvalue()[-3000:])
            return 1
    flag.unlink()
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(worker() if "--worker" in sys.argv else main())
