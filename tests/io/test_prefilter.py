"""The receive pre-filter (``dlcp/io/_prefilter.h``, ``_udpio.filter_runs``): it
drops exactly the datagrams the session's parser rejects for a header rule of
spec §6.1 (every rule but the tag's), counted under the parser's reason, and
keeps the genuine datagrams of a run in order, whatever junk lies between them."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from dlcp.io import udp
from dlcp.io.udp import DataSockets
from dlcp.proto.batch import parse_batch
from dlcp.proto.wire import AUTH_TRAILER_LEN, DataHeader, DType, Flags, Reason, encode_data

pytestmark = pytest.mark.skipif(udp._udpio is None, reason="dlcp.io._udpio not built")

JOB = 7
KEY = bytes(range(32))


def _genuine(
    seq: int,
    *,
    chunk: int = 100,
    elems: int = 1000,
    key: bytes | None = None,
    dtype: DType = DType.FLOAT32,
) -> bytes:
    payload = np.arange(seq * chunk, (seq + 1) * chunk).astype(dtype.name.lower()).tobytes()
    header = DataHeader(
        job=JOB,
        step=3,
        msg=1,
        seq=seq,
        offset=seq * chunk,
        msg_elems=elems,
        payload_len=len(payload),
        src=1,
        flags=Flags.LAST if (seq + 1) * chunk == elems else Flags.NONE,
        dtype=dtype,
    )
    return encode_data(header, payload, key, nonce=seq if key else None)


def _mutants(rng: np.random.Generator, n: int) -> list[bytes]:
    """Genuine datagrams (tagged or not) with a header byte or the length changed,
    random bytes, and random bytes behind a valid version, type and job."""
    out: list[bytes] = []
    for i in range(n):
        base = bytearray(_genuine(int(rng.integers(0, 10)), key=KEY if i % 2 else None))
        kind = i % 4
        if kind == 0:  # one header byte changed
            base[int(rng.integers(0, 32))] = int(rng.integers(0, 256))
        elif kind == 1:  # cut or grown
            base = base[: int(rng.integers(0, len(base)))] if i % 3 else base + b"\0" * 4
        elif kind == 2:
            base = bytearray(rng.integers(0, 256, int(rng.integers(1, 1472)), dtype=np.uint8))
        else:
            base = bytearray(rng.integers(0, 256, int(rng.integers(32, 1472)), dtype=np.uint8))
            base[0], base[2:4] = 0x11, JOB.to_bytes(2, "big")
            base[29] &= 0x30  # a known element type, so that later rules are reached
            base[1] &= 0x07
        out.append(bytes(base))
    return out


@pytest.mark.parametrize("require_auth", [False, True])
def test_a_datagram_is_dropped_iff_the_parser_rejects_its_header_for_the_same_reason(
    require_auth: bool,
) -> None:
    rng = np.random.default_rng(25)
    datagrams = _mutants(rng, 2000) + [_genuine(s, key=KEY) for s in range(10)]
    dropped_by = {reason: 0 for reason in Reason}
    kept = 0
    for d in datagrams:
        buf = np.frombuffer(d, dtype=np.uint8).copy()
        counts = np.zeros(16, dtype=np.int64)
        runs = udp._udpio.filter_runs(
            buf, [(0, len(d), len(d))], JOB, require_auth, AUTH_TRAILER_LEN, counts
        )
        reason = Reason(
            int(parse_batch(buf, len(d), job=JOB, require_auth=require_auth).reasons[0])
        )
        if runs:
            assert reason is Reason.OK, (d.hex(), reason)
            assert counts.sum() == 0 and runs == [(0, len(d), len(d))]
            kept += 1
        else:
            assert reason is not Reason.OK and counts[reason] == 1 and counts.sum() == 1, (
                d.hex(),
                reason,
                counts,
            )
            dropped_by[reason] += 1
    # the sample reaches every rule the filter checks
    wanted = set(Reason) - {Reason.OK, Reason.AUTH_FAILED}
    if not require_auth:
        wanted.discard(Reason.AUTH_REQUIRED)
    assert {r for r, c in dropped_by.items() if c} == wanted
    assert kept >= 10


def test_genuine_datagrams_of_a_run_are_kept_in_order_between_junk() -> None:
    genuine = [_genuine(s) for s in range(10)]  # 432 bytes each, the last one too
    seg = len(genuine[0])
    junk = bytearray(seg)
    junk[0] = 0x11  # right version and type, wrong job
    run = b"".join(g if i % 2 else bytes(junk) for i in range(20) for g in [genuine[i // 2]])
    buf = np.zeros(len(run) + 100, dtype=np.uint8)
    buf[100:] = np.frombuffer(run, dtype=np.uint8)
    counts = np.zeros(16, dtype=np.int64)
    runs = udp._udpio.filter_runs(
        buf, [(0, 100, 25), (100, len(buf), seg)], JOB, False, AUTH_TRAILER_LEN, counts
    )
    assert runs == [(100, 100 + 10 * seg, seg)]
    assert buf[100 : 100 + 10 * seg].tobytes() == b"".join(genuine)
    assert counts[Reason.WRONG_JOB] == 10 and counts[Reason.TRUNCATED] == 4
    assert counts.sum() == 14


def test_a_run_that_keeps_everything_is_handed_back_as_it_was() -> None:
    genuine = b"".join(_genuine(s) for s in range(4))
    buf = np.frombuffer(genuine, dtype=np.uint8).copy()
    run = (0, len(buf), len(buf) // 4)
    counts = np.zeros(16, dtype=np.int64)
    out = udp._udpio.filter_runs(buf, [run], JOB, False, AUTH_TRAILER_LEN, counts)
    assert out == [run] and out[0] is run and not counts.any()


@pytest.mark.parametrize(
    ("run", "counts_len", "error"),
    [
        ((0, 2000, 100), 16, "does not lie in a 1000-byte buffer"),
        ((0, 100, 0), 16, "does not lie"),
        ((0, 100, 100), 8, "needs 16 int64"),
    ],
)
def test_bad_runs_and_a_short_counts_array_are_refused(
    run: tuple[int, int, int], counts_len: int, error: str
) -> None:
    buf = np.zeros(1000, dtype=np.uint8)
    counts = np.zeros(counts_len, dtype=np.int64)
    with pytest.raises(ValueError, match=error):
        udp._udpio.filter_runs(buf, [run], JOB, False, AUTH_TRAILER_LEN, counts)


def test_the_socket_screens_junk_before_delivering_and_counts_it_by_reason() -> None:
    rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="auto", rcvbuf=1 << 22, sndbuf=1 << 20)
    try:
        assert rx.screen(job=JOB, require_auth=False, tag_len=AUTH_TRAILER_LEN, in_kernel=False)
        sent = [_genuine(0), b"\x21" + bytes(40), _genuine(1), b"x", _genuine(2)]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for d in sent:
                tx.sendto(d, rx.address)
        got: list[bytes] = []
        # every datagram is queued on loopback once sendto returned
        rx.receive(lambda buf, seg: got.append(buf.tobytes()))
        assert b"".join(got) == b"".join(sent[0::2])
        assert rx.take_screened() == {"bad_version": 1, "truncated": 1}
        assert rx.take_screened() == {}
    finally:
        rx.close()


@pytest.mark.parametrize("dtype", [DType.FLOAT16, DType.UINT8])
def test_datagrams_of_other_element_types_pass_with_their_own_size(dtype: DType) -> None:
    d = _genuine(2, chunk=3, elems=9, dtype=dtype)
    counts = np.zeros(16, dtype=np.int64)
    buf = np.frombuffer(d, dtype=np.uint8).copy()
    assert udp._udpio.filter_runs(buf, [(0, len(d), len(d))], JOB, False, AUTH_TRAILER_LEN, counts)
    assert not counts.any()


def test_a_receive_reads_past_junk_to_the_data_queued_behind_it() -> None:
    """Junk the pre-filter drops does not count against the reads a receive may
    make (udp._MAX_READS) up to udp._MAX_ALL_READS: the genuine datagram behind
    more junk than _MAX_READS arrives in the same call."""
    rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="auto", rcvbuf=64 << 20, sndbuf=1 << 20)
    try:
        rx.screen(job=JOB, require_auth=False, tag_len=AUTH_TRAILER_LEN, in_kernel=False)
        junk = udp._MAX_READS + 500
        assert junk < udp._MAX_ALL_READS
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for _ in range(junk):
                tx.sendto(b"\x21" + bytes(40), rx.address)
            tx.sendto(_genuine(0), rx.address)
        got: list[bytes] = []
        # every datagram is queued on loopback once sendto returned
        rx.receive(lambda buf, seg: got.append(buf.tobytes()))
        assert got == [_genuine(0)]
        assert rx.take_screened() == {"bad_version": junk}
        assert not rx.backlog
    finally:
        rx.close()
