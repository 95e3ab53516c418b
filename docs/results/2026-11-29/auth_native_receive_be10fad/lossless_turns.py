"""Only the lossless phase of ``dlcp.bench.transport``: its two workers in its
namespaces (the line topology, MTU 1500, offloads on), a warm-up of each, then
``ROUNDS`` rounds of one plain and one authenticated DLCP transfer of 64 MiB,
alternating which goes first. Prints one JSON line: each transfer's seconds,
the medians as GB/s, and authenticated / plain (plain median seconds over
authenticated median seconds), with the receiver's datagrams taken natively
where the worker reports them.

    DLCP_ENGINE=native python lossless_turns.py ROUNDS
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from dlcp.bench import transport as t


def main(rounds: int) -> None:
    args = t._parser().parse_args(["--no-progress"])
    args.size_bytes = int(args.size_mib * 2**20) // 4 * 4
    env = {**os.environ, t.KEY_ENV: os.urandom(32).hex()}
    seconds: dict[str, list[float]] = {"plain": [], "auth": []}
    native: dict[str, list[int]] = {"plain": [], "auth": []}
    with t._placement(args) as (path, pair):
        env.setdefault("DLCP_MTU", "auto")
        base = args.port_base or 41000
        hosts, bases = (pair.addr_a, pair.addr_b), (base, base + 10)
        workers = []
        try:
            for role, ns in (("send", "ns_a"), ("recv", "ns_b")):
                argv = pair.exec_argv(
                    getattr(pair, ns), t._worker_argv(args, role, hosts, bases, 0.0)
                )
                workers.append(t.WorkerProc.start(role, argv, env))
            t.collect(workers, {"send": 1, "recv": 1}, 60, "ready")
            bench = t.Bench(args, workers, t.Progress(1, False))
            pair.set_offloads(on=True)
            bench.rep("dlcp", "plain", 0.0, "warm-up")
            bench.rep("dlcp", "auth", 0.0, "warm-up")
            for k in range(rounds):
                for kind in ("plain", "auth") if k % 2 == 0 else ("auth", "plain"):
                    rep = bench.rep("dlcp", kind, 0.0, "lossless")
                    seconds[kind].append(rep.seconds)
                    native[kind].append(rep.receiver.get("datagrams_native", -1))
        finally:
            for w in workers:
                w.stop()
    med = {k: statistics.median(v) for k, v in seconds.items()}
    gbps = {k: round(args.size_bytes / v / 1e9, 3) for k, v in med.items()}
    print(
        json.dumps(
            {
                "path": path,
                "rounds": rounds,
                "seconds": seconds,
                "datagrams_native": native,
                "gbps": gbps,
                "auth_over_plain": round(med["plain"] / med["auth"], 3),
                "load": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
