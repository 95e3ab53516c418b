"""The receive admission rules of ``dlcp.proto.inbox`` (its module docstring),
each checked on every path that can meet it: the run path (``_receive_run``, the
C kernel), the first path (``_receive_first``) and the general path
(``_receive_parsed``). A path is forced by turning the others off, so the same
datagrams go through each in turn and must leave the same accounting."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dlcp.proto import kernels
from dlcp.proto.control import Abort, AbortReason, decode_control
from dlcp.proto.ended import Ended, Outcome
from dlcp.proto.inbox import OPEN_MESSAGE_BYTES
from dlcp.proto.session import Session
from dlcp.proto.wire import DATA_HEADER_LEN
from tests.proto.session_helpers import JOB, config
from tests.proto.test_receive_run import MSG, STEP, message_datagrams

KEY = (0, STEP, MSG)
N_ELEMS = 3000  # float32: 12000 bytes, several datagrams
#: the paths a datagram can take; "run" needs the C kernel
PATHS = ["run", "first", "general"]


def _receiver(
    monkeypatch: pytest.MonkeyPatch, path: str, *, peers: tuple[int, ...] | None = None,
    **cfg: object,
) -> Session:  # fmt: skip
    """A receiver whose new messages open by ``path`` ("run": first path, then
    the run path for the rest) and whose later datagrams take ``path``."""
    if path == "run" and not kernels.ACCELERATED:
        pytest.skip("C accelerator not built")
    s = Session(rank=1, job=JOB, config=config(**cfg), peers=peers)
    inbox = s._inbox
    if path in ("first", "general"):
        monkeypatch.setattr(inbox, "_receive_run", lambda *a, **k: 0)
    if path == "general":
        monkeypatch.setattr(inbox, "_receive_first", lambda *a, **k: False)
    return s


def _feed(s: Session, grams: list[bytes], *, now: float = 0.0) -> None:
    """Each datagram on its own (so every one of them meets the path under test)."""
    for g in grams:
        s.receive_batch(np.frombuffer(g, np.uint8), len(g), now=now)


def _grams() -> list[bytes]:
    grams = message_datagrams(N_ELEMS, seed=1)
    assert len(grams) >= 4
    return grams


def _meter_bytes(s: Session) -> dict[int, int]:
    return dict(s._inbox._meter._bytes)


def _aborts(s: Session) -> list[Abort]:
    msgs = [decode_control(c.data, job=JOB) for c in s._ctx.control]
    return [m for m in msgs if isinstance(m, Abort)]


# ------------------------------------------------------------------ rule 1: count


@pytest.mark.parametrize("path", PATHS)
def test_rule_count_every_datagram_once_in_datagrams_and_bytes(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    grams = _grams()[:-1]  # (not the last: the message stays under way)
    s = _receiver(monkeypatch, path)
    _feed(s, grams)
    assert s.stats.datagrams_in == len(grams)
    assert s.stats.bytes_in == sum(map(len, grams))
    # only the run path counts as fast, and it took all but the opening datagram
    assert s.stats.datagrams_fast == (len(grams) - 1 if path == "run" else 0)


@pytest.mark.parametrize("path", ["first", "general"])
def test_rule_count_includes_datagrams_rejected_on_the_wire(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    bad = bytearray(_grams()[0])
    bad[2:4] = (JOB + 1).to_bytes(2, "big")  # another job's
    s = _receiver(monkeypatch, path)
    _feed(s, [bytes(bad)])
    assert s.stats.datagrams_in == 1 and s.stats.bytes_in == len(bad)
    assert s.stats.rejected == {"wrong_job": 1}


# ------------------------------------------------------------------ rule 2: peer


@pytest.mark.parametrize("path", PATHS)
def test_rule_peer_a_stranger_is_rejected_and_touches_nothing(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    grams = _grams()
    s = _receiver(monkeypatch, path, peers=(2,))  # rank 0 is not a peer
    _feed(s, grams)
    inbox = s._inbox
    assert s.stats.rejected == {"unknown_peer": len(grams)}
    assert s.stats.datagrams_in == len(grams) and s.stats.datagrams_fast == 0
    assert not inbox._incoming and not inbox._ended and not inbox._last_data
    assert inbox._unexpected_bytes == 0 and _meter_bytes(s) == {}


@pytest.mark.parametrize("path", PATHS)
def test_rule_peer_notes_when_its_data_last_arrived(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    grams = _grams()
    s = _receiver(monkeypatch, path)
    _feed(s, grams[:1], now=1.0)
    _feed(s, grams[1:2], now=2.5)
    assert s._inbox._last_data == {0: 2.5}


# ------------------------------------------------------------------ rule 3: ended


def _ended_by(how: str, s: Session, grams: list[bytes]) -> None:
    if how == "completed":
        _feed(s, grams)
    elif how == "cancelled":
        _feed(s, grams[:1])
        assert s.cancel(0, step=STEP, msg=MSG, outgoing=False)
    else:  # refused: it would pass max_unexpected_bytes
        _feed(s, grams[:1])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("how", ["completed", "cancelled", "refused"])
def test_rule_ended_late_datagrams_are_counted_and_open_nothing(
    monkeypatch: pytest.MonkeyPatch, path: str, how: str
) -> None:
    grams = _grams()
    limit = {"max_unexpected_bytes": 100} if how == "refused" else {}
    s = _receiver(monkeypatch, path, **limit)  # type: ignore[arg-type]
    _ended_by(how, s, grams)
    inbox = s._inbox
    assert inbox._ended[KEY].outcome is Outcome(how)
    metered, late = _meter_bytes(s), s.stats.late_packets
    _feed(s, grams, now=1.0)
    assert s.stats.late_packets == late + len(grams)
    assert KEY not in inbox._incoming and _meter_bytes(s) == metered
    assert inbox._last_data == {0: 1.0}  # still the peer's data (rule 2)


# ------------------------------------------------------------------ rule 4: open


@pytest.mark.parametrize("path", ["first", "general"])
def test_rule_open_an_unexpected_message_is_charged_its_buffer_and_state(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    s = _receiver(monkeypatch, path)
    _feed(s, _grams()[:1])
    assert s._inbox._unexpected_bytes == N_ELEMS * 4 + OPEN_MESSAGE_BYTES
    assert s._inbox._incoming[KEY].unexpected_bytes == N_ELEMS * 4 + OPEN_MESSAGE_BYTES


@pytest.mark.parametrize("path", ["first", "general"])
def test_rule_open_an_awaited_message_with_out_is_not_charged(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    s = _receiver(monkeypatch, path, max_unexpected_bytes=100)  # (could not fit)
    out = np.zeros(N_ELEMS, np.float32)
    s.expect_message(0, step=STEP, msg=MSG, out=out)
    _feed(s, _grams()[:1])
    assert KEY in s._inbox._incoming and s._inbox._unexpected_bytes == 0
    assert s._inbox._incoming[KEY].expected


@pytest.mark.parametrize("path", ["first", "general"])
def test_rule_open_past_the_limit_an_unexpected_message_is_refused(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    s = _receiver(monkeypatch, path, max_unexpected_bytes=N_ELEMS * 4)  # not the state too
    _feed(s, _grams()[:1])
    inbox = s._inbox
    assert s.stats.rejected == {"unexpected_overflow": 1}
    assert inbox._ended[KEY] == Ended(Outcome.REFUSED) and inbox._unexpected_bytes == 0
    assert [(a.reason, a.by_receiver) for a in _aborts(s)] == [(AbortReason.UNCLAIMED_LIMIT, True)]


@pytest.mark.parametrize("path", ["first", "general"])
def test_rule_open_past_the_limit_an_awaited_message_waits(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # awaited without out=: charged, so refused datagrams, but the receive stays
    s = _receiver(monkeypatch, path, max_unexpected_bytes=N_ELEMS * 4)
    s.expect_message(0, step=STEP, msg=MSG)
    _feed(s, _grams()[:1])
    assert s.stats.rejected == {"unexpected_overflow": 1}
    assert s._inbox.expects(KEY) and KEY not in s._inbox._ended and _aborts(s) == []


def _seq(gram: bytes) -> int:
    return int.from_bytes(gram[12:16], "big")


def _is_last(gram: bytes) -> bool:
    return bool(gram[1] & 0x01)


@pytest.mark.parametrize("path", ["first", "general"])
def test_rule_open_a_header_without_geometry_opens_nothing(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # the last datagram gives the chunk size as offset / seq: not a whole one
    (last,) = [g for g in _grams() if _is_last(g)]
    bad = bytearray(last)
    assert _seq(last) > 1
    bad[16:20] = (int.from_bytes(bad[16:20], "big") - 1).to_bytes(4, "big")
    s = _receiver(monkeypatch, path)
    _feed(s, [bytes(bad)])
    assert s.stats.rejected == {"geometry": 1}
    assert not s._inbox._incoming and s._inbox._unexpected_bytes == 0


# ------------------------------------------------------------------ rule 5: land


def _run_each(
    monkeypatch: pytest.MonkeyPatch, grams: list[bytes], check: Callable[[Session], object]
) -> list[object]:
    paths = PATHS if kernels.ACCELERATED else PATHS[1:]
    results = []
    for path in paths:
        with monkeypatch.context() as m:
            s = _receiver(m, path)
            _feed(s, grams)
            results.append(check(s))
    return results


def test_rule_land_every_written_datagram_is_metered_alike_on_every_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grams = _grams()[:-1]
    metered = _run_each(monkeypatch, grams, _meter_bytes)
    assert metered[0] == {0: sum(map(len, grams))}  # header and payload of each
    assert all(m == metered[0] for m in metered)


def test_rule_land_a_duplicate_is_metered_not_written_and_completes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grams = _grams()
    twice = grams[:2] + grams[1:2] + grams[2:-1]  # the second datagram twice

    def seen(s: Session) -> tuple[int, int, int, bool]:
        r = s._inbox._incoming[KEY].reassembler
        return r.duplicates, r.received_elems, _meter_bytes(s)[0], r.is_complete()

    results = _run_each(monkeypatch, twice, seen)
    dups, received, metered, complete = results[0]
    assert dups == 1 and not complete
    assert metered == sum(map(len, twice))
    assert all(r == results[0] for r in results)
    assert received < N_ELEMS


@pytest.mark.parametrize("path", PATHS)
def test_rule_land_fresh_data_runs_the_completion_check(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    s = _receiver(monkeypatch, path)
    _feed(s, _grams())
    assert s._inbox._ended[KEY].outcome is Outcome.COMPLETED
    assert s._inbox._ended[KEY].received_elems == N_ELEMS and KEY not in s._inbox._incoming


def test_a_misfit_in_a_batch_is_rejected_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    grams = sorted((g for g in _grams() if not _is_last(g)), key=_seq)
    s = _receiver(monkeypatch, "general")
    _feed(s, grams[:1])
    forged = bytearray(grams[2])
    forged[16:20] = (int.from_bytes(forged[16:20], "big") - 1).to_bytes(4, "big")  # off by one
    batch = grams[1] + bytes(forged) + grams[3]
    seg = len(grams[1])
    assert seg > DATA_HEADER_LEN and len(batch) == 3 * seg
    s.receive_batch(np.frombuffer(batch, np.uint8), seg, now=0.0)
    assert s.stats.rejected == {"geometry": 1}
    r = s._inbox._incoming[KEY].reassembler
    here = [_seq(g) for g in (grams[0], grams[1], grams[3])]
    assert r.received[here].all() and not r.received[_seq(grams[2])]
