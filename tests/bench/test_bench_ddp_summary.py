"""``dlcp.bench.ddp``'s floors under loss are jobs of the loss phase's rounds: the
floor ratios divided a floor measured in an earlier phase (the loopback's
no-communication job, the namespace's lossless UDP floor) by Gloo's lossy
iterations measured later, so the machine's drift between the phases went into
the ratio."""

from __future__ import annotations

import argparse
from typing import Any

from dlcp.bench.ddp import summary


def _config(iter_s: list[float], **extra: Any) -> dict[str, Any]:
    ordered = sorted(iter_s)
    return {"params": 6922, "iter_s": ordered[len(ordered) // 2], "iter_s_jobs": iter_s,
            **extra}  # fmt: skip


def _dlcp(iter_s: list[float]) -> dict[str, Any]:
    return _config(iter_s, lost_fraction=0.0, retransmitted_per_iter=0.0, comm_s=0.001,
                   emulated_loss_dropped=0)  # fmt: skip


def test_the_floor_ratios_under_loss_divide_jobs_of_the_same_rounds() -> None:
    args = argparse.Namespace(nproc=4, inputs=32, width=64, depth=2, batch=32, iters=3,
                              warmup=1, collective="ring", p=0.05, loss=1.0, rounds=3)  # fmt: skip
    res = {
        # earlier phases, on a quieter machine
        "nocomm": _config([0.001]),
        "gloo": _config([0.010, 0.010, 0.010]),
        "dlcp": _dlcp([0.020, 0.020, 0.020]),
        "udpfloor": _config([0.009, 0.009, 0.009]),
        "gloo_netns": _config([0.012, 0.012, 0.012]),
        "dlcp_netns": _dlcp([0.030, 0.030, 0.030]),
        "udpfloor_netns": _config([0.010, 0.010, 0.010]),
        # the loss phase, its jobs in turns: the machine twice as slow by then
        "gloo_loss": _config([0.040, 0.040, 0.040], nft_dropped=10),
        "dlcp_loss": _dlcp([0.050, 0.050, 0.050]) | {"nft_dropped": 10},
        "nocomm_loss": _config([0.002, 0.004, 0.002], nft_dropped=0),
        "udpfloor_loss": _config([0.020, 0.020, 0.020]),
    }
    r = summary(args, res, kernel=True)
    assert r["nocomm_iter_s_loss"] == 0.002
    assert r["floor_ratio_loss"] == 0.05  # 2 ms over 40, not the loopback's 1 ms over 40
    assert r["floor_ratio_loss_rounds"] == [0.05, 0.1, 0.05]
    assert r["udp_floor_iter_s_loss_phase"] == 0.02
    assert r["udp_floor_ratio_loss"] == 0.5  # 20 ms over 40, not the lossless phase's 10
    assert r["udp_floor_ratio_netns_lossless"] == round(0.010 / 0.012, 3)  # (unchanged)
