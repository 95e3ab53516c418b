"""End-to-end behaviour of :class:`dlcp.proto.session.Session` over the in-memory link.

Every test drives real sessions with :class:`dlcp.linkemu.LossyLink` on a virtual
clock with seeded randomness, and checks what a user of the transport sees: the
bytes that arrive, the loss report, the sender's report and the failures.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.config import FillPolicy, ProtocolConfig
from dlcp.proto.session import (
    ControlDatagram,
    DataBatch,
    MessageDelivered,
    MessageFailed,
    MessageReceived,
    Session,
)
from dlcp.proto.wire import (
    Abort,
    AbortReason,
    DataHeader,
    Finish,
    Flags,
    Nack,
    RateFeedback,
    Stop,
    TosMap,
    bound_to_wire,
    decode_control,
    encode_control,
    encode_data,
)

JOB = 7
KEY = bytes(range(32))
CHUNK = 256  # payload bytes per packet: many chunks from small messages


def config(**kw: object) -> ProtocolConfig:
    kw.setdefault("payload_bytes", CHUNK)
    return ProtocolConfig(**kw)  # type: ignore[arg-type]


def sessions(
    n: int = 2, cfg: ProtocolConfig | None = None, key: bytes | None = None
) -> list[Session]:
    cfg = cfg or config()
    return [Session(rank=r, job=JOB, config=cfg, key=key) for r in range(n)]


def events(link: LossyLink, kind: type, rank: int | None = None) -> list:
    return [e for r, e in link.events if isinstance(e, kind) and (rank is None or r == rank)]


def has_event(kind: type, rank: int | None = None) -> Callable[[LossyLink], bool]:
    return lambda link: bool(events(link, kind, rank))


def only_received(link: LossyLink, rank: int = 1) -> MessageReceived:
    got = events(link, MessageReceived, rank)
    assert len(got) == 1, link.events
    return got[0]


def only_delivered(link: LossyLink, rank: int = 0) -> MessageDelivered:
    got = events(link, MessageDelivered, rank)
    assert len(got) == 1, link.events
    return got[0]


def same_bits(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """(offset, length) of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(s), int(e - s)) for s, e in zip(edges[0::2], edges[1::2], strict=True)]


def seq_of(d: bytes) -> int:
    return int.from_bytes(d[12:16], "big")


def is_data(d: bytes) -> bool:
    return len(d) >= 32 and d[0] == 0x11


def is_retransmit(d: bytes) -> bool:
    return bool(d[1] & Flags.RETRANSMIT)


def is_droppable(d: bytes) -> bool:
    return bool(d[28] & 0x10)


def cls_of(d: bytes) -> int:
    """Class index prio * 2 + drop of a data datagram."""
    return (d[28] >> 5) * 2 + ((d[28] >> 4) & 1)


def gradient(n: int, seed: int, *, layers: int = 1) -> npt.NDArray[np.float32]:
    """Nonzero float32 values whose magnitude varies from chunk to chunk."""
    rng = np.random.default_rng(seed)
    scale = np.repeat(rng.uniform(0.01, 10.0, -(-n // 16)), 16)[:n]
    x = rng.standard_normal(n) * scale
    x[x == 0] = 1.0
    return x.astype(np.float32)


def layer_segments(n: int, layers: int) -> list[tuple[int, int, int]]:
    bounds = np.linspace(0, n, layers + 1).astype(int)
    return [(int(bounds[i]), int(bounds[i + 1] - bounds[i]), i) for i in range(layers)]


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
    assert a.get_timer() is None or not a._peers[1].outgoing


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


def partial_then(link: LossyLink, b: Session, at_least: int = 1) -> float:
    """Run until ``b`` holds part of the message (nothing complete yet)."""
    now = link.run(stop_when=lambda _: b.stats.datagrams_in >= at_least)
    assert not events(link, MessageReceived)
    return now


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
    assert b.stats.late_packets > 0  # the rest of the message was ignored
    with pytest.raises(ValueError, match="already failed"):
        b.expect_message(0, step=0, msg=0)


# ----------------------------------------------------------------------------- loss report


def test_loss_report_matches_what_the_link_dropped() -> None:
    cfg = config(classifier="combined", classifier_options={"drop_fraction": 0.25, "n_classes": 4})
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
    a.send_message(1, x, step=8, msg=1, now=0.0, p=0.0)
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


# ----------------------------------------------------------------------------- priorities, TOS


def data_batches(items: list) -> list[DataBatch]:
    return [i for i in items if isinstance(i, DataBatch)]


def datagrams(batch: DataBatch) -> list[bytes]:
    raw = batch.data.tobytes()
    return [raw[i : i + batch.segment_size] for i in range(0, len(raw), batch.segment_size)]


def test_higher_priority_message_leaves_first_with_its_tos() -> None:
    cfg = config(pacer="unpaced", batch_packets=8, classifier="layer")
    a, _ = sessions(cfg=cfg)
    n = 3000
    low = gradient(n, 21)
    high = gradient(n, 22)
    # layer 7 of 8 is priority class 0 (front layers are the most urgent)
    a.send_message(1, low, step=0, msg=1, now=0.0, segments=[(0, n, 7)])
    a.send_message(1, high, step=0, msg=2, now=0.0)  # one layer: class 7
    batches = data_batches(a.datagrams_to_send(now=0.0, max_batches=1000))
    msgs = [int.from_bytes(datagrams(bt)[0][8:10], "big") for bt in batches]
    n_high = msgs.count(2)
    assert n_high > 1 and msgs.count(1) > 1
    assert msgs == [2] * n_high + [1] * (len(msgs) - n_high)
    for bt, m in zip(batches, msgs, strict=True):
        prio = 7 if m == 2 else 0
        assert bt.tos == (8 * prio) << 2 | 0b10  # DSCP CSx, ECT(0): protected
        assert bt.dst == 1
        assert all(d[28] >> 5 == prio and not is_droppable(d) for d in datagrams(bt))


@pytest.mark.parametrize("tos_map", [TosMap(), TosMap((1, 3, 5, 7, 9, 11, 13, 63), 0b01, 0b11)])
def test_batches_go_in_class_order_and_carry_the_class_tos(tos_map: TosMap) -> None:
    cfg = config(
        pacer="unpaced",
        batch_packets=8,
        tos=tos_map,
        classifier="combined",
        classifier_options={"drop_fraction": 0.3},
    )
    a, _ = sessions(cfg=cfg)
    n = 20000
    a.send_message(1, gradient(n, 23), step=0, msg=0, now=0.0, segments=layer_segments(n, 8))
    batches = data_batches(a.datagrams_to_send(now=0.0, max_batches=1000))
    keys = []
    for bt in batches:
        ds = datagrams(bt)
        prio, drop = ds[0][28] >> 5, is_droppable(ds[0])
        assert all((d[28] >> 5, is_droppable(d)) == (prio, drop) for d in ds)
        dscp = tos_map.dscp[prio]
        ecn = tos_map.ecn_droppable if drop else tos_map.ecn_protected
        assert bt.tos == dscp << 2 | ecn
        keys.append((-prio, drop))
    assert keys == sorted(keys)  # highest class first, protected before drop-eligible
    assert len(set(keys)) == 16  # all 8 classes, both kinds
    assert sum(bt.count for bt in batches) == -(-n * 4 // CHUNK)


# ----------------------------------------------------------------------------- paths


def test_batches_are_sprayed_over_all_paths() -> None:
    cfg = config(pacer="unpaced", batch_packets=4, n_paths=4)
    a, _ = sessions(cfg=cfg)
    a.send_message(1, gradient(8000, 24), step=0, msg=0, now=0.0)
    batches = data_batches(a.datagrams_to_send(now=0.0, max_batches=1000))
    assert {bt.path for bt in batches} == {0, 1, 2, 3}
    for bt in batches:
        assert all(d[31] == bt.path for d in datagrams(bt))
    counts = np.bincount([bt.path for bt in batches], minlength=4)
    assert counts.max() - counts.min() <= 1  # equal weights: round robin


def test_lossy_path_loses_its_share() -> None:
    cfg = config(batch_packets=4, n_paths=4)
    a, b = sessions(cfg=cfg)
    link = LossyLink([a, b], loss=[0.0, 0.0, 0.5, 0.0], seed=25)
    shares = []
    now = 0.0
    for m in range(6):
        before = dict(link.stats.per_path_sent)
        a.send_message(1, gradient(8000, 25 + m), step=m, msg=0, now=now)
        now = link.run(start=now)
        after = link.stats.per_path_sent
        sent = np.array([after.get(i, 0) - before.get(i, 0) for i in range(4)], float)
        shares.append(sent / sent.sum())
    assert len(events(link, MessageReceived)) == 6 and not events(link, MessageFailed)
    assert shares[0][2] == pytest.approx(0.25, abs=0.06)  # equal until loss is seen
    last = shares[-1]
    others = np.delete(last, 2)
    assert last[2] < 0.5 * others.min()
    weights = a._peers[1].paths.effective_weights
    assert weights[2] < 0.5 * np.delete(weights, 2).min()


# ----------------------------------------------------------------------------- rate feedback


class BottleneckLink(LossyLink):
    """Delivers data no faster than ``rate`` bytes/s (one serialising queue), and
    records every control datagram."""

    def __init__(self, sessions: list[Session], rate: float, **kw: object) -> None:
        super().__init__(sessions, **kw)  # type: ignore[arg-type]
        self.rate = rate
        self.free_at = 0.0
        self.control: list[tuple[float, int, bytes]] = []

    def transmit(self, src: int, item: DataBatch | ControlDatagram, *, now: float) -> None:
        if isinstance(item, ControlDatagram):
            self.control.append((now, item.dst, item.data))
            super().transmit(src, item, now=now)
            return
        for d in datagrams(item):
            self.free_at = max(self.free_at, now) + len(d) / self.rate
            self.stats.data_sent += 1
            self._order += 1
            heapq.heappush(self._queue, (self.free_at + self.delay, self._order, item.dst, d))


def test_sender_paces_to_the_rate_the_receiver_measures() -> None:
    cfg = config(payload_bytes=1024, rate_interval=0.0005)
    a, b = sessions(cfg=cfg)
    bottleneck = 50e6  # bytes/s, far below the pacer's initial 1.25 GB/s
    link = BottleneckLink([a, b], bottleneck, seed=26)
    xs = [gradient(100_000, 26 + i) for i in range(3)]
    for i, x in enumerate(xs):
        a.send_message(1, x, step=0, msg=i, now=0.0)
    link.run()
    for i, x in enumerate(xs):
        (got,) = [e for e in events(link, MessageReceived) if e.msg == i]
        assert same_bits(got.data, x)
    rates = []
    for _t, dst, raw in link.control:
        if raw[0] & 0x0F == 5:
            fb = decode_control(raw, job=JOB)
            assert isinstance(fb, RateFeedback) and dst == 0 and fb.src == 1
            assert fb.interval_us == 500
            rates.append(fb.bytes_per_s)
    assert len(rates) > 10
    # the receiver measures the bottleneck ...
    assert np.median(rates) == pytest.approx(bottleneck, rel=0.2)
    # ... and the sender's pacer follows it down from its initial 1.25 GB/s
    rate = a._peers[1].pacer.rate
    assert bottleneck <= rate <= 2 * bottleneck


def test_rate_feedback_raises_the_pacer_rate() -> None:
    a, _ = sessions()
    a.send_message(1, gradient(1000, 27), step=0, msg=0, now=0.0)
    before = a._peers[1].pacer.rate
    fb = RateFeedback(0, 0, 1, bytes_per_s=int(4e9), interval_us=5000)
    a.receive_datagram(encode_control(fb, job=JOB), now=0.001)
    assert a._peers[1].pacer.rate == pytest.approx(1.25 * 4e9)
    assert a._peers[1].pacer.rate > before


# ----------------------------------------------------------------------------- peers


def test_data_and_control_from_unknown_peers_are_ignored() -> None:
    cfg = config(finish_timeout=0.01, finish_retries=3)
    stranger = Session(rank=7, job=JOB, config=cfg)
    b = Session(rank=1, job=JOB, config=cfg, peers={0, 1})
    stranger.send_message(1, gradient(3000, 28), step=0, msg=0, now=0.0)
    link = LossyLink([stranger, b], seed=28)
    link.run()
    assert not events(link, MessageReceived)
    (failed,) = events(link, MessageFailed, 7)
    assert failed.peer_timeout
    assert b.stats.rejected == {"unknown_peer": b.stats.datagrams_in}
    assert b.stats.datagrams_in == link.stats.data_sent + link.stats.control_sent
    with pytest.raises(ValueError, match="rank 7"):
        b.send_message(7, gradient(10, 0), step=0, msg=0, now=0.0)
    with pytest.raises(ValueError, match="rank 7"):
        b.expect_message(7, step=0, msg=0)
    with pytest.raises(ValueError, match="rank 1"):
        b.send_message(1, gradient(10, 0), step=0, msg=0, now=0.0)


# ----------------------------------------------------------------------------- authentication


def test_authenticated_transfer() -> None:
    cfg = config(authenticate=True)
    a, b = sessions(cfg=cfg, key=KEY)
    x = gradient(10000, 29)
    a.send_message(1, x, step=0, msg=0, now=0.0)
    b.send_message(0, x[::-1].copy(), step=0, msg=0, now=0.0)
    link = LossyLink([a, b], loss=0.05, reorder=True, seed=29)
    link.run()
    assert same_bits(only_received(link, 1).data, x)
    assert same_bits(only_received(link, 0).data, x[::-1])
    assert not a.stats.rejected and not b.stats.rejected


def test_tampered_and_forged_datagrams_are_rejected_under_authentication() -> None:
    cfg = config(authenticate=True)
    a, b = sessions(cfg=cfg, key=KEY)
    x = gradient(10000, 30)
    a.send_message(1, x, step=3, msg=1, now=0.0)
    captured: list[bytes] = []

    def steal(d: bytes) -> bool:  # seq 5 of round 0 is lost on the way ...
        if seq_of(d) == 5 and not is_retransmit(d):
            captured.append(d)
            return True
        return False

    link = LossyLink([a, b], seed=30, drop_filter=steal)
    now = link.run(stop_when=lambda _: bool(captured))
    # ... and an attacker delivers it with a flipped payload byte instead
    tampered = bytearray(captured[0])
    tampered[40] ^= 0x01
    b.receive_datagram(bytes(tampered), now=now)
    # forged control messages: a STOP that would end the transfer early, an ABORT
    wrong_key = bytes(32)
    stop = Stop(3, 1, 1, received_elems=10000)
    a.receive_datagram(encode_control(stop, job=JOB, key=wrong_key), now=now)
    a.receive_datagram(encode_control(stop, job=JOB), now=now)  # no tag at all
    abort = Abort(3, 1, 0, reason=AbortReason.CANCELLED)
    forged = bytearray(encode_control(abort, job=JOB, key=KEY))
    forged[11] ^= 0x02  # src 0 -> 2 after signing
    b.receive_datagram(bytes(forged), now=now)
    link.run(start=now)

    assert b.stats.rejected == {"auth_failed": 2}
    assert a.stats.rejected == {"auth_failed": 1, "auth_required": 1}
    got = only_received(link)
    assert same_bits(got.data, x)
    assert got.report.retransmitted_chunks == 1
    assert only_delivered(link).report.acknowledged_elems == len(x)


def test_session_with_another_key_accepts_nothing() -> None:
    cfg = config(authenticate=True, finish_timeout=0.01, finish_retries=3)
    a = Session(rank=0, job=JOB, config=cfg, key=KEY)
    b = Session(rank=1, job=JOB, config=cfg, key=bytes(reversed(KEY)))
    a.send_message(1, gradient(3000, 31), step=0, msg=0, now=0.0)
    link = LossyLink([a, b], seed=31)
    link.run()
    assert b.stats.datagrams_in > 0
    assert b.stats.rejected == {"auth_failed": b.stats.datagrams_in}
    assert not events(link, MessageReceived)
    (failed,) = events(link, MessageFailed, 0)
    assert failed.peer_timeout


def test_unauthenticated_session_is_refused_by_an_authenticating_one() -> None:
    plain = Session(rank=0, job=JOB, config=config(finish_timeout=0.01, finish_retries=2))
    b = Session(rank=1, job=JOB, config=config(authenticate=True), key=KEY)
    plain.send_message(1, gradient(2000, 32), step=0, msg=0, now=0.0)
    link = LossyLink([plain, b], seed=32)
    link.run()
    assert b.stats.rejected == {"auth_required": b.stats.datagrams_in}
    assert not events(link, MessageReceived)


# ----------------------------------------------------------------------------- hostile input


def test_last_chunk_claiming_offset_zero_with_a_nonzero_seq_is_rejected() -> None:
    """The first packet of a message decides its chunk size (offset / seq for the
    LAST chunk); offset 0 with seq 5 would mean chunks of 0 elements."""
    _, b = sessions()
    h = DataHeader(
        job=JOB,
        step=3,
        msg=4,
        seq=5,
        offset=0,
        msg_elems=100,
        payload_len=16,
        src=0,
        flags=Flags.LAST,
    )
    b.receive_datagram(encode_data(h, bytes(16)), now=0.0)
    assert b.stats.rejected == {"geometry": 1}
    b.handle_timer(now=100.0)
    assert b.next_event() is None


def test_finish_announcing_zero_chunks_is_rejected() -> None:
    """A wire-valid FINISH for 0 chunks must not make the receiver build an
    invalid NACK (range of 0 chunks) when it NACKs the orphan FINISH."""
    _, b = sessions()
    finish = Finish(3, 4, 0, round=0, total_chunks=0, protected_chunks=0)
    b.receive_datagram(encode_control(finish, job=JOB), now=0.0)
    b.handle_timer(now=1.0)
    assert b.stats.rejected == {"geometry": 1}
    assert b.datagrams_to_send(now=1.0) == []


def test_nack_naming_the_whole_sequence_space_resends_the_message_once() -> None:
    """NACK ranges may name up to 2**32 - 1 chunks; the sender resends what exists
    instead of materialising the range."""
    a, b = sessions(cfg=config(classifier="layer"))
    x = gradient(3000, 33)
    a.send_message(1, x, step=3, msg=4, now=0.0)
    link = LossyLink([a, b], seed=33, drop_filter=lambda d: seq_of(d) == 7 and not is_retransmit(d))
    now = link.run(stop_when=lambda _: b.stats.datagrams_in >= 1)
    out = [i for i in a.datagrams_to_send(now=now) if isinstance(i, DataBatch)]
    assert not out  # round 0 is all out: FINISH went, now NACK it with a giant range
    nack = Nack(3, 4, 1, round=0, needed_elems=0xFFFFFFFF, ranges=((0, 0xFFFFFFFE),))
    a.receive_datagram(encode_control(nack, job=JOB), now=now)
    resent = [i for i in a.datagrams_to_send(now=now) if isinstance(i, DataBatch)]
    assert sum(bt.count for bt in resent) == -(-3000 * 4 // CHUNK)
    link.run(start=now)
    assert same_bits(only_received(link).data, x)


def test_late_packets_of_an_aborted_message_do_not_restart_it() -> None:
    """After a sender's ABORT, retransmissions still in flight are ignored rather
    than starting the message again (which would fail a second time later)."""
    cfg = config(recv_idle_timeout=0.5)
    a, b = sessions(cfg=cfg)
    x = gradient(50000, 34)
    a.send_message(1, x, step=1, msg=1, now=0.0)
    link = LossyLink([a, b], reorder=True, seed=34)
    now = partial_then(link, b)
    in_flight = sum(d[0] == 0x11 for *_, d in link._queue)  # data still on the way
    b.receive_datagram(
        encode_control(Abort(1, 1, 0, reason=AbortReason.CANCELLED), job=JOB), now=now
    )
    link.run(start=now, until=now + 0.1)
    del link.sessions[0]  # the sender is gone too: nothing may keep b busy
    link.run(start=now + 0.1)
    (failed,) = events(link, MessageFailed, 1)
    assert "aborted" in failed.reason
    assert b.stats.late_packets >= in_flight > 0
    assert not events(link, MessageReceived)
