"""All-reduce benchmark: one small array on 4 ranks, DLCP's collectives against Gloo's.

    python -m dlcp.bench.allreduce --json        # or: dlcp bench allreduce --json

The testbed's training iterations are short (the digits CNN has 38,282
parameters), so what decides them is what one all-reduce of ~150 KB costs, in
time and in CPU. This benchmark times exactly that, side by side in one job of
4 ranks: Gloo's ``all_reduce`` and DLCP's ring, halving-doubling and
parameter-server-style all-reduce (every rank serves a shard) of the same
float32 array (``--elems``; the digits CNN's 38,282 by default), averaging,
loss bound ``--p`` for DLCP's push phase. The kinds take turns, ``--rounds``
times ``--iters`` calls each after one warm-up round; a kind's figure is the
median over all its calls of rank 0's time per call.

Where:

* root (``path = "testbed"``): the default leaf-spine testbed (4 hosts, 2
  leaves, 2 spines, network namespaces), every router egress shaped to
  ``--link-rate`` Mbit/s by the DLCP switch profile, hosts sending MTU-sized
  packets (segmentation offloads off for TCP and UDP alike), one rank per
  host; DLCP sprays over ``--paths`` source ports;
* otherwise (``path = "loopback"``): 4 local ranks on the loopback.

On the loopback as root (``--loopback``), a fifth kind takes its turn too: the
**UDP floor** (``floor``, :class:`dlcp.bench.ddp_floor.UdpRingFloor`), the ring's
all-reduce in bare datagrams of DLCP's size through DLCP's own UDP layer, each
sent once, with no protocol above it (no classes, pacing, control messages or
recovery) and the same copies: what DLCP's ring would cost if its protocol cost
nothing. ``ring_over_floor_cpu`` (the ring's CPU per call over the floor's) is
what the protocol costs in CPU; the floor needs root for its 64 MB receive
buffers (it resends nothing, so a datagram dropped at a full buffer would fail
it) and a lossless path, so neither without root nor on the testbed; a rank
whose kernel refuses those buffers (root without CAP_NET_ADMIN) leaves it out,
saying why in ``floor_error``. While the floor runs, the DLCP endpoints' I/O
threads wait idle beside it; what little CPU they take counts as the floor's.

The ranks share the machine's cores, and the routers forward in the same
kernel, so the machine's CPU is part of the result: ``*_cpu_ms`` is the busy
time of all cores (``/proc/stat``: user, nice, system, interrupts, softirq) per call,
over the calls of that kind. The last stdout line (``--json``) is one JSON
object: ``gloo_ms``, ``ring_ms``, ``hd_ms``, ``ps_ms``, ``floor_ms`` (null
where the floor did not run), their CPU, ``ratio_ring = ring_ms / gloo_ms``,
``ratio_hd``, ``ratio_ps``, ``ratio_floor`` likewise, and ``ring_over_floor`` /
``ring_over_floor_cpu`` (the ring's time / CPU per call over the floor's), and
``floor_error`` (why the floor was left out, if it was).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlcp.errors import BenchError

from .outcome import finish, ranks_authenticate

if TYPE_CHECKING:
    from .ddp_floor import UdpRingFloor

KINDS = ("gloo", "ring", "hd", "ps")
#: the UDP floor's kind (loopback, root): see the module docstring
FLOOR = "floor"
#: the ring on an endpoint of the Python engine, beside the native engine's ring
RING_PYTHON = "ring_python"
#: the digits CNN of examples/train_digits.py: one DDP bucket of this many floats
DIGITS_PARAMS = 38282


# ---------------------------------------------------------------------- worker (one rank)


def _busy_jiffies() -> int:
    """Busy time of all cores so far (jiffies): user, nice, system, irq and
    softirq (not idle, iowait, or a hypervisor's steal; guest time is in user)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return user + nice + system + irq + softirq


def worker(args: argparse.Namespace) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist

    from dlcp.collectives import (
        CollectiveReport,
        Communicator,
        halving_doubling_allreduce,
        ps_allreduce,
    )
    from dlcp.collectives.ring import ring_allreduce
    from dlcp.rendezvous import connect

    dist.init_process_group("gloo")
    endpoint, job = connect(group="bench-allreduce")
    comm = Communicator(endpoint, job.world_size, channel=1)
    # the same ring on the Python engine, in turn with the native one's
    py_endpoint = py_comm = None
    if endpoint.engine == "native":
        import dataclasses


        py_config = dataclasses.replace(endpoint.config, engine="python", engine_threads=1)
        py_endpoint, _ = connect(group="bench-allreduce-python", config=py_config)
        py_comm = Communicator(py_endpoint, job.world_size, channel=1)
    n = args.elems
    original = np.random.default_rng(job.rank).standard_normal(n).astype(np.float32)
    data = original.copy()
    tensor = torch.from_numpy(original.copy())
    floor, floor_skipped = _floor(job.rank, job.world_size) if args.floor else (None, None)
    kinds = (
        *KINDS,
        *((RING_PYTHON,) if py_comm is not None else ()),
        *((FLOOR,) if floor is not None else ()),
    )
    floor_data = original.copy()
    half = n // 2  # two layers: packets carry two priority classes
    segments = [(0, half, 0), (half, n - half, 1)]
    def gloo() -> None:  # the same averaging as DLCP's (average=True): values stay put
        dist.all_reduce(tensor)
        tensor.div_(job.world_size)

    calls: dict[str, Callable[[], CollectiveReport | None]] = {
        "gloo": gloo,
        "ring": lambda: ring_allreduce(comm, data, segments=segments, p=args.p, average=True),
        "hd": lambda: halving_doubling_allreduce(
            comm, data, segments=segments, p=args.p, average=True
        ),
        "ps": lambda: ps_allreduce(comm, data, segments=segments, p_push=args.p, average=True),
    }
    if floor is not None:
        calls[FLOOR] = lambda: floor.allreduce(floor_data)
    if py_comm is not None:
        calls[RING_PYTHON] = lambda: ring_allreduce(
            py_comm, data, segments=segments, p=args.p, average=True
        )
    times: dict[str, list[float]] = {k: [] for k in kinds}
    busy: dict[str, int] = dict.fromkeys(kinds, 0)
    lost: list[float] = []  # each DLCP call's CollectiveReport.lost_fraction
    for round_no in range(args.rounds + 1):  # round 0 warms up
        for kind in kinds:
            dist.barrier()  # every rank starts the kind together
            b0 = _busy_jiffies()
            for _ in range(args.iters):
                t0 = time.perf_counter()
                report = calls[kind]()
                if round_no:
                    times[kind].append(time.perf_counter() - t0)
                    if report is not None:  # a DLCP call (Gloo and the floor report none)
                        lost.append(report.lost_fraction)
            dist.barrier()  # every rank's calls are done: all their CPU is in the window
            if round_no:
                busy[kind] += _busy_jiffies() - b0
    dist.barrier()
    _verify(comm, data, original, segments, job.world_size, floor)
    endpoint.close()
    if py_endpoint is not None:
        py_endpoint.close()
    if floor is not None:
        floor.close()
    if job.rank == 0:
        hz = os.sysconf("SC_CLK_TCK")
        result = {
            "times": times,
            "cpu_ms": {k: 1e3 * busy[k] / hz / len(times[k]) for k in kinds},
            "floor_skipped": floor_skipped,
            "lost_fractions": lost,
        }
        Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


def _floor(rank: int, world: int) -> tuple[UdpRingFloor | None, str | None]:
    """This rank's UDP floor ring, connected to the others' (a collective call);
    (None, why) on every rank if any rank's kernel refused its receive buffers
    (the floor would then fail on the first burst it drops, and take the other
    kinds' figures with it)."""
    import torch.distributed as dist

    from .ddp_floor import UdpRingFloor

    floor = UdpRingFloor(rank, world)
    granted: list[Any] = [None] * world
    dist.all_gather_object(granted, floor.buffers_granted())
    if not all(granted):
        floor.close()
        refused = [r for r, ok in enumerate(granted) if not ok]
        return None, (f"the kernel refused ranks {refused} the floor's receive buffers "
                      "(SO_RCVBUFFORCE needs CAP_NET_ADMIN)")  # fmt: skip
    addresses: list[Any] = [None] * world
    dist.all_gather_object(addresses, floor.addresses)
    floor.connect(addresses)
    return floor, None


def _verify(
    comm: Any, data: Any, original: Any, segments: Any, world: int, floor: Any
) -> None:
    """What was timed must be right (untimed, after the rounds): the replicas of
    the lossy calls (``data``) hold the same bytes on every rank, and the same
    calls with no loss allowed give, from each rank's ``original``, the mean Gloo
    gives (up to float rounding: another order of summation); so does the UDP
    floor's ring, if it ran."""
    import hashlib

    import numpy as np
    import torch
    import torch.distributed as dist

    from dlcp.collectives import halving_doubling_allreduce, ps_allreduce
    from dlcp.collectives.ring import ring_allreduce

    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, hashlib.sha256(data.tobytes()).hexdigest())
    if len(set(digests)) != 1:
        raise BenchError(f"the DLCP replicas differ after the timed calls: {digests}")
    want = torch.from_numpy(original.copy())
    dist.all_reduce(want)
    want.div_(world)
    for name, call in (
        ("DLCP ring", lambda x: ring_allreduce(comm, x, segments=segments, p=0.0, average=True)),
        ("DLCP halving-doubling", lambda x: halving_doubling_allreduce(
            comm, x, segments=segments, p=0.0, average=True)),
        ("DLCP ps", lambda x: ps_allreduce(comm, x, segments=segments, p_push=0.0, average=True)),
        *([("UDP floor", floor.allreduce)] if floor is not None else []),
    ):
        got = original.copy()
        call(got)
        if not np.allclose(got, want.numpy(), rtol=1e-5, atol=1e-6):
            worst = float(np.max(np.abs(got - want.numpy())))
            raise BenchError(f"{name} all-reduce differs from Gloo's by up to {worst:g}")


# ---------------------------------------------------------------------- driver


def _worker_argv(args: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable, "-u", "-m", "dlcp.bench.allreduce", "--worker", "--out", str(out),
        "--elems", str(args.elems), "--iters", str(args.iters), "--rounds", str(args.rounds),
        "--p", repr(args.p), *(["--floor"] if args.floor else []),
    ]  # fmt: skip


def _run_loopback(args: argparse.Namespace, out: Path) -> None:
    from dlcp.launch import launch

    log = io.StringIO()
    result = launch(_worker_argv(args, out), 4, stdout=log, stderr=log, timeout=args.timeout)
    result.raise_if_interrupted()
    if result.returncode != 0:
        raise BenchError(f"loopback job: {result.message}\n{log.getvalue()[-5000:]}")


def _run_testbed(args: argparse.Namespace, out: Path) -> None:
    import dataclasses

    from dlcp.launch import launch
    from testbed.experiments import MASTER_PORT, switch_policy
    from testbed.impairments import apply_profile
    from testbed.topology import Topology, build

    t = dataclasses.replace(Topology.default(), link_rate_mbit=args.link_rate)
    with build(t) as net:
        apply_profile(net, switch_policy(t, args.link_rate))
        master = net.host_addr(t.host_names[0])
        cmds = {}
        for rank, host in enumerate(t.host_names):
            argv = [
                "env", f"MASTER_ADDR={master}", f"MASTER_PORT={MASTER_PORT}", f"RANK={rank}",
                f"WORLD_SIZE={len(t.host_names)}", "LOCAL_RANK=0",
                f"GLOO_SOCKET_IFNAME={t.leaf_of(host)}", f"DLCP_N_PATHS={args.paths}",
                *_worker_argv(args, out),
            ]  # fmt: skip
            cmds[rank] = net.exec_argv(host, argv)
        log = io.StringIO()
        result = launch(
            cmds[0],
            len(t.host_names),
            rank_cmd=cmds,
            master_port=MASTER_PORT,
            stdout=log,
            stderr=log,
            timeout=args.timeout,
        )
        result.raise_if_interrupted()
        if result.returncode != 0:
            raise BenchError(f"testbed job: {result.message}\n{log.getvalue()[-5000:]}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    authenticated = ranks_authenticate(args.auth)
    testbed = os.geteuid() == 0 and not args.loopback
    # (the worker's flag: the floor runs on the loopback as root, unless told not to)
    args.floor = args.udp_floor and not testbed and os.geteuid() == 0
    if testbed:
        from testbed.netns import require_tools

        require_tools("the all-reduce benchmark's testbed", offloads=True)
    with tempfile.TemporaryDirectory(prefix="dlcp-bench-allreduce-") as tmp:
        out = Path(tmp) / "result.json"
        started = time.monotonic()
        print(f"{'testbed' if testbed else 'loopback'}: 4 ranks ...", file=sys.stderr, flush=True)
        (_run_testbed if testbed else _run_loopback)(args, out)
        raw = json.loads(out.read_text())
    med = {k: 1e3 * statistics.median(t) for k, t in raw["times"].items()}
    cpu = raw["cpu_ms"]
    calls = len(raw["times"]["ring"])
    floor = FLOOR in med
    return {
        "bench": "allreduce",
        "path": "testbed" if testbed else "loopback",
        "authenticated": authenticated,
        "link_rate_mbit": args.link_rate if testbed else None,
        "n_paths": args.paths if testbed else None,
        "world_size": 4,
        "elems": args.elems,
        "bytes": 4 * args.elems,
        "p": args.p,
        "calls_per_kind": calls,
        "gloo_ms": round(med["gloo"], 3),
        **{f"{k}_ms": round(med[k], 3) for k in KINDS},
        **{f"ratio_{k}": round(med[k] / med["gloo"], 3) for k in KINDS if k != "gloo"},
        **{f"{k}_cpu_ms": round(cpu[k], 2) for k in KINDS},
        # the UDP floor (loopback, root): the ring with no protocol above the datagrams
        "floor_ms": round(med[FLOOR], 3) if floor else None,
        "floor_cpu_ms": round(cpu[FLOOR], 2) if floor else None,
        "ratio_floor": round(med[FLOOR] / med["gloo"], 3) if floor else None,
        "ring_over_floor": round(med["ring"] / med[FLOOR], 3) if floor else None,
        # (None too if the floor's calls took less than a clock tick of CPU)
        "ring_over_floor_cpu": round(cpu["ring"] / cpu[FLOOR], 3) if floor and cpu[FLOOR] else None,
        "floor_error": raw.get("floor_skipped"),
        # the native engine's ring beside the Python engine's, in the same run (null
        # when the ranks ran the Python engine)
        "ring_python_ms": round(med[RING_PYTHON], 3) if RING_PYTHON in med else None,
        "ring_python_cpu_ms": round(cpu[RING_PYTHON], 2) if RING_PYTHON in med else None,
        "ring_python_over_floor_cpu": (
            round(cpu[RING_PYTHON] / cpu[FLOOR], 3)
            if floor and RING_PYTHON in med and cpu[FLOOR] else None
        ),
        "ring_over_ring_python_cpu": (
            round(cpu["ring"] / cpu[RING_PYTHON], 3)
            if RING_PYTHON in med and cpu[RING_PYTHON] else None
        ),
        # rank 0's share of the elements it received under the loss bound that were
        # lost, over its DLCP calls (comparable with p; not over all 2 * elems)
        "dlcp_lost_fraction": round(statistics.fmean(raw["lost_fractions"]), 6),
        "job_s": round(time.monotonic() - started, 1),
    }


def table(r: dict[str, Any]) -> str:
    where = (
        f"testbed, links {r['link_rate_mbit']:g} Mbit/s, {r['n_paths']} paths"
        if r["path"] == "testbed"
        else "loopback"
    )
    lines = [
        f"all-reduce of {r['elems']} float32 ({r['bytes'] / 1e3:.0f} KB), 4 ranks, {where}, "
        f"DLCP p={r['p']:g}, median of {r['calls_per_kind']} calls:",
        f"  {'':14}{'ms/call':>9}{'CPU ms/call':>13}{'/ Gloo':>8}",
        f"  {'Gloo':14}{r['gloo_ms']:9.2f}{r['gloo_cpu_ms']:13.1f}",
        *(
            f"  {label:14}{r[k + '_ms']:9.2f}{r[k + '_cpu_ms']:13.1f}{r['ratio_' + k]:8.2f}"
            for k, label in (("ring", "DLCP ring"), ("hd", "DLCP halv.-dbl."),
                             ("ps", "DLCP PS-style"))
        ),
    ]
    if r.get("ring_python_ms") is not None:
        lines.append(
            f"  {'ring, Python':14}{r['ring_python_ms']:9.2f}{r['ring_python_cpu_ms']:13.1f}"
            f"{r['ring_python_ms'] / r['gloo_ms']:8.2f}   (the ring above: native engine)"
        )
    if r["floor_ms"] is not None:
        lines += [
            f"  {'UDP floor':14}{r['floor_ms']:9.2f}{r['floor_cpu_ms']:13.1f}"
            f"{r['ratio_floor']:8.2f}",
            f"  DLCP ring over the UDP floor: {r['ring_over_floor']:.2f} in time, "
            + (f"{r['ring_over_floor_cpu']:.2f}" if r["ring_over_floor_cpu"] is not None
               else "-") + " in CPU",
        ]
    elif r["floor_error"]:
        lines.append(f"  UDP floor: left out ({r['floor_error']})")
    lines.append("  (CPU: busy time of all the machine's cores per call: ranks and routers)")
    lines.append(_lost_line(r))
    return "\n".join(lines)


def _lost_line(r: dict[str, Any]) -> str:
    """What DLCP lost under its bound: Gloo's all-reduce is exact, so a DLCP that
    lost values on a lossless path did less work than the figures compare."""
    lost = r["dlcp_lost_fraction"]
    if not lost:
        return f"  DLCP lost nothing (p = {r['p']:g}): every call was exact, as Gloo's"
    return (
        f"  DLCP lost {100 * lost:.4f} % of the values it received under its bound "
        f"(p = {r['p']:g}): the comparison with Gloo's exact all-reduce is not like "
        "for like"
    )


def _parser(prog: str = "python -m dlcp.bench.allreduce") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument(
        "--elems",
        type=int,
        default=DIGITS_PARAMS,
        help=f"float32 elements (default {DIGITS_PARAMS}: the digits CNN)",
    )
    ap.add_argument("--iters", type=int, default=20, help="calls per kind per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds after the warm-up one")
    ap.add_argument("--p", type=float, default=0.05, help="DLCP loss bound of the push phase")
    ap.add_argument("--link-rate", type=float, default=200.0, help="testbed links, Mbit/s")
    ap.add_argument("--paths", type=int, default=8, help="DLCP source ports (testbed)")
    ap.add_argument("--loopback", action="store_true", help="loopback even as root")
    ap.add_argument("--no-udp-floor", dest="udp_floor", action="store_false",
                    help="skip the UDP floor's calls (loopback as root only)")
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds one job of 4 ranks may take (default 600)")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    ap.add_argument(
        "--auth",
        action="store_true",
        help="DLCP ranks authenticate (default: not, as Gloo does not)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.allreduce") -> int:
    args = _parser(prog).parse_args(argv)
    if args.elems < 4:
        raise SystemExit(f"--elems={args.elems}: at least one element per rank (4)")
    if args.worker:
        return worker(args)
    return finish(
        "allreduce",
        run,
        table,
        args,
        errors=BenchError,
        cleaned_up="ranks stopped, testbed removed",
    )


if __name__ == "__main__":
    sys.exit(main())
