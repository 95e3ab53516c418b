"""Fuzzing the receive path with >= 100,000 random and mutated datagrams.

Two sessions exchange two real messages over the emulated link while garbage is
injected between link steps: mutations of genuine data records and control
messages (bit flips, byte overwrites, truncation, extension, header fields set to
extreme values, random jobs / versions / types), valid-but-absurd control
messages, and pure random bytes; some as single datagrams, most as GRO-style
batches with random segment sizes. Every mutation is generated with numpy in
bulk from a fixed seed.

What must hold:

* ``receive_datagram`` / ``receive_batch`` / timers never raise;
* the codec (``decode_data``, ``decode_control``) raises nothing but ``WireError``,
  and a batch parse gives each record the verdict it gets on its own;
* the session's rejection counts per wire reason equal the codec's verdicts on
  what was fed, and its datagram counter adds up;
* the real transfers complete bit-exact: garbage never disturbs other messages.

Fuzz messages use a (step, msg) that no mutation used here can turn into a real
message's, because without authentication a well-formed datagram for a real
message *is* that message's data.
"""

from __future__ import annotations

import contextlib

import numpy as np
import numpy.typing as npt

from dlcp.linkemu import LossyLink
from dlcp.proto.batch import decode_data, parse_batch
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.control import (
    Abort,
    AbortReason,
    ControlMessage,
    Finish,
    Nack,
    RateFeedback,
    Stop,
    decode_control,
    encode_control,
)
from dlcp.proto.session import DataBatch, MessageReceived, Session
from dlcp.proto.wire import Reason, WireError

JOB = 0x0B0B
REAL_STEP = 12345
FUZZ_STEP = 0xA5A5A5A5
FUZZ_MSG = 0x5A5A
SLICES = 420
PER_SLICE = 250  # 105,000 datagrams in all
WIDTH = 1408  # bytes per generated datagram row (the longest template is 1384)

WIRE_REASONS = {r.name.lower() for r in Reason if r is not Reason.OK}

# (offset, size) of header fields: data, then control
DATA_FIELDS = [
    (0, 1),
    (1, 1),
    (2, 2),
    (4, 4),
    (8, 2),
    (10, 2),
    (12, 4),
    (16, 4),
    (20, 4),
    (24, 2),
    (26, 2),
    (28, 1),
    (29, 1),
    (30, 1),
    (31, 1),
]
CONTROL_FIELDS = [
    (0, 1),
    (1, 1),
    (2, 2),
    (4, 4),
    (8, 2),
    (10, 2),
    (12, 2),
    (14, 2),
    (16, 2),
    (18, 2),
    (20, 4),
    (24, 4),
    (28, 4),
]


def config() -> ProtocolConfig:
    return ProtocolConfig(
        payload_bytes=256,
        classifier="combined",
        classifier_options={"drop_fraction": 0.3},
        pacer_options={"initial_rate": 1.5e6, "min_rate": 1e6, "burst_bytes": 4096},
        batch_packets=4,
        recv_idle_timeout=0.02,  # fuzz-made messages die young
        finish_timeout=0.01,
        max_unexpected_bytes=256 << 20,
    )


# ----------------------------------------------------------------------------- templates


def data_templates() -> list[bytes]:
    """Genuine data records of fuzz messages (several types, sizes, flags)."""
    out: list[bytes] = []
    rng = np.random.default_rng(1)
    key = bytes(range(16, 48))
    for src, arr, keyed in [
        (0, rng.standard_normal(700).astype(np.float32), False),
        (1, rng.standard_normal(900).astype(np.float16), False),
        (0, rng.integers(0, 2**16, 500, dtype=np.uint16), False),
        (1, rng.integers(0, 256, 1000, dtype=np.uint8), False),
        (0, rng.standard_normal(300).astype(np.float32), True),
    ]:
        cfg = ProtocolConfig(payload_bytes=256, authenticate=keyed, pacer="unpaced")
        s = Session(rank=src, job=JOB, config=cfg, key=key if keyed else None)
        s.send_message(
            1 - src, arr, step=FUZZ_STEP, msg=FUZZ_MSG, now=0.0, bfloat16=arr.dtype == np.uint16
        )
        for item in s.datagrams_to_send(now=0.0, max_batches=1000):
            if isinstance(item, DataBatch):
                raw = item.data.tobytes()
                seg = item.segment_size
                out.extend(raw[i : i + seg] for i in range(0, len(raw), seg))
    return out


def control_templates(rng: np.random.Generator) -> list[bytes]:
    """Control messages about fuzz messages, including valid but absurd ones."""
    msgs: list[ControlMessage] = []
    for src in (0, 1, 9):
        s, m = FUZZ_STEP, FUZZ_MSG
        msgs += [
            Stop(s, m, src, received_elems=700),
            Stop(s, m, src, received_elems=0xFFFFFFFF),
            Finish(
                s,
                m,
                src,
                round=0,
                total_chunks=3,
                protected_chunks=2,
                class_chunks=(0,) * 14 + (2, 1),
            ),
            Finish(s, m, src, round=0xFFFF, total_chunks=0, protected_chunks=0),
            Finish(
                s,
                m,
                src,
                round=1,
                total_chunks=0xFFFFFFFF,
                protected_chunks=0,
                class_chunks=(0xFFFFFFFF,) + (0,) * 15,
            ),
            Nack(s, m, src, round=0, needed_elems=5, ranges=((0, 1), (7, 3))),
            Nack(s, m, src, round=0, needed_elems=0xFFFFFFFF, ranges=((0, 0xFFFFFFFF),)),
            Nack(s, m, src, round=3, needed_elems=0, ranges=()),
            Nack(s, m, src, round=0, needed_elems=9, ranges=((2, 5),), more=True),
            Nack(s, m, src, round=1, needed_elems=0, ranges=(), more=True),
            Nack(s, m, src, round=0, needed_elems=1, ranges=tuple((i * 3, 2) for i in range(170))),
            Abort(s, m, src, reason=AbortReason.GAVE_UP),
            Abort(s, m, src, reason=AbortReason.PEER_TIMEOUT),
        ]
    msgs.append(RateFeedback(0, 0, 9, bytes_per_s=2**64 - 1, interval_us=0))
    msgs.append(RateFeedback(0, 0, 9, bytes_per_s=0, interval_us=0xFFFFFFFF))
    out = [encode_control(c, job=JOB) for c in msgs]
    out.append(encode_control(msgs[0], job=JOB, key=bytes(32), nonce=7))  # tagged
    # random valid FINISH / NACK / STOP bodies
    for _ in range(40):
        total = int(rng.integers(0, 2**32))
        classes = [0] * 16
        classes[int(rng.integers(16))] = total
        out.append(
            encode_control(
                Finish(
                    FUZZ_STEP,
                    FUZZ_MSG,
                    int(rng.integers(0, 3)),
                    round=int(rng.integers(0, 2**16)),
                    total_chunks=total,
                    protected_chunks=int(rng.integers(0, total + 1)),
                    class_chunks=tuple(classes),
                ),
                job=JOB,
            )
        )
        k = int(rng.integers(0, 6))
        firsts = rng.integers(0, 2**31, k)
        ranges = tuple((int(f), int(rng.integers(1, 2**31))) for f in firsts)
        out.append(
            encode_control(
                Nack(
                    FUZZ_STEP,
                    FUZZ_MSG,
                    int(rng.integers(0, 3)),
                    round=int(rng.integers(0, 2**16)),
                    needed_elems=int(rng.integers(0, 2**32)),
                    ranges=ranges,
                ),
                job=JOB,
            )
        )
    return out


# ----------------------------------------------------------------------------- mutations


def mutate(
    templates: list[bytes], n: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``n`` datagrams (rows of ``WIDTH`` bytes and their lengths), in bulk."""
    tlen = np.array([len(t) for t in templates])
    table = np.zeros((len(templates), WIDTH), np.uint8)
    for i, t in enumerate(templates):
        table[i, : len(t)] = np.frombuffer(t, np.uint8)
    # half data records, half control messages
    n_data = int(np.count_nonzero(table[:, 0] == 0x11))
    pick = np.where(
        rng.random(n) < 0.5,
        rng.integers(0, n_data, n),
        rng.integers(n_data, len(templates), n),
    )
    rows = table[pick]
    lens = tlen[pick].copy()
    is_data = rows[:, 0] == 0x11
    idx = np.arange(n)
    kind = rng.integers(0, 10, n)

    # 0: a few bit flips anywhere
    sel = idx[kind == 0]
    for _ in range(4):
        pos = (rng.random(len(sel)) * lens[sel]).astype(np.int64)
        rows[sel, pos] ^= (1 << rng.integers(0, 8, len(sel))).astype(np.uint8)
        sel = sel[rng.random(len(sel)) < 0.5]
    # 1: bit flips in the header only
    sel = idx[kind == 1]
    pos = rng.integers(0, 32, len(sel))
    rows[sel, pos] ^= (1 << rng.integers(0, 8, len(sel))).astype(np.uint8)
    # 2: random byte overwrites
    sel = idx[kind == 2]
    for _ in range(3):
        pos = (rng.random(len(sel)) * lens[sel]).astype(np.int64)
        rows[sel, pos] = rng.integers(0, 256, len(sel), dtype=np.uint8)
    # 3: one header field set to an extreme value (0, all ones, top bit, random)
    sel = idx[kind == 3]
    overwrite_field(rows, sel[is_data[sel]], DATA_FIELDS, rng)
    overwrite_field(rows, sel[~is_data[sel]], CONTROL_FIELDS, rng)
    # 4: truncated
    sel = idx[kind == 4]
    lens[sel] = (rng.random(len(sel)) * lens[sel]).astype(np.int64)
    # 5: extended with random bytes
    sel = idx[kind == 5]
    extra = np.minimum(rng.integers(1, 65, len(sel)), WIDTH - lens[sel])
    for j, i in enumerate(sel.tolist()):
        rows[i, lens[i] : lens[i] + extra[j]] = rng.integers(0, 256, extra[j], dtype=np.uint8)
    lens[sel] += extra
    # 6: random job, 7: random version / type byte
    sel = idx[kind == 6]
    rows[sel, 2:4] = rng.integers(0, 256, (len(sel), 2), dtype=np.uint8)
    sel = idx[kind == 7]
    rows[sel, 0] = rng.integers(0, 256, len(sel), dtype=np.uint8)
    # 8: pure random bytes of random length
    sel = idx[kind == 8]
    rows[sel] = rng.integers(0, 256, (len(sel), WIDTH), dtype=np.uint8)
    lens[sel] = rng.integers(0, WIDTH, len(sel))
    # 9: unchanged (valid datagrams about fuzz messages)
    # and on top of that, a fifth of the data records claim a message nobody saw yet
    # (the first packet of a message decides its geometry); the step's top bit keeps
    # it clear of the real messages
    sel = idx[is_data & (rng.random(n) < 0.2)]
    rows[sel, 4:10] = rng.integers(0, 256, (len(sel), 6), dtype=np.uint8)
    rows[sel, 4] |= 0x80
    overwrite_field(rows, sel, DATA_FIELDS, rng)
    return rows, lens


def overwrite_field(
    rows: npt.NDArray[np.uint8],
    sel: npt.NDArray[np.int64],
    fields: list[tuple[int, int]],
    rng: np.random.Generator,
) -> None:
    """Set one random header field of each selected row to 0, all ones, only the
    top bit, or a random value."""
    which = rng.integers(0, len(fields), len(sel))
    extreme = rng.integers(0, 4, len(sel))
    for i, f, e in zip(sel.tolist(), which.tolist(), extreme.tolist(), strict=True):
        off, size = fields[f]
        top = 2 ** (8 * size)
        value = (0, top - 1, top // 2, int(rng.integers(0, top)))[e]
        rows[i, off : off + size] = np.frombuffer(value.to_bytes(size, "big"), np.uint8)


# ----------------------------------------------------------------------------- oracles


def single_verdict(d: bytes) -> str | None:
    """What a session must count for one datagram: a wire reason, or None."""
    try:
        if len(d) and d[0] & 0x0F == 1:
            decode_data(d, job=JOB)
        else:
            decode_control(d, job=JOB)
    except WireError as exc:
        return exc.reason.name.lower()
    return None


def test_receive_path_survives_fuzz_while_real_transfers_complete() -> None:
    rng = np.random.default_rng(20240601)
    templates = data_templates() + control_templates(rng)

    cfg = config()
    a, b = Session(rank=0, job=JOB, config=cfg), Session(rank=1, job=JOB, config=cfg)
    x = np.random.default_rng(5).standard_normal(6000).astype(np.float32)
    y = np.random.default_rng(6).standard_normal(8000).astype(np.float16)
    out_x = np.zeros_like(x)
    out_y = np.zeros_like(y)
    b.expect_message(0, step=REAL_STEP, msg=77, out=out_x)
    a.expect_message(1, step=REAL_STEP, msg=78, out=out_y)
    a.send_message(1, x, step=REAL_STEP, msg=77, now=0.0, p=0.0)
    b.send_message(0, y, step=REAL_STEP, msg=78, now=0.0, p=0.0)
    link = LossyLink([a, b], loss=0.02, reorder=True, duplicate=0.01, seed=7)
    from_link = [0]  # datagrams the link delivered (the fuzz calls the class's method)
    for s in (a, b):

        def counted(data: bytes, *, now: float, _s: Session = s) -> None:
            from_link[0] += 1
            Session.receive_datagram(_s, data, now=now)

        s.receive_datagram = counted  # type: ignore[method-assign]

    expected = [dict.fromkeys(WIRE_REASONS, 0) for _ in range(2)]
    fed = [0, 0]
    fed_during_transfer = 0
    sessions = (a, b)
    now = 0.0
    total = 0
    for _ in range(SLICES):
        link.run(start=now, until=now + 50e-6)
        now += 50e-6
        real_done = sum(
            isinstance(e, MessageReceived) and e.step == REAL_STEP for _, e in link.events
        )
        rows, lens = mutate(templates, PER_SLICE, rng)  # generated in bulk, slice by slice
        cursor, stop = 0, PER_SLICE
        while cursor < stop:
            target = int(rng.integers(0, 2))
            s = sessions[target]
            if rng.random() < 0.4:  # a single datagram
                d = rows[cursor, : lens[cursor]].tobytes()
                Session.receive_datagram(s, d, now=now)
                verdict = single_verdict(d)
                if verdict:
                    expected[target][verdict] += 1
                fed[target] += 1
                cursor += 1
                n_fed = 1
            else:  # a GRO batch: records of one segment size, the last maybe shorter
                m = min(int(rng.integers(1, 17)), stop - cursor)
                if rng.random() < 0.5:  # the first record's own length
                    seg = max(1, int(lens[cursor]))
                else:
                    seg = int(rng.choice([288, 304, 160, int(rng.integers(1, WIDTH))]))
                recs = rows[cursor : cursor + m, :seg].copy()
                if rng.random() < 0.7:  # the last record as long as it is (up to seg)
                    tail = min(int(lens[cursor + m - 1]), seg)
                else:
                    tail = int(rng.integers(0, seg + 1))
                buf = recs.reshape(-1)[: (m - 1) * seg + tail]
                s.receive_batch(buf, seg, now=now)
                parsed = parse_batch(buf, seg, job=JOB)
                counts = np.bincount(parsed.reasons, minlength=len(Reason))
                for code in np.flatnonzero(counts[1:]) + 1:
                    expected[target][Reason(int(code)).name.lower()] += int(counts[code])
                fed[target] += len(parsed.reasons)
                cursor += m
                n_fed = len(parsed.reasons)
            if real_done == 0:  # both real messages still under way
                fed_during_transfer += n_fed
        total += cursor
    assert total >= 100_000
    link.run(start=now)

    # the real messages arrived intact, while garbage was being injected
    got = {(r, e.msg): e for r, e in link.events if isinstance(e, MessageReceived)}
    assert got[(1, 77)].data is out_x and out_x.tobytes() == x.tobytes()
    assert got[(0, 78)].data is out_y and out_y.tobytes() == y.tobytes()
    assert fed_during_transfer > 20_000, fed_during_transfer
    # every wire reason was exercised, and each session counted exactly the codec's verdicts
    assert a.stats.datagrams_in + b.stats.datagrams_in == from_link[0] + sum(fed)
    for t, s in enumerate(sessions):
        wire = {k: v for k, v in s.stats.rejected.items() if k in WIRE_REASONS}
        assert wire == {k: v for k, v in expected[t].items() if v}
        assert sum(s.stats.rejected.values()) <= fed[t]
        assert s.stats.rejected.get("geometry", 0) > 0
    seen = set(a.stats.rejected) | set(b.stats.rejected)
    assert WIRE_REASONS - {"auth_required", "auth_failed"} <= seen


def test_codec_raises_only_wire_errors_and_batches_agree_with_singles() -> None:
    rng = np.random.default_rng(99)
    templates = data_templates() + control_templates(rng)
    rows, lens = mutate(templates, 20_000, rng)
    key = bytes(range(16, 48))
    reasons: list[int] = []
    for i in range(len(rows)):
        d = rows[i, : lens[i]].tobytes()
        for k in (None, key) if i % 8 == 0 else (None,):
            with contextlib.suppress(WireError):
                decode_control(d, job=JOB, key=k)
        try:
            decode_data(d, job=JOB, key=key if i % 16 == 0 else None)
            reasons.append(0)
        except WireError as exc:
            reasons.append(int(exc.reason))
    # the same records as fixed-stride batches: per-record verdicts match the singles
    for seg in (288, 304):
        sel = np.flatnonzero(lens == seg)[:2000]
        sel = sel[sel % 16 != 0]  # the ones decoded above without a key
        parsed = parse_batch(rows[sel, :seg].reshape(-1), seg, job=JOB)
        assert parsed.reasons.tolist() == [reasons[i] for i in sel]
    assert len(set(reasons)) >= 8
