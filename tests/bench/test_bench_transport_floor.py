"""The transport benchmark's UDP floor on a busy machine: a floor transfer whose
receive socket overflowed (its receiver fell behind, so its time is not a floor)
is made again, at most ``FLOOR_ATTEMPTS`` times, before the run fails; what was
given up is counted, and the network's drops are those of the attempt kept."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from dlcp.bench import transport
from dlcp.bench.transport import FLOOR_ATTEMPTS, Bench, Progress
from dlcp.bench.transport_report import Rep


def _bench(overflows: list[int], drops: list[int]) -> tuple[Bench, list[bool], list[int]]:
    """A bench whose floor transfers overflow ``overflows[i]`` times in attempt i,
    and a network whose drop counter grows by ``drops[i]`` during it; the
    ``overflow_ok`` each attempt was made with, and the running drop counter."""
    bench = Bench(argparse.Namespace(timeout=1.0), [object(), object()], Progress(1, False))
    asked: list[bool] = []
    counter = [0]

    def rep(
        transport_: str, endpoint: str, p: float, phase: str, *, overflow_ok: bool = False
    ) -> Rep:
        i = len(asked)
        asked.append(overflow_ok)
        counter[0] += drops[i]
        receiver: dict[str, Any] = {"counters": {"udp_RcvbufErrors": overflows[i]}}
        if overflows[i] and not overflow_ok:
            raise transport.WorkerError("recv worker: the floor transfer overflowed")
        return Rep(0.01 * (i + 1), {}, receiver)

    bench.rep = rep
    return bench, asked, counter


def test_an_overflowed_floor_transfer_is_made_again() -> None:
    bench, asked, counter = _bench([12, 0, 0], [5, 3, 0])
    rep = bench.floor_rep(0.01, "loss", lambda: counter[0])
    assert rep.seconds == pytest.approx(0.02)  # the second attempt's
    assert asked == [True, True]
    assert bench.floor_overflows == 1
    assert bench.floor_dropped == 3  # the kept attempt's drops, not the first one's


def test_a_floor_that_keeps_overflowing_fails_the_run() -> None:
    bench, asked, counter = _bench([7] * FLOOR_ATTEMPTS, [0] * FLOOR_ATTEMPTS)
    with pytest.raises(transport.WorkerError, match="overflowed"):
        bench.floor_rep(0.0, "warm-up floor", lambda: counter[0])
    assert asked == [True] * (FLOOR_ATTEMPTS - 1) + [False]
    assert bench.floor_overflows == FLOOR_ATTEMPTS - 1


def test_a_clean_floor_transfer_is_kept_at_once() -> None:
    bench, asked, _ = _bench([0], [0])
    assert bench.floor_rep(0.0, "offloads off").seconds == pytest.approx(0.01)
    assert asked == [True] and bench.floor_overflows == 0 and bench.floor_dropped == 0
