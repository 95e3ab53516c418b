"""End-to-end behaviour of :class:`dlcp.proto.session.Session` over the in-memory link.

Every test drives real sessions with :class:`dlcp.linkemu.LossyLink` on a virtual
clock with seeded randomness, and checks what a user of the transport sees: the
bytes that arrive, the loss report, the sender's report and the failures.
"""

import itertools

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.config import FillPolicy
from dlcp.proto.session import (
    MessageDelivered,
    MessageFailed,
    MessageReceived,
)
from dlcp.proto.wire import (
    bound_to_wire,
)
from tests.proto.session_helpers import (
    CHUNK,
    cls_of,
    config,
    events,
    gradient,
    has_event,
    is_data,
    is_droppable,
    is_retransmit,
    layer_segments,
    only_delivered,
    only_received,
    partial_then,
    runs,
    same_bits,
    seq_of,
    sessions,
)

# ----------------------------------------------------------------------------- lossless


def random_words(dtype: str, n: int, rng: np.random.Generator) -> npt.NDArray[np.generic]:
    """Arbitrary bit patterns: NaN payloads, infinities, subnormals, -0."""
    if dtype == "float32":
        return rng.integers(0, 2**32, n, dtype=np.uint32).view(np.float32)
    if dtype == "float16":
        return rng.integers(0, 2**16, n, dtype=np.uint16).view(np.float16)
    if dtype == "bfloat16":
        return rng.integers(0, 2**16, n, dtype=np.uint16)
    return rng.integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
def test_lossless_transfer_is_bit_exact_and_fully_acknowledged(dtype: str) -> None:
    rng = np.random.default_rng(1)
    n = 5003  # the last chunk is short for every element size
    x = random_words(dtype, n, rng)
    a, b = sessions()
    with np.errstate(all="ignore"):  # magnitudes of NaN / inf words
        a.send_message(1, x, step=11, msg=3, now=0.0, p=0.0, bfloat16=dtype == "bfloat16")
    link = LossyLink([a, b], seed=1)
    link.run()

    got = only_received(link)
    assert (got.src, got.step, got.msg) == (0, 11, 3)
    assert same_bits(got.data, x)
    rep = got.report
    assert rep.msg_elems == n and rep.received_elems == n
    assert rep.lost_elems == 0 and rep.lost_ranges == () and sum(rep.lost_chunks) == 0
    chunks = -(-n * x.itemsize // CHUNK)
    assert sum(rep.received_chunks) == chunks
    assert rep.retransmitted_chunks == 0 and rep.nack_rounds == 0

    sent = only_delivered(link)
    assert (sent.dst, sent.step, sent.msg) == (1, 11, 3)
    assert sent.report.acknowledged_elems == n == sent.report.msg_elems
    assert sent.report.chunks == chunks == sent.report.sent_packets
    assert sent.report.retransmitted_packets == 0 and sent.report.rounds == 0
    assert not events(link, MessageFailed)
    assert a.get_timer() is None or not a._outbox.peers[1].outgoing


def test_sender_may_reuse_its_buffer_after_send_message() -> None:
    x = gradient(3000, 2)
    keep = x.copy()
    a, b = sessions()
    a.send_message(1, x, step=0, msg=0, now=0.0)
    x[:] = -1.0  # overwritten before anything went out
    link = LossyLink([a, b], seed=2)
    link.run()
    assert same_bits(only_received(link).data, keep)


# ----------------------------------------------------------------------------- many messages


def test_many_messages_in_both_directions_between_three_sessions() -> None:
    cfg = config(n_paths=3, classifier="combined", classifier_options={"drop_fraction": 0.1})
    ss = sessions(3, cfg)
    rng = np.random.default_rng(3)
    sent: dict[tuple[int, int, int], tuple[npt.NDArray[np.generic], float]] = {}
    for m in range(3):  # every message of every pair queued before anything moves
        for src in range(3):
            for dst in range(3):
                if src == dst:
                    continue
                n = int(rng.integers(2000, 6000))
                if m == 2:
                    x: npt.NDArray[np.generic] = rng.standard_normal(n).astype(np.float16)
                else:
                    x = gradient(n, int(rng.integers(1 << 30)))
                p = 0.0 if (src + dst + m) % 2 else 0.05
                ss[src].send_message(dst, x, step=5, msg=m, now=0.0, p=p)
                sent[(src, dst, m)] = (x, p)
    started: set[tuple[int, int, int]] = set()  # (src, msg, msg_elems) seen on the wire

    def tap(d: bytes) -> bool:
        started.add((int.from_bytes(d[26:28], "big"), d[9], int.from_bytes(d[20:24], "big")))
        return False

    link = LossyLink(ss, loss=0.05, reorder=True, duplicate=0.02, seed=3, drop_filter=tap)
    now = link.run(stop_when=has_event(MessageReceived))
    in_flight = len(started)
    link.run(start=now)

    assert in_flight >= 12  # most of the 18 messages were under way before the first completed
    assert not events(link, MessageFailed)
    for (src, dst, m), (x, p) in sent.items():
        rx = [e for e in events(link, MessageReceived, dst) if (e.src, e.msg) == (src, m)]
        tx = [e for e in events(link, MessageDelivered, src) if (e.dst, e.msg) == (dst, m)]
        assert len(rx) == 1 and len(tx) == 1, (src, dst, m)
        rep = rx[0].report
        assert rep.lost_elems <= bound_to_wire(p) * len(x) // 1000
        assert tx[0].report.acknowledged_elems == rep.received_elems
        lost = np.zeros(len(x), bool)
        for off, k in rep.lost_ranges:
            lost[off : off + k] = True
        assert int(lost.sum()) == rep.lost_elems
        assert same_bits(rx[0].data[~lost], x[~lost])
        assert np.all(rx[0].data[lost] == 0)
        if p == 0:
            assert same_bits(rx[0].data, x)


# ----------------------------------------------------------------------------- expect_message


def test_expect_before_data_writes_into_out() -> None:
    x = gradient(20000, 4)
    a, b = sessions()
    out = np.full(len(x), np.nan, np.float32)
    b.expect_message(0, step=1, msg=2, out=out)
    a.send_message(1, x, step=1, msg=2, now=0.0)
    link = LossyLink([a, b], loss=0.02, reorder=True, seed=4)
    link.run()
    got = only_received(link)
    assert got.data is out
    assert same_bits(out, x)


def test_expect_after_data_arrived_moves_it_into_out() -> None:
    x = gradient(20000, 5)
    a, b = sessions()
    a.send_message(1, x, step=1, msg=2, now=0.0)
    link = LossyLink([a, b], loss=0.02, reorder=True, seed=5)
    now = partial_then(link, b)
    assert b.stats.datagrams_in < 313  # only part of the 313 chunks is there
    out = np.zeros(len(x), np.float32)
    b.expect_message(0, step=1, msg=2, out=out)
    link.run(start=now)
    got = only_received(link)
    assert got.data is out
    assert same_bits(out, x)


def test_expect_for_a_completed_message_is_an_error() -> None:
    a, b = sessions()
    a.send_message(1, gradient(500, 6), step=1, msg=2, now=0.0)
    link = LossyLink([a, b], seed=6)
    link.run()
    with pytest.raises(ValueError, match="already completed"):
        b.expect_message(0, step=1, msg=2)


def drop_droppable_round0(d: bytes) -> bool:
    return is_data(d) and is_droppable(d) and not is_retransmit(d)


@pytest.mark.parametrize("when", ["before", "after"])
def test_receiver_bound_stricter_than_sender_wins(when: str) -> None:
    cfg = config(classifier="combined", classifier_options={"drop_fraction": 0.1})
    x = gradient(20000, 7)
    a, b = sessions(cfg=cfg)
    if when == "before":
        b.expect_message(0, step=3, msg=0, p=0.0)
    a.send_message(1, x, step=3, msg=0, now=0.0, p=0.2)
    link = LossyLink([a, b], reorder=True, seed=7, drop_filter=drop_droppable_round0)
    if when == "after":
        now = partial_then(link, b)
        b.expect_message(0, step=3, msg=0, p=0.0)
        link.run(start=now)
    else:
        link.run()
    got = only_received(link)
    assert got.report.bound == 0.0
    assert got.report.lost_elems == 0 and got.report.nack_rounds >= 1
    assert got.report.retransmitted_chunks == 31  # floor(0.1 * 313) drop-eligible chunks
    assert same_bits(got.data, x)


def test_receiver_bound_looser_than_sender_does_not_loosen_it() -> None:
    cfg = config(classifier="combined", classifier_options={"drop_fraction": 0.1})
    x = gradient(20000, 8)
    a, b = sessions(cfg=cfg)
    b.expect_message(0, step=3, msg=0, p=0.25)
    a.send_message(1, x, step=3, msg=0, now=0.0, p=0.0)
    link = LossyLink([a, b], seed=8, drop_filter=drop_droppable_round0)
    link.run()
    got = only_received(link)
    assert got.report.bound == 0.0 and got.report.lost_elems == 0
    assert same_bits(got.data, x)


def lossy_transfer(
    x: npt.NDArray[np.generic],
    *,
    fill: FillPolicy,
    out: npt.NDArray[np.generic] | None = None,
    when: str = "before",
    bfloat16: bool = False,
) -> MessageReceived:
    """Drop every drop-eligible chunk of round 0; p covers them, so the message
    completes with exactly those chunks missing and no retransmission."""
    cfg = config(classifier="combined", classifier_options={"drop_fraction": 0.1})
    a, b = sessions(cfg=cfg)
    if when == "before":
        b.expect_message(0, step=9, msg=1, out=out, fill=fill)
    a.send_message(1, x, step=9, msg=1, now=0.0, p=0.2, bfloat16=bfloat16)
    link = LossyLink([a, b], reorder=True, seed=9, drop_filter=drop_droppable_round0)
    if when == "after":
        now = partial_then(link, b)
        b.expect_message(0, step=9, msg=1, out=out, fill=fill)
        link.run(start=now)
    else:
        link.run()
    got = only_received(link)
    assert got.report.fill is fill
    assert got.report.nack_rounds == 0 and got.report.retransmitted_chunks == 0
    assert 0 < got.report.lost_elems <= 0.2 * len(x)
    assert only_delivered(link).report.acknowledged_elems == got.report.received_elems
    return got


def lost_mask(got: MessageReceived) -> npt.NDArray[np.bool_]:
    mask = np.zeros(got.report.msg_elems, bool)
    for off, k in got.report.lost_ranges:
        mask[off : off + k] = True
    assert int(mask.sum()) == got.report.lost_elems
    return mask


@pytest.mark.parametrize("when", ["before", "after"])
def test_fill_zero(when: str) -> None:
    x = gradient(20000, 10)
    got = lossy_transfer(x, fill=FillPolicy.ZERO, when=when)
    lost = lost_mask(got)
    assert np.all(got.data[lost] == 0) and not np.signbit(got.data[lost]).any()
    assert same_bits(got.data[~lost], x[~lost])
    # the report names exactly the elements that differ from what was sent
    assert runs(got.data.view(np.uint32) != x.view(np.uint32)) == list(got.report.lost_ranges)


@pytest.mark.parametrize("when", ["before", "after"])
def test_fill_previous_keeps_outs_values_where_lost(when: str) -> None:
    x = gradient(20000, 11)
    prev = gradient(20000, 12) + np.float32(100.0)  # differs from x everywhere
    out = prev.copy()
    got = lossy_transfer(x, fill=FillPolicy.PREVIOUS, out=out, when=when)
    assert got.data is out
    lost = lost_mask(got)
    assert same_bits(out[lost], prev[lost])
    assert same_bits(out[~lost], x[~lost])
    assert runs(out.view(np.uint32) != x.view(np.uint32)) == list(got.report.lost_ranges)


def test_fill_previous_needs_out() -> None:
    _, b = sessions()
    with pytest.raises(ValueError, match="previous"):
        b.expect_message(0, step=0, msg=0, fill=FillPolicy.PREVIOUS)


@pytest.mark.parametrize("when", ["before", "after"])
def test_fill_rescale_float32_scales_received_values(when: str) -> None:
    x = gradient(20000, 13)
    got = lossy_transfer(x, fill=FillPolicy.RESCALE, when=when)
    rep = got.report
    lost = lost_mask(got)
    scale = rep.msg_elems / rep.received_elems
    assert scale > 1.0
    assert np.all(got.data[lost] == 0)
    assert same_bits(got.data[~lost], x[~lost] * np.float32(scale))
    # the unbiased-sum relationship: sum(out) = msg_elems / received * sum(received values)
    total = float(got.data.astype(np.float64).sum())
    want = scale * float(x[~lost].astype(np.float64).sum())
    assert total == pytest.approx(want, rel=1e-5, abs=1e-3)


def test_fill_rescale_float16_and_bfloat16_round_to_nearest() -> None:
    x32 = gradient(20000, 14)
    for kind in ("float16", "bfloat16"):
        if kind == "float16":
            x: npt.NDArray[np.generic] = x32.astype(np.float16)
            as32 = x.astype(np.float32)
            tol = 2.0**-10  # the scale and the product are each rounded to float16
        else:
            x = (x32.view(np.uint32) >> 16).astype(np.uint16)
            as32 = (x.astype(np.uint32) << 16).view(np.float32)
            tol = 2.0**-8
        got = lossy_transfer(x, fill=FillPolicy.RESCALE, bfloat16=kind == "bfloat16")
        lost = lost_mask(got)
        scale = got.report.msg_elems / got.report.received_elems
        if kind == "float16":
            out32 = got.data.astype(np.float32)
        else:
            out32 = (got.data.astype(np.uint32) << 16).view(np.float32)
        assert np.all(out32[lost] == 0)
        exact = as32[~lost].astype(np.float64) * scale
        err = np.abs(out32[~lost] - exact)
        assert np.all(err <= tol * np.abs(exact) + 2.0**-24), kind  # 2**-24: float16 subnormals


@pytest.mark.parametrize("problem", ["rescale_uint8", "wrong_size"])
def test_message_that_cannot_go_where_expected_fails_once_on_both_sides(problem: str) -> None:
    x = np.arange(3000, dtype=np.uint8)
    a, b = sessions(cfg=config(classifier="layer"))
    if problem == "rescale_uint8":
        b.expect_message(0, step=0, msg=0, fill=FillPolicy.RESCALE)
    else:
        b.expect_message(0, step=0, msg=0, out=np.zeros(2999, np.uint8))
    a.send_message(1, x, step=0, msg=0, now=0.0)
    link = LossyLink([a, b], loss=0.1, seed=0)
    link.run(until=5.0)
    (failed,) = events(link, MessageFailed, 1)  # once, and no later success with other rules
    assert "rank 0" in failed.reason and not failed.outgoing
    assert ("rescale" if problem == "rescale_uint8" else "does not fit") in failed.reason
    assert not events(link, MessageReceived)
    (gave_up,) = events(link, MessageFailed, 0)  # the sender hears of it
    assert gave_up.outgoing and "receiver aborted" in gave_up.reason
    # no packet was taken: refused while the receive waited for one that fits,
    # the retransmissions after the FINISH had failed it ignored as late
    assert b.stats.rejected.get("geometry", 0) + b.stats.late_packets >= b.stats.datagrams_in - 1
    assert b.stats.rejected.get("geometry", 0) > 0
    with pytest.raises(ValueError, match="already failed"):
        b.expect_message(0, step=0, msg=0)


# ----------------------------------------------------------------------------- loss report


def test_loss_report_matches_what_the_link_dropped() -> None:
    # (the link reorders each path's datagrams: no FINISH tail to trust)
    cfg = config(
        classifier="combined",
        classifier_options={"drop_fraction": 0.25, "n_classes": 4},
        ordered_paths=False,
    )
    n = 16000  # 250 chunks of 64 float32
    x = gradient(n, 15)
    a, b = sessions(cfg=cfg)
    a.send_message(1, x, step=2, msg=4, now=0.0, p=0.2, segments=layer_segments(n, 4))
    class_total = np.zeros(16, int)
    dropped: dict[int, int] = {}  # seq -> class

    def drop(d: bytes) -> bool:
        if is_retransmit(d):
            return False
        class_total[cls_of(d)] += 1
        if seq_of(d) % 7 == 3:
            dropped[seq_of(d)] = cls_of(d)
            return True
        return False

    link = LossyLink([a, b], reorder=True, seed=15, drop_filter=drop)
    link.run()
    rep = only_received(link).report
    got = only_received(link).data

    lost_by_class = np.zeros(16, int)
    protected_dropped = 0
    for _seq, c in dropped.items():
        if c % 2:
            lost_by_class[c] += 1
        else:
            protected_dropped += 1
    assert lost_by_class.sum() > 0 and protected_dropped > 0  # both kinds were hit
    assert len(np.flatnonzero(class_total)) > 2  # several priority classes in play
    assert list(rep.lost_chunks) == lost_by_class.tolist()
    assert list(rep.received_chunks) == (class_total - lost_by_class).tolist()
    lost_seqs = sorted(s for s, c in dropped.items() if c % 2)
    assert rep.lost_elems == 64 * len(lost_seqs)  # the short last chunk (seq 249) is not one
    assert rep.lost_ranges == tuple((s * 64, 64) for s in lost_seqs)
    assert runs(got.view(np.uint32) != x.view(np.uint32)) == list(rep.lost_ranges)
    # the protected chunks were asked for once and resent, nothing else
    assert rep.nack_rounds == 1 and rep.retransmitted_chunks == protected_dropped
    sent = only_delivered(link).report
    assert sent.retransmitted_packets == protected_dropped and sent.rounds == 1
    assert sent.acknowledged_elems == n - rep.lost_elems


# ----------------------------------------------------------------------------- control loss


def test_control_loss_only_costs_time() -> None:
    cfg = config(finish_timeout=0.01, nack_timeout=0.005, finish_retries=60)
    a, b = sessions(cfg=cfg)
    xs = [gradient(4000 + 1000 * i, 16 + i) for i in range(4)]
    for i, x in enumerate(xs):
        a.send_message(1, x, step=0, msg=i, now=0.0)
    b.send_message(0, xs[0], step=0, msg=9, now=0.0)
    link = LossyLink([a, b], loss=0.05, control_loss=0.3, seed=16)
    link.run()
    assert link.stats.control_dropped > 0
    assert not events(link, MessageFailed)
    for i, x in enumerate(xs):
        (got,) = [e for e in events(link, MessageReceived, 1) if e.msg == i]
        assert same_bits(got.data, x)
    assert same_bits(only_received(link, 0).data, xs[0])
    assert len(events(link, MessageDelivered)) == 5


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_all_data_of_round_zero_lost(p: float) -> None:
    """Only the FINISH arrives: the receiver NACKs everything and gets it all."""
    cfg = config(classifier="combined", classifier_options={"drop_fraction": 0.1})
    x = gradient(10000, 17)
    a, b = sessions(cfg=cfg)
    a.send_message(1, x, step=0, msg=0, now=0.0, p=p)
    link = LossyLink([a, b], seed=17, drop_filter=lambda d: is_data(d) and not is_retransmit(d))
    link.run()
    got = only_received(link)
    assert same_bits(got.data, x)
    chunks = -(-len(x) * 4 // CHUNK)
    assert got.report.lost_elems == 0
    assert got.report.retransmitted_chunks == chunks
    sent = only_delivered(link).report
    assert sent.retransmitted_packets == chunks and sent.rounds == 1


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize("peer", ["absent", "black_hole"])
def test_sender_gives_up_on_a_silent_peer(peer: str) -> None:
    cfg = config(finish_timeout=0.05, finish_retries=4)
    a, b = sessions(cfg=cfg)
    a.send_message(1, gradient(2000, 18), step=4, msg=6, now=0.0)
    if peer == "absent":
        link = LossyLink([a], seed=18)
    else:
        link = LossyLink([a, b], control_loss=1.0, drop_filter=lambda d: True, seed=18)
    t = link.run(stop_when=has_event(MessageFailed, 0))
    (failed,) = events(link, MessageFailed, 0)
    assert (failed.peer, failed.step, failed.msg) == (1, 4, 6)
    assert failed.outgoing and failed.peer_timeout
    assert "rank 1" in failed.reason
    assert t == pytest.approx(0.05 * 4, abs=0.005)
    assert not events(link, MessageDelivered)
    assert b.stats.datagrams_in == 0 and not events(link, MessageReceived)


def test_receiver_gives_up_when_the_sender_vanishes() -> None:
    # a small pacer burst, so that the sender is still sending when it vanishes
    cfg = config(recv_idle_timeout=0.5, pacer_options={"burst_bytes": 16384})
    a, b = sessions(cfg=cfg)
    a.send_message(1, gradient(50000, 19), step=4, msg=6, now=0.0)
    link = LossyLink([a, b], seed=19)
    now = partial_then(link, b)
    del link.sessions[0]  # the sender's host dies; what is in flight still lands
    last_arrival = max(t for t, *_ in link._queue) if link._queue else now
    t = link.run(start=now, stop_when=has_event(MessageFailed, 1))
    (failed,) = events(link, MessageFailed, 1)
    assert (failed.peer, failed.step, failed.msg) == (0, 4, 6)
    assert not failed.outgoing and failed.peer_timeout
    assert "rank 0" in failed.reason
    assert last_arrival + 0.5 <= t <= last_arrival + 0.5 + 1e-3
    assert not events(link, MessageReceived)


def test_sender_gives_up_after_max_rounds_and_receiver_is_told() -> None:
    cfg = config(max_rounds=3, classifier="combined", classifier_options={"drop_fraction": 0.5})
    x = gradient(8000, 20)
    a, b = sessions(cfg=cfg)
    # p = 0.05: the bound absorbs whole chunks, so the classifier's drop-eligible
    # ones stay eligible (with p = 0 nothing would be)
    a.send_message(1, x, step=8, msg=1, now=0.0, p=0.05)
    # every protected chunk is lost, every time
    link = LossyLink([a, b], seed=20, drop_filter=lambda d: is_data(d) and not is_droppable(d))
    link.run()
    (failed,) = events(link, MessageFailed, 0)
    assert failed.outgoing and not failed.peer_timeout and failed.peer == 1
    assert "gave up after 3 retransmission rounds" in failed.reason
    (told,) = events(link, MessageFailed, 1)
    assert not told.outgoing and (told.peer, told.step, told.msg) == (0, 8, 1)
    assert "abort" in told.reason
    assert not events(link, MessageReceived) and not events(link, MessageDelivered)


def test_rounds_that_make_progress_do_not_count_towards_giving_up() -> None:
    """Under incast most of every round may be lost while the pacer slows down:
    each round still gets the receiver closer, and the message must not fail
    for that. Here four of every five data datagrams are lost, p = 0, so a
    round that resends one chunk may lose it up to four times in a row: with
    max_rounds=5 the sender gave up after 5 rounds ("receiver still needs ...")
    while every round had brought the receiver closer."""
    cfg = config(max_rounds=5, classifier="layer")
    a, b = sessions(cfg=cfg)
    x = gradient(20000, 36)
    out = np.zeros_like(x)
    b.expect_message(0, step=3, msg=4, out=out)
    a.send_message(1, x, step=3, msg=4, now=0.0)
    seen = itertools.count()
    link = LossyLink([a, b], drop_filter=lambda d: is_data(d) and next(seen) % 5 != 0)
    link.run()
    assert not events(link, MessageFailed, 0) and not events(link, MessageFailed, 1)
    (delivered,) = events(link, MessageDelivered, 0)
    assert delivered.report.rounds > 2 * cfg.max_rounds  # (more rounds than the old limit)
    (got,) = events(link, MessageReceived, 1)
    assert got.report.lost_elems == 0 and np.array_equal(out, x)


def test_protected_chunks_arriving_count_as_progress_with_the_bound_met() -> None:
    """The receiver holds enough elements for its bound but misses protected
    chunks: its NACKs say it needs 0 elements, round after round, while the
    chunks it names get fewer. Every protected datagram of the first round is
    lost, and three of every four resent ones: that is progress, not a stall
    (the sender counted it as none and gave up after max_rounds rounds)."""
    cfg = config(max_rounds=4, classifier="combined", classifier_options={"drop_fraction": 0.9})
    a, b = sessions(cfg=cfg)
    x = gradient(200_000, 37)
    a.send_message(1, x, step=5, msg=6, now=0.0, p=0.2)
    resent = itertools.count()

    def drop(d: bytes) -> bool:
        if not is_data(d) or is_droppable(d):
            return False
        return not is_retransmit(d) or next(resent) % 4 != 0

    link = LossyLink([a, b], drop_filter=drop)
    link.run()
    assert not events(link, MessageFailed, 0) and not events(link, MessageFailed, 1)
    (delivered,) = events(link, MessageDelivered, 0)
    assert delivered.report.rounds > 2 * cfg.max_rounds
    (got,) = events(link, MessageReceived, 1)
    assert got.report.lost_elems == 0  # (the bound was met by elements from round 0 on)


def test_expected_message_the_sender_abandons_before_any_data_fails() -> None:
    """The application that asked for a message hears that it will not come, even
    when not one data packet of it ever arrived."""
    cfg = config(max_rounds=1, classifier="layer")
    a, b = sessions(cfg=cfg)
    out = np.zeros(3000, np.float32)
    b.expect_message(0, step=2, msg=3, out=out)
    a.send_message(1, gradient(3000, 35), step=2, msg=3, now=0.0)
    link = LossyLink([a, b], seed=35, drop_filter=is_data)
    link.run()
    (gave_up,) = events(link, MessageFailed, 0)
    assert gave_up.outgoing and "gave up" in gave_up.reason
    (told,) = events(link, MessageFailed, 1)
    assert (told.peer, told.step, told.msg, told.outgoing) == (0, 2, 3, False)
    assert "aborted" in told.reason
    with pytest.raises(ValueError, match="already failed"):
        b.expect_message(0, step=2, msg=3)
