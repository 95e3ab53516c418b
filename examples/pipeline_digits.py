"""Pipeline-parallel training of a small MLP on scikit-learn's digits with
``torch.distributed.pipelining``, its stages talking over DLCP (or Gloo).

    dlcp launch -n 2 examples/pipeline_digits.py
    torchrun --nproc-per-node 4 examples/pipeline_digits.py --backend gloo

The model (64 -> 128 -> 128 -> 64 -> 10, ReLU between) is cut into as many
stages as there are ranks (2 to 4): rank ``r`` holds stage ``r``, built from
the same seed on every rank. ``torch.distributed.pipelining``'s GPipe schedule
splits every batch into ``--microbatches`` and moves the activations forward
and their gradients backward with ``batch_isend_irecv`` (``isend`` / ``irecv``)
of the default process group: ``"dlcp"``'s point-to-point, exact (``p = 0``).
The data is ``sklearn.datasets.load_digits`` (nothing is downloaded), split
once into 80 % training and 20 % test with a fixed seed.

The last stage prints the mean training loss per epoch; at the end every stage
sends its parameters to rank 0 (``gather_object``), which puts the whole model
together and prints its test accuracy. ``--json PATH`` writes the figures (the
per-epoch losses are identical, bit for bit, over DLCP and Gloo: the
point-to-point messages are exact).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

WIDTHS = (64, 128, 128, 64, 10)


def layers() -> list[nn.Module]:
    """The whole model's layers, in order (a Linear, then its ReLU but the last)."""
    torch.manual_seed(0)
    out: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(WIDTHS)):
        out.append(nn.Linear(a, b))
        if i < len(WIDTHS) - 2:
            out.append(nn.ReLU())
    return out


def cut(world: int) -> list[nn.Sequential]:
    """The model in ``world`` stages of consecutive Linear(+ReLU) blocks."""
    blocks: list[list[nn.Module]] = []
    all_layers = layers()
    for layer in all_layers:
        if isinstance(layer, nn.Linear):
            blocks.append([layer])
        else:
            blocks[-1].append(layer)
    per = np.array_split(np.arange(len(blocks)), world)
    return [nn.Sequential(*[m for i in idx for m in blocks[i]]) for idx in per]


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.int64)
    n = int(0.8 * len(y))
    return x[:n], y[:n], x[n:], y[n:]


def _env_defaults() -> None:
    """Run as a single process (one stage) when started without a launcher."""
    if "RANK" not in os.environ:
        from dlcp.launch import free_port

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def train(args: argparse.Namespace) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    _env_defaults()
    if args.backend == "dlcp":
        import shims.process_group  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if not 1 <= world <= len(WIDTHS) - 1:
        raise SystemExit(f"pipeline_digits: 1 to {len(WIDTHS) - 1} ranks, got {world}")
    torch.set_num_threads(1)
    stages = cut(world)
    module = stages[rank]
    x_train, y_train, x_test, y_test = digits()
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    loss_fn = nn.CrossEntropyLoss()
    schedule = ScheduleGPipe(stage, args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    n = len(y_train) // args.batch * args.batch
    epochs = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        losses: list[torch.Tensor] = []
        for start in range(0, n, args.batch):
            idx = order[start : start + args.batch]
            opt.zero_grad()
            if world == 1:
                schedule.step(x_train[idx], target=y_train[idx], losses=losses)
            elif rank == 0:
                schedule.step(x_train[idx])
            elif rank == world - 1:
                schedule.step(target=y_train[idx], losses=losses)
            else:
                schedule.step()
            opt.step()
        if rank == world - 1:
            mean = float(torch.stack(losses).detach().mean())
            epochs.append(mean)
            print(f"epoch {epoch}: training loss {mean:.6f}", flush=True)
    # the whole model on rank 0, for its test accuracy
    states: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(module.state_dict(), states if rank == 0 else None, dst=0)
    last_losses: list[Any] = [epochs if rank == world - 1 else None]
    dist.broadcast_object_list(last_losses, src=world - 1)
    result: dict[str, Any] = {"backend": args.backend, "ranks": world,
                              "losses": last_losses[0]}
    if rank == 0:
        whole = cut(world)
        for part, state in zip(whole, states, strict=True):
            part.load_state_dict(state)
        model = nn.Sequential(*whole).eval()
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean()) * 100
        result["test_accuracy"] = accuracy
        print(f"test accuracy {accuracy:.1f} % ({world} stages over {args.backend})",
              flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("dlcp", "gloo"), default="dlcp")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--json", help="write the figures here (rank 0)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 1 or args.microbatches < 1:
        p.error("--epochs, --batch and --microbatches must be positive")
    if args.batch % args.microbatches:
        p.error(f"--batch {args.batch} must be a multiple of --microbatches {args.microbatches}")
    return args


def main(argv: list[str] | None = None) -> int:
    train(parse(argv))
    return 0


if __name__ == "__main__":
    code = main()
    # the training is done, its figures written and the group destroyed: leave
    # without the interpreter's finalization, where a Gloo thread torn down late
    # aborted a rank of the Gloo run once in CI ("terminate called without an
    # active exception", SIGABRT), as dlcp.bench.ddp's workers leave
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
