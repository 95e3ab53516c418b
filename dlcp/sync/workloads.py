"""Workloads for the synchronisation schemes' tests and benchmarks (nothing is
downloaded): the digits CNN (scikit-learn's bundled 8x8 digits) and a synthetic
click-through-rate task with a known logistic ground truth.

CTR task: ``fields`` categorical features, field ``f`` taking values
``0 .. vocab - 1`` (Zipf-like frequencies); each (field, value) has a hidden
weight drawn from N(0, ``scale``^2); a sample's click probability is
``sigmoid(bias + sum of its weights)`` and its label a Bernoulli draw of it.
The model hashes (field, value) into ``buckets`` embedding rows (the hashing
trick), sums them per sample (EmbeddingBag) and feeds an MLP. Metrics: log
loss, normalised entropy (log loss over the entropy of the base click rate)
and AUC (probability that a random click scores above a random non-click).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["CTRModel", "CTRTask", "DigitsTask", "auc", "digits_cnn"]


def auc(labels: npt.NDArray[np.floating], scores: npt.NDArray[np.floating]) -> float:
    """Area under the ROC curve by ranks (ties share their mean rank)."""
    is_pos = np.asarray(labels, dtype=bool)
    pos, neg = int(is_pos.sum()), int(np.logical_not(is_pos).sum())
    if pos == 0 or neg == 0:
        return 0.5
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    sorted_scores = np.asarray(scores)[order]
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[is_pos].sum() - pos * (pos + 1) / 2) / (pos * neg))


@dataclass
class CTRTask:
    """The seeded generator (module docstring)."""

    fields: int = 8
    vocab: int = 200
    buckets: int = 4096
    scale: float = 0.6
    bias: float = -1.0
    seed: int = 0

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.weights = rng.normal(0.0, self.scale, (self.fields, self.vocab))
        p = 1.0 / np.arange(1, self.vocab + 1) ** 1.1
        self.freq = p / p.sum()

    def batch(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` samples: hashed ids (n, fields) and labels (n,) as float."""
        rng = np.random.default_rng([self.seed, seed])
        values = rng.choice(self.vocab, size=(n, self.fields), p=self.freq)
        logit = self.bias + self.weights[np.arange(self.fields), values].sum(axis=1)
        labels = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
        ids = (np.arange(self.fields) * 1_000_003 + values * 7919) % self.buckets
        return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(labels.astype(np.float32))

    def evaluate(self, model: torch.nn.Module, n: int = 4000) -> dict[str, float]:
        ids, labels = self.batch(n, seed=10**6)
        with torch.no_grad():
            logits = model(ids)
        loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))
        rate = float(labels.mean())
        entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
        return {"log_loss": loss, "ne": loss / entropy,
                "auc": auc(labels.numpy(), logits.numpy())}  # fmt: skip


class CTRModel(torch.nn.Module):
    """EmbeddingBag (sum over the fields' hashed rows) + MLP -> one logit."""

    def __init__(self, buckets: int = 4096, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(buckets, dim, mode="sum")
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 1))  # fmt: skip

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.embed(ids)).squeeze(-1)
        return out


class DigitsTask:
    """scikit-learn's 8x8 digits, split into a training and a test part."""

    def __init__(self, seed: int = 0) -> None:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]

        d = load_digits()
        x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
        self.train_x, self.train_y = x[order[:1500]], y[order[:1500]]
        self.test_x, self.test_y = x[order[1500:]], y[order[1500:]]

    def batch(self, rank: int, step: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(rank * 100_003 + step)
        idx = torch.randint(0, len(self.train_x), (size,), generator=g)
        return self.train_x[idx], self.train_y[idx]

    def accuracy(self, model: torch.nn.Module) -> float:
        with torch.no_grad():
            pred = model(self.test_x).argmax(dim=1)
        return float((pred == self.test_y).float().mean())


def digits_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10),
    )  # fmt: skip
