"""The receiver's recovery phases (``dlcp.proto.recovery.ReceiverRecovery``):
every move of its transition table, driven by its events (FINISH, completion,
a tighter bound, timer, ABORT, cancel), and the moves it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.errors import DLCPError, ProtocolStateError
from dlcp.proto.config import FillPolicy
from dlcp.proto.control import Finish
from dlcp.proto.reassembler import Reassembler
from dlcp.proto.recovery import ReceivePhase, ReceiverRecovery
from dlcp.proto.wire import DType, allowed_loss
from tests.proto.session_helpers import config

CHUNKS, CHUNK = 10, 10  # ten chunks of ten float32 elements
CFG = config(reorder_grace=0.01, nack_timeout=0.1, recv_idle_timeout=5.0)
GRACE, NACK_T = CFG.reorder_grace, CFG.nack_timeout


def _recovery(*, bound: float = 0.1, nacked_round: int | None = None) -> ReceiverRecovery:
    r = Reassembler(
        dtype=DType.FLOAT32,
        msg_elems=CHUNKS * CHUNK,
        chunk_elems=CHUNK,
        out=None,
        bound=bound,
        fill=FillPolicy.ZERO,
        now=0.0,
    )
    return ReceiverRecovery(r, CFG, nacked_round=nacked_round)


def _arrive(rec: ReceiverRecovery, seqs: range | list[int], *, now: float) -> None:
    payload = np.ones(CHUNK * 4, np.uint8)
    for seq in seqs:
        rec.reassembler.scatter_one(seq, payload, 0, 0x01 if seq == CHUNKS - 1 else 0, now=now)


def _finish(rec: ReceiverRecovery, rnd: int, *, now: float) -> None:
    """FINISH of round ``rnd`` reaches the reassembler, then the recovery (as the
    inbox applies it)."""
    classes = (CHUNKS,) + (0,) * 15
    f = Finish(3, 5, 0, round=rnd, total_chunks=CHUNKS, protected_chunks=0, class_chunks=classes)
    assert rec.reassembler.on_finish(f)
    rec.on_finish(rnd, now=now)


def _timer(rec: ReceiverRecovery, now: float) -> list[object]:
    return list(rec.on_timer(now=now, step=3, msg=5, src=1))


def test_a_new_message_is_receiving_and_waits_only_for_its_idle_timeout() -> None:
    rec = _recovery()
    assert rec.phase is ReceivePhase.RECEIVING
    assert rec.timer == CFG.recv_idle_timeout
    assert _timer(rec, 1.0) == [] and rec.phase is ReceivePhase.RECEIVING


def test_finish_short_of_the_bound_schedules_a_nack_after_the_grace() -> None:
    rec = _recovery()
    _arrive(rec, range(5), now=0.0)
    _finish(rec, 0, now=1.0)
    assert rec.phase is ReceivePhase.FINISHED and rec.timer == pytest.approx(1.0 + GRACE)
    assert _timer(rec, 1.0 + GRACE / 2) == [] and rec.phase is ReceivePhase.FINISHED
    nacks = _timer(rec, 1.0 + GRACE)
    assert len(nacks) == 1 and rec.phase is ReceivePhase.NACKED
    assert rec.nack_round == 0 and rec.reassembler.nack_rounds == 1
    assert rec.timer == pytest.approx(1.0 + GRACE + NACK_T)


def test_a_nack_is_repeated_every_nack_timeout_as_the_same_round() -> None:
    rec = _recovery()
    _arrive(rec, range(5), now=0.0)
    _finish(rec, 0, now=1.0)
    _timer(rec, 1.0 + GRACE)
    again = _timer(rec, 1.0 + GRACE + NACK_T)
    assert len(again) == 1 and rec.phase is ReceivePhase.NACKED
    assert rec.reassembler.nack_rounds == 1  # a repeat is not a new round


def test_finish_of_the_same_round_leaves_a_nacked_message_alone() -> None:
    rec = _recovery()
    _arrive(rec, range(5), now=0.0)
    _finish(rec, 0, now=1.0)
    _timer(rec, 1.0 + GRACE)
    timer = rec.timer
    _finish(rec, 0, now=1.05)
    assert rec.phase is ReceivePhase.NACKED and rec.timer == timer


def test_finish_of_a_later_round_takes_a_nacked_message_back_to_finished() -> None:
    rec = _recovery()
    _arrive(rec, range(5), now=0.0)
    _finish(rec, 0, now=1.0)
    _timer(rec, 1.0 + GRACE)
    _finish(rec, 1, now=1.05)
    assert rec.phase is ReceivePhase.FINISHED and rec.timer == pytest.approx(1.05 + GRACE)
    _timer(rec, 1.05 + GRACE)
    assert rec.phase is ReceivePhase.NACKED and rec.nack_round == 1


def test_complete_by_the_bound_settles_for_the_grace_then_is_done() -> None:
    rec = _recovery()
    _arrive(rec, range(9), now=1.0)  # 90 of 100 elements: the bound (10 lost) is met
    _finish(rec, 0, now=1.0)
    assert rec.reassembler.is_complete()
    assert rec.on_complete(now=1.0) is False
    assert rec.phase is ReceivePhase.SETTLING and rec.timer == pytest.approx(1.0 + GRACE)
    _finish(rec, 0, now=1.001)  # a repeated FINISH changes nothing
    assert rec.phase is ReceivePhase.SETTLING and rec.timer == pytest.approx(1.0 + GRACE)
    assert rec.on_complete(now=1.0 + GRACE) is True and rec.phase is ReceivePhase.DONE


def test_a_whole_message_or_a_nacked_one_completes_at_once() -> None:
    whole = _recovery()
    _arrive(whole, range(CHUNKS), now=1.0)
    assert whole.on_complete(now=1.0) is True and whole.phase is ReceivePhase.DONE
    nacked = _recovery(nacked_round=0)  # its orphan FINISH was NACKed: grace waited
    _arrive(nacked, range(9), now=1.0)
    _finish(nacked, 0, now=1.0)
    assert nacked.on_complete(now=1.0) is True and nacked.phase is ReceivePhase.DONE


@pytest.mark.parametrize("finish_came", [True, False])
def test_a_tighter_bound_takes_a_settling_message_back(finish_came: bool) -> None:
    rec = _recovery()
    _arrive(rec, range(9), now=1.0)
    _finish(rec, 0, now=1.0)
    assert rec.on_complete(now=1.0) is False
    r = rec.reassembler
    r.bound, r.allowed_loss = 0.0, allowed_loss(0.0, r.msg_elems)
    if not finish_came:
        # (only a FINISH makes a message complete by the bound: the reassembler
        # is set back by hand to reach the other row of the table)
        r.finish = None
    rec.on_bound_tightened()
    if finish_came:
        assert rec.phase is ReceivePhase.FINISHED and rec.timer == pytest.approx(1.0 + GRACE)
        assert len(_timer(rec, 1.0 + GRACE)) == 1 and rec.phase is ReceivePhase.NACKED
    else:
        assert rec.phase is ReceivePhase.RECEIVING
        assert rec.timer == pytest.approx(1.0 + CFG.recv_idle_timeout)


def test_a_tighter_bound_still_met_changes_nothing() -> None:
    rec = _recovery(bound=0.2)
    _arrive(rec, range(9), now=1.0)
    _finish(rec, 0, now=1.0)
    assert rec.on_complete(now=1.0) is False
    r = rec.reassembler
    r.bound, r.allowed_loss = 0.1, allowed_loss(0.1, r.msg_elems)
    rec.on_bound_tightened()
    assert rec.phase is ReceivePhase.SETTLING


def test_idle_timeout_fails_the_message_with_its_reason() -> None:
    rec = _recovery()
    _arrive(rec, range(3), now=1.0)
    assert _timer(rec, 1.0 + CFG.recv_idle_timeout) == []
    assert rec.phase is ReceivePhase.FAILED
    assert rec.failure is not None and rec.failure.peer_timeout
    assert "30 of 100 elements received" in rec.failure.message


@pytest.mark.parametrize(
    ("event", "phase"), [("on_abort", ReceivePhase.FAILED), ("on_cancel", ReceivePhase.CANCELLED)]
)
@pytest.mark.parametrize("start", ["receiving", "finished", "nacked", "settling"])
def test_abort_and_cancel_end_every_live_phase(event: str, phase: ReceivePhase, start: str) -> None:
    rec = _recovery()
    _arrive(rec, range(9 if start == "settling" else 5), now=1.0)
    if start != "receiving":
        _finish(rec, 0, now=1.0)
    if start == "nacked":
        _timer(rec, 1.0 + GRACE)
    if start == "settling":
        rec.on_complete(now=1.0)
    assert rec.phase.value == start
    getattr(rec, event)()
    assert rec.phase is phase


def _ended(how: str) -> ReceiverRecovery:
    rec = _recovery()
    if how == "done":
        _arrive(rec, range(CHUNKS), now=1.0)
        rec.on_complete(now=1.0)
    elif how == "failed":
        rec.on_abort()
    else:
        rec.on_cancel()
    assert rec.phase.value == how
    return rec


@pytest.mark.parametrize("how", ["done", "failed", "cancelled"])
@pytest.mark.parametrize(
    "event",
    [
        lambda rec: rec.on_finish(0, now=2.0),
        lambda rec: rec.on_complete(now=2.0),
        lambda rec: rec.on_bound_tightened(),
        lambda rec: rec.on_timer(now=2.0, step=3, msg=5, src=1),
        lambda rec: rec.on_abort(),
        lambda rec: rec.on_cancel(),
    ],
    ids=["finish", "complete", "tighter_bound", "timer", "abort", "cancel"],
)
def test_no_event_moves_an_ended_message(how: str, event: object) -> None:
    rec = _ended(how)
    with pytest.raises(ProtocolStateError, match=f"after the message ended \\({how.upper()}\\)"):
        event(rec)  # type: ignore[operator]
    assert rec.phase.value == how


def test_a_move_the_table_does_not_list_is_refused() -> None:
    rec = _recovery()
    # a NACK is only sent for a FINISH: RECEIVING never moves to NACKED
    with pytest.raises(ProtocolStateError, match="phase RECEIVING cannot move it to NACKED"):
        rec._move(ReceivePhase.NACKED, "NACK timer")
    assert rec.phase is ReceivePhase.RECEIVING
    assert issubclass(ProtocolStateError, DLCPError)


def test_the_timer_does_not_nack_a_message_without_a_finish() -> None:
    rec = _recovery()
    _arrive(rec, range(5), now=0.0)
    assert _timer(rec, 1.0) == [] and rec.phase is ReceivePhase.RECEIVING


def test_the_table_lets_every_live_phase_and_no_ended_one_complete() -> None:
    # (on_complete checks its move to DONE inline, on this property of the table)
    from dlcp.proto.recovery import _RECEIVE_MOVES

    for phase in ReceivePhase:
        ended = phase in (ReceivePhase.DONE, ReceivePhase.FAILED, ReceivePhase.CANCELLED)
        assert (ReceivePhase.DONE in _RECEIVE_MOVES[phase]) is not ended, phase
