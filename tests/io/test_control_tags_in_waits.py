"""Control frames taken by the receive loop's waits in a job that authenticates
(``dlcp/io/_control_frames.h``, ``dlcp.io.control_in_waits``): a RATE, STOP or
crossed FINISH is taken only with the AUTH flag and a trailer whose AES-GMAC tag
verifies under the key of its source (the table's key of that rank, libcrypto),
exactly as ``decode_control`` with that key accepts it; anything else stays on the
socket for Python, which refuses it as it always did.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import numpy as np
import pytest

from dlcp.io import native_receive
from dlcp.io.engine import native_available, native_seals
from dlcp.proto.auth import Domain
from dlcp.proto.control import (
    RATE_SHARED,
    ControlMessage,
    Finish,
    RateFeedback,
    Stop,
    decode_control,
    encode_control,
)
from dlcp.proto.wire import VERSION, Flags, PacketType, WireError, seal_datagram
from tests.io.test_linger_rates import FIRST, JOB, SRC, Lingering, _udpio, framed

pytestmark = pytest.mark.skipif(
    not (native_receive.available() and native_available() and native_receive.verifies_tags()),
    reason="the native receive path, the native engine or its libcrypto was not built",
)

STOP_FIRST = (VERSION << 4) | PacketType.STOP
FINISH_FIRST = (VERSION << 4) | PacketType.FINISH
AUTH = int(Flags.AUTH)
KEY, OTHER_KEY = bytes(range(16)), bytes(range(100, 116))


def tagged(msg: ControlMessage, *, key: bytes = KEY, nonce: int = 7) -> bytes:
    """One frame of ``msg`` as an authenticating rank sends it."""
    return framed(encode_control(msg, job=JOB, key=key, nonce=nonce))


def rate(bytes_per_s: int = 2_000_000, *, src: int = SRC, **tag: Any) -> bytes:
    return tagged(RateFeedback(0, 0, src, bytes_per_s=bytes_per_s, interval_us=5000), **tag)


def stop(step: int = 7, msg: int = 1, *, src: int = SRC, **tag: Any) -> bytes:
    return tagged(Stop(step, msg, src, received_elems=10), **tag)


def finish(step: int = 7, msg: int = 1, **tag: Any) -> bytes:
    counts = (40,) + (0,) * 15
    body = Finish(step, msg, SRC, round=0, total_chunks=40, protected_chunks=40,
                  class_chunks=counts, tail=(38, 39))  # fmt: skip
    return tagged(body, **tag)


def walked(stream: bytes, *, auth: int = AUTH, key: bytes | None = KEY) -> tuple[int, list[Any]]:
    consumed, frames = _udpio().control_frames(
        stream, JOB, FIRST, RATE_SHARED, SRC, STOP_FIRST, FINISH_FIRST, auth, key
    )
    return int(consumed), list(frames)


def python_applies(frame: bytes, kind: type[Any]) -> bool:
    """Whether the session, verifying with KEY, applies ``frame`` as a ``kind`` from SRC
    (a FINISH with chunks in it: the inbox refuses one without)."""
    (length,) = struct.unpack_from(">I", frame)
    datagram = frame[4:]
    if length != len(datagram) or len(datagram) < 16:
        return False
    try:
        ctrl = decode_control(datagram, job=JOB, key=KEY)
    except WireError:
        return False
    if isinstance(ctrl, Finish) and ctrl.total_chunks == 0:
        return False
    return isinstance(ctrl, kind) and ctrl.src == SRC


def resealed(frame: bytes, key: bytes = KEY) -> bytes:
    """``frame`` with its tag made again over what it now says (its header's source
    rank and its nonce), as a sender with ``key`` would have tagged it."""
    datagram = frame[4:]
    src = struct.unpack_from(">H", datagram, 10)[0]
    nonce = int.from_bytes(datagram[-24:-16], "big")
    sealed = seal_datagram(datagram[:-24], key, domain=Domain.CONTROL, src=src, nonce=nonce)
    return frame[:4] + sealed


@pytest.mark.parametrize(("kind", "make"), [(RateFeedback, rate), (Stop, stop), (Finish, finish)])
def test_a_tagged_frame_is_taken_exactly_when_decode_control_accepts_it(
    kind: type[Any], make: Any
) -> None:
    """A tagged RATE, STOP or FINISH and every single-byte change of it, a good
    frame behind it: the walk takes the frame exactly when the session, verifying
    with the key, applies it as that message from this rank, and then the next."""
    base = make()
    good = stop(8, 2)  # (a STOP: no RATE is taken behind a STOP)
    assert python_applies(base, kind) and walked(base + good)[0] == len(base) + len(good)
    for i in range(len(base)):
        for value in {0, 0x80, 0xFF, base[i] ^ 1}:
            frame = base[:i] + bytes([value]) + base[i + 1 :]
            if frame == base:
                continue
            consumed, _ = walked(frame + good)
            want = len(frame) + len(good) if python_applies(frame, kind) else 0
            assert consumed == want, (i, value)


@pytest.mark.parametrize(("kind", "make"), [(RateFeedback, rate), (Stop, stop), (Finish, finish)])
def test_a_changed_frame_tagged_again_is_taken_exactly_when_decode_control_accepts_it(
    kind: type[Any], make: Any
) -> None:
    """Every single-byte change of a RATE, STOP or FINISH's header and body (its
    flags, job, source, lengths, counts, tail) tagged again under the key, so that
    the tag verifies: the walk takes it exactly when the session applies it."""
    base = make()
    good = stop(8, 2)
    taken = 0
    for i in range(4, len(base) - 24):  # (the length prefix and the trailer aside)
        for value in {0, 0x80, 0xFF, base[i] ^ 1}:
            frame = resealed(base[:i] + bytes([value]) + base[i + 1 :])
            consumed, _ = walked(frame + good)
            applies = python_applies(frame, kind)
            taken += applies
            assert consumed == (len(frame) + len(good) if applies else 0), (i, value)
    assert taken > 0  # (changes of the step, message and values are still messages)


def test_a_frame_tagged_with_another_ranks_key_is_not_taken() -> None:
    """A table holding the keys of two ranks: a frame on SRC's connection that claims
    SRC but is tagged with the other rank's key is left to Python."""
    t = TaggedLingering()
    other_r, other_w = socket.socketpair()
    try:
        t.runs.watch_control(other_r.fileno(), SRC + 1, OTHER_KEY)  # (its key is held too)
        t.ctl_w.sendall(stop(key=OTHER_KEY))
        assert t.receive(30.0) < 30.0
        assert t.left_on_socket() == stop(key=OTHER_KEY) and t.runs.stops_taken == (0, 0)
        t.ctl_w.sendall(stop())
        t.receive(0.05)
        assert t.left_on_socket() == b"" and t.runs.stops_taken == (1, 0)
    finally:
        other_r.close()
        other_w.close()
        t.close()


def test_untagged_wrongly_keyed_and_keyless_frames_stay_for_python() -> None:
    untagged = framed(encode_control(Stop(7, 1, SRC, received_elems=10), job=JOB))
    assert walked(untagged) == (0, [])
    assert walked(stop(key=OTHER_KEY)) == (0, [])
    assert walked(stop(src=SRC + 1)) == (0, [])  # (another rank's, whatever its tag)
    assert walked(stop(), key=None) == (0, [])  # (no key: no tag verifies)
    assert walked(stop(), auth=0) == (0, [])  # (a job that does not authenticate)
    consumed, frames = walked(rate() + stop(5, 9) + finish(5, 8) + untagged + rate())
    assert consumed == len(rate() + stop(5, 9) + finish(5, 8))
    assert [f[0] for f in frames] == ["rate", "stop", "finish"]
    assert frames[1][1:] == (5, 9) and frames[2][1:] == (5, 8)


class TaggedLingering(Lingering):
    """A lingering table of a job that authenticates, its connection watched with
    the key of SRC, STOPs taken."""

    def __init__(self, key: bytes | None = KEY) -> None:
        super().__init__()
        from dlcp.io.engine import _native

        assert _native is not None
        self.runs.take_rates(_native.PACER_API, JOB, authenticates=True)
        self.runs.take_stops(0.05)
        self.runs.watch_control(self.ctl_r.fileno(), SRC, key)


@pytest.fixture
def tagged_lingering():  # type: ignore[no-untyped-def]
    t = TaggedLingering()
    try:
        yield t
    finally:
        t.close()


def test_tagged_frames_are_taken_in_the_linger_and_a_bad_tag_ends_it(
    tagged_lingering: TaggedLingering,
) -> None:
    """A tagged RATE and STOP are taken (the STOP kept with its trailer, which the
    session verifies again); a RATE whose tag is one bit off stays whole on the
    socket and ends the linger at once."""
    t = tagged_lingering
    t.ctl_w.sendall(rate(3_000_000) + stop(5, 9))
    t.receive(0.05)
    assert t.left_on_socket() == b""
    assert t.runs.rates_taken == 1 and t.runs.stops_taken == (1, 0)
    ((src, datagram, _),) = t.runs.stops()
    assert src == SRC and datagram == stop(5, 9)[4:]
    assert decode_control(datagram, job=JOB, key=KEY) == Stop(5, 9, SRC, received_elems=10)
    forged = rate(9_000_000)
    forged = forged[:-1] + bytes([forged[-1] ^ 1])
    t.ctl_w.sendall(forged)
    assert t.receive(30.0) < 30.0
    assert t.left_on_socket() == forged and t.runs.rates_taken == 1


def test_a_rank_the_table_has_no_key_of_has_every_frame_left_to_python() -> None:
    t = TaggedLingering(key=None)
    try:
        t.ctl_w.sendall(rate())
        assert t.receive(30.0) < 30.0
        assert t.left_on_socket() == rate() and t.runs.rates_taken == 0
    finally:
        t.close()


def test_bad_arguments_are_named(tagged_lingering: TaggedLingering) -> None:
    with pytest.raises(ValueError, match="a tag_key of 5 bytes"):
        walked(stop(), key=b"short")
    table = tagged_lingering.runs.table
    for flag in (3, 1):  # (two bits; the SHARED bit)
        with pytest.raises(ValueError, match=f"auth_flag {flag} is not one flag bit apart from "
                           "shared_flag 1"):  # fmt: skip
            table.take_rates(None, JOB, FIRST, RATE_SHARED, flag)
    with pytest.raises(ValueError, match="tag_key of src 3 must be 16, 24 or 32 bytes"):
        table.watch_control(tagged_lingering.ctl_r.fileno(), SRC, b"short")


@pytest.mark.integration
def test_authenticating_endpoints_take_control_frames_in_their_waits() -> None:
    """Two native endpoints of a job that authenticates, messages one way: the
    sender's waits take some of the receiver's RATEs and STOPs, the receiver's
    drop some FINISHes that crossed their STOP, every send settles with its report
    and every message arrives exact, with nothing refused."""
    from dlcp.proto.config import ProtocolConfig
    from tests.io.test_engines import _data, pair, transfer

    if not native_seals():
        pytest.skip("native engine built without libcrypto")
    auth = {"key": lambda src, dst: bytes([src, dst]) * 16,
            "protocol": ProtocolConfig(authenticate=True)}  # fmt: skip
    with pair(("native", "native"), receive_linger=0.01, **auth) as (a, b):
        deadline = time.monotonic() + 60.0
        msg = 0
        while True:
            data = _data(msg)
            received, sent, out = transfer(a, b, data, msg=msg, p=0.0)
            assert np.array_equal(out, data) and received.report.lost_elems == 0
            assert sent.acknowledged_elems == data.size
            sender, receiver = a.stats(), b.stats()
            if msg >= 11 and receiver["control_finishes_native"] > 0:
                break
            assert time.monotonic() < deadline, "no FINISH crossed its STOP"
            msg += 1
        assert sender["control_rates_native"] > 0 and sender["control_stops_native"] > 0
        for stats in (sender, receiver):
            assert stats["rejected"].get("auth_failed", 0) == 0, stats["rejected"]
            assert stats["rejected"].get("auth_required", 0) == 0, stats["rejected"]
