"""DDP benchmark: 4 local ranks train an MLP of ~10M parameters over DLCP and over Gloo.

    python -m dlcp.bench.ddp --json        # or: dlcp bench ddp --json

Each configuration is one job of ``--nproc`` ranks started by
:func:`dlcp.launch.launch` (this module with ``--worker``): DDP over a Gloo
process group, gradients averaged either by Gloo's all-reduce (``gloo``) or by
the DLCP comm hook (``dlcp``: by default ring all-reduce, reduce-scatter with
loss bound ``--p``, reliable all-gather; ``--collective`` also takes
``halving-doubling`` and ``ps``). Synthetic data (a fixed random batch per rank),
SGD. Every rank times every iteration (zero_grad, forward, backward, which waits
for the gradient all-reduce, optimizer step); an iteration's time is the
slowest rank's, and a configuration's figure is the median over the iterations
after ``--warmup``.

Phases:

1. lossless, on the host's loopback (``path = "loopback"``, 64 KB MTU): both
   transports; ``ratio = dlcp_iter_s / gloo_iter_s``.
2. under ``--loss`` % (default 1) loss:

   * root (``loss_method = "nftables"``): the ranks run inside a network
     namespace of their own whose loopback has MTU 1500 and its offloads off
     (``loss_path = "netns-lo-mtu1500-offloads-off"``), so that every packet of
     either transport (Gloo's TCP segments, DLCP's datagrams and its control
     connection, the TCPStore) is at most 1500 bytes; first lossless in that
     namespace (``*_netns_lossless``: what the smaller packets cost each
     transport), then with an nftables rule dropping ``--loss`` % of the
     packets delivered on that loopback: both transports suffer the same drops.
   * otherwise (``loss_method = "emulated"``): DLCP only, the endpoints' in-process
     EMULATOR dropping ``--loss`` % of received data datagrams; Gloo figures null.

Also on the loopback, first: the same training with **no communication**
(``nocomm``: a comm hook that hands DDP back each rank's own gradients, not
averaged), the floor under both transports. ``*_comm_cost_s`` is what
averaging the gradients adds to it. Under nftables loss ``nocomm`` also takes its
turns in the loss phase, in the namespace (``nocomm_iter_s_loss``), and
``floor_ratio_loss`` (that over Gloo's iteration under loss, jobs of the same
rounds) is the lowest ``ratio_loss`` any transport could reach, one that cost
nothing.

As root, with the ring and ``--p`` above 0, the two lossless phases also run
the **UDP floor** (``udpfloor``, :mod:`dlcp.bench.ddp_floor`; ``--no-udp-floor``
skips it): the same ring all-reduce in bare datagrams of DLCP's size through
DLCP's own UDP layer, each sent once, with no protocol above it, making the
copies DLCP makes. ``udp_floor_ratio`` (over Gloo, lossless) and
``udp_floor_ratio_loss`` (its time over Gloo's under loss) are what a transport
built like DLCP would reach if its protocol cost nothing. The floor cannot run
under loss (nothing is resent): in the loss phase it takes its turns between the
lossy jobs with the loss rule lifted for its job alone
(``udp_floor_iter_s_loss_phase``), so that it and Gloo's lossy jobs meet the same
drift of the machine. A job of it that fails (``udp_floor_error``) leaves its
figures null and the rest of the run standing.

The transports take turns: each phase runs ``--rounds`` (default 3) rounds of
one job each, in the order Gloo, DLCP (, DLCP on the Python engine, floor) in odd
rounds and reversed in even ones, so that a drift of the machine during the
phase falls on all. A configuration's figure is the median of its jobs' medians;
``ratio*_rounds`` lists each round's DLCP / Gloo ratio. The no-communication
floor of the loopback phase is one job.

``--python-engine`` adds DLCP's jobs on the Python engine (``DLCP_ENGINE=python``)
to every phase's turns (:mod:`dlcp.bench.ddp_figures`): ``python_engine`` in the
JSON. Every DLCP job's ranks report the engine they ran; a job on another engine
than its name says fails the run.

The last stdout line (``--json``) is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dlcp.errors import BenchError

from .ddp_figures import (
    PYTHON_ENGINE,
    check_job_engines,
    check_python_engine_jobs,
    expected_engine,
    job_env,
    ms,
    or_dash,
    python_engine_lines,
    python_engine_summary,
    ratio,
    round_ratios,
    rounded,
)
from .outcome import engine_of_run, finish, ranks_authenticate

# ---------------------------------------------------------------------- worker (one rank)


def build_model(width: int, depth: int, inputs: int, classes: int) -> Any:
    from torch import nn

    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def _no_communication(state, bucket):  # type: ignore[no-untyped-def]
    """A comm hook that exchanges nothing: each rank keeps its own gradients.
    (Unannotated: DDP refuses a hook whose annotations are strings, which they
    are in this module.)"""
    import torch

    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _floor_hook(state, bucket):  # type: ignore[no-untyped-def]
    """The UDP floor's comm hook (:mod:`.ddp_floor`); unannotated as above."""
    return state.submit(bucket.buffer())


def worker(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch import nn

    timeout = timedelta(seconds=float(os.environ.get("DLCP_TIMEOUT", "30")) + 60)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.transport == "dlcp":
        os.environ.setdefault("DLCP_EMULATED_LOSS_SEED", str(rank))
    torch.manual_seed(0)
    model = build_model(args.width, args.depth, args.inputs, 10)
    ddp = nn.parallel.DistributedDataParallel(model)
    state = None
    if args.transport == "dlcp":
        from shims.ddp import DLCPState, dlcp_hook

        state = DLCPState(model=ddp, collective=args.collective, p=args.p)
        ddp.register_comm_hook(state, dlcp_hook)
    elif args.transport == "nocomm":
        ddp.register_comm_hook(None, _no_communication)
    elif args.transport == "udpfloor":
        from .ddp_floor import UdpRingFloor

        floor = UdpRingFloor(rank, world)
        addresses: list[Any] = [None] * world
        dist.all_gather_object(addresses, floor.addresses)
        floor.connect(addresses)
        ddp.register_comm_hook(floor, _floor_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, args.inputs, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    times = []
    for _ in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # (Tensor.backward: unannotated in torch)
        opt.step()
        times.append(time.perf_counter() - t0)
    # every replica must end with the same parameters (the no-communication job's
    # do not: each rank steps on its own gradient)
    digest = hashlib.sha256()
    for prm in model.parameters():
        digest.update(prm.detach().contiguous().numpy().tobytes())
    mine: dict[str, Any] = {"times": times[args.warmup :], "params_sha256": digest.hexdigest()}
    if state is not None:
        steps = state.metrics.history[args.warmup :]
        mine.update(
            lost_elems=sum(s.lost_elems for s in steps),
            elems=sum(s.elems for s in steps),
            retransmitted=sum(s.retransmitted_packets for s in steps),
            comm_s=[s.comm_seconds for s in steps],
            stats=state.endpoint.stats() if state.endpoint is not None else {},
        )
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    if state is not None:
        logging.getLogger("dlcp.io").setLevel(logging.ERROR)  # peers closing at the end
    dist.barrier()
    if state is not None:
        state.close()  # (and the endpoint it made)
    if args.transport == "udpfloor":
        floor.close()
    # DDP's reducer and its pending work go before the group they use (see main)
    del ddp, opt, state
    gc.collect()
    dist.destroy_process_group()
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        Path(args.out).write_text(json.dumps({"params": n_params, "ranks": every}))
    return 0


# ---------------------------------------------------------------------- parent


def run_job(args: argparse.Namespace, transport: str, *, prefix: list[str] | None = None,
            env_extra: dict[str, str] | None = None, p: float | None = None) -> dict[str, Any]:
    """One job of ``args.nproc`` ranks; the figures of its measured iterations."""
    from dlcp.launch import launch

    worker_transport, engine_env = job_env(transport)

    with tempfile.TemporaryDirectory(prefix="dlcp-bench-ddp-") as tmp:
        out_path = Path(tmp) / "result.json"
        cmd = [
            *(prefix or []), sys.executable, "-u", "-m", "dlcp.bench.ddp", "--worker",
            "--transport", worker_transport, "--out", str(out_path),
            "--iters", str(args.iters), "--warmup", str(args.warmup),
            "--width", str(args.width), "--depth", str(args.depth),
            "--inputs", str(args.inputs), "--batch", str(args.batch),
            "--collective", args.collective, "--p", repr(args.p if p is None else p),
        ]
        env = {k: v for k, v in os.environ.items() if k != "DLCP_EMULATED_LOSS"}
        env.update({**engine_env, **(env_extra or {})})
        log = io.StringIO()
        started = time.monotonic()
        result = launch(cmd, args.nproc, env=env, stdout=log, stderr=log, timeout=args.timeout)
        result.raise_if_interrupted()
        if result.returncode != 0:
            raise BenchError(f"{transport} job: {result.message}\n{log.getvalue()[-5000:]}")
        raw = json.loads(out_path.read_text())
    ranks = raw["ranks"]
    if transport != "nocomm" and len({r["params_sha256"] for r in ranks}) != 1:
        raise BenchError(
            f"{transport} job: the ranks' parameters differ after training (replicas "
            "diverged: the all-reduce did not give every rank the same gradient)"
        )
    per_iter = [max(col) for col in zip(*(r["times"] for r in ranks), strict=True)]
    fig: dict[str, Any] = {
        "params": raw["params"],
        "iter_s": statistics.median(per_iter),
        "iter_s_p90": sorted(per_iter)[int(0.9 * (len(per_iter) - 1))],
        "job_s": time.monotonic() - started,
    }
    if worker_transport == "dlcp":
        engines = [r["stats"].get("engine") for r in ranks]
        check_job_engines(transport, engines, expected_engine(env, engine_of_run))
        fig["engine"] = engines[0]
        elems = sum(r["elems"] for r in ranks)
        fig["lost_fraction"] = sum(r["lost_elems"] for r in ranks) / elems if elems else 0.0
        # (all ranks together: the packets the job resent per iteration)
        fig["retransmitted_per_iter"] = sum(r["retransmitted"] for r in ranks) / args.iters
        fig["comm_s"] = statistics.median(
            max(col) for col in zip(*(r["comm_s"] for r in ranks), strict=True)
        )
        fig["emulated_loss_dropped"] = sum(
            r["stats"].get("emulated_loss_dropped", 0) for r in ranks
        )
    return fig


def _progress(args: argparse.Namespace, what: str, fig: dict[str, Any]) -> None:
    extra = ""
    if "lost_fraction" in fig:
        extra = (f", lost {100 * fig['lost_fraction']:.2f}% of elements, "
                 f"{fig['retransmitted_per_iter']:.1f} packets retransmitted/iter (all ranks)")
    print(f"  {what}: {1e3 * fig['iter_s']:.1f} ms/iter (median of {args.iters}){extra}",
          file=sys.stderr, flush=True)


@contextlib.contextmanager
def _lossy_place(args: argparse.Namespace) -> Iterator[Any]:
    from testbed.netns import missing_tools, netns_loopback

    if args.emulated or missing_tools(loss=True, offloads=True):
        yield None
        return
    with netns_loopback(mtu=1500) as box:
        box.set_offloads(on=False)
        yield box


def _tcp_timers_like_dlcp(box: Any) -> int | None:
    """Gloo's TCP in the namespace waits for a lost segment as DLCP's control
    connections do, not 200 ms (:func:`testbed.netns.tcp_timers_like_dlcp`)."""
    import subprocess

    from testbed.netns import tcp_timers_like_dlcp

    return tcp_timers_like_dlcp(
        lambda argv: subprocess.run(box.exec_argv(list(argv)), capture_output=True, text=True)
    )


def _combined(figs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's figures over its jobs: times are medians of the jobs'
    medians, losses and retransmissions means, counts sums."""
    out: dict[str, Any] = {
        "params": figs[0]["params"],
        "iter_s": statistics.median(f["iter_s"] for f in figs),
        "iter_s_jobs": [f["iter_s"] for f in figs],
    }
    if "engine" in figs[0]:  # (a DLCP configuration: the engine of each job)
        out["engines"] = [f["engine"] for f in figs]
    if "lost_fraction" in figs[0]:
        out["lost_fraction"] = statistics.fmean(f["lost_fraction"] for f in figs)
        out["retransmitted_per_iter"] = statistics.fmean(f["retransmitted_per_iter"] for f in figs)
        out["comm_s"] = statistics.median(f["comm_s"] for f in figs)
        out["emulated_loss_dropped"] = sum(f["emulated_loss_dropped"] for f in figs)
    if "nft_dropped" in figs[0]:
        out["nft_dropped"] = sum(f["nft_dropped"] for f in figs)
    return out


def _turns(
    args: argparse.Namespace, what: str, transports: tuple[str, ...],
    job: Callable[[str], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """``args.rounds`` jobs of each transport, taking turns (the first of a round
    alternates), combined per transport."""
    figs: dict[str, list[dict[str, Any]]] = {t: [] for t in transports}
    for n in range(args.rounds):
        for transport in transports if n % 2 == 0 else transports[::-1]:
            if transport == "udpfloor" and "udpfloor_error" in args.notes:
                continue  # (it failed once: a yardstick that drops datagrams is none)
            try:
                figs[transport].append(job(transport))
            except BenchError as exc:
                if transport != "udpfloor":
                    raise
                # the floor resends nothing: a lost datagram ends it, not the benchmark
                args.notes["udpfloor_error"] = str(exc).splitlines()[0][:300]
                print(f"  udpfloor, {what}: failed ({args.notes['udpfloor_error']})",
                      file=sys.stderr, flush=True)  # fmt: skip
                figs[transport].clear()
                continue
            _progress(args, f"{transport}, {what}, round {n + 1}/{args.rounds}",
                      figs[transport][-1])  # fmt: skip
    return {t: _combined(f) for t, f in figs.items() if f}


def run(args: argparse.Namespace) -> dict[str, Any]:
    authenticated = ranks_authenticate(args.auth)
    if args.python_engine:
        check_python_engine_jobs(engine_of_run())
    py = (PYTHON_ENGINE,) if args.python_engine else ()
    res: dict[str, Any] = {}
    print(f"lossless, loopback ({args.nproc} ranks):", file=sys.stderr, flush=True)
    res["nocomm"] = _combined([run_job(args, "nocomm", p=args.p)])
    _progress(args, "nocomm", res["nocomm"])
    # the UDP floor models the ring with a loss bound (p = 0 sends small buckets in one
    # round), and needs a receive buffer beyond net.core.rmem_max (SO_RCVBUFFORCE)
    runs_floor = args.udp_floor and args.collective == "ring" and args.p > 0
    floor = ("udpfloor",) if runs_floor and os.geteuid() == 0 else ()
    args.notes = {}
    res.update(_turns(args, "lossless", ("gloo", "dlcp", *py, *floor),
                      lambda t: run_job(args, t, p=args.p)))  # fmt: skip
    with _lossy_place(args) as box:
        if box is not None:
            res["netns_tcp_rto_min_us"] = _tcp_timers_like_dlcp(box)
            prefix = box.exec_argv([])
            print(f"namespace {box.ns}: loopback MTU 1500, offloads off", file=sys.stderr)
            netns = _turns(args, "lossless netns", ("gloo", "dlcp", *py, *floor),
                           lambda t: run_job(args, t, prefix=prefix))  # fmt: skip
            res.update({f"{t}_netns": f for t, f in netns.items()})
            box.set_loss(args.loss)
            print(f"  nftables drops {args.loss:g}% of packets on loopback", file=sys.stderr)

            def lossy(transport: str) -> dict[str, Any]:
                if transport == "udpfloor":  # (lossless: it resends nothing)
                    box.set_loss(0)
                    try:
                        return run_job(args, transport, prefix=prefix)
                    finally:
                        box.set_loss(args.loss)
                before = box.dropped()
                fig = run_job(args, transport, prefix=prefix)
                fig["nft_dropped"] = box.dropped() - before
                return fig

            # the floors take their turns with the lossy jobs: a ratio of two phases
            # run one after the other would carry the machine's drift between them
            lost = _turns(args, f"{args.loss:g}% loss", ("gloo", "dlcp", *py, "nocomm", *floor),
                          lossy)  # fmt: skip
            res.update({f"{t}_loss": f for t, f in lost.items()})
        else:
            print(f"EMULATED loss {args.loss:g}% (DLCP only):", file=sys.stderr)
            env = {"DLCP_EMULATED_LOSS": repr(args.loss / 100)}
            emulated = _turns(args, "emulated loss", ("dlcp", *py),
                              lambda t: run_job(args, t, env_extra=env))  # fmt: skip
            res.update({f"{t}_loss": f for t, f in emulated.items()})
    return {**summary(args, res, kernel=box is not None), "authenticated": authenticated}


def summary(args: argparse.Namespace, res: dict[str, Any], *, kernel: bool) -> dict[str, Any]:
    d, g, floor = res["dlcp"], res["gloo"], res["nocomm"]["iter_s"]
    dl, gl = res.get("dlcp_loss", {}), res.get("gloo_loss")
    dn, gn = res.get("dlcp_netns"), res.get("gloo_netns")
    uf, ufn = res.get("udpfloor"), res.get("udpfloor_netns")
    # the floors of the loss phase, jobs taking turns with Gloo's lossy ones
    nl, ufl = res.get("nocomm_loss"), res.get("udpfloor_loss")
    return {
        "bench": "ddp",
        "world_size": args.nproc,
        "params": d["params"],
        "model": f"MLP {args.inputs}-{'-'.join([str(args.width)] * args.depth)}-10",
        "batch_per_rank": args.batch,
        "iters": args.iters,
        "warmup": args.warmup,
        "collective": args.collective,
        "p": args.p,
        "path": "loopback",
        "dlcp_iter_s": rounded(d["iter_s"]),
        "gloo_iter_s": rounded(g["iter_s"]),
        "ratio": ratio(d["iter_s"], g["iter_s"]),
        "rounds": args.rounds,
        "ratio_rounds": round_ratios(d, g),
        "dlcp_comm_s": rounded(d["comm_s"]),
        "nocomm_iter_s": rounded(floor),
        "dlcp_comm_cost_s": rounded(d["iter_s"] - floor),
        "gloo_comm_cost_s": rounded(g["iter_s"] - floor),
        "ratio_comm_cost": ratio(d["iter_s"] - floor, g["iter_s"] - floor),
        "dlcp_lost_fraction": rounded(d["lost_fraction"], 6),
        "loss_percent": args.loss,
        "loss_method": "nftables" if kernel else "emulated",
        # the namespace's TCP minimum RTO (Gloo's sockets), as DLCP's control channel
        "netns_tcp_rto_min_us": res.get("netns_tcp_rto_min_us"),
        "loss_path": "netns-lo-mtu1500-offloads-off" if kernel else "loopback",
        "dlcp_iter_s_netns_lossless": rounded(dn["iter_s"]) if dn else None,
        "gloo_iter_s_netns_lossless": rounded(gn["iter_s"]) if gn else None,
        "ratio_netns_lossless": ratio(dn["iter_s"], gn["iter_s"]) if dn and gn else None,
        "ratio_netns_lossless_rounds": round_ratios(dn, gn),
        "dlcp_iter_s_loss": rounded(dl.get("iter_s")),
        "gloo_iter_s_loss": rounded(gl["iter_s"]) if gl else None,
        "ratio_loss": ratio(dl.get("iter_s"), gl["iter_s"]) if gl else None,
        "ratio_loss_rounds": round_ratios(dl, gl),
        "nocomm_iter_s_loss": rounded(nl["iter_s"]) if nl else None,
        "floor_ratio_loss": ratio(nl["iter_s"], gl["iter_s"]) if nl and gl else None,
        "floor_ratio_loss_rounds": round_ratios(nl, gl),
        # the UDP floor (dlcp/bench/ddp_floor.py): the same ring in bare DLCP-sized datagrams
        "udp_floor_iter_s": rounded(uf["iter_s"]) if uf else None,
        "udp_floor_ratio": ratio(uf["iter_s"], g["iter_s"]) if uf else None,
        "udp_floor_iter_s_netns_lossless": rounded(ufn["iter_s"]) if ufn else None,
        "udp_floor_ratio_netns_lossless": (
            ratio(ufn["iter_s"], gn["iter_s"]) if ufn and gn else None
        ),
        "udp_floor_iter_s_loss_phase": rounded(ufl["iter_s"]) if ufl else None,
        "udp_floor_ratio_loss": ratio(ufl["iter_s"], gl["iter_s"]) if ufl and gl else None,
        "udp_floor_rounds": [rounded(x) for x in uf["iter_s_jobs"]] if uf else None,
        "udp_floor_rounds_netns_lossless": (
            [rounded(x) for x in ufn["iter_s_jobs"]] if ufn else None
        ),
        "udp_floor_error": getattr(args, "notes", {}).get("udpfloor_error"),
        "dlcp_lost_fraction_loss": rounded(dl.get("lost_fraction"), 6),
        "dlcp_retransmitted_per_iter_loss": rounded(dl.get("retransmitted_per_iter"), 1),
        "dlcp_comm_s_loss": rounded(dl.get("comm_s")),
        "nft_dropped": (
            {"dlcp": dl.get("nft_dropped"), "gloo": gl.get("nft_dropped")} if gl else None
        ),
        "emulated_loss_dropped": dl.get("emulated_loss_dropped") if not kernel else None,
        # with --python-engine: DLCP's jobs again on the Python engine, in the same turns
        "python_engine": python_engine_summary(res, floor, kernel=kernel),
        # the engine each lossless DLCP job's ranks reported (native unless DLCP_ENGINE)
        "dlcp_engines": d.get("engines"),
        # the project's goals for these ratios (docs/benchmarks.md's engine table)
        "targets": {"ratio": 1.05, "ratio_comm_cost": 1.1, "ratio_loss": 0.85},
    }


def table(r: dict[str, Any]) -> str:
    lines = [
        f"DDP, {r['world_size']} ranks, {r['params'] / 1e6:.1f}M parameters ({r['model']}), "
        f"DLCP {r['collective']} p={r['p']:g}, median per iteration:",
        f"  lossless, loopback: DLCP {ms(r['dlcp_iter_s'])}  Gloo {ms(r['gloo_iter_s'])}"
        f"  ratio {r['ratio']}",
        f"  no communication (each rank's own gradients): {ms(r['nocomm_iter_s'])}; "
        f"averaging adds DLCP {ms(r['dlcp_comm_cost_s'])}, Gloo {ms(r['gloo_comm_cost_s'])}"
        f"  ratio {r['ratio_comm_cost']}",
    ]
    if r["ratio_netns_lossless"] is not None:
        lines.append(
            f"  lossless, {r['loss_path']}: DLCP {ms(r['dlcp_iter_s_netns_lossless'])}  "
            f"Gloo {ms(r['gloo_iter_s_netns_lossless'])}  ratio {r['ratio_netns_lossless']}"
        )
    lines.append(
        f"  {r['loss_percent']:g}% loss ({r['loss_method']}, {r['loss_path']}): "
        f"DLCP {ms(r['dlcp_iter_s_loss'])}  Gloo {ms(r['gloo_iter_s_loss'])}  "
        f"ratio {or_dash(r['ratio_loss'])}  "
        f"(DLCP lost {100 * (r['dlcp_lost_fraction_loss'] or 0):.2f}% of gradient elements)"
    )
    if r["udp_floor_ratio"] is not None:
        lines.append(
            f"  UDP floor (the same ring in bare DLCP-sized datagrams, no protocol): "
            f"{ms(r['udp_floor_iter_s'])}, over Gloo {r['udp_floor_ratio']}"
        )
    if r["udp_floor_ratio_loss"] is not None:
        lines.append(
            f"  UDP floor, {r['loss_path']}, lossless: "
            f"{ms(r['udp_floor_iter_s_netns_lossless'])}, over Gloo's lossless "
            f"{r['udp_floor_ratio_netns_lossless']}; in turns with the loss phase's jobs "
            f"{ms(r['udp_floor_iter_s_loss_phase'])}, over Gloo's under loss "
            f"{r['udp_floor_ratio_loss']}"
        )
    if r["floor_ratio_loss"] is not None:
        lines.append(
            f"  the least ratio under loss any transport could reach (no communication, "
            f"{ms(r['nocomm_iter_s_loss'])} in turns with them, over Gloo's): "
            f"{r['floor_ratio_loss']}"
        )
    return "\n".join([*lines, *python_engine_lines(r)])


def _parser(prog: str = "python -m dlcp.bench.ddp") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    ap.add_argument(
        "--auth",
        action="store_true",
        help="DLCP ranks authenticate (default: not, as Gloo does not)",
    )
    ap.add_argument("--nproc", type=int, default=4, help="local ranks (default 4)")
    ap.add_argument("--iters", type=int, default=20, help="measured iterations (default 20)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="iterations before the measured ones (default 3)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="jobs per transport and phase, the transports in turn (default 3)")
    ap.add_argument("--width", type=int, default=1664, help="units of each hidden layer")
    ap.add_argument("--depth", type=int, default=4, help="hidden layers of --width")
    ap.add_argument("--inputs", type=int, default=1024, help="input features")
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--collective", choices=["ring", "halving-doubling", "ps"], default="ring",
                    help="DLCP's all-reduce (default ring)")
    ap.add_argument("--p", type=float, default=0.05, help="DLCP loss bound (default 0.05)")
    ap.add_argument("--loss", type=float, default=1.0, help="loss in percent (default 1)")
    ap.add_argument("--emulated", action="store_true", help="emulated loss even as root")
    ap.add_argument("--no-udp-floor", dest="udp_floor", action="store_false",
                    help="skip the UDP floor's jobs (root only; see dlcp/bench/ddp_floor.py)")
    ap.add_argument("--python-engine", action="store_true",
                    help="run DLCP's jobs on the Python engine too (DLCP_ENGINE=python), in "
                         "the same turns as the native engine's: the python_engine figures")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", choices=["dlcp", "gloo", "nocomm", "udpfloor"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.ddp") -> int:
    args = _parser(prog).parse_args(argv)
    if args.worker:
        code = worker(args)
        # the job's work is done (figures written, group destroyed): leave without the
        # interpreter's finalization, where a torch/Gloo thread torn down late aborted
        # a rank twice in CI ("terminate called without an active exception", SIGABRT)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if args.rounds < 1:
        print(f"dlcp bench ddp: --rounds={args.rounds} must be >= 1", file=sys.stderr)
        return 2
    if not 0 < args.loss < 100:
        print(f"dlcp bench ddp: --loss={args.loss} is not a percentage in (0, 100)",
              file=sys.stderr)
        return 2
    return finish(
        "ddp", run, table, args, errors=BenchError, cleaned_up="ranks stopped, namespace removed"
    )


if __name__ == "__main__":
    sys.exit(main())
