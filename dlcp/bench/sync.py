"""Synchronisation schemes benchmark: the digits CNN trained by each scheme of
:mod:`dlcp.sync` (and by Gloo's all-reduce) on ``--workers`` local ranks.

    python -m dlcp.bench.sync --schemes allreduce,ssp,ripples --workers 4 --json
    dlcp sync run --scheme ssp --workers 4 --slow-rank 3 --slowdown 3
    dlcp sync suite --out results/sync        # every scheme, 3 seeds

Heterogeneous links (root): ``--testbed-cross-mbit R`` runs the 4 ranks on the
namespace testbed (``testbed``: 4 hosts, two per leaf), the halves joined
only by leaf-spine links shaped to ``R`` Mbit/s while host-leaf links run at
1000 Mbit/s (FIFO queues).

Besides the schemes of ``dlcp.sync``: ``gloo`` (torch.distributed's Gloo
all-reduce of the gradients, BSP) and ``local`` (no synchronisation at all: each
rank trains alone, the throughput ceiling; not in the default list).

Each (scheme, seed) is one job of ``--workers`` processes started by
:func:`dlcp.launch.launch` (this module with ``--worker``), each an endpoint
found through the job's TCPStore (``dlcp.rendezvous.connect``); every rank
is a worker (parameter servers co-located, sharded by parameter). An
iteration is a real forward/backward pass on a batch of 32 digits plus an
**injected compute delay** of ``--delay`` seconds (``time.sleep``, standing in
for an accelerator, so that the 2 shared cores do not decide the result); the
rank ``--slow-rank`` sleeps ``--slowdown`` times as long.

Every rank runs ``--steps`` iterations, except that where the scheme lets a
worker finish early without holding anyone (asp, ssp, eager, vsgd, ripples,
shadow-*), the slow rank runs the share its speed allows (``steps / slowdown``;
for Ripples the rounds its Group Buffer holds), so that the job lasts about as
long as the fast workers' work. Lockstep schemes (allreduce, gloo, bsp,
ds-sync) run every rank for ``--steps``.

``--task ctr`` trains the click-through-rate model of
:mod:`dlcp.sync.workloads` instead (batches of 128, Adagrad; SGD for the digits;
metric AUC: ``final_acc`` and
``time_to_target_s`` are then AUC figures).

Rank 0 (never the slow rank) evaluates its model's test accuracy every
``--eval-every`` iterations; evaluation time is left out of its wall clock.
Figures per job: ``wall_s`` (the slowest rank's training time), ``iter_s``
(rank 0's mean time per iteration), ``final_acc``, ``time_to_target_s``
(rank 0's wall time when its accuracy first reached ``--target``; null if never),
``lost_fraction`` (rank 0's transport loss) and ``mean_staleness``. A scheme's
figure is the median over ``--seeds`` seeds. ``--out DIR`` writes
``sync.json``, ``sync.csv``, ``sync_accuracy.png`` (accuracy against wall time
per scheme, first seed) and ``sync_iter.png`` (time per iteration).
The last stdout line (``--json``) is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dlcp.errors import BenchError

ALL = ["allreduce", "gloo", "bsp", "asp", "ssp", "eager", "vsgd", "ds-sync", "ripples",
       "shadow-ma", "shadow-bmuf", "shadow-easgd"]  # fmt: skip
#: schemes whose slow worker may stop early without holding the others
EARLY_EXIT = {"local", "asp", "ssp", "eager", "vsgd", "ripples", "shadow-ma", "shadow-bmuf",
              "shadow-easgd"}  # fmt: skip
OPTIONS: dict[str, dict[str, Any]] = {
    "ssp": {"staleness": 2},
    "vsgd": {"staleness": 2},
    "ds-sync": {"group_size": 2},
    "ripples": {"group_size": 2},
    "shadow-ma": {"interval": 0.02},
    "shadow-bmuf": {"interval": 0.02},
    "shadow-easgd": {"interval": 0.02},
}


def _steps_of(cfg: dict[str, Any], rank: int) -> int:
    steps: int = cfg["steps"]
    if rank != cfg["slow_rank"] or cfg["scheme"] not in EARLY_EXIT:
        return steps
    if cfg["scheme"] == "ripples":
        from dlcp.sync.groups import GroupGenerator

        gen = GroupGenerator(cfg["workers"], 2, seed=cfg["seed"],
                             slowdown={rank: cfg["slowdown"]})  # fmt: skip
        return gen.steps_of(rank, steps)
    slowdown: float = cfg["slowdown"]
    return max(1, math.ceil(steps / slowdown))


def worker(cfg: dict[str, Any]) -> None:  # pragma: no cover - runs in the ranks
    import torch
    import torch.distributed as dist

    from dlcp.rendezvous import connect
    from dlcp.sync import make
    from dlcp.sync.workloads import CTRModel, CTRTask, DigitsTask, digits_cnn

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(cfg["seed"])
    if cfg.get("task") == "ctr":
        ctr = CTRTask(seed=0)
        model: torch.nn.Module = CTRModel(buckets=ctr.buckets)

        def batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
            return ctr.batch(128, seed=rank * 1_000_003 + t)

        def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)

        def metric() -> float:
            return ctr.evaluate(model)["auc"]
    else:
        digits = DigitsTask(seed=0)
        model = digits_cnn()

        def batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
            return digits.batch(rank, t)

        def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(model(x), y)

        def metric() -> float:
            return digits.accuracy(model)

    opt = (torch.optim.Adagrad(model.parameters(), lr=cfg["lr"]) if cfg.get("task") == "ctr"
           else torch.optim.SGD(model.parameters(), lr=cfg["lr"]))  # fmt: skip
    scheme = cfg["scheme"]
    sync = None
    if scheme == "gloo":
        dist.init_process_group("gloo")
    elif scheme != "local":
        options = dict(OPTIONS.get(scheme, {}))
        if scheme == "ripples" and cfg["slow_rank"] >= 0:
            options["slowdown"] = {cfg["slow_rank"]: cfg["slowdown"]}
        if scheme in ("ds-sync", "ripples"):
            options["seed"] = cfg["seed"]
        if cfg["p"] > 0:
            options["p"] = cfg["p"]
        ep, _ = connect(group="bench-sync")
        sync = make(scheme, model, opt, endpoint=ep, world_size=world, **options)
    delay = cfg["delay"] * (cfg["slowdown"] if rank == cfg["slow_rank"] else 1)
    evals: list[tuple[float, int, float]] = []
    eval_time = lost = bounded = 0.0
    staleness: list[int] = []
    start = time.perf_counter()
    steps = _steps_of(cfg, rank)
    for t in range(steps):
        x, y = batch(t + 1000 * cfg["seed"])
        opt.zero_grad()
        loss_of(x, y).backward()  # type: ignore[no-untyped-call]  # (unannotated in torch)
        time.sleep(delay)  # the injected compute time (an accelerator's share)
        if scheme == "local":  # no synchronisation at all: the throughput ceiling
            opt.step()
        elif sync is None:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
        else:
            rep = sync.step()
            lost += rep.lost_elems
            bounded += rep.bounded_elems
            staleness.append(rep.staleness)
        if rank == 0 and ((t + 1) % cfg["eval_every"] == 0 or t + 1 == steps):
            e0 = time.perf_counter()
            acc = metric()
            eval_time += time.perf_counter() - e0
            evals.append((time.perf_counter() - start - eval_time, t + 1, acc))
    wall = time.perf_counter() - start - eval_time
    if sync is not None:
        sync.close()
    elif scheme == "gloo":
        dist.destroy_process_group()
    out = {"rank": rank, "steps": steps, "wall_s": wall, "iter_s": wall / steps,
           "evals": evals, "lost_fraction": lost / bounded if bounded else 0.0,
           "mean_staleness": statistics.fmean(staleness) if staleness else 0.0}  # fmt: skip
    Path(cfg["result_dir"], f"rank{rank}.json").write_text(json.dumps(out))


def run_job(cfg: dict[str, Any]) -> dict[str, Any]:
    """One (scheme, seed): launch the ranks, gather their results."""
    from dlcp.launch import launch

    with tempfile.TemporaryDirectory(prefix="dlcp-bench-sync-") as tmp:
        job = {**cfg, "result_dir": tmp}
        cmd = [sys.executable, "-m", "dlcp.bench.sync", "--worker", json.dumps(job)]
        env = dict(os.environ)
        if cfg.get("cross_mbit"):
            result = _launch_on_testbed(cmd, cfg, env)
        else:
            result = launch(cmd, cfg["workers"], env=env, timeout=cfg["job_timeout"],
                            stdout=sys.stderr)  # fmt: skip
        ranks = []
        for r in range(cfg["workers"]):
            path = Path(tmp, f"rank{r}.json")
            if not path.exists():
                raise BenchError(f"{cfg['scheme']} seed {cfg['seed']}: rank {r} left no "
                                   f"result (launch: {result})")  # fmt: skip
            ranks.append(json.loads(path.read_text()))
    r0 = ranks[0]
    reached = [t for t, _, acc in r0["evals"] if acc >= cfg["target"]]
    return {
        "scheme": cfg["scheme"], "seed": cfg["seed"], "task": cfg.get("task", "digits"),
        "wall_s": max(r["wall_s"] for r in ranks), "iter_s": r0["iter_s"],
        "final_acc": r0["evals"][-1][2], "time_to_target_s": reached[0] if reached else None,
        "lost_fraction": r0["lost_fraction"], "mean_staleness": r0["mean_staleness"],
        "steps": [r["steps"] for r in ranks], "curve": r0["evals"],
    }  # fmt: skip


def _launch_on_testbed(cmd: list[str], cfg: dict[str, Any], env: dict[str, str]) -> Any:
    """The ranks on the namespace testbed's 4 hosts (root): two halves of two hosts,
    each half on its own leaf, the halves joined only by leaf-spine links shaped to
    ``cross_mbit`` (host-leaf links at the topology's 1000 Mbit/s): heterogeneous
    links, fast within a half and slow between them."""
    import dataclasses

    from dlcp.io.engine import shared_host_threads
    from dlcp.launch import launch
    from dlcp.switch.policy import FifoPolicy
    from testbed.impairments import apply_profile
    from testbed.topology import LinkSpec, Topology, build

    t = Topology.default()
    if cfg["workers"] != len(t.host_names):
        from dlcp.errors import ConfigError

        raise ConfigError(f"--testbed-cross-mbit runs {len(t.host_names)} workers (one a host)")
    slow = tuple(LinkSpec((leaf, spine), link_rate_mbit=cfg["cross_mbit"])
                 for leaf in t.leaves for spine in t.spines)  # fmt: skip
    t = dataclasses.replace(t, link_specs=slow)
    port = 29517
    with build(t) as net:
        apply_profile(net, FifoPolicy(link_rate_mbit=t.link_rate_mbit,
                                      queue_packets=t.buffer_packets))  # fmt: skip
        master = net.host_addr(t.host_names[0])
        world = len(t.host_names)
        cmds = {}
        for rank, host in enumerate(t.host_names):
            argv = ["env", f"MASTER_ADDR={master}", f"MASTER_PORT={port}", f"RANK={rank}",
                    f"WORLD_SIZE={world}", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
                    f"GLOO_SOCKET_IFNAME={t.leaf_of(host)}",
                    # (the hosts share this machine's CPUs: their share of send threads)
                    *(f"{k}={v}" for k, v in shared_host_threads(world, env).items()),
                    "OMP_NUM_THREADS=1", *cmd]  # fmt: skip
            cmds[rank] = net.exec_argv(host, argv)
        return launch(cmds[0], world, rank_cmd=cmds, master_port=port, env=env,
                      timeout=cfg["job_timeout"], stdout=sys.stderr)  # fmt: skip


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    # a target some seeds never reached has no median time
    return statistics.median(got) if got and len(got) == len(values) else None


def summarise(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for scheme in dict.fromkeys(j["scheme"] for j in jobs):
        mine = [j for j in jobs if j["scheme"] == scheme]
        row: dict[str, Any] = {"scheme": scheme, "seeds": len(mine)}
        for key in ("wall_s", "iter_s", "final_acc", "time_to_target_s", "lost_fraction",
                    "mean_staleness"):  # fmt: skip
            row[key] = _median([j[key] for j in mine])
        rows.append(row)
    return rows


def _plots(out: Path, jobs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, scheme in enumerate(dict.fromkeys(j["scheme"] for j in jobs)):
        first = next(j for j in jobs if j["scheme"] == scheme)
        ax.plot([t for t, _, _ in first["curve"]], [a for _, _, a in first["curve"]],
                label=scheme, linestyle=("-", "--", ":")[i // 10 % 3])  # fmt: skip
    ax.set_xlabel("wall time on rank 0 (s)")
    ax.set_ylabel("rank 0's " + ("AUC" if jobs[0].get("task") == "ctr" else "test accuracy"))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "sync_accuracy.png", dpi=120)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([r["scheme"] for r in rows], [r["iter_s"] * 1000 for r in rows])
    ax.set_ylabel("time per iteration, rank 0 (ms)")
    ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(out / "sync_iter.png", dpi=120)
    plt.close("all")


def _parser(prog: str = "python -m dlcp.bench.sync") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--schemes", default=",".join(ALL), help="comma-separated")
    ap.add_argument("--scheme", help="one scheme (instead of --schemes)")
    ap.add_argument("--workers", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--steps", type=int, default=100, help="iterations per worker (default 100)")
    ap.add_argument("--delay", type=float, default=0.02, help="injected compute s/iteration")
    ap.add_argument("--slow-rank", type=int, default=-1, help="-1: none")
    ap.add_argument("--slowdown", type=int, default=3,
                    help="--slow-rank's compute, times --delay (default 3)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="runs per scheme, seeds 0..N-1; medians (default 1)")
    ap.add_argument("--lr", type=float, default=None,
                    help="default 0.2 (digits, SGD), 0.05 (ctr, Adagrad)")
    ap.add_argument("--p", type=float, default=0.0, help="DLCP loss bound of pushes/reduces")
    ap.add_argument("--task", choices=["digits", "ctr"], default="digits",
                    help="digits CNN (metric: test accuracy) or the CTR task (metric: AUC)")
    ap.add_argument("--target", type=float, default=None,
                    help="metric to reach (default 0.85 accuracy, 0.75 AUC)")
    ap.add_argument("--eval-every", type=int, default=10,
                    help="rank 0 evaluates the model every N steps (default 10)")
    ap.add_argument("--job-timeout", type=float, default=300.0,
                    help="seconds one run of a scheme may take (default 300)")
    ap.add_argument("--testbed-cross-mbit", type=float, default=0.0,
                    help="root: run on the namespace testbed, the two halves joined by "
                    "links of this rate (Mbit/s); 0: local loopback")
    ap.add_argument("--out", default=None, help="directory for JSON, CSV and PNG")
    ap.add_argument("--json", action="store_true", help="last line: one JSON object")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None, prog: str = "python -m dlcp.bench.sync") -> int:
    args = _parser(prog).parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    from dlcp.errors import ConfigError

    try:
        return _run(args)
    except ConfigError as exc:
        print(f"dlcp.bench.sync: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from dlcp.errors import ConfigError
    from dlcp.sync import SCHEMES

    schemes = [args.scheme] if args.scheme else [s for s in args.schemes.split(",") if s]
    unknown = [s for s in schemes if s not in ("gloo", "local") and s not in SCHEMES]
    if unknown:
        known = ", ".join(["gloo", "local", *SCHEMES])
        raise ConfigError(f"unknown scheme(s) {unknown}: {known}")
    if args.workers < 2 or args.steps < 1 or args.delay < 0 or args.slowdown < 1:
        raise ConfigError("need --workers >= 2, --steps >= 1, --delay >= 0, --slowdown >= 1")
    if args.slow_rank == 0 or args.slow_rank >= args.workers:
        raise ConfigError(f"--slow-rank {args.slow_rank}: 1..{args.workers - 1} (0 evaluates)")
    target = args.target if args.target is not None else (0.75 if args.task == "ctr" else 0.85)
    base = {"task": args.task, "target": target, "workers": args.workers,
            "steps": args.steps, "delay": args.delay,
            "slow_rank": args.slow_rank, "slowdown": args.slowdown,
            "lr": args.lr if args.lr is not None else (0.05 if args.task == "ctr" else 0.2),
            "p": args.p, "eval_every": args.eval_every,
            "cross_mbit": args.testbed_cross_mbit,
            "job_timeout": args.job_timeout}  # fmt: skip
    jobs = []
    for scheme in schemes:
        for seed in range(args.seeds):
            t0 = time.monotonic()
            job = run_job({**base, "scheme": scheme, "seed": seed})
            jobs.append(job)
            print(f"[dlcp.bench.sync] {scheme} seed {seed}: wall {job['wall_s']:.2f} s, "
                  f"{job['iter_s'] * 1000:.1f} ms/iter, acc {job['final_acc']:.3f} "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    rows = summarise(jobs)
    result = {"config": {**base, "schemes": schemes, "seeds": args.seeds,
                         "compute": "real forward/backward + injected delay"},
              "rows": rows, "jobs": jobs}  # fmt: skip
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sync.json").write_text(json.dumps(result, indent=1))
        with (out / "sync.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        _plots(out, jobs, rows)
    for row in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()), file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
