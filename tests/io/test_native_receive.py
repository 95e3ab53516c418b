"""The native receive path (``dlcp.io.native_receive``: the receive loop scatters
the runs of registered messages itself) against the Python run path
(``Inbox._receive_run``): fed the same datagrams, a session whose runs go
through the C table ends in exactly the state of one whose runs go through
Python: output bytes, reassembly state, counters, rejects, meter and events.
Loss, reordering, duplicates, forged and foreign datagrams mixed into runs, a
message that completes mid-call, completion by the bound, a message cancelled
while its data arrives, and one whose receive names its buffer late, plain and
authenticated (the table's tag checks themselves: ``test_native_receive_auth.py``;
its own calls: ``test_native_receive_table.py``)."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.io import native_receive
from dlcp.io.native_receive import MessageRuns, hand_over
from dlcp.io.udp import RECEIVE_STEP_BYTES, DataSockets
from dlcp.proto.events import ControlDatagram, DataBatch, MessageReceived
from dlcp.proto.receive_paths import Taken
from dlcp.proto.session import Session
from dlcp.proto.wire import DATA_HEADER_LEN
from tests.proto.session_helpers import JOB, assert_same_messages, config
from tests.proto.test_receive_run import _mutate

pytestmark = pytest.mark.skipif(
    not native_receive.available(), reason="the native receive path was not built"
)

STEP, MSG = 3, 5
NOW = 1.0
#: the pair key of authenticated sessions here, and an outsider's
KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))

needs_tags = pytest.mark.skipif(
    not native_receive.verifies_tags(), reason="the native receive path verifies no tags"
)


def message(
    n_elems: int,
    *,
    seed: int,
    msg: int = MSG,
    job: int = JOB,
    p: float | None = None,
    key: bytes | None = None,
) -> tuple[list[bytes], list[bytes]]:
    """Every data datagram of one message in send order (classes mixed), and the
    sender's control datagrams that followed them (its FINISH); tagged under
    ``key`` if given."""
    tx = Session(
        rank=0,
        job=job,
        config=config(classifier="combined", pacer="unpaced", authenticate=key is not None),
        key=key,
    )
    data = np.random.default_rng(seed).standard_normal(n_elems).astype(np.float32)
    tx.send_message(1, data, step=STEP, msg=msg, now=0.0, p=p)
    grams: list[bytes] = []
    control: list[bytes] = []
    for item in tx.datagrams_to_send(now=0.0, max_batches=1 << 20):
        if isinstance(item, DataBatch):
            raw = bytes(item.data)
            seg = item.segment_size
            grams += [raw[i : i + seg] for i in range(0, len(raw), seg)]
        elif isinstance(item, ControlDatagram):
            control.append(item.data)
    return grams, control


def receiver(key: bytes | None = None, **cfg: object) -> Session:
    """Rank 1, authenticating with ``key`` if given; ``cfg``: more protocol settings."""
    return Session(
        rank=1, job=JOB, config=config(authenticate=key is not None, **cfg), key=key
    )


class Native:
    """A session whose runs go through a C table, fed as the receive loop feeds it."""

    def __init__(self, key: bytes | None = None, **cfg: object) -> None:
        self.session = receiver(key, **cfg)
        self.runs = MessageRuns(JOB)
        self.session.take_runs_natively(self.runs)
        self.native = 0  # datagrams the table took
        self.handovers: Counter[int] = Counter()  # by kind

    def taken(self, taken: list[Taken]) -> None:
        self.native += sum(t[3] for t in taken)
        self.session.receive_taken(taken, now=NOW)

    def rest(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        self.session.receive_rest(buf, segment_size, now=NOW)

    def feed(self, runs: list[tuple[list[bytes], int]]) -> None:
        """The runs, back to back in one receive buffer, staged as recv_runs gives them."""
        buf = np.zeros(sum(len(g) for gs, _ in runs for g in gs) + 64, np.uint8)
        staged, at = [], 0
        for grams, seg in runs:
            raw = b"".join(grams)
            buf[at : at + len(raw)] = np.frombuffer(raw, np.uint8)
            staged.append((at, at + len(raw), seg))
            at += len(raw)
        self.runs.table.stage(buf, staged)

        def deliver(b: npt.NDArray[np.uint8], seg: int) -> None:
            self.session.receive_batch(b, seg, now=NOW)

        table = self.runs.table

        class Counting:  # (the table, counting its handovers by kind)
            @staticmethod
            def next(b: npt.NDArray[np.uint8]) -> tuple[tuple[int, ...] | None, list[Taken]]:
                handover, taken = table.next(b)
                if handover is not None:
                    self.handovers[handover[3]] += 1
                return handover, taken

        hand_over(Counting, buf, deliver, self)


class Pair:
    """Two receivers fed the same bytes: runs through the C table, runs through Python."""

    def __init__(
        self, n_elems: int, *, expect: bool, key: bytes | None = None, **cfg: object
    ) -> None:
        self.native = Native(key, **cfg)
        self.python = receiver(key, **cfg)
        self.outs: list[npt.NDArray[np.float32] | None] = []
        for s in self.sessions:
            out = np.full(n_elems, np.nan, np.float32) if expect else None
            if expect:
                s.expect_message(0, step=STEP, msg=MSG, out=out)
            self.outs.append(out)

    @property
    def sessions(self) -> tuple[Session, Session]:
        return self.native.session, self.python

    def feed(self, runs: list[tuple[list[bytes], int]]) -> None:
        self.native.feed(runs)
        for grams, seg in runs:
            self.python.receive_batch(np.frombuffer(b"".join(grams), np.uint8).copy(), seg, now=NOW)
        self.check()

    def control(self, datagrams: list[bytes]) -> None:
        for s in self.sessions:
            for d in datagrams:
                s.receive_datagram(d, now=NOW)
        self.check()

    def check(self) -> None:
        f, s = self.native.session._inbox, self.python._inbox
        native_stats, python_stats = dataclasses.asdict(f.stats), dataclasses.asdict(s.stats)
        # (a posted message's first datagrams are taken by the table, where Python's
        # first path takes them, which does not count them fast: that count alone
        # may be higher, and only where a receive was posted)
        fast = native_stats.pop("datagrams_fast") - python_stats.pop("datagrams_fast")
        assert native_stats == python_stats
        assert fast == 0 or (fast > 0 and self.outs[0] is not None)
        assert f._meter._bytes == s._meter._bytes
        assert f._last_data == s._last_data
        assert f._incoming.keys() == s._incoming.keys()
        # every message under way is registered, and those still expected whose
        # receive posted their buffer, and only those
        posted = sum(want.posted is not None for want in f._expected.values())
        assert len(self.native.runs) == len(f._incoming) + posted
        assert_same_messages(f, s, times=True)
        control = [[c.data for c in s._ctx.control] for s in self.sessions]
        assert control[0] == control[1]


def expect_both(native: Native, python: Session, n: int) -> list[npt.NDArray[np.float32]]:
    """Both sessions expect the message into buffers of their own (returned)."""
    outs = [np.empty(n, np.float32), np.empty(n, np.float32)]
    for s, out in zip((native.session, python), outs, strict=True):
        s.expect_message(0, step=STEP, msg=MSG, out=out)
    return outs


def read_from_socket(
    native: Native, arriving: list[bytes], *, require_auth: bool = False, tag_len: int = 0
) -> dict[str, int]:
    """``arriving`` sent to a loopback socket and read by the whole receive loop
    (pre-filter, then the C table) into ``native``; what the pre-filter dropped."""
    socks = DataSockets("127.0.0.1", 0, 1, gso="off", gro="off", rcvbuf=32 << 20, sndbuf=1 << 20)
    try:
        socks.screen(job=JOB, require_auth=require_auth, tag_len=tag_len, in_kernel=False)
        socks.runs = native.runs
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for g in arriving:
                tx.sendto(g, socks.address)

        def deliver(b: npt.NDArray[np.uint8], seg: int) -> None:
            native.session.receive_batch(b, seg, now=NOW)

        while socks.receive(deliver, taken=native):
            pass
    finally:
        socks.close()
    return socks.take_screened()


def assert_same_stats(native: Native, python: Session, n_grams: int) -> dict[str, object]:
    """Both sessions' counters agree but for the run path's own count (in Python,
    one datagram a run: the run path takes none but itself); the table took more
    than half of the ``n_grams`` datagrams. The native session's counters."""
    f, s = dataclasses.asdict(native.session.stats), dataclasses.asdict(python.stats)
    assert f.pop("datagrams_fast") >= native.native > n_grams // 2
    s.pop("datagrams_fast")
    assert f == s
    return f


def cut(rng: np.random.Generator, grams: list[bytes], others: list[bytes], seg: int,
        *, mutate: bool) -> list[tuple[list[bytes], int]]:  # fmt: skip
    """``grams`` in runs of 1-60 datagrams (mutated), a short datagram only last."""
    runs, at = [], 0
    while at < len(grams):
        size = int(rng.integers(1, 60))
        run = grams[at : at + size]
        at += size
        for _ in range(int(rng.integers(0, 3)) if mutate else 0):
            run = _mutate(rng, run, others)
        shorts = [g for g in run if len(g) != seg]
        run = [g for g in run if len(g) == seg] + shorts[:1]
        if mutate and rng.random() < 0.1:  # truncated last datagram
            run[-1] = run[-1][: int(rng.integers(1, len(run[-1])))]
        runs.append((run, seg))
    return runs


AUTH = [None, pytest.param(KEY, marks=needs_tags)]
AUTH_IDS = ["plain", "authenticated"]


@pytest.mark.parametrize("key", AUTH, ids=AUTH_IDS)
@pytest.mark.parametrize("expect", [True, False], ids=["posted", "unexpected"])
def test_clean_message_is_taken_by_the_table(key: bytes | None, expect: bool) -> None:
    """Authenticated, the table verifies each tag and writes the payload without
    the trailer: the output is the data sent, bit for bit. A message whose receive
    was posted with its buffer is registered then, and the table takes even its
    first run; an unexpected one opens with its first datagram, in Python, which
    takes the rest of that run."""
    n = 20_000
    grams, _ = message(n, seed=1, key=key)
    seg = len(grams[0])
    pair = Pair(n, expect=expect, key=key)
    assert len(pair.native.runs) == (1 if expect else 0)
    pair.feed([(grams[:5], seg)])
    runs = [(grams[i : i + 17], seg) for i in range(5, len(grams), 17)]
    pair.feed(runs[:10])
    pair.feed(runs[10:])
    assert pair.native.native == len(grams) - (0 if expect else 5)
    assert pair.native.session._inbox.stats.datagrams_fast == len(grams) - (0 if expect else 1)
    want = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    if expect:
        assert pair.outs[0] is not None and pair.outs[0].tobytes() == want.tobytes()
    else:
        event = pair.native.session.next_event()
        assert isinstance(event, MessageReceived) and event.data.tobytes() == want.tobytes()
    assert len(pair.native.runs) == 0  # completed: removed


@pytest.mark.parametrize("key", AUTH, ids=AUTH_IDS)
@pytest.mark.parametrize("expect", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_mutated_runs_of_two_messages_end_in_the_same_state(
    seed: int, expect: bool, key: bytes | None
) -> None:
    """Duplicates, reordering, corrupted and truncated datagrams, retransmission and
    LAST flags, garbage, datagrams of another message and of another job, in runs
    of one receive buffer; a second message under way at the same time.
    Authenticated, every change to a datagram fails its tag (auth_failed)."""
    rng = np.random.default_rng(seed)
    n = 30_011  # a short last chunk
    grams, _ = message(n, seed=seed, key=key)
    second, _ = message(9_000, seed=seed + 300, msg=MSG + 2, key=key)
    others = (
        message(4_000, seed=seed + 100, msg=MSG + 1, key=key)[0]
        + message(4_000, seed=seed + 200, job=JOB + 1, key=key)[0]
    )
    seg = len(grams[0])
    others = [g for g in others if len(g) == seg]
    pair = Pair(n, expect=expect, key=key)
    pair.feed([(grams[:2], seg), (second[:1], seg)])
    runs = cut(rng, grams[2:], others, seg, mutate=True)
    runs += cut(rng, second[1:], others, seg, mutate=True)
    rng.shuffle(runs)  # type: ignore[arg-type]
    while runs:
        k = int(rng.integers(1, 6))
        pair.feed(runs[:k])
        runs = runs[k:]
    assert pair.native.native > len(grams) // 2
    kinds = pair.native.handovers
    assert kinds[native_receive.TAKE_WHOLE] and kinds[native_receive.TAKE_REST], kinds


def test_a_message_that_completes_mid_call_takes_nothing_behind_it() -> None:
    """The run that completes a message is followed, in the same receive buffer, by
    more of its datagrams (late: not written, counted late) and by a new
    message's (opened by Python, then taken by the table)."""
    n = 3_072  # whole chunks: no short last datagram
    grams, _ = message(n, seed=7)
    later, _ = message(5_000, seed=8, msg=MSG + 1)
    seg = len(grams[0])
    pair = Pair(n, expect=True)
    pair.feed([(grams[:1], seg)])
    pair.feed([
        (grams[1:20], seg),
        (grams[20:] + grams[3:9], seg),  # completes it; duplicates behind, same run
        (grams[9:15], seg),  # late
        (later[:3], seg),
        (later[3:40], seg),
        (grams[15:16], seg),  # late
        (later[40:], seg),
    ])  # fmt: skip
    stats = pair.native.session._inbox.stats
    assert stats.late_packets == 7
    assert pair.native.handovers[native_receive.TAKE_CHECK] == 2  # each completion
    assert len(list(pair.native.session._inbox._events)) == 2
    assert len(pair.native.runs) == 0


def test_a_finish_before_any_data_leaves_the_tables_counts_whole() -> None:
    """A posted receive whose FINISH overtook all of its data: the table's first
    report opens the message, which applies that FINISH; the table's counts must
    still hold what that report took, so that the run which completes the message
    is the last it takes (the duplicates behind it are late, as Python counts them)."""
    n = 20_000
    grams, finish = message(n, seed=24)  # p = 0: complete once every element is in
    seg = len(grams[0])
    pair = Pair(n, expect=True, ordered_paths=False)
    pair.control(finish)
    pair.feed([(grams[:50], seg)])
    pair.feed([(grams[50:], seg), (grams[:10], seg)])  # completes it; duplicates behind
    assert pair.native.session._inbox.stats.late_packets == 10
    assert pair.native.handovers[native_receive.TAKE_CHECK] == 1


def test_completion_by_the_bound_waits_and_takes_what_still_arrives() -> None:
    """With the sender's FINISH in, a message that lost some datagrams completes
    by its bound: its check is due mid-call (SETTLING, then the grace), and the
    runs after it still land."""
    n = 40_000
    grams, finish = message(n, seed=9, p=0.05)
    assert finish
    seg = len(grams[0])
    rng = np.random.default_rng(9)
    droppable = [i for i, g in enumerate(grams[:-1]) if i and g[28] & 0x10]  # (tclass's bit)
    lost = set(rng.choice(droppable, size=len(grams) // 40, replace=False).tolist())
    kept = [g for i, g in enumerate(grams) if i not in lost]
    # (no FINISH tail: with one, the message completes as soon as its last datagram
    # lands, with no grace to wait out)
    pair = Pair(n, expect=True, ordered_paths=False)
    pair.feed([(kept[:1], seg)])
    pair.control(finish)
    runs = [(kept[i : i + 23], seg) for i in range(1, len(kept), 23)]
    pair.feed(runs[: len(runs) // 2])
    pair.feed(runs[len(runs) // 2 :])
    # due once the bound was met, and again after each run that brought data
    assert pair.native.handovers[native_receive.TAKE_CHECK] > 1
    settling = [st.recovery.phase.name for st in pair.python._inbox._incoming.values()]
    assert settling == ["SETTLING"]  # complete by the bound, waiting out the grace
    pair.feed([([grams[i] for i in sorted(lost)[:5]], seg)])  # late arrivals still land
    for s in pair.sessions:
        s.handle_timer(now=NOW + 10)
    pair.check()
    assert len(list(pair.native.session._inbox._events)) == 1


def test_a_message_cancelled_while_its_data_arrives() -> None:
    n = 20_000
    grams, _ = message(n, seed=11)
    seg = len(grams[0])
    pair = Pair(n, expect=True)
    pair.feed([(grams[:1], seg), (grams[1:30], seg)])
    assert len(pair.native.runs) == 1
    for s in pair.sessions:
        assert s.cancel(0, step=STEP, msg=MSG, outgoing=False)
    assert len(pair.native.runs) == 0
    out = pair.outs[0]
    assert out is not None
    before = out.copy()
    pair.feed([(grams[30:60], seg), (grams[60:], seg)])  # late: nothing written
    assert out.tobytes() == before.tobytes()
    assert pair.native.session._inbox.stats.late_packets == len(grams) - 30


@pytest.mark.parametrize("n", [50_000, 250_000])
def test_a_receive_buffer_read_from_the_socket(n: int) -> None:
    """The whole loop: datagrams read from a loopback socket, pre-filtered and taken
    in C, against the same datagrams through the Python run path. 250,000 elements
    (1 MB in 3,907 datagrams) take several of the loop's 256 KB steps, and the
    first datagram of another message, two steps in, makes a step hand the rest
    of its run to Python mid-call."""
    grams, _ = message(n, seed=13)
    other, _ = message(100, seed=14, msg=MSG + 1)
    junk = [b"\x00" * 100, grams[5][: DATA_HEADER_LEN - 1]]
    later = min(len(grams), 2_000)
    arriving = grams[:later] + other[:1] + grams[later:]
    sent = arriving[:40] + junk + arriving[40:]
    python = Session(rank=1, job=JOB, config=config())
    native = Native()
    outs = expect_both(native, python, n)
    assert read_from_socket(native, sent) == {"bad_version": 1, "truncated": 1}
    for g in arriving:
        python.receive_batch(np.frombuffer(g, np.uint8), len(g), now=NOW)
    want = np.random.default_rng(13).standard_normal(n).astype(np.float32)
    assert outs[0].tobytes() == outs[1].tobytes() == want.tobytes()
    assert_same_stats(native, python, len(grams))
    if n * 4 > 3 * RECEIVE_STEP_BYTES:  # (the table took more than two steps' worth)
        assert native.native > 2 * RECEIVE_STEP_BYTES // len(grams[0])


# ------------------------------------------------------------------ a registered message


def registered(n_elems: int = 1000) -> tuple[MessageRuns, Session, npt.NDArray[np.float32]]:
    session = Session(rank=1, job=JOB, config=config())
    runs = MessageRuns(JOB)
    session.take_runs_natively(runs)
    out = np.zeros(n_elems, np.float32)
    session.expect_message(0, step=STEP, msg=MSG, out=out)
    return runs, session, out


# ------------------------------------------------------------------ endpoints


@pytest.mark.parametrize("key", AUTH, ids=AUTH_IDS)
@pytest.mark.parametrize("on", [True, False], ids=["native", "python-run-path"])
def test_endpoints_deliver_the_same_with_the_native_path_on_and_off(
    on: bool, key: bytes | None
) -> None:
    """Two endpoints on loopback: messages arrive exact either way; the native path
    takes datagrams of the messages under way when on, none when off (the
    diagnostic setting), and the table is empty once they completed; the same
    authenticated (the table verifies the tags). The receiver counts every data
    datagram the sender sent once, across receive calls and steps. (25 MB messages: more than one
    receive call's budget, so that each is under way, registered, when later
    calls read its data, however the reads batch.)"""
    from dlcp.io import Endpoint, EndpointConfig
    from dlcp.proto.config import ProtocolConfig
    from tests.io.endpoint_helpers import JOB as EP_JOB
    from tests.io.endpoint_helpers import LocalStore

    store = LocalStore()
    cfg = EndpointConfig(
        native_receive=on, protocol=ProtocolConfig(authenticate=key is not None)
    )
    a = Endpoint(0, store=store, world_size=2, job=EP_JOB, config=cfg, key=key)
    b = Endpoint(1, store=store, world_size=2, job=EP_JOB, config=cfg, key=key)
    try:
        data = np.random.default_rng(15).standard_normal(6_250_000).astype(np.float32)
        out = np.empty_like(data)
        for i in range(2):
            got = b.recv(src=0, msg=i, step=2, out=out)
            a.send(data, to=1, msg=i, step=2).result(timeout=30)
            got.result(timeout=30)
            assert out.tobytes() == data.tobytes()
        stats = b.stats()
        assert stats["native_receive"] is on
        assert stats["rejected"] == {}
        if on:
            assert 0 < stats["datagrams_native"] <= stats["datagrams_fast"]
            assert b._data.runs is not None and len(b._data.runs) == 0
        else:
            assert stats["datagrams_native"] == 0 and b._data.runs is None
        # every data datagram a sent is counted once at b (or dropped by b's
        # kernel); a resent one may still be crossing once the futures are done
        deadline = time.monotonic() + 10.0
        while True:
            rx, tx = b.stats(), a.stats()
            counted = rx["datagrams_in"] - rx["control_in"] + rx["socket_drops"]
            if counted == tx["packets_out"] or time.monotonic() > deadline:
                break
            time.sleep(0.01)  # (polling b's counters: they must reach a's count)
        assert counted == tx["packets_out"], (rx, tx)
    finally:
        a.close()
        b.close()
