"""The first datagram of a new message (``Inbox._receive_first``, plain integers)
against the general path (``parse_batch`` + ``Inbox._start_incoming`` +
``Reassembler.scatter``): clean, corrupted, truncated, foreign, duplicated and
refused first datagrams leave a session in exactly the state the general path
leaves it in: output bytes, reassembly state, counters, rejects, events and the
control messages queued."""

import numpy as np
import pytest

from dlcp.proto.config import FillPolicy
from dlcp.proto.control import Finish, encode_control
from dlcp.proto.session import Session
from dlcp.proto.wire import DATA_HEADER_LEN, Flags
from tests.proto.session_helpers import JOB, config
from tests.proto.test_receive_run import MSG, STEP, Pair, message_datagrams


class FirstPair(Pair):
    """Two receivers fed the same bytes, one of which starts every message the
    general way (and neither takes the C fast path, so the first datagram of a
    batch is the one the two differ on)."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        n_elems: int,
        *,
        expect: bool,
        out_dtype: type = np.float32,
        peers: tuple[int, ...] | None = None,
        fill: FillPolicy | None = None,
        **cfg: object,
    ) -> None:
        sessions = [Session(rank=1, job=JOB, config=config(**cfg), peers=peers) for _ in range(2)]
        self.fast, self.slow = sessions
        self.taken = 0
        self.first = 0
        for s in sessions:
            monkeypatch.setattr(s._inbox, "_receive_run", lambda *a, **k: 0)
        monkeypatch.setattr(self.slow._inbox, "_receive_first", lambda *a, **k: False)
        first = self.fast._inbox._receive_first

        def counting(*a: object, **k: object) -> bool:
            took = first(*a, **k)  # type: ignore[arg-type]
            self.first += took
            return took

        monkeypatch.setattr(self.fast._inbox, "_receive_first", counting)
        self.outs = []
        for s in sessions:
            out = np.full(n_elems, 7, out_dtype) if expect else None
            if expect:
                s.expect_message(0, step=STEP, msg=MSG, out=out, fill=fill)
            self.outs.append(out)

    def feed(self, datagrams: list[bytes], segment_size: int) -> None:
        super().feed(datagrams, segment_size)
        a, b = self.fast._inbox, self.slow._inbox
        assert a._unexpected_bytes == b._unexpected_bytes
        assert a._ended == b._ended
        assert a._last_data == b._last_data
        assert a._expected.keys() == b._expected.keys()
        assert a._orphan_finish.keys() == b._orphan_finish.keys()
        assert [c.data for c in self.fast._ctx.control] == [c.data for c in self.slow._ctx.control]
        for key, state in a._incoming.items():
            ra, rb = state.reassembler, b._incoming[key].reassembler
            for name in ("n_chunks", "chunk_elems", "bound", "allowed_loss", "last_activity"):
                assert getattr(ra, name) == getattr(rb, name), name
            assert state.recovery.timer == b._incoming[key].recovery.timer
        for ea, eb in zip(list(a._events), list(b._events), strict=True):
            assert type(ea) is type(eb)
            if hasattr(ea, "reason"):
                assert ea == eb


def _flip(gram: bytes, byte: int, bit: int) -> bytes:
    b = bytearray(gram)
    b[byte] ^= 1 << bit
    return bytes(b)


@pytest.mark.parametrize("n", [1, 3, 64, 1000, 30_011])
@pytest.mark.parametrize("expect", [True, False])
def test_clean_first_datagram(monkeypatch: pytest.MonkeyPatch, n: int, expect: bool) -> None:
    grams = message_datagrams(n, seed=n)
    seg = len(grams[0])
    pair = FirstPair(monkeypatch, n, expect=expect)
    pair.feed(grams[:1], seg)
    assert pair.first == 1
    pair.feed(grams[1:], seg)  # the rest, the general way in both
    pair.feed(grams[:2], seg)  # late copies
    if n * 4 <= 256:  # one datagram: the message completed on it
        assert pair.fast.next_event() is not None


@pytest.mark.parametrize("seed", range(40))
def test_mutated_first_datagram(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 5, 64, 65, 3000]))
    grams = message_datagrams(n, seed=seed)
    others = message_datagrams(100, seed=seed + 1, msg=MSG + 1) + message_datagrams(
        100, seed=seed + 2, job=JOB + 1
    )
    seg = max(len(g) for g in grams)
    pair = FirstPair(monkeypatch, n, expect=bool(rng.integers(2)))
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(grams)))
        first = grams[i]
        kind = int(rng.integers(7))
        if kind == 0:  # a header bit flipped
            first = _flip(first, int(rng.integers(DATA_HEADER_LEN)), int(rng.integers(8)))
        elif kind == 1:  # truncated
            first = first[: int(rng.integers(1, len(first)))]
        elif kind == 2:  # a datagram of another message or job
            first = others[int(rng.integers(len(others)))]
        elif kind == 3:  # flags: retransmission, LAST, AUTH (without a tag)
            first = _flip(first, 1, int(rng.integers(3)))
        elif kind == 4:  # padded: longer than its payload says
            first = first + b"\0" * int(rng.integers(1, 16))
        # (else: as sent)
        run = [first, *grams[i + 1 : i + int(rng.integers(1, 5))]]
        run = [g for g in run[:-1] if len(g) == seg] + run[-1:]
        pair.feed(run, seg)
    pair.feed(grams, seg)


@pytest.mark.parametrize("byte", range(DATA_HEADER_LEN))
def test_every_header_bit_of_the_first_datagram(monkeypatch: pytest.MonkeyPatch, byte: int) -> None:
    grams = message_datagrams(200, seed=byte)  # four chunks, the last one short
    seg = len(grams[0])
    for i in (0, 1, 3):
        for bit in range(8):
            pair = FirstPair(monkeypatch, 200, expect=bit % 2 == 0)
            pair.feed([_flip(grams[i], byte, bit)], seg)
            pair.feed(grams, seg)


def test_refused_first_datagrams(monkeypatch: pytest.MonkeyPatch) -> None:
    grams = message_datagrams(1000, seed=3)
    seg = len(grams[0])
    # from a rank that is not a peer
    pair = FirstPair(monkeypatch, 1000, expect=False, peers=(2,))
    pair.feed(grams[:1], seg)
    assert pair.fast.stats.rejected == {"unknown_peer": 1}
    # beyond the budget for unexpected messages
    pair = FirstPair(monkeypatch, 1000, expect=False, max_unexpected_bytes=100)
    pair.feed(grams[:1], seg)
    pair.feed(grams[1:2], seg)
    # refused once (its sender is told: ABORT UNCLAIMED_LIMIT); the rest of it is late
    assert pair.fast.stats.rejected == {"unexpected_overflow": 1}
    assert pair.fast.stats.late_packets == 1
    # into a buffer of the wrong size or type: refused, the message still expected
    # (the sender's FINISH fails it if no packet fits: test_session_edges.py)
    for n, dtype in ((999, np.float32), (1000, np.float16)):
        pair = FirstPair(monkeypatch, n, expect=True, out_dtype=dtype)
        pair.feed(grams[:1], seg)
        assert pair.fast.stats.rejected == {"geometry": 1}
        assert pair.fast.next_event() is None
        assert not pair.fast._inbox._incoming and pair.fast._inbox._expected
    # a LAST packet whose seq and offset give a chunk size that contradicts it
    bad = bytearray(grams[1])
    bad[1] |= Flags.LAST
    pair = FirstPair(monkeypatch, 1000, expect=False)
    pair.feed([bytes(bad)], seg)
    assert pair.fast.stats.rejected == {"geometry": 1}
    assert pair.fast._inbox._incoming  # started all the same, as the general path does
    assert pair.first == 1


@pytest.mark.parametrize("fill", list(FillPolicy))
def test_first_datagram_after_an_orphan_finish(
    monkeypatch: pytest.MonkeyPatch, fill: FillPolicy
) -> None:
    n = 200  # four chunks of 64 elements
    grams = message_datagrams(n, seed=4)
    seg = len(grams[0])
    pair = FirstPair(monkeypatch, n, expect=True, fill=fill)
    finish = Finish(
        STEP, MSG, 0, round=0, total_chunks=4, protected_chunks=0, class_chunks=(0,) * 15 + (4,)
    )
    for s in (pair.fast, pair.slow):
        s.receive_datagram(encode_control(finish, job=JOB), now=0.5)
    pair.feed(grams[-1:], seg)
    assert pair.first == 1
    pair.feed(grams[:1], seg)


@pytest.mark.parametrize("seed", range(30))
def test_parse_batch_fast_check_agrees_with_the_rules(seed: int) -> None:
    """``parse_batch`` accepts a uniform batch by its shortcut exactly when every
    record passes the rules one by one (``batch._validate``)."""
    from dlcp.proto import batch

    rng = np.random.default_rng(seed)
    grams = message_datagrams(int(rng.choice([1, 64, 200, 3000])), seed=seed)
    seg = len(grams[0])
    for _ in range(40):
        at = int(rng.integers(len(grams)))
        run = [bytearray(g) for g in grams[at : at + int(rng.integers(1, 12))]]
        for _ in range(int(rng.integers(0, 3))):
            g = run[int(rng.integers(len(run)))]
            where = int(rng.integers(DATA_HEADER_LEN))
            if where in (1, 8, 9, 12, 13, 14, 15, 16, 17, 18, 19, 24, 25):  # per-packet bytes
                g[where] ^= 1 << int(rng.integers(8))
        size0 = seg
        if rng.random() < 0.3:  # every datagram cut short, its payload_len to match
            cut = int(rng.integers(1, 6))
            size0 -= cut
            for g in run:
                del g[len(g) - cut :]
                g[24:26] = ((int.from_bytes(g[24:26], "big") - cut) % 0x10000).to_bytes(2, "big")
            run = [g for g in run[:-1] if len(g) == size0] + run[-1:]
        raw = b"".join(run)
        if rng.random() < 0.2:
            raw = raw[: len(raw) - int(rng.integers(1, 40))]
        for size in (size0, len(raw) if len(run) == 1 and raw else size0):
            buf = np.frombuffer(raw, np.uint8)
            if not len(buf):
                continue
            parsed = batch.parse_batch(buf, size, job=JOB)
            n = len(parsed.reasons)
            lengths = np.full(n, size, dtype=np.int64)
            lengths[-1] = len(buf) - (n - 1) * size
            want = batch._validate(parsed.headers, lengths, job=JOB, key=None, require_auth=False)
            assert parsed.reasons.tolist() == want.tolist()


def test_parse_batch_misaligned_full_datagrams() -> None:
    from dlcp.proto import batch

    grams = message_datagrams(200, seed=9)  # float32: three full chunks, a short one
    seg = len(grams[0])
    cut = bytearray(grams[1][:-2])
    cut[24:26] = (int.from_bytes(cut[24:26], "big") - 2).to_bytes(2, "big")
    buf = np.frombuffer(bytes(cut) + grams[-1], np.uint8)
    parsed = batch.parse_batch(buf, seg - 2, job=JOB)
    assert parsed.reasons.tolist() == [5, 0]  # LENGTH_MISMATCH: not whole elements
