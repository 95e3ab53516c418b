"""Data-parallel training of a small CNN on scikit-learn's digits, over DLCP or Gloo.

    torchrun --nproc-per-node 4 examples/train_digits.py --transport dlcp
    dlcp launch -n 4 examples/train_digits.py --transport gloo --json gloo.json
    DLCP_EMULATED_LOSS=0.01 dlcp launch -n 4 examples/train_digits.py --p 0.05

The data is ``sklearn.datasets.load_digits`` (1797 8x8 images that ship inside
scikit-learn; nothing is downloaded), split once into 80 % training and 20 %
test with a fixed seed. Every epoch the training set is shuffled with a seed
that every rank shares, and rank ``r`` of ``W`` takes every ``W``-th sample
from position ``r`` on (all shards the same length, so every rank runs the same
number of steps, as DDP needs).

``--transport gloo`` is plain DDP over Gloo (its ring all-reduce); with
``--collective ps`` the gradients go through a parameter server on rank 0
over Gloo's point-to-point TCP instead (:mod:`shims.tcp_ps`, the TCP
baseline of DLCP's parameter server). ``--transport dlcp`` still creates
a Gloo process group (for what DDP does outside the gradient all-reduce: the
initial broadcast of the parameters) and registers the DLCP comm hook, so the
gradients travel over DLCP with loss bound ``--p``, by ring all-reduce,
``--collective halving-doubling`` (fewer steps; a power-of-two number of ranks)
or ``--collective ps`` (a parameter server on rank 0, or on ``--ps-servers``).
Emulated loss comes from ``DLCP_EMULATED_LOSS`` (in-process drops of received
datagrams; each rank draws its drops from a different seed,
``DLCP_EMULATED_LOSS_SEED`` = its rank unless set), other knobs from the other
``DLCP_*`` variables (e.g. ``DLCP_TIMEOUT``).

Rank 0 prints, per epoch: test accuracy, training loss, time per iteration,
and for DLCP the fraction of gradient elements lost (filled with zeros instead
of received, over all ranks) and the packets retransmitted. ``--json PATH``
writes the same per-epoch figures; ``--trace PATH`` a Chrome trace of the
collectives (one file per rank: ``PATH`` with ``.rank<N>`` before the suffix).
``--check-replicas`` compares a hash of every rank's parameters after every
step and stops with an error if any two differ. ``--exit-rank R --exit-step S``
makes rank R die (``os._exit(3)``) at step S, to see how the others fail.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

EXIT_CODE_INJECTED = 3
#: the endpoint counters a DLCP run reports per rank (``endpoint_counters``)
ENDPOINT_COUNTERS = ("datagrams_in", "packets_out", "late_packets", "socket_drops", "rejected",
                     "control_in", "control_out")  # fmt: skip


def build_model(hidden: int = 64) -> nn.Module:
    """Two 3x3 convolutions, a pooling, two linear layers with ``hidden`` units
    between them: ~38k parameters (hidden 64), ~540k (hidden 1024, where the
    gradient, 2.2 MB, outweighs the computation)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): images scaled to [0, 1], shape (N, 1, 8, 8)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return (torch.from_numpy(x_tr), torch.from_numpy(y_tr),
            torch.from_numpy(x_te), torch.from_numpy(y_te))


def shard(n: int, rank: int, world: int, seed: int, epoch: int) -> torch.Tensor:
    """This rank's sample indices for ``epoch`` (same length on every rank)."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(n, generator=g)
    per_rank = n // world
    return order[rank::world][:per_rank]


def params_hash(model: nn.Module) -> int:
    """A 63-bit hash of every parameter's bytes (equal iff bit-identical, practically)."""
    h = hashlib.blake2b(digest_size=8)
    for prm in model.parameters():
        h.update(prm.detach().cpu().numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def check_replicas(model: nn.Module, step: int, world: int) -> None:
    mine = torch.tensor([params_hash(model)], dtype=torch.int64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    values = [int(t.item()) for t in every]
    if len(set(values)) != 1:
        raise RuntimeError(
            f"replicas diverged after step {step}: parameter hashes by rank "
            + ", ".join(f"{r}:{v:016x}" for r, v in enumerate(values))
        )


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = int((model(x).argmax(dim=1) == y).sum())
    model.train()
    return 100.0 * correct / len(y)


def _env_defaults() -> None:
    """Run as a single process when started without a launcher."""
    if "RANK" not in os.environ:
        from dlcp.launch import free_port

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def train(args: argparse.Namespace) -> dict[str, Any]:
    _env_defaults()
    rank = int(os.environ["RANK"])
    if args.transport == "dlcp":
        os.environ.setdefault("DLCP_EMULATED_LOSS_SEED", str(rank))
    from dlcp.errors import ConfigError
    from dlcp.rendezvous import env_job, startup_hint
    from dlcp.settings import config_from_env

    # the endpoints' timeout, read (and every DLCP_* variable checked) as they will;
    # a wrong setting or a job that never gathers all its ranks is one line per rank
    try:
        job = env_job()
        timeout = timedelta(seconds=config_from_env().timeout + 30)
    except ConfigError as exc:
        raise SystemExit(f"dlcp rank {rank}: {exc}") from None
    try:
        dist.init_process_group("gloo", timeout=timeout)
    except dist.DistError as exc:  # (torch's start-up wait for all WORLD_SIZE ranks)
        said = str(exc).strip().splitlines()[0]
        raise SystemExit(
            f"dlcp rank {rank}: the job did not start within {timeout.total_seconds():g} s "
            f"(DLCP_TIMEOUT + 30): {said}. {startup_hint(job)}."
        ) from None
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    model = build_model(args.hidden)
    # DDP's bucket views of the 1-input-channel conv weight have other (equivalent)
    # strides than autograd's gradient; DDP copies, and warns once per rank
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view")
    ddp = nn.parallel.DistributedDataParallel(model)
    state = None
    if args.transport == "dlcp":
        from shims.ddp import DLCPState, dlcp_hook

        state = DLCPState(
            model=ddp,
            collective=args.collective,
            p=args.p,
            p_gather=args.p_gather,
            # a parameter server on rank 0, as the TCP baseline has (the hook's own
            # default, every rank serving a shard, is --ps-servers all)
            servers=args.ps_servers if args.collective == "ps" else None,
            trace_path=args.trace,  # (one file per rank: DLCPState names them)
        )
        ddp.register_comm_hook(state, dlcp_hook)
    elif args.collective == "ps":
        from shims.tcp_ps import TcpPsState, tcp_ps_hook

        ddp.register_comm_hook(TcpPsState(server=0), tcp_ps_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = -(-(len(x_tr) // world) // args.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * steps_per_epoch)
    loss_fn = nn.CrossEntropyLoss()
    say = print if rank == 0 else (lambda *a, **k: None)
    emulated = float(os.environ.get("DLCP_EMULATED_LOSS", "0")) if state else 0.0
    say(
        f"digits CNN ({sum(p.numel() for p in model.parameters())} parameters), "
        f"{world} ranks, transport {args.transport}"
        + (f" ({args.collective}, p={args.p:g}, emulated loss {emulated:.1%})" if state else
           f" ({'parameter server on rank 0' if args.collective == 'ps' else 'its all-reduce'})")
        + f", {len(x_tr)} train / {len(x_te)} test samples, batch {args.batch_size} per rank",
        flush=True,
    )
    epochs: list[dict[str, Any]] = []
    step = replica_checks = 0
    for epoch in range(args.epochs):
        idx = shard(len(x_tr), rank, world, args.seed, epoch)
        first_step = len(state.metrics.history) if state else 0
        loss_sum, iters, checks_s = 0.0, 0, 0.0
        iteration_s: list[float] = []
        t0 = time.perf_counter()
        for start in range(0, len(idx), args.batch_size):
            t_iter = time.perf_counter()
            if step == args.exit_step and rank == args.exit_rank:
                print(f"rank {rank}: exiting at step {step} (--exit-rank)", file=sys.stderr,
                      flush=True)
                os._exit(EXIT_CODE_INJECTED)
            b = idx[start : start + args.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x_tr[b]), y_tr[b])
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            iteration_s.append(time.perf_counter() - t_iter)
            iters += 1
            step += 1
            if args.check_replicas:
                t_check = time.perf_counter()
                check_replicas(model, step, world)
                replica_checks += 1
                checks_s += time.perf_counter() - t_check
        elapsed = time.perf_counter() - t0 - checks_s  # training only, as iteration_s
        steps = state.metrics.history[first_step:] if state else []
        totals = torch.tensor(
            [
                loss_sum / iters,
                sum(s.lost_elems for s in steps),
                sum(s.elems for s in steps),
                sum(s.retransmitted_packets for s in steps),
                sum(s.comm_seconds for s in steps),
                elapsed,
            ],
            dtype=torch.float64,
        )
        dist.all_reduce(totals)  # over ranks (Gloo: a few numbers once per epoch)
        mean_loss, lost, elems, retx, comm_s, elapsed_sum = totals.tolist()
        # every rank runs the same iterations: an iteration takes its slowest rank's time
        slowest = torch.tensor(iteration_s, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        row = {
            "epoch": epoch + 1,
            "test_accuracy": evaluate(model, x_te, y_te),
            "train_loss": mean_loss / world,
            "iterations": iters,
            "iter_s": elapsed_sum / world / iters,
            "loss_fraction": lost / elems if elems else 0.0,
            "lost_elems": int(lost),
            "retransmitted_packets": int(retx),
            "comm_s_per_iter": comm_s / world / iters,
            #: each iteration's time on its slowest rank (check_replicas not included);
            #: ranks absorb waits in different iterations, so their sum is at least
            #: any one rank's timed loop time, and may exceed it
            "iteration_s": [round(t, 6) for t in slowest.tolist()],
        }
        epochs.append(row)
        say(
            f"epoch {epoch + 1:2d}/{args.epochs}  test acc {row['test_accuracy']:5.1f}%  "
            f"train loss {row['train_loss']:.3f}  {1e3 * row['iter_s']:6.1f} ms/iter"
            + (
                f"  DLCP lost {100 * row['loss_fraction']:.2f}% of all ranks' gradient elements, "
                f"{row['retransmitted_packets']} packets retransmitted"
                if state
                else ""
            ),
            flush=True,
        )
    result = {
        "transport": args.transport,
        "collective": args.collective,
        "p": args.p if state else None,
        "emulated_loss": emulated,
        "world_size": world,
        "parameters": sum(prm.numel() for prm in model.parameters()),
        "epochs": epochs,
        "final_test_accuracy": epochs[-1]["test_accuracy"] if epochs else None,
        "replica_checks": replica_checks,
        "parameters_hash": f"{params_hash(model):016x}",
    }
    if state is not None:
        # each rank's datagram counters, once (where the data went: late, dropped
        # at the socket, rejected), for the testbed's record of the run
        counters = [None] * world
        stats = state.endpoint.stats()
        dist.all_gather_object(counters, {k: stats[k] for k in ENDPOINT_COUNTERS})
        result["endpoint_counters"] = counters
        # peers closing their control connections at the end is expected: not a warning
        logging.getLogger("dlcp.io").setLevel(logging.ERROR)
    dist.barrier()
    if state is not None:
        state.close()  # (and the endpoint it made)
    dist.destroy_process_group()
    if rank == 0 and args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def _ps_servers(spec: str) -> list[int] | None:
    """``--ps-servers``: ``all`` (None: every rank serves a shard) or ranks like 0,1."""
    if spec == "all":
        return None
    try:
        return [int(x) for x in spec.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: 'all' or ranks like 0,1") from None


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _bound(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 0.255:  # (a data header carries thousandths up to 255)
        raise argparse.ArgumentTypeError(f"a loss bound is in [0, 0.255], got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", choices=["dlcp", "gloo"], default="dlcp")
    ap.add_argument("--collective", choices=["ring", "halving-doubling", "ps"], default="ring")
    ap.add_argument("--ps-servers", type=_ps_servers, default="0",
                    help="DLCP's --collective ps: the server ranks (default 0, a parameter "
                         "server on rank 0 like the TCP baseline's; 'all': every rank "
                         "serves a shard)")  # fmt: skip
    ap.add_argument("--p", type=_bound, default=0.05,
                    help="DLCP loss bound of the push phase, 0..0.255")  # fmt: skip
    ap.add_argument("--p-gather", type=_bound, default=0.0,
                    help="bound of the gather phase, 0..p")  # fmt: skip
    ap.add_argument("--epochs", type=_positive, default=8)
    ap.add_argument("--batch-size", type=_positive, default=16, help="per rank")
    ap.add_argument("--hidden", type=_positive, default=64,
                    help="units of the hidden linear layer (default 64: ~38k parameters; "
                         "1024: ~540k)")  # fmt: skip
    ap.add_argument("--lr", type=float, default=0.1, help="peak of the cosine schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", help="Chrome trace of the collectives (one file per rank)")
    ap.add_argument("--json", help="write per-epoch metrics here (rank 0)")
    ap.add_argument("--check-replicas", action="store_true",
                    help="compare a hash of the parameters across ranks after every step")
    ap.add_argument("--exit-rank", type=int, default=-1, help="fault injection: this rank ...")
    ap.add_argument("--exit-step", type=int, default=-1, help="... calls os._exit(3) here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.p_gather > args.p:
        ap.error(f"--p-gather {args.p_gather} must not exceed --p {args.p}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json {args.json}: no directory {Path(args.json).resolve().parent}")
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
