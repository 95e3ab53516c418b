"""PNG plots of simulation results: FCT CDFs and iteration-time bars."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_fct_cdf", "plot_iteration_bars"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fct_cdf(fcts: Mapping[str, Sequence[float]], path: Path, title: str) -> None:
    """One CDF line per label; FCTs in microseconds, log x axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in fcts.items():
        xs = sorted(v for v in values if not math.isnan(v))
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("flow completion time (us)")
    ax.set_ylabel("CDF")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_iteration_bars(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Bars of mean iteration time, mean FCT and p99 FCT per run label."""
    plt = _pyplot()
    labels = [str(r["label"]) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, key, name in zip(
        axes,
        ("iteration_mean_us", "fct_mean_us", "fct_p99_us"),
        ("iteration time (us)", "mean FCT (us)", "p99 FCT (us)"),
        strict=True,
    ):
        ax.bar(range(len(rows)), [float(r[key]) for r in rows], color="tab:blue")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_title(name)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
