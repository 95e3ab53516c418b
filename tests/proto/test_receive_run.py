"""The receive fast path (``Inbox._receive_run``, the C ``scatter_run``) against
the general path (``parse_batch`` + ``Reassembler.scatter``): for clean runs and
for runs with duplicates, reordering, retransmissions, corrupted, truncated and
foreign datagrams, a session with the fast path ends in exactly the state of one
without it: output bytes, reassembly state, counters, rejects and events; with
authentication too (the fast path then takes the runs whose tags verify)."""

import dataclasses

import numpy as np
import pytest

from dlcp.proto import kernels
from dlcp.proto.events import DataBatch
from dlcp.proto.session import Session
from dlcp.proto.wire import DATA_HEADER_LEN, Flags
from tests.proto.session_helpers import JOB, KEY, assert_same_messages, config

pytestmark = pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")

STEP, MSG = 3, 5


def message_datagrams(
    n_elems: int, *, seed: int, msg: int = MSG, job: int = JOB, key: bytes | None = None
) -> list[bytes]:
    """Every data datagram of one message, in send order (classes mixed: the
    magnitude classifier marks a share of them drop-eligible), tagged with ``key``."""
    cfg = config(classifier="combined", authenticate=key is not None)
    tx = Session(rank=0, job=job, config=cfg, key=key)
    data = np.random.default_rng(seed).standard_normal(n_elems).astype(np.float32)
    tx.send_message(1, data, step=STEP, msg=msg, now=0.0)
    out: list[bytes] = []
    for item in tx.datagrams_to_send(now=0.0, max_batches=1 << 20):
        if isinstance(item, DataBatch):
            raw = bytes(item.data)
            out += [raw[i : i + item.segment_size] for i in range(0, len(raw), item.segment_size)]
    return out


class Pair:
    """Two receivers fed the same bytes, one with the fast path and one without."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, n_elems: int, *, expect: bool, key: bytes | None
    ) -> None:
        cfg = config(authenticate=key is not None)
        self.fast = Session(rank=1, job=JOB, config=cfg, key=key)
        self.slow = Session(rank=1, job=JOB, config=cfg, key=key)
        monkeypatch.setattr(self.slow._inbox, "_receive_run", lambda *a, **k: 0)
        self.taken = 0
        run = self.fast._inbox._receive_run

        def counting(*a: object, **k: object) -> int:
            got = run(*a, **k)  # type: ignore[arg-type]
            self.taken += got
            return got

        monkeypatch.setattr(self.fast._inbox, "_receive_run", counting)
        self.outs = []
        for s in (self.fast, self.slow):
            out = np.full(n_elems, np.nan, np.float32) if expect else None
            if expect:
                s.expect_message(0, step=STEP, msg=MSG, out=out)
            self.outs.append(out)

    def feed(self, datagrams: list[bytes], segment_size: int) -> None:
        buf = np.frombuffer(b"".join(datagrams), np.uint8)
        for s in (self.fast, self.slow):
            s.receive_batch(buf.copy(), segment_size, now=1.0)
        self.check()

    def check(self) -> None:
        f, s = self.fast._inbox, self.slow._inbox  # their stats are the sessions'
        fast_stats, slow_stats = dataclasses.asdict(f.stats), dataclasses.asdict(s.stats)
        assert fast_stats.pop("datagrams_fast") == self.taken
        assert slow_stats.pop("datagrams_fast") == 0
        assert fast_stats == slow_stats
        assert f._meter._bytes == s._meter._bytes
        assert_same_messages(f, s)


KEYS = [None, KEY]


@pytest.mark.parametrize("key", KEYS, ids=["plain", "authenticated"])
def test_clean_message_is_taken_by_the_fast_path(
    monkeypatch: pytest.MonkeyPatch, key: bytes | None
) -> None:
    n = 20_000
    grams = message_datagrams(n, seed=1, key=key)
    seg = len(grams[0])
    pair = Pair(monkeypatch, n, expect=True, key=key)
    pair.feed(grams[:300], seg)  # the first datagram starts the message (general path)
    for i in range(300, len(grams), 17):
        pair.feed(grams[i : i + 17], seg)
        if i == 300:  # nothing, or less than a header: counted as truncated either way
            pair.feed([b""], seg)
            pair.feed([grams[i][:20]], seg)
    # everything after the first datagram went through the kernel (authenticating
    # too: the general path verifies the first alone, and the run path takes the
    # rest of its run)
    assert pair.taken == len(grams) - 1
    assert pair.fast.next_event() is not None and pair.fast.next_event() is None
    assert pair.outs[0] is not None
    want = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    assert pair.outs[0].tobytes() == want.tobytes()


def _mutate(rng: np.random.Generator, run: list[bytes], others: list[bytes]) -> list[bytes]:
    run = list(run)
    kind = rng.integers(8)
    i = int(rng.integers(len(run)))
    if kind == 0:  # duplicates
        run.insert(i, run[int(rng.integers(len(run)))])
    elif kind == 1:  # reordered
        rng.shuffle(run)  # type: ignore[arg-type]
    elif kind == 2:  # a header byte corrupted
        b = bytearray(run[i])
        b[int(rng.integers(DATA_HEADER_LEN))] ^= 1 << int(rng.integers(8))
        run[i] = bytes(b)
    elif kind == 3:  # a payload byte corrupted: detected by the tag only
        b = bytearray(run[i])
        b[DATA_HEADER_LEN + int(rng.integers(len(b) - DATA_HEADER_LEN))] ^= 0xFF
        run[i] = bytes(b)
    elif kind == 4:  # a datagram of another message (or job) mid-run
        run.insert(i, others[int(rng.integers(len(others)))])
    elif kind == 5:  # retransmission flag
        b = bytearray(run[i])
        b[1] |= Flags.RETRANSMIT
        run[i] = bytes(b)
    elif kind == 6:  # a garbage datagram of the right size
        run.insert(i, rng.integers(0, 256, len(run[0]), dtype=np.uint8).tobytes())
    else:  # the LAST flag flipped
        b = bytearray(run[i])
        b[1] ^= Flags.LAST
        run[i] = bytes(b)
    return run


@pytest.mark.parametrize("key", KEYS, ids=["plain", "authenticated"])
@pytest.mark.parametrize("expect", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_mutated_runs_end_in_the_same_state(
    monkeypatch: pytest.MonkeyPatch, seed: int, expect: bool, key: bytes | None
) -> None:
    rng = np.random.default_rng(seed)
    n = 30_011  # a short last chunk
    grams = message_datagrams(n, seed=seed, key=key)
    others = message_datagrams(4_000, seed=seed + 100, msg=MSG + 1, key=key) + message_datagrams(
        4_000, seed=seed + 200, job=JOB + 1, key=key
    )
    seg = len(grams[0])
    others = [g for g in others if len(g) == seg]
    pair = Pair(monkeypatch, n, expect=expect, key=key)
    pair.feed(grams[:2], seg)
    at = 2
    while at < len(grams):
        size = int(rng.integers(1, 60))
        run = grams[at : at + size]
        at += size
        for _ in range(int(rng.integers(0, 3))):
            run = _mutate(rng, run, others)
        # only the last datagram of a run may be short: a GRO read ends there
        shorts = [g for g in run if len(g) != seg]
        run = [g for g in run if len(g) == seg] + shorts[:1]
        if rng.random() < 0.1:  # truncated last datagram
            run[-1] = run[-1][: int(rng.integers(1, len(run[-1])))]
        pair.feed(run, seg)
    # the kernel did take part; what it did not take went the general way (with
    # tags, a mutated datagram also ends the verified prefix of its run)
    assert pair.taken > len(grams) // (2 if key is None else 4)


def test_a_forged_first_datagram_opens_nothing_and_the_rest_of_its_run_still_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # authenticated, the general path verifies a new message's first datagram
    # alone; a forged one is rejected there, the rest of its read takes the
    # general path, where the datagram after it opens the message (the same end
    # state as without the run path), and later reads take the run path
    n = 5_000
    grams = message_datagrams(n, seed=4, key=KEY)
    seg = len(grams[0])
    forged = bytearray(grams[0])
    forged[DATA_HEADER_LEN] ^= 0x01
    pair = Pair(monkeypatch, n, expect=True, key=KEY)
    pair.feed([bytes(forged), *grams[1:40]], seg)
    stats = pair.fast._inbox.stats
    assert stats.datagrams_in == 40 and sum(stats.rejected.values()) == 1
    assert pair.taken == 0
    pair.feed(grams[:1] + grams[40:], seg)
    assert pair.taken == len(grams) - 39
    want = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    assert pair.outs[0] is not None and pair.outs[0].tobytes() == want.tobytes()
