"""AES-GMAC of data records (spec §3): the C batch functions (``dlcp.proto._gmac``,
libcrypto) and the Python reference (``cryptography``'s AESGCM) give the same
nonces and tags and accept the same records, both ways; the native send engine
seals what it sends so that the reference verifies it; nonces drawn by several
threads at once under one counter are never the same."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcp.io.engine import native_seals
from dlcp.io.extensions import load
from dlcp.proto import auth, wire
from dlcp.proto.auth import AUTH_NONCE_LEN, AUTH_TAG_LEN, AUTH_TRAILER_LEN, NonceCounter

needs_c = pytest.mark.skipif(not auth.ACCELERATED, reason="built without libcrypto")


@pytest.fixture(params=["modes", "evp", "sized"])
def backend(request: pytest.FixtureRequest) -> Any:
    """Each way the C code computes tags (dlcp/proto/gmac.h; "sized" takes EVP for
    datagrams of 4,096 bytes or more, the mode functions below), for the keys
    dlcp.proto._gmac expands during the test (the verifiers auth caches by key are
    forgotten before and after, so none of another backend's is used)."""
    gmac = auth._accel  # (a test may take it from auth meanwhile: the reference)
    auth._verifiers.clear()
    previous = gmac.use_backend(request.param)
    try:
        yield request.param
    finally:
        gmac.use_backend(previous)
        auth._verifiers.clear()


def _records(seed: int, n: int, stride: int, *, short: int | None = None) -> tuple[Any, Any]:
    """``n`` random tagged-looking records (AUTH set) and their lengths; the last
    ``short`` bytes long when given."""
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, (n, stride), dtype=np.uint8)
    records[:, 1] |= np.uint8(wire.Flags.AUTH)
    lengths = np.full(n, stride, np.int64)
    if short is not None:
        lengths[-1] = short
    return records, lengths


def _nonce_of(record: Any, length: int) -> int:
    end = length - AUTH_TAG_LEN
    return int.from_bytes(record[end - AUTH_NONCE_LEN : end].tobytes(), "big")


@needs_c
@pytest.mark.parametrize("key_len", [16, 24, 32])
@pytest.mark.parametrize(("stride", "short"), [(1480, 100), (56, None), (9000, 57)])
def test_c_and_python_seal_the_same_bytes(
    key_len: int, stride: int, short: int | None, backend: str
) -> None:
    key = bytes(range(7, 7 + key_len))
    records, lengths = _records(key_len + stride, 40, stride, short=short)
    by_c, by_py = records.copy(), records.copy()
    c_nonces, py_nonces = NonceCounter(2**64 - 100), NonceCounter(2**64 - 100)
    auth.seal_records(by_c, lengths, 3, 40, key, c_nonces, accelerated=True)
    auth.seal_records(by_py, lengths, 3, 40, key, py_nonces, accelerated=False)
    assert np.array_equal(by_c, by_py)
    assert np.array_equal(by_c[:3], records[:3])  # outside [start, stop): untouched
    assert c_nonces.next == py_nonces.next == 2**64 - 100 + 37
    assert [_nonce_of(by_c[i], int(lengths[i])) for i in range(3, 40)] == list(
        range(2**64 - 100, 2**64 - 100 + 37)
    )


@needs_c
@pytest.mark.parametrize("sealed_by_c", [True, False])
def test_each_side_verifies_what_the_other_sealed(sealed_by_c: bool, backend: str) -> None:
    key = bytes(range(32))
    records, lengths = _records(5, 64, 1480, short=200)
    auth.seal_records(records, lengths, 0, 64, key, NonceCounter(1), accelerated=sealed_by_c)
    rows = np.arange(64, dtype=np.int64)
    # damage some: a payload bit, a header bit, the nonce, the tag, the src field
    bad = {5: 40, 9: 3, 17: 1480 - AUTH_TRAILER_LEN + 2, 30: 1480 - 1, 44: 27}
    for row, at in bad.items():
        records[row, at] ^= 0x10
    for accelerated in (True, False):
        ok = auth.verify_records(records, lengths, rows, key, accelerated=accelerated)
        assert [i for i in range(64) if not ok[i]] == sorted(bad)
        other = auth.verify_records(records, lengths, rows, bytes(32), accelerated=accelerated)
        assert not other.any()  # another key (another pair or run): nothing verifies


@needs_c
def test_verify_takes_any_rows_in_any_order() -> None:
    key = bytes(range(16))
    records, lengths = _records(6, 10, 300)
    auth.seal_records(records, lengths, 0, 10, key, NonceCounter(0))
    records[4, 50] ^= 1
    rows = np.array([9, 4, 0, 4], np.int64)
    for accelerated in (True, False):
        ok = auth.verify_records(records, lengths, rows, key, accelerated=accelerated)
        assert ok.tolist() == [True, False, True, False]


@needs_c
def test_bad_arguments_are_refused_by_name() -> None:
    records, lengths = _records(7, 4, 100)
    with pytest.raises(ValueError, match="16, 24 or 32 bytes"):
        auth.seal_records(records, lengths, 0, 4, b"k" * 20, NonceCounter(0))
    with pytest.raises(IndexError, match=r"records \[0, 5\) of 4"):
        auth.seal_records(records, lengths, 0, 5, bytes(16), NonceCounter(0))
    short = lengths.copy()
    short[2] = 40  # shorter than a data header and a trailer
    with pytest.raises(ValueError, match="record 2: length 40 cannot hold a tagged datagram"):
        auth.seal_records(records, short, 0, 4, bytes(16), NonceCounter(0))
    with pytest.raises(ValueError, match="row 4 is not a tagged record"):
        auth.verify_records(records, lengths, np.array([4]), bytes(16))


@needs_c
@pytest.mark.parametrize("payload_len", [0, 1, 1400, 8940])
def test_a_datagram_sealed_where_its_pieces_lie_carries_the_reference_tag(
    payload_len: int, backend: str
) -> None:
    # the native engine's lent sends: header, payload and trailer in three places,
    # handed to GCM as additional data one after the other
    key = bytes(range(3, 35))
    records, lengths = _records(payload_len, 1, wire.DATA_HEADER_LEN + payload_len + 24)
    whole = records.copy()
    auth.seal_records(whole, lengths, 0, 1, key, NonceCounter(77), accelerated=False)
    header = records[0, : wire.DATA_HEADER_LEN].tobytes()
    payload = records[0, wire.DATA_HEADER_LEN : wire.DATA_HEADER_LEN + payload_len].tobytes()
    trailer = bytearray(AUTH_TRAILER_LEN)
    auth._accel.seal_gathered(header, payload, trailer, key, 77)
    assert bytes(trailer) == whole[0, -AUTH_TRAILER_LEN:].tobytes()
    with pytest.raises(ValueError, match="a data header is 32 bytes and a trailer 24"):
        auth._accel.seal_gathered(header[:-1], payload, trailer, key, 77)


@needs_c
def test_the_backend_is_chosen_from_the_library_and_the_cpu_unless_set() -> None:
    flags = set(Path("/proc/cpuinfo").read_text().split("\n\n")[0].split())
    assert auth.LIBCRYPTO_VERSION is not None
    version = tuple(int(n) for n in auth.LIBCRYPTO_VERSION.split()[1].split(".")[:2])
    wanted = {"avx512f", "avx512dq", "avx512bw", "avx512vl", "vaes", "vpclmulqdq"}
    fast_evp = version >= (3, 1) and wanted <= flags
    amd = "AuthenticAMD" in Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    assert auth.gmac_backend() == (("evp" if amd else "sized") if fast_evp else "modes")
    assert auth.use_gmac_backend("evp") == "auto"
    try:
        assert auth.gmac_backend() == "evp"
        refused = "unknown AES-GMAC backend 'gcm': 'auto', 'modes', 'evp' or 'sized'"
        with pytest.raises(ValueError, match=refused):
            auth.use_gmac_backend("gcm")
        assert auth.gmac_backend() == "evp"  # (a refused name changes nothing)
    finally:
        assert auth.use_gmac_backend("auto") == "evp"


@pytest.mark.parametrize("accelerated", [True, False])
def test_a_counter_refuses_to_wrap(accelerated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if accelerated and not auth.ACCELERATED:
        pytest.skip("built without libcrypto")
    if not accelerated:
        monkeypatch.setattr(auth, "_accel", None)
    counter = NonceCounter(2**64 - 3)
    assert counter.take(2) == 2**64 - 3
    with pytest.raises(OverflowError, match="nonce counter exhausted"):
        counter.take(1)
    assert counter.next == 2**64 - 1  # nothing drawn by the refused call


@needs_c
def test_threads_drawing_at_once_never_share_a_nonce() -> None:
    """Eight threads seal records under one key and one counter at once (the
    sealing releases the GIL, so their draws interleave): every record gets its
    own nonce, and the nonces are exactly the range the counter went through."""
    key = bytes(range(32))
    counter = NonceCounter(1000)
    n_threads, rounds, per_call = 8, 200, 16
    seen: list[list[int]] = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads)

    def sender(k: int) -> None:
        records, lengths = _records(k, per_call, 200)
        start.wait()
        for _ in range(rounds):
            auth.seal_records(records, lengths, 0, per_call, key, counter)
            assert auth.verify_records(records, lengths, np.arange(per_call), key).all()
            seen[k] += [_nonce_of(records[i], 200) for i in range(per_call)]

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drawn = sorted(x for s in seen for x in s)
    assert drawn == list(range(1000, 1000 + n_threads * rounds * per_call))


@pytest.mark.skipif(not native_seals(), reason="native engine built without libcrypto")
@pytest.mark.parametrize("engine_threads", [1, 2, 4])
def test_the_native_engine_seals_each_batch_as_it_sends_it(engine_threads: int) -> None:
    """Rounds posted from several threads at once (rule 7 sends some from the
    posting thread, the engine's threads the rest, several batches of one round
    at once where there are more than one) draw from the counter the session's
    own sealing shares: every datagram that arrives verifies with the reference
    and no two carry the same nonce."""
    _engine = load("_engine")  # (make sanitize: the build it names)

    key, counter = bytes(range(100, 132)), NonceCounter(77)
    n_threads, rounds, count, stride = 4, 20, 12, 700
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    engine = _engine.Engine([tx.fileno()], 5, "dlcp-seal-test", threads=engine_threads)
    total = n_threads * rounds * count
    try:
        engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _engine.Pacer(unpaced=True))
        start = threading.Barrier(n_threads)

        def poster(k: int) -> None:
            start.wait()
            for r in range(rounds):
                records, _ = _records(k * 1000 + r, count, stride, short=300)
                engine.post(
                    dst=1, step=k, msg=r, order=k * 1000 + r, records=records, stride=stride,
                    per_message=1, count=count, short=count - 1, short_len=300,
                    tos=np.zeros(count, np.uint8), path=np.zeros(count, np.uint8),
                    prio=np.zeros(count, np.uint8), breaks=np.array([5, 10, count], np.int64),
                    key=key, nonces=counter.cell,
                )  # fmt: skip

        threads = [threading.Thread(target=poster, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        rx.settimeout(10.0)
        got = [rx.recv(65536) for _ in range(total)]
        for t in threads:
            t.join()
    finally:
        engine.close()
        rx.close()
        tx.close()
    nonces = [_nonce_of(np.frombuffer(d, np.uint8), len(d)) for d in got]
    assert sorted(nonces) == list(range(77, 77 + total))
    assert counter.next == 77 + total
    for d in got:
        row = np.zeros((1, stride), np.uint8)
        row[0, : len(d)] = np.frombuffer(d, np.uint8)
        ok = auth.verify_records(row, np.array([len(d)]), np.array([0]), key, accelerated=False)
        assert ok.all()


@pytest.mark.skipif(not native_seals(), reason="native engine built without libcrypto")
def test_the_native_engine_refuses_a_bad_key_or_cell_by_name() -> None:
    _engine = load("_engine")  # (make sanitize: the build it names)

    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    engine = _engine.Engine([tx.fileno()], 5, "dlcp-seal-test")
    try:
        engine.add_peer(1, "127.0.0.1", 9, _engine.Pacer(unpaced=True))
        base = {
            "dst": 1, "step": 0, "msg": 0, "order": 1, "records": np.zeros((2, 100), np.uint8),
            "stride": 100, "per_message": 1, "count": 2, "short": -1, "short_len": 0,
            "tos": np.zeros(2, np.uint8), "path": np.zeros(2, np.uint8),
            "prio": np.zeros(2, np.uint8), "breaks": np.array([2], np.int64),
        }  # fmt: skip
        with pytest.raises(ValueError, match="key must be bytes of 16, 24 or 32"):
            engine.post(**base, key=b"short", nonces=NonceCounter().cell)
        with pytest.raises(ValueError, match="a key needs nonces"):
            engine.post(**base, key=bytes(16))
        with pytest.raises(ValueError, match="nonces must be one aligned uint64"):
            engine.post(**base, key=bytes(16), nonces=np.zeros(2, np.uint64))
        small = {**base, "records": np.zeros((2, 40), np.uint8), "stride": 40}
        with pytest.raises(ValueError, match="cannot hold a data header and an authentication"):
            engine.post(**small, key=bytes(16), nonces=NonceCounter().cell)
        lent = {**base, "records": np.zeros((2, 32), np.uint8), "payload": np.zeros(136, np.uint8),
                "seqs": np.arange(2, dtype=np.int64), "chunk_bytes": 68}  # fmt: skip
        with pytest.raises(ValueError, match=r"sealed lent round needs .* \(56 bytes\), got 32"):
            engine.post(**lent, key=bytes(16), nonces=NonceCounter().cell)
    finally:
        engine.close()
        tx.close()


@pytest.mark.skipif(not native_seals(), reason="native engine built without libcrypto")
@pytest.mark.parametrize("engine_threads", [1, 4])
@pytest.mark.parametrize(("per_message", "tail"), [(1, 700), (8, 123), (44, 1)])
def test_the_native_engine_seals_a_lent_round_where_its_pieces_lie(
    per_message: int, tail: int, engine_threads: int
) -> None:
    """A lent round's records are header and trailer; each datagram goes out as
    header, lent chunk, trailer (three iovecs), and the tag the engine wrote
    over those pieces is the one the reference computes over the datagram. With
    4 send threads the round's batches go side by side, in any order: each
    datagram is checked against the record its header says it is."""
    _engine = load("_engine")  # (make sanitize: the build it names)

    key, counter = bytes(range(7, 39)), NonceCounter(5)
    count, chunk, head = 30, 700, wire.DATA_HEADER_LEN + AUTH_TRAILER_LEN
    rng = np.random.default_rng(per_message)
    payload = rng.integers(0, 256, (count - 1) * chunk + tail, dtype=np.uint8)
    seqs = np.concatenate((rng.permutation(count - 1), [count - 1])).astype(np.int64)
    records, _ = _records(per_message, count, head)
    short = head + tail if tail < chunk else head + chunk
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    engine = _engine.Engine([tx.fileno()], 9, "dlcp-seal-test", threads=engine_threads)
    try:
        engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _engine.Pacer(unpaced=True))
        engine.post(
            dst=1, step=0, msg=0, order=1, records=records, stride=head + chunk,
            per_message=per_message, count=count, short=count - 1 if tail < chunk else -1,
            short_len=short if tail < chunk else 0, tos=np.zeros(count, np.uint8),
            path=np.zeros(count, np.uint8), prio=np.zeros(count, np.uint8),
            breaks=np.array([10, count], np.int64), key=key, nonces=counter.cell,
            payload=payload, seqs=seqs, chunk_bytes=chunk,
        )  # fmt: skip
        rx.settimeout(10.0)
        got = [rx.recv(65536) for _ in range(count)]
    finally:
        engine.close()
        rx.close()
        tx.close()
    by_header = {records[i, : wire.DATA_HEADER_LEN].tobytes(): i for i in range(count)}
    which = [by_header[d[: wire.DATA_HEADER_LEN]] for d in got]  # (record i of the round)
    assert sorted(which) == list(range(count))
    if engine_threads == 1:
        assert which == list(range(count))
    assert [len(d) for d in got] == [short if i == count - 1 else head + chunk for i in which]
    nonce = {}
    for i, d in zip(which, got, strict=True):
        at = int(seqs[i]) * chunk
        lent = payload[at : at + len(d) - head].tobytes()
        assert d[wire.DATA_HEADER_LEN : len(d) - AUTH_TRAILER_LEN] == lent, f"datagram {i}"
        nonce[i] = _nonce_of(np.frombuffer(d, np.uint8), len(d))
        row = np.frombuffer(d, np.uint8).reshape(1, -1)
        ok = auth.verify_records(row, np.array([len(d)]), np.array([0]), key, accelerated=False)
        assert ok.all(), f"datagram {i}: the reference does not verify the engine's tag"
        forged = row.copy()
        forged[0, wire.DATA_HEADER_LEN] ^= 1  # one payload bit: the tag no longer fits
        assert not auth.verify_records(forged, np.array([len(d)]), np.array([0]), key).any()
    assert sorted(nonce.values()) == list(range(5, 5 + count))  # (each once)
    if engine_threads == 1:
        assert [nonce[i] for i in range(count)] == list(range(5, 5 + count))
    assert counter.next == 5 + count


def _received(n: int, stride: int, tail: int, key: bytes) -> Any:
    """``n`` sealed records of ``stride`` bytes back to back, the last ``tail``
    bytes long (as one receive hands datagrams over), as one 1-D buffer."""
    records, lengths = _records(11, n, stride, short=tail if tail < stride else None)
    auth.seal_records(records, lengths, 0, n, key, NonceCounter(9), accelerated=False)
    return np.concatenate([records[i, : lengths[i]] for i in range(n)])


@needs_c
@pytest.mark.parametrize(
    ("stride", "tail", "spoil", "want"),
    [
        (1472, 1472, None, 12),  # every datagram whole and right
        (1472, 300, None, 12),  # a short last one
        (1472, 1472, 5, 5),  # a wrong tag stops the prefix where it is
        (1472, 300, 11, 11),  # ... the short last one's too
        (1472, 1472, 0, 0),
        (56, 56, None, 12),  # datagrams of a header and a trailer alone
    ],
)
def test_verified_prefix_in_c_agrees_with_the_reference(
    stride: int,
    tail: int,
    spoil: int | None,
    want: int,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = bytes(range(40, 72))
    buf = _received(12, stride, tail, key)
    if spoil is not None:
        buf[spoil * stride + wire.DATA_HEADER_LEN] ^= 0x80  # one payload bit
    got = auth.verified_prefix(buf, stride, key)
    monkeypatch.setattr(auth, "_accel", None)  # the reference: AESGCM record by record
    # (the nonces are 9, 10, ...: one above the prefix's highest)
    assert got == auth.verified_prefix(buf, stride, key) == (want, 9 + want if want else 0)


@needs_c
@pytest.mark.parametrize(("tail", "floor", "want"), [
    (1472, 0, 12), (1472, 15, 6), (1472, 21, 0), (300, 0, 12), (300, 10, 10), (300, 9, 12),
])  # fmt: skip
def test_verified_prefix_stops_at_a_nonce_below_the_floor(
    tail: int, floor: int, want: int, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = bytes(range(40, 72))
    sealed = _received(12, 1472, tail, key)
    # the whole ones in reverse (nonces 19 down to 9, or 20 down to 9), a short one last
    whole = sealed[: 11 * 1472 if tail < 1472 else 12 * 1472].reshape(-1, 1472)[::-1]
    buf = np.concatenate([whole.reshape(-1), sealed[len(whole) * 1472 :]])
    nonces = [int.from_bytes(buf[end - 24 : end - 16], "big")
              for end in [*range(1472, len(whole) * 1472 + 1, 1472), len(buf)][:12]]  # fmt: skip
    got = auth.verified_prefix(buf, 1472, key, floor)
    monkeypatch.setattr(auth, "_accel", None)
    assert got == auth.verified_prefix(buf, 1472, key, floor)
    assert got == (want, max(nonces[:want], default=-1) + 1)
    assert all(n >= floor for n in nonces[:want])


@needs_c
def test_verified_prefix_skips_a_tail_too_short_for_a_trailer_and_a_wrong_key() -> None:
    key = bytes(range(16))
    buf = _received(4, 700, 700, key)
    runt = np.concatenate((buf, np.zeros(40, np.uint8)))  # 40 bytes: no header and trailer
    assert auth.verified_prefix(runt, 700, key)[0] == 4
    assert auth.verified_prefix(buf, 700, bytes(16)) == (0, 0)
    assert auth.verified_prefix(buf, 40, key) == (0, 0)  # (a segment cannot hold a trailer)
    with pytest.raises(ValueError, match="must be 16, 24 or 32 bytes"):
        auth.verified_prefix(buf, 700, b"short")


@needs_c
def test_threads_verifying_under_one_key_at_once_each_get_the_right_answer() -> None:
    key = bytes(range(1, 33))
    good = _received(30, 1000, 1000, key)
    bad = good.copy()
    bad[17 * 1000 + 40] ^= 1
    answers: list[list[int]] = []
    start = threading.Barrier(4)

    def verify(k: int) -> None:
        start.wait()
        buf = good if k % 2 else bad
        answers.append([auth.verified_prefix(buf, 1000, key)[0] for _ in range(200)])

    threads = [threading.Thread(target=verify, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(tuple(set(a)) for a in answers) == [(17,), (17,), (30,), (30,)]
