"""Metrics of a run from its per-flow CSV, and the files a run or suite writes.

* FCT (flow completion time): from when a message may start (its dependencies
  are met) to when its receiver has it -- the whole message for TCP/DCTCP, the
  bound's worth plus every protected chunk for DLCP.
* Iteration (communication round) time: from the first start to the last
  completion of the iteration's messages, averaged over the iterations whose
  messages all completed (``iterations_incomplete`` counts the others).
* Loss fraction: gradient bytes DLCP accepted as lost (zero-filled) over the
  bytes of the bounded messages (push / reduce-scatter).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FlowRecord", "read_flows", "summarize", "write_summary_csv"]

FlowRecord = dict[str, Any]


def read_flows(path: Path, kinds: Sequence[str], iterations: Sequence[int]) -> list[FlowRecord]:
    out: list[FlowRecord] = []
    with path.open(newline="") as f:
        for row, kind, it in zip(csv.DictReader(f), kinds, iterations, strict=True):
            start, end = float(row["start"]), float(row["end"])
            out.append(
                {
                    "src": int(row["src"]),
                    "dst": int(row["dst"]),
                    "bytes": int(row["bytes"]),
                    "cls": int(row["cls"]),
                    "p": float(row["p"]),
                    "start": start,
                    "end": end,
                    "fct": end - start if end >= 0 and start >= 0 else math.nan,
                    "lost_bytes": int(row["lost_bytes"]),
                    "retx_pkts": int(row["retx_pkts"]),
                    "failed": row["failed"] == "1",
                    "kind": kind,
                    "iteration": it,
                }
            )
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def summarize(flows: list[FlowRecord]) -> dict[str, Any]:
    """Headline metrics (times in microseconds) of the training messages."""
    train = [f for f in flows if f["kind"] != "background"]
    # a message its sender gave up on has an end time but is not delivered
    done = [f for f in train if not f["failed"] and not math.isnan(f["fct"])]
    fct = [f["fct"] * 1e6 for f in done]
    iters: dict[int, list[FlowRecord]] = {}
    for f in train:
        iters.setdefault(f["iteration"], []).append(f)
    # an iteration with a message that never completed has no iteration time
    iter_us = [
        1e6 * (max(f["end"] for f in fs) - min(f["start"] for f in fs))
        for _, fs in sorted(iters.items())
        if all(not f["failed"] and not math.isnan(f["fct"]) for f in fs)
    ]
    bounded = [f for f in train if f["p"] > 0]
    bounded_bytes = sum(f["bytes"] for f in bounded)
    out: dict[str, Any] = {
        "messages": len(train),
        "completed": len(done),
        "failed": sum(f["failed"] for f in train),
        "fct_mean_us": sum(fct) / len(fct) if fct else math.nan,
        "fct_p50_us": percentile(fct, 50),
        "fct_p99_us": percentile(fct, 99),
        "fct_max_us": max(fct) if fct else math.nan,
        "iteration_us": iter_us,
        "iteration_mean_us": sum(iter_us) / len(iter_us) if iter_us else math.nan,
        "iterations_incomplete": len(iters) - len(iter_us),
        "loss_fraction": (
            sum(f["lost_bytes"] for f in bounded) / bounded_bytes if bounded_bytes else 0.0
        ),
        "loss_fraction_max_message": max(
            (f["lost_bytes"] / f["bytes"] for f in bounded), default=0.0
        ),
        "lost_bytes_total": sum(f["lost_bytes"] for f in train),
        "retransmitted_packets": sum(f["retx_pkts"] for f in train),
    }
    bg = [f["fct"] * 1e6 for f in flows if f["kind"] == "background" and not math.isnan(f["fct"])]
    if bg:
        out["background_fct_mean_us"] = sum(bg) / len(bg)
        out["background_fct_p99_us"] = percentile(bg, 99)
    return out


SUMMARY_FIELDS = (
    "label", "transport", "workload", "hosts", "scale", "seed", "messages", "completed",
    "failed", "fct_mean_us", "fct_p50_us", "fct_p99_us", "fct_max_us", "iteration_mean_us",
    "loss_fraction", "loss_fraction_max_message", "retransmitted_packets", "switch_drops",
    "sim_time_s", "wall_s",
)  # fmt: skip


def write_summary_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def write_json(data: Any, path: Path) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
