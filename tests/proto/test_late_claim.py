"""A receive posted after its message completed (``dlcp.proto.late_claim``):
the core's decision, without a driver."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.config import FillPolicy
from dlcp.proto.events import MessageReceived
from dlcp.proto.late_claim import ClaimAccepted, ClaimRefused, claim_completed
from dlcp.proto.loss_report import LossReport


def _event(
    data: np.ndarray, lost: tuple[tuple[int, int], ...], fill: FillPolicy
) -> MessageReceived:
    n_lost = sum(n for _, n in lost)
    for off, n in lost:
        data[off : off + n] = 0
    report = LossReport(
        msg_elems=len(data), received_elems=len(data) - n_lost, lost_elems=n_lost,
        lost_ranges=lost, received_chunks=(0,) * 16, lost_chunks=(0,) * 16,
        retransmitted_chunks=0, duplicate_chunks=0, nack_rounds=0, bound=0.2, fill=fill,
        duration=0.0,
    )  # fmt: skip
    return MessageReceived(0, 3, 5, data, report)


def test_a_message_that_lost_nothing_is_taken_as_it_is() -> None:
    ev = _event(np.ones(10, np.float32), (), FillPolicy.ZERO)
    assert claim_completed(ev, None, p=0.0, fill=FillPolicy.RESCALE) == ClaimAccepted(ev)


def test_more_loss_than_the_receive_allows_is_refused() -> None:
    ev = _event(np.ones(100, np.float32), ((0, 10),), FillPolicy.ZERO)
    claim = claim_completed(ev, None, p=0.05, fill=FillPolicy.ZERO)
    assert isinstance(claim, ClaimRefused)
    assert "10 of 100 elements lost, more than p=0.05 allows" in claim.why
    assert claim_completed(ev, None, p=0.1, fill=FillPolicy.ZERO) == ClaimAccepted(ev)


def test_previous_is_applied_into_out_keeping_its_values_where_elements_were_lost() -> None:
    ev = _event(np.ones(10, np.float32), ((2, 3),), FillPolicy.ZERO)
    out = np.full(10, 7, np.float32)
    claim = claim_completed(ev, out, p=None, fill=FillPolicy.PREVIOUS)
    assert isinstance(claim, ClaimAccepted) and claim.in_out
    assert claim.event.report.fill is FillPolicy.PREVIOUS
    assert out.tolist() == [1, 1, 7, 7, 7, 1, 1, 1, 1, 1]


def test_rescale_scales_the_received_values_up() -> None:
    ev = _event(np.ones(10, np.float32), ((0, 2),), FillPolicy.ZERO)
    claim = claim_completed(ev, None, p=None, fill=FillPolicy.RESCALE)
    assert isinstance(claim, ClaimAccepted) and not claim.in_out
    assert claim.event.data[2:].tolist() == pytest.approx([10 / 8] * 8)


@pytest.mark.parametrize(
    ("data", "session_fill", "fill", "out"),
    [
        (np.ones(10, np.uint8), FillPolicy.ZERO, FillPolicy.RESCALE, None),  # uint8
        (np.ones(10, np.float32), FillPolicy.RESCALE, FillPolicy.ZERO, None),  # not undone
        (np.ones(10, np.float32), FillPolicy.ZERO, FillPolicy.PREVIOUS, None),  # no out
        (np.ones(10, np.float32), FillPolicy.ZERO, FillPolicy.PREVIOUS, np.zeros(9, np.float32)),
    ],
    ids=["rescale_uint8", "from_rescale", "previous_without_out", "previous_wrong_out"],
)
def test_a_fill_that_cannot_be_applied_afterwards_is_refused(
    data: np.ndarray, session_fill: FillPolicy, fill: FillPolicy, out: np.ndarray | None
) -> None:
    ev = _event(data, ((0, 1),), session_fill)
    claim = claim_completed(ev, out, p=None, fill=fill)
    assert isinstance(claim, ClaimRefused)
    assert f"filled with fill={session_fill.value}: fill={fill.value} cannot be applied" in (
        claim.why
    )
