"""What :class:`dlcp.proto.session.Session` puts on the wire and what it accepts:
priority order and TOS, path spraying, rate feedback, unknown peers,
authentication and hostile input, over the in-memory link (see test_session.py)."""

import heapq

import numpy as np
import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.control import (
    Abort,
    AbortReason,
    Finish,
    Nack,
    RateFeedback,
    Stop,
    decode_control,
    encode_control,
)
from dlcp.proto.recovery import MAX_NACK_PARTS
from dlcp.proto.session import (
    ControlDatagram,
    DataBatch,
    MessageFailed,
    MessageReceived,
    Session,
)
from dlcp.proto.wire import MAX_NACK_RANGES, DataHeader, Flags, TosMap, encode_data
from tests.proto.session_helpers import (
    CHUNK,
    JOB,
    KEY,
    config,
    events,
    gradient,
    is_droppable,
    is_retransmit,
    layer_segments,
    only_delivered,
    only_received,
    partial_then,
    same_bits,
    seq_of,
    sessions,
)

# ----------------------------------------------------------------------------- priorities, TOS


def data_batches(items: list) -> list[DataBatch]:
    return [i for i in items if isinstance(i, DataBatch)]


def datagrams(batch: DataBatch) -> list[bytes]:
    raw = batch.data.tobytes()
    return [raw[i : i + batch.segment_size] for i in range(0, len(raw), batch.segment_size)]


def _message_order(same_step: bool) -> list[tuple[int, int]]:
    """(step, msg) of each data batch: a low-class message sent before a
    high-class one, in one step or in two."""
    cfg = config(pacer="unpaced", batch_packets=8, classifier="layer")
    a, _ = sessions(cfg=cfg)
    n = 3000
    # layer 7 of 8 is priority class 0 (front layers are the most urgent)
    a.send_message(1, gradient(n, 21), step=0, msg=1, now=0.0, segments=[(0, n, 7)])
    a.send_message(1, gradient(n, 22), step=0 if same_step else 1, msg=2, now=0.0)  # class 7
    batches = data_batches(a.datagrams_to_send(now=0.0, max_batches=1000))
    for bt in batches:
        prio = 7 if int.from_bytes(datagrams(bt)[0][8:10], "big") == 2 else 0
        assert bt.tos == (8 * prio) << 2 | 0b10  # DSCP CSx, ECT(0): protected
        assert bt.dst == 1
        assert all(d[28] >> 5 == prio and not is_droppable(d) for d in datagrams(bt))
    return [
        (int.from_bytes(d[4:8], "big"), int.from_bytes(d[8:10], "big"))
        for d in (datagrams(bt)[0] for bt in batches)
    ]


def test_a_higher_priority_message_of_another_step_leaves_first_with_its_tos() -> None:
    order = _message_order(same_step=False)
    n_high = order.count((1, 2))
    assert n_high > 1 and order.count((0, 1)) > 1
    assert order == [(1, 2)] * n_high + [(0, 1)] * (len(order) - n_high)


def test_messages_of_one_step_leave_in_the_order_they_were_sent() -> None:
    """A collective call is one step whose later messages depend on its earlier
    ones: a ring's all-gather message overtaking its last reduce-scatter one
    (a higher class for its chunks' layers) stalled every rank behind it."""
    order = _message_order(same_step=True)
    n_low = order.count((0, 1))
    assert n_low > 1 and order.count((0, 2)) > 1
    assert order == [(0, 1)] * n_low + [(0, 2)] * (len(order) - n_low)


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
    a.send_message(
        1, gradient(n, 23), step=0, msg=0, now=0.0, segments=layer_segments(n, 8), p=0.05
    )
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


def test_no_chunk_is_drop_eligible_when_the_bound_cannot_absorb_one() -> None:
    """A dropped drop-eligible chunk that the bound cannot absorb is sent again:
    with p = 0, or a message whose p * elements is less than one chunk, the
    sender marks nothing drop-eligible (a switch would only drop it first)."""
    cfg = config(pacer="unpaced", classifier="combined", classifier_options={"drop_fraction": 0.5})
    for n, p, any_droppable in ((20000, 0.0, False), (1000, 0.05, False), (2000, 0.05, True)):
        a, _ = sessions(cfg=cfg)  # chunks of 64 elements: 0.05 * 1000 = 50 < 64 <= 100
        a.send_message(1, gradient(n, 5), step=0, msg=0, now=0.0, p=p)
        grams = [d for bt in data_batches(a.datagrams_to_send(now=0.0)) for d in datagrams(bt)]
        assert len(grams) == -(-n * 4 // CHUNK)
        assert any(is_droppable(d) for d in grams) == any_droppable, (n, p)


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
    weights = a._outbox.peers[1].paths.effective_weights
    assert weights[2] < 0.5 * np.delete(weights, 2).min()


# ----------------------------------------------------------------------------- rate feedback


@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_a_receiver_that_nacks_a_sender_withholds_its_idle_claim_from_it(loss: float) -> None:
    """The receiver's NACK to a sender (its data went missing on the way) makes its
    rate meter report what arrives from that sender, without the idle claim
    (RateMeter.withhold_claim); a sender whose data all arrived keeps the claim."""
    a, b = sessions()
    link = LossyLink([a, b], loss=loss, seed=31)
    a.send_message(1, gradient(40_000, 31), step=0, msg=0, now=0.0)
    link.run()
    (got,) = events(link, MessageReceived)
    assert (got.report.nack_rounds > 0) == (loss > 0)
    assert (0 in b._inbox._meter._plain_until) == (loss > 0)


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
    cfg = config(payload_bytes=1024, rate_interval=0.0005, lone_rate_interval=0.0005)
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
            assert fb.interval_us >= 500  # (the window measured: due every 500 us)
            rates.append(fb.bytes_per_s)
    assert len(rates) > 10
    # the receiver measures the bottleneck ...
    assert np.median(rates) == pytest.approx(bottleneck, rel=0.2)
    # ... and the sender's pacer follows it down from its initial 1.25 GB/s
    rate = a._outbox.peers[1].pacer.rate
    assert bottleneck <= rate <= 2 * bottleneck


def test_rate_feedback_raises_the_pacer_rate() -> None:
    a, _ = sessions()
    a.send_message(1, gradient(1000, 27), step=0, msg=0, now=0.0)
    before = a._outbox.peers[1].pacer.rate
    fb = RateFeedback(0, 0, 1, bytes_per_s=int(4e9), interval_us=5000)
    a.receive_datagram(encode_control(fb, job=JOB), now=0.001)
    assert a._outbox.peers[1].pacer.rate == pytest.approx(1.25 * 4e9)
    assert a._outbox.peers[1].pacer.rate > before


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
    a.receive_datagram(encode_control(stop, job=JOB, key=wrong_key, nonce=1), now=now)
    a.receive_datagram(encode_control(stop, job=JOB), now=now)  # no tag at all
    abort = Abort(3, 1, 0, reason=AbortReason.CANCELLED)
    forged = bytearray(encode_control(abort, job=JOB, key=KEY, nonce=2))
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


def test_retransmitted_drop_eligible_chunks_travel_protected() -> None:
    """A drop-eligible chunk resent in answer to a NACK is one the bound needs:
    its batch carries the protected TOS (a WRED-by-colour switch would shed it
    first again, round after round), while its header keeps the chunk's class
    (the receiver counts protected chunks by it) and gets RETRANSMIT."""
    cfg = config(pacer="unpaced", classifier="combined", classifier_options={"drop_fraction": 0.5})
    a, b = sessions(cfg=cfg)
    n = 20000
    out = np.empty(n, np.float32)
    b.expect_message(0, step=0, msg=0, out=out, p=0.05)
    a.send_message(1, gradient(n, 31), step=0, msg=0, now=0.0, p=0.05)
    first = a.datagrams_to_send(now=0.0, max_batches=1000)
    first += a.datagrams_to_send(now=0.0, max_batches=1000)  # (the FINISH, after the data)
    assert any(is_droppable(d) for bt in data_batches(first) for d in datagrams(bt))
    for bt in data_batches(first):
        assert bt.tos & 0b11 == (0b00 if is_droppable(datagrams(bt)[0]) else 0b10)
        for d in datagrams(bt):
            if not is_droppable(d):  # the network sheds every drop-eligible packet
                b.receive_batch(np.frombuffer(d, np.uint8), len(d), now=0.0)
    for item in first:
        if isinstance(item, ControlDatagram):
            b.receive_datagram(item.data, now=0.0)
    b.handle_timer(now=1.0)  # the reorder grace is over: NACK
    for item in b.datagrams_to_send(now=1.0):
        a.receive_datagram(item.data, now=1.0)
    resent = data_batches(a.datagrams_to_send(now=1.0, max_batches=1000))
    grams = [(bt, d) for bt in resent for d in datagrams(bt)]
    assert grams and all(is_retransmit(d) for _, d in grams)
    assert any(is_droppable(d) for _, d in grams)  # the bound needs some of them back
    assert all(bt.tos == 0b10 | (cfg.tos.dscp[d[28] >> 5] << 2) for bt, d in grams)


def test_a_rounds_finish_leaves_in_the_call_that_hands_out_its_last_batch() -> None:
    """The FINISH goes after its round's data in the same call: a driver that
    stops after a few calls (the endpoint's does, after 8) held it until a timer
    or an input woke it (the FINISH timer: 200 ms when the data was lost)."""
    a, _ = sessions(cfg=config(pacer="unpaced", batch_packets=1))
    a.send_message(1, np.ones(512 * CHUNK // 4, np.float32), step=1, msg=1, now=0.0)
    calls = []
    while items := a.datagrams_to_send(now=0.0, max_batches=64):
        calls.append(items)
    assert len(calls) == 8  # 512 one-packet batches, 64 per call
    last = calls[-1]
    assert all(isinstance(i, DataBatch) for i in last[:-1])
    assert isinstance(last[-1], ControlDatagram)
    assert isinstance(decode_control(last[-1].data, job=JOB), Finish)


def test_an_abort_after_only_the_finish_keeps_late_data_from_starting_the_message() -> None:
    """The FINISH can overtake its data; an ABORT then finds only that FINISH.
    It used to be ignored (no such message), and the data still on the way
    started the message again (delivered here, though its sender gave up)."""
    a, b = sessions(cfg=config(pacer="unpaced"))
    a.send_message(1, gradient(3000, 35), step=1, msg=1, now=0.0)
    items = a.datagrams_to_send(now=0.0, max_batches=1000)
    finish = [i for i in items if isinstance(i, ControlDatagram)]
    assert len(finish) == 1
    b.receive_datagram(finish[0].data, now=0.0)
    abort = Abort(1, 1, 0, reason=AbortReason.CANCELLED)
    b.receive_datagram(encode_control(abort, job=JOB), now=0.0)
    grams = [d for bt in data_batches(items) for d in datagrams(bt)]
    for d in grams:
        b.receive_batch(np.frombuffer(d, np.uint8), len(d), now=0.001)
    assert b.stats.late_packets == len(grams) > 0
    kinds = []
    while (ev := b.next_event()) is not None:
        kinds.append(type(ev).__name__)
    assert kinds == ["MessageFailed"], kinds  # (a receive posted later hears why)


MERGED = MAX_NACK_RANGES * MAX_NACK_PARTS  # the ranges a NACK of every part carries


@pytest.mark.parametrize("ranges", [MERGED - 1, MERGED])
def test_a_nack_with_merged_ranges_is_not_taken_for_path_loss(ranges: int) -> None:
    """A receiver with more gaps than a NACK carries merges them: the merged
    ranges name chunks that arrived too. The sender took them all for lost and
    marked its paths lossy; now it counts each range's first and last chunk (a
    lower bound), here: one range per missing chunk, so the same estimate."""
    a, _ = sessions(cfg=config(pacer="unpaced", n_paths=2, payload_bytes=16))
    chunks = 2 * ranges + 2
    a.send_message(1, np.ones(4 * chunks, np.float32), step=1, msg=1, now=0.0)
    while a.datagrams_to_send(now=0.0, max_batches=1000):
        pass
    gaps = [(2 * i, 1) for i in range(ranges)]  # (first seq, count): every other chunk
    if ranges == MERGED:  # merged: each range spans three chunks, one of them here
        gaps = [(2 * i, 3) for i in range(ranges)]
    for k in range(0, ranges, MAX_NACK_RANGES):
        part = Nack(1, 1, 1, round=0, needed_elems=4, ranges=tuple(gaps[k : k + MAX_NACK_RANGES]),
                    more=k + MAX_NACK_RANGES < ranges)  # fmt: skip
        a.receive_datagram(encode_control(part, job=JOB), now=0.01)
    # (half of what each path sent is lost: one chunk in two, the paths alternate
    # by batch; the estimate moves a loss_alpha step towards that)
    loss = a._outbox.peers[1].paths.loss
    assert np.allclose(loss, 0.15, rtol=0.01), loss  # (0.3 when merged ranges counted whole)


def test_an_abort_before_anything_of_the_message_fails_a_receive_posted_later() -> None:
    """A sender whose call failed aborts a message the receiver has not asked for
    yet and of which nothing arrived (the receiver is late to the call). The
    ABORT used to be dropped as stale, and the receive posted later waited out
    its whole timeout for data that never came."""
    _, b = sessions(cfg=config(pacer="unpaced"))
    abort = Abort(1, 1, 0, reason=AbortReason.CANCELLED)
    b.receive_datagram(encode_control(abort, job=JOB), now=0.0)
    assert b.stats.stale_control == 0
    ev = b.next_event()
    assert isinstance(ev, MessageFailed)
    assert (ev.peer, ev.step, ev.msg, ev.outgoing) == (0, 1, 1, False)
    assert "sender aborted the message (cancelled)" in ev.reason
    # data of it still on the way does not start it again
    a, _ = sessions(cfg=config(pacer="unpaced"))
    a.send_message(1, gradient(3000, 35), step=1, msg=1, now=0.0)
    grams = [d for bt in data_batches(a.datagrams_to_send(now=0.0)) for d in datagrams(bt)]
    for d in grams:
        b.receive_batch(np.frombuffer(d, np.uint8), len(d), now=0.001)
    assert b.stats.late_packets == len(grams) > 0
    assert b.next_event() is None
    # a repeated ABORT of the ended message is stale
    b.receive_datagram(encode_control(abort, job=JOB), now=0.002)
    assert b.stats.stale_control == 1
