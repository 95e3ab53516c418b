"""Expert-parallel training of a small mixture-of-experts on scikit-learn's
digits: tokens routed between ranks with ``all_to_all_single`` over DLCP (or Gloo).

    dlcp launch -n 2 examples/moe_digits.py
    torchrun --nproc-per-node 4 examples/moe_digits.py --backend gloo

Every rank holds one expert (an MLP, 32 -> 64 -> 32) and a replica of the rest
(an encoder 64 -> 32, a gate choosing an expert per sample, a head 32 -> 10).
Each sample is a token: the gate sends it to its top-1 expert. Per batch, the
ranks first tell each other how many tokens each expert gets (an
``all_to_all_single`` of counts, equal splits), then send the tokens
(``all_to_all_single_autograd`` of torch's functional collectives, uneven
splits, so the gradients go back the same way) and receive the experts' outputs, which are
added to the tokens weighted by the gate's probability. A load-balancing loss
(``--balance``) keeps the gate from sending every token to one expert. The replicated
parameters' gradients are averaged with ``all_reduce``. All of it over the
default process group: ``"dlcp"`` (exact, ``p = 0``) or ``"gloo"``.

The data is ``sklearn.datasets.load_digits`` (nothing is downloaded), split
once into 80 % training and 20 % test with a fixed seed; rank ``r`` of ``W``
takes every ``W``-th sample from position ``r`` on. Rank 0 prints, per epoch,
the mean training loss over all ranks, the test accuracy over all ranks and how
many tokens each expert took; ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import _functional_collectives as funcol


class MoE(nn.Module):
    """Encoder, gate and head replicated; ``expert`` is this rank's own."""

    def __init__(self, world: int, rank: int) -> None:
        super().__init__()
        torch.manual_seed(0)  # the replicated parts: the same on every rank
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.gate = nn.Linear(32, world)
        self.head = nn.Linear(32, 10)
        torch.manual_seed(1 + rank)  # each expert its own
        self.expert = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.world = world
        self.load = torch.zeros(world, dtype=torch.int64)  # tokens each expert took
        #: the last batch's load-balancing loss (Switch Transformer's: the world
        #: size times the sum over experts of token share x mean gate probability)
        self.balance = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        probs = torch.softmax(self.gate(h), dim=1)
        weight, chosen = probs.max(dim=1)
        order = torch.argsort(chosen, stable=True)  # the tokens grouped by expert
        send_counts = torch.bincount(chosen, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        self.load += send_counts
        share = send_counts.float() / max(len(order), 1)
        self.balance = self.world * (share * probs.mean(dim=0)).sum()
        sends, recvs = send_counts.tolist(), recv_counts.tolist()
        group = dist.group.WORLD
        assert group is not None
        tokens = funcol.all_to_all_single_autograd(h[order], recvs, sends, group)
        done = funcol.all_to_all_single_autograd(self.expert(tokens), sends, recvs, group)
        back = torch.empty_like(done).index_copy(0, order, done)  # (in the batch's order)
        return self.head(h + weight.unsqueeze(1) * back)


def digits(rank: int, world: int) -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.int64)
    n = int(0.8 * len(y))
    n_train = n // world * world  # every rank the same number of batches
    n_test = (len(y) - n) // world * world
    xt, yt = x[n:][:n_test], y[n:][:n_test]
    return x[:n_train][rank::world], y[:n_train][rank::world], xt[rank::world], yt[rank::world]


def _env_defaults() -> None:
    """Run as a single process (one expert) when started without a launcher."""
    if "RANK" not in os.environ:
        from dlcp.launch import free_port

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))


def train(args: argparse.Namespace) -> dict[str, Any]:
    _env_defaults()
    if args.backend == "dlcp":
        import shims.process_group  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = MoE(world, rank)
    shared = [p for name, p in model.named_parameters() if not name.startswith("expert.")]
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x_train, y_train, x_test, y_test = digits(rank, world)
    history = []
    for epoch in range(args.epochs):
        model.load.zero_()
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(2)  # summed loss, batches
        for start in range(0, len(order), args.batch):
            idx = order[start : start + args.batch]
            loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            (loss + args.balance * model.balance).backward()
            for p in shared:  # the replicas' mean; the experts' got every rank's tokens
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            for p in model.expert.parameters():
                assert p.grad is not None
                p.grad /= world
            opt.step()
            total += torch.tensor([loss.item(), 1.0])
        with torch.no_grad():
            correct = (model(x_test).argmax(1) == y_test).sum().float()
        figures = torch.cat([total, correct.view(1), torch.tensor([float(len(y_test))])])
        dist.all_reduce(figures)
        load = model.load.clone()
        dist.all_reduce(load)
        row = {"epoch": epoch, "loss": float(figures[0] / figures[1]),
               "test_accuracy": float(100 * figures[2] / figures[3]),
               "expert_tokens": load.tolist()}
        history.append(row)
        if rank == 0:
            print(f"epoch {epoch}: training loss {row['loss']:.4f}, test accuracy "
                  f"{row['test_accuracy']:.1f} %, tokens per expert {row['expert_tokens']}",
                  flush=True)
    result = {"backend": args.backend, "ranks": world, "epochs": history}
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("dlcp", "gloo"), default="dlcp")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--balance", type=float, default=0.1,
                   help="weight of the load-balancing loss (0: none)")
    p.add_argument("--json", help="write the figures here (rank 0)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch < 1 or args.balance < 0:
        p.error("--epochs and --batch must be positive, --balance at least 0")
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
