"""Per-run, per-pair keys (docs/spec.md §3, dlcp.keyring): a datagram tagged for
one destination, or in one run, fails verification at another destination or
in another run, and is counted as ``auth_failed``; the wire format is unchanged.

Sans I/O: sessions exchange datagrams by hand, so each replay is exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlcp.errors import ConfigError
from dlcp.keyring import KeyRing, job_secret, new_run_nonce
from dlcp.proto.batch import parse_batch
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.control import decode_control
from dlcp.proto.session import (
    ControlDatagram,
    DataBatch,
    Session,
)
from tests.proto.session_helpers import received_events

JOB = 0x51
SECRET = bytes(range(40, 72))
CFG = ProtocolConfig(authenticate=True, payload_bytes=256, pacer="unpaced")
X = np.arange(2_000, dtype=np.float32)


def _ranks(ring: KeyRing, n: int = 3) -> list[Session]:
    return [Session(rank=r, job=JOB, config=CFG, key=ring) for r in range(n)]


def _ring(nonce: bytes | None = None, secret: bytes = SECRET) -> KeyRing:
    return KeyRing(secret, job=JOB, run_nonce=nonce or new_run_nonce())


def _sent(s: Session) -> tuple[list[DataBatch], list[ControlDatagram]]:
    data: list[DataBatch] = []
    ctrl: list[ControlDatagram] = []
    for item in s.datagrams_to_send(now=0.0, max_batches=10_000):
        if isinstance(item, DataBatch):
            data.append(DataBatch(item.dst, item.path, item.tos, item.segment_size, item.count,
                                  memoryview(bytes(item.data))))  # fmt: skip
        else:
            ctrl.append(item)
    return data, ctrl


def _feed(rx: Session, batches: list[DataBatch]) -> None:
    for b in batches:
        rx.receive_batch(np.frombuffer(b.data, np.uint8), b.segment_size, now=0.001)


def _records(batches: list[DataBatch]) -> int:
    return sum(b.count for b in batches)


def test_every_pair_and_run_has_a_key_of_its_own() -> None:
    ring = _ring(bytes(16))
    keys = {ring(s, d) for s in range(4) for d in range(4) if s != d}
    assert len(keys) == 12 and all(len(k) == 32 for k in keys)
    assert ring(0, 1) == _ring(bytes(16))(0, 1)  # derived, not drawn: every rank agrees
    assert ring(0, 1) != _ring(bytes(range(16)))(0, 1)  # another run
    assert ring(0, 1) != KeyRing(SECRET, job=JOB + 1, run_nonce=bytes(16))(0, 1)  # another job
    assert ring(0, 1) != _ring(bytes(16), secret=bytes(32))(0, 1)  # another secret
    assert SECRET.hex() not in repr(ring)


def test_a_datagram_replayed_to_another_destination_fails_and_is_counted() -> None:
    """Rank 0 sends X to rank 2; its datagrams, replayed to rank 1 (which waits
    for a message of rank 0 with the same step and msg, as a scatter's ranks do),
    are rejected: they carry the tag of the pair 0 -> 2."""
    a, b, c = _ranks(_ring())
    b.expect_message(0, step=4, msg=9, out=np.zeros_like(X))
    c.expect_message(0, step=4, msg=9, out=np.zeros_like(X))
    a.send_message(2, X, step=4, msg=9, now=0.0)
    data, _ = _sent(a)
    assert data and all(d.dst == 2 for d in data)
    _feed(b, data)  # the replay
    assert b.stats.rejected == {"auth_failed": _records(data)}
    assert received_events(b) == []
    _feed(c, data)  # the genuine destination takes them
    (got,) = received_events(c)
    assert np.array_equal(got.data, X) and c.stats.rejected == {}
    # the receiver's STOP to rank 0, replayed to rank 2 as if rank 1 sent it, fails too
    _, ctrl = _sent(c)
    assert ctrl and all(cd.dst == 0 for cd in ctrl)
    for cd in ctrl:
        b.receive_datagram(cd.data, now=0.002)
    assert b.stats.rejected["auth_failed"] == _records(data) + len(ctrl)


def test_a_datagram_of_an_earlier_run_fails_in_the_next_and_is_counted() -> None:
    """A restart that keeps the job's secret and job id gets a fresh run nonce:
    the previous run's data and control datagrams fail verification."""
    old = _ranks(_ring(), 2)
    new = _ranks(_ring(), 2)
    old[0].send_message(1, X, step=1, msg=1, now=0.0)
    data, _ = _sent(old[0])
    new[1].expect_message(0, step=1, msg=1, out=np.zeros_like(X))
    _feed(new[1], data)
    assert new[1].stats.rejected == {"auth_failed": _records(data)}
    assert received_events(new[1]) == []
    # and the old run's control (the old receiver's STOP) fails at the new sender
    old[1].expect_message(0, step=1, msg=1, out=np.zeros_like(X))
    _feed(old[1], data)
    assert len(received_events(old[1])) == 1
    _, ctrl = _sent(old[1])
    new[0].send_message(1, X, step=1, msg=1, now=0.0)
    for cd in ctrl:
        new[0].receive_datagram(cd.data, now=0.002)
    assert new[0].stats.rejected == {"auth_failed": len(ctrl)}
    # the new run itself works
    fresh, _ = _sent(new[0])
    _feed(new[1], fresh)
    (got,) = received_events(new[1])
    assert np.array_equal(got.data, X)


def test_the_tag_covers_the_pair_with_the_wire_format_unchanged() -> None:
    """A tagged datagram keeps the §2/§3 layout: parsing it with the pair's key
    (as one key) accepts it, with any other pair's key refuses it."""
    ring = _ring()
    a = Session(rank=0, job=JOB, config=CFG, key=ring)
    a.send_message(2, X[:10], step=0, msg=0, now=0.0)
    (batch,), _ = _sent(a)
    buf = np.frombuffer(batch.data, np.uint8)
    assert parse_batch(buf, batch.segment_size, job=JOB, key=ring(0, 2)).ok.all()
    assert not parse_batch(buf, batch.segment_size, job=JOB, key=ring(0, 1)).ok.any()
    assert not parse_batch(buf, batch.segment_size, job=JOB, key=ring(2, 0)).ok.any()
    # a lookup by claimed source, as a receiver verifies
    assert parse_batch(buf, batch.segment_size, job=JOB, key=lambda src: ring(src, 2)).ok.all()
    ctrl = Session(rank=2, job=JOB, config=CFG, key=ring)
    ctrl.expect_message(0, step=0, msg=0, out=np.zeros(10, np.float32))
    _feed(ctrl, [batch])
    _, (stop, *_) = _sent(ctrl)
    decode_control(stop.data, job=JOB, key=ring(2, 0), require_auth=True)
    decode_control(stop.data, job=JOB, key=lambda src: ring(src, 0), require_auth=True)


def test_the_job_secret_comes_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert job_secret({}) is None
    assert job_secret({"DLCP_JOB_SECRET": SECRET.hex()}) == SECRET
    hexfile, rawfile = tmp_path / "hex", tmp_path / "raw"
    hexfile.write_text(SECRET.hex() + "\n")
    rawfile.write_bytes(b"\xff" + SECRET)
    assert job_secret({"DLCP_JOB_SECRET_FILE": str(hexfile)}) == SECRET
    assert job_secret({"DLCP_JOB_SECRET_FILE": str(rawfile)}) == b"\xff" + SECRET
    with pytest.raises(ConfigError, match="DLCP_JOB_SECRET is not hex") as bad:
        job_secret({"DLCP_JOB_SECRET": "zz" + SECRET.hex()})
    assert SECRET.hex() not in str(bad.value)  # a secret is never echoed
    with pytest.raises(ConfigError, match="secret of 4 bytes: a job secret has 16"):
        job_secret({"DLCP_JOB_SECRET": "00112233"})
    with pytest.raises(ConfigError, match="both DLCP_JOB_SECRET and DLCP_JOB_SECRET_FILE"):
        job_secret({"DLCP_JOB_SECRET": SECRET.hex(), "DLCP_JOB_SECRET_FILE": str(hexfile)})
    with pytest.raises(ConfigError, match="DLCP_JOB_SECRET_FILE='/nonexistent/s' cannot be"):
        job_secret({"DLCP_JOB_SECRET_FILE": "/nonexistent/s"})


def test_a_rank_outside_the_job_has_no_key_and_costs_no_derivation() -> None:
    """Datagrams claiming a rank that is not a peer fail verification without a
    key being derived or kept for it (a flood of made-up ranks grows nothing)."""
    ring = _ring()
    asked: list[tuple[int, int]] = []

    def lookup(src: int, dst: int) -> bytes:
        asked.append((src, dst))
        return ring(src, dst)

    stranger = Session(rank=7, job=JOB, config=CFG, key=ring)  # holds the secret, not a peer
    rx = Session(rank=1, job=JOB, config=CFG, key=lookup, peers=(0, 1, 2))
    stranger.send_message(1, X, step=0, msg=0, now=0.0)
    data, _ = _sent(stranger)
    _feed(rx, data)
    assert rx.stats.rejected == {"auth_failed": _records(data)}
    assert asked == []
    assert rx.keys is not None and rx.keys.of(7) is None and rx.keys.of(0) == ring(0, 1)
