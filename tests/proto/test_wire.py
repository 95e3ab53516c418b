"""The wire codec against the golden vectors, round trips and batch parsing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlcp.proto import batch as batch_codec
from dlcp.proto import control, wire
from dlcp.proto.control import Abort, AbortReason, Finish, Nack, RateFeedback, Stop
from dlcp.proto.wire import (
    AUTH_NONCE_LEN,
    AUTH_TAG_LEN,
    AUTH_TRAILER_LEN,
    DATA_HEADER_LEN,
    HEADER_DTYPE,
    MAX_NACK_RANGES,
    DataHeader,
    Domain,
    DType,
    Flags,
    PacketType,
    Reason,
    TosMap,
    WireError,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "wire_vectors.json").read_text())
DATA = GOLDEN["data"]
CONTROL = GOLDEN["control"]
BAD = GOLDEN["bad"]

U16 = 0xFFFF
U32 = 0xFFFFFFFF


def _key(vector: dict[str, Any]) -> bytes | None:
    return bytes.fromhex(vector["key"]) if vector["key"] is not None else None


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


def expected_header(fields: dict[str, Any]) -> DataHeader:
    return DataHeader(
        **{**fields, "dtype": DType[fields["dtype"]], "flags": Flags(fields["flags"])}
    )


def expected_control(vector: dict[str, Any]) -> control.ControlMessage:
    f = dict(vector["fields"])
    ptype = PacketType[vector["type"]]
    if ptype is PacketType.STOP:
        return Stop(**f)
    if ptype is PacketType.FINISH:
        tail = tuple(f.get("tail", ()))
        return Finish(**{**f, "class_chunks": tuple(f["class_chunks"]), "tail": tail})
    if ptype is PacketType.NACK:
        return Nack(**{**f, "ranges": tuple(tuple(r) for r in f["ranges"])})
    if ptype is PacketType.RATE:
        return RateFeedback(**f)
    return Abort(**{**f, "reason": AbortReason[f["reason"]]})


# ----------------------------------------------------------------------------- golden


def test_golden_file_covers_the_spec() -> None:
    assert GOLDEN["version"] == wire.VERSION
    assert {DType[v["header"]["dtype"]] for v in DATA} == set(DType)
    assert {v["header"]["flags"] for v in DATA} >= {0, 1, 2, 3, 4, 7}
    assert {PacketType[v["type"]] for v in CONTROL} == set(PacketType) - {PacketType.DATA}
    assert any(v["type"] == "RATE" and v["fields"].get("shared") for v in CONTROL)
    assert {AbortReason[v["fields"]["reason"]] for v in CONTROL if v["type"] == "ABORT"} == set(
        AbortReason
    )
    assert {Reason[v["reason"]] for v in BAD} == set(Reason) - {Reason.OK}


@pytest.mark.parametrize("vector", DATA, ids=_ids(DATA))
def test_golden_data_decodes_and_reencodes(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    key = _key(vector)
    header, payload = batch_codec.decode_data(raw, job=vector["job"], key=key)
    assert header == expected_header(vector["header"])
    assert payload == bytes.fromhex(vector["payload"])
    assert wire.encode_data(header, payload, key=key, nonce=vector.get("nonce")) == raw
    if key is not None:
        end = len(raw) - AUTH_TAG_LEN
        assert raw[-AUTH_TAG_LEN:].hex() == vector["tag"]
        assert int.from_bytes(raw[end - AUTH_NONCE_LEN : end], "big") == vector["nonce"]
        tag = wire.gmac_tag(
            key, raw[:end], domain=Domain.DATA, src=header.src, nonce=vector["nonce"]
        )
        assert tag == raw[end:]


@pytest.mark.parametrize("vector", DATA, ids=_ids(DATA))
def test_golden_data_matches_the_structured_dtype(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    rec = np.frombuffer(raw[:DATA_HEADER_LEN], dtype=HEADER_DTYPE)[0]
    h = vector["header"]
    for name in ("job", "step", "msg", "layer", "seq", "offset", "msg_elems", "payload_len"):
        assert int(rec[name]) == h[name], name
    for name in ("src", "bound", "path"):
        assert int(rec[name]) == h[name], name
    for name, value in vector["wire"].items():
        assert int(rec[name]) == value, name
    assert vector["wire"]["ver_type"] == 0x11
    assert vector["wire"]["tclass"] == (h["prio"] << 5) | (int(h["drop"]) << 4) | h["mag"]
    assert vector["wire"]["dtype"] == DType[h["dtype"]] << 4


@pytest.mark.parametrize("vector", CONTROL, ids=_ids(CONTROL))
def test_golden_control_decodes_and_reencodes(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    key = _key(vector)
    msg = control.decode_control(raw, job=vector["job"], key=key, require_auth=key is not None)
    assert msg == expected_control(vector)
    assert wire.peek_type(raw) is PacketType[vector["type"]]
    assert control.encode_control(msg, job=vector["job"], key=key, nonce=vector.get("nonce")) == raw
    assert raw[1] == vector["flags"]
    assert len(raw) == 16 + vector["body_len"] + (AUTH_TRAILER_LEN if key else 0)
    if key is not None:
        end = len(raw) - AUTH_TAG_LEN
        tag = wire.gmac_tag(
            key, raw[:end], domain=Domain.CONTROL, src=msg.src, nonce=vector["nonce"]
        )
        assert tag == raw[end:] and raw[end:].hex() == vector["tag"]


@pytest.mark.parametrize("vector", BAD, ids=_ids(BAD))
def test_bad_vectors_raise_the_exact_reason_and_message(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    key = _key(vector)
    with pytest.raises(WireError) as info:
        if vector["kind"] == "data":
            batch_codec.decode_data(raw, job=vector["job"], key=key)
        else:
            control.decode_control(
                raw, job=vector["job"], key=key, require_auth=vector["require_auth"]
            )
    assert info.value.reason is Reason[vector["reason"]]
    assert str(info.value) == vector["message"]
    assert isinstance(info.value, ValueError)


BAD_DATA = [v for v in BAD if v["kind"] == "data"]


@pytest.mark.parametrize("vector", BAD_DATA, ids=_ids(BAD_DATA))
def test_bad_data_vectors_give_the_same_verdict_in_a_batch(vector: dict[str, Any]) -> None:
    raw = np.frombuffer(bytes.fromhex(vector["hex"]), dtype=np.uint8)
    batch = batch_codec.parse_batch(raw, max(len(raw), 1), job=vector["job"], key=_key(vector))
    assert Reason(int(batch.reasons[0])) is Reason[vector["reason"]]
    assert batch.message(0) == vector["message"]
    assert not batch.ok[0]


def test_a_receiver_without_a_key_accepts_tagged_data_unchecked() -> None:
    vector = next(v for v in DATA if v["key"] is not None)
    raw = bytearray(bytes.fromhex(vector["hex"]))
    raw[-1] ^= 0xFF  # a wrong tag is not looked at without a key
    header, _ = batch_codec.decode_data(bytes(raw), job=vector["job"])
    assert header.flags & Flags.AUTH


def test_peek_type_reads_only_version_and_type() -> None:
    assert wire.peek_type(b"\x16") is PacketType.ABORT
    with pytest.raises(WireError, match=r"^unknown packet type 9$"):
        wire.peek_type(b"\x19")


# -------------------------------------------------------------------------- encoding


def test_encoder_rejects_values_that_do_not_fit() -> None:
    base: dict[str, Any] = dict(job=1, step=0, msg=0, seq=0, offset=0, msg_elems=1, payload_len=4)
    with pytest.raises(ValueError, match=r"^prio=8 does not fit its field \(0\.\.7\)$"):
        DataHeader(**base, prio=8)
    with pytest.raises(ValueError, match=r"^mag=16 does not fit"):
        DataHeader(**base, mag=16)
    with pytest.raises(ValueError, match=r"^job=65536 does not fit"):
        DataHeader(**{**base, "job": 65536})
    with pytest.raises(ValueError, match=r"^unknown data flags 0x8$"):
        DataHeader(**base, flags=Flags(8))
    with pytest.raises(ValueError, match=r"^payload is 3 bytes but header says payload_len=4$"):
        wire.encode_data(DataHeader(**base), b"abc")
    with pytest.raises(ValueError, match="at most 170 ranges"):
        control.encode_control(Nack(0, 0, 0, ranges=((0, 1),) * 171), job=1)
    with pytest.raises(ValueError, match="needs 16 counts"):
        control.encode_control(Finish(0, 0, 0, class_chunks=(0,) * 15), job=1)


def test_encode_data_sets_or_clears_auth_to_match_the_key() -> None:
    h = DataHeader(
        job=1,
        step=0,
        msg=0,
        seq=0,
        offset=0,
        msg_elems=1,
        payload_len=1,
        dtype=DType.UINT8,
        flags=Flags.AUTH,
    )
    plain = wire.encode_data(h, b"\x05")
    assert plain[1] == 0 and len(plain) == 33
    tagged = wire.encode_data(h, b"\x05", key=b"k" * 16, nonce=9)
    assert tagged[1] == Flags.AUTH and len(tagged) == 33 + AUTH_TRAILER_LEN
    assert tagged[33:41] == (9).to_bytes(8, "big")


@pytest.mark.parametrize(
    ("p", "wire_value"), [(0.0, 0), (0.01, 10), (0.035, 35), (0.1, 100), (0.255, 255)]
)
def test_loss_bound_travels_in_thousandths(p: float, wire_value: int) -> None:
    assert wire.bound_to_wire(p) == wire_value
    assert wire.bound_from_wire(wire_value) == pytest.approx(p)


@pytest.mark.parametrize("p", [-0.001, 0.256, 1.0, math.nan])
def test_loss_bound_outside_the_field_is_rejected(p: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        wire.bound_to_wire(p)


# ------------------------------------------------------------------------ round trips

keys = st.none() | st.sampled_from([16, 24, 32]).flatmap(
    lambda n: st.binary(min_size=n, max_size=n)
)
nonces = st.integers(0, 2**64 - 1)


@st.composite
def data_datagrams(draw: st.DrawFn) -> tuple[DataHeader, bytes]:
    dtype = draw(st.sampled_from(list(DType)))
    n = draw(st.integers(1, 64))
    msg_elems = draw(st.integers(n, U32))
    offset = draw(st.integers(0, msg_elems - n))
    header = DataHeader(
        job=draw(st.integers(0, U16)),
        step=draw(st.integers(0, U32)),
        msg=draw(st.integers(0, U16)),
        seq=draw(st.integers(0, U32)),
        offset=offset,
        msg_elems=msg_elems,
        payload_len=n * dtype.itemsize,
        layer=draw(st.integers(0, U16)),
        src=draw(st.integers(0, U16)),
        prio=draw(st.integers(0, 7)),
        drop=draw(st.booleans()),
        mag=draw(st.integers(0, 15)),
        dtype=dtype,
        bound=draw(st.integers(0, 255)),
        path=draw(st.integers(0, 255)),
        flags=Flags(draw(st.integers(0, 3))),
    )
    payload = draw(st.binary(min_size=header.payload_len, max_size=header.payload_len))
    return header, payload


@given(data_datagrams(), keys, nonces)
def test_data_round_trip(datagram: tuple[DataHeader, bytes], key: bytes | None, nonce: int) -> None:
    header, payload = datagram
    raw = wire.encode_data(header, payload, key=key, nonce=nonce)
    assert len(raw) == DATA_HEADER_LEN + header.payload_len + (AUTH_TRAILER_LEN if key else 0)
    back, back_payload = batch_codec.decode_data(raw, job=header.job, key=key)
    want_flags = header.flags | Flags.AUTH if key is not None else header.flags
    assert back == DataHeader(**{**_fields(header), "flags": want_flags})
    assert back_payload == payload
    assert header.pack()[2:] == raw[2:DATA_HEADER_LEN]  # only the flags byte may differ


def _fields(h: DataHeader) -> dict[str, Any]:
    return {name: getattr(h, name) for name in DataHeader.__dataclass_fields__}


u16, u32 = st.integers(0, U16), st.integers(0, U32)


@st.composite
def finishes(draw: st.DrawFn) -> Finish:
    classes = tuple(draw(st.lists(st.integers(0, 2**27), min_size=16, max_size=16)))
    total = sum(classes)
    return Finish(
        draw(u32),
        draw(u16),
        draw(u16),
        round=draw(u16),
        total_chunks=total,
        protected_chunks=draw(st.integers(0, total)),
        class_chunks=classes,
    )


@st.composite
def nack_ranges(draw: st.DrawFn) -> tuple[int, int]:
    first = draw(st.integers(0, U32 - 1))
    return first, draw(st.integers(1, U32 - first))


control_messages = st.one_of(
    st.builds(Stop, u32, u16, u16, received_elems=u32),
    finishes(),
    st.builds(
        Nack,
        u32,
        u16,
        u16,
        round=u16,
        needed_elems=u32,
        ranges=st.lists(nack_ranges(), max_size=MAX_NACK_RANGES).map(tuple),
    ),
    st.builds(
        RateFeedback,
        u32,
        u16,
        u16,
        bytes_per_s=st.integers(0, 2**64 - 1),
        interval_us=u32,
        shared=st.booleans(),
    ),
    st.builds(
        Abort, u32, u16, u16, reason=st.sampled_from(list(AbortReason)), by_receiver=st.booleans()
    ),
)


@given(control_messages, u16, keys, nonces)
def test_control_round_trip(
    msg: control.ControlMessage, job: int, key: bytes | None, nonce: int
) -> None:
    raw = control.encode_control(msg, job=job, key=key, nonce=nonce)
    assert control.decode_control(raw, job=job, key=key, require_auth=key is not None) == msg
    assert control.decode_control(raw, job=job) == msg  # without a key the tag is not checked
    assert raw[0] == 0x10 | wire.peek_type(raw)


# ---------------------------------------------------------------------------- batches

KEY = bytes(range(32))
STRIDE = DATA_HEADER_LEN + 16 + AUTH_TRAILER_LEN  # 4 float32 elements, nonce and tag


def _record(seq: int, *, job: int = 1, n: int = 4, key: bytes | None = KEY) -> bytes:
    header = DataHeader(job=job, step=7, msg=2, seq=seq, offset=0, msg_elems=16, payload_len=4 * n)
    payload = np.arange(seq, seq + n, dtype="<f4").tobytes()
    return wire.encode_data(header, payload, key=key, nonce=1000 + seq)


def test_parse_batch_judges_each_record_on_its_own() -> None:
    tampered = bytearray(_record(2))
    tampered[40] ^= 0x01
    records = [
        _record(0),
        _record(1, job=9),  # wrong job
        bytes(tampered),  # payload changed after tagging
        _record(3),
        _record(4, n=10, key=None),  # same size, but untagged
        _record(5)[:20],  # the last datagram of a batch may be short: here truncated
    ]
    assert all(len(r) == STRIDE for r in records[:-1])
    buf = np.frombuffer(b"".join(records), dtype=np.uint8)
    batch = batch_codec.parse_batch(buf, STRIDE, job=1, key=KEY)

    assert [Reason(int(r)) for r in batch.reasons] == [
        Reason.OK,
        Reason.WRONG_JOB,
        Reason.AUTH_FAILED,
        Reason.OK,
        Reason.AUTH_REQUIRED,
        Reason.TRUNCATED,
    ]
    assert batch.ok.tolist() == [True, False, False, True, False, False]
    assert batch.lengths.tolist() == [STRIDE] * 5 + [20]
    assert batch.message(0) == ""
    assert batch.message(1) == "wrong job: datagram is for job 9, this endpoint serves job 1"
    assert batch.message(2) == "authentication failed: tag does not match"
    assert batch.message(4) == "authentication required: datagram carries no tag"
    assert batch.message(5) == "truncated datagram: 20 bytes, a data header needs 32"
    for i in np.flatnonzero(batch.ok):
        assert int(batch.headers[i]["seq"]) == i
        values = batch.payloads[i, :16].view("<f4")
        assert values.tolist() == [float(i + k) for k in range(4)]


def test_parse_batch_accepts_a_short_last_record_and_views_in_place() -> None:
    records = [_record(0, key=None), _record(1, key=None), _record(2, n=2, key=None)]
    stride = len(records[0])
    buf = np.frombuffer(b"".join(records), dtype=np.uint8)
    batch = batch_codec.parse_batch(buf, stride, job=1)
    assert batch.ok.all()
    assert batch.lengths.tolist() == [stride, stride, DATA_HEADER_LEN + 8]
    assert batch.headers["payload_len"].tolist() == [16, 16, 8]
    assert batch.payloads[2, :8].view("<f4").tolist() == [2.0, 3.0]


def test_parse_batch_without_short_tail_shares_memory() -> None:
    records = [_record(i, key=None) for i in range(3)]
    buf = np.frombuffer(b"".join(records), dtype=np.uint8)
    batch = batch_codec.parse_batch(buf, len(records[0]), job=1)
    assert batch.ok.all()
    assert np.shares_memory(batch.payloads, buf)


def test_parse_batch_require_auth_without_key_only_checks_presence() -> None:
    untagged = np.frombuffer(_record(0, key=None), dtype=np.uint8)
    batch = batch_codec.parse_batch(untagged, len(untagged), job=1, require_auth=True)
    assert Reason(int(batch.reasons[0])) is Reason.AUTH_REQUIRED
    forged = np.frombuffer(_record(0, key=b"some other key!!"), dtype=np.uint8)
    batch = batch_codec.parse_batch(forged, len(forged), job=1, require_auth=True)
    assert batch.ok.all()


def test_parse_batch_rejects_a_nonpositive_segment_size() -> None:
    with pytest.raises(ValueError, match="segment_size must be positive, got 0"):
        batch_codec.parse_batch(np.zeros(64, dtype=np.uint8), 0, job=1)


# -------------------------------------------------------------------------------- TOS


def test_tos_map_defaults() -> None:
    tos = TosMap()
    for entry in GOLDEN["tos_defaults"]:
        assert tos.tos(entry["prio"], entry["drop"]) == entry["tos"]
    for c in range(8):
        assert tos.tos(c, False) >> 2 == 8 * c  # DSCP CSc
        assert tos.tos(c, False) & 0b11 == 0b10  # protected: ECT(0), WRED marks it
        assert tos.tos(c, True) & 0b11 == 0b00  # drop-eligible: Not-ECT, WRED drops it


def test_tos_map_is_configurable() -> None:
    tos = TosMap(dscp=(0, 10, 18, 26, 34, 46, 48, 56), ecn_protected=0b01, ecn_droppable=0b00)
    assert tos.tos(5, False) == (46 << 2) | 0b01
    assert tos.tos(5, True) == 46 << 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dscp": (0, 8, 16)}, r"^TosMap\.dscp needs one DSCP per priority class \(8\), got 3$"),
        ({"dscp": (0, 8, 16, 24, 32, 40, 48, 64)}, r"^TosMap\.dscp\[7\]=64 is not a DSCP"),
        ({"dscp": (-1, 8, 16, 24, 32, 40, 48, 56)}, r"^TosMap\.dscp\[0\]=-1 is not a DSCP"),
        ({"ecn_protected": 4},
         r"^TosMap\.ecn_protected=4 is not an ECN codepoint \(an integer 0\.\.3\)$"),
        ({"ecn_droppable": -1}, r"^TosMap\.ecn_droppable=-1 is not an ECN codepoint"),
    ],
)
def test_tos_map_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TosMap(**kwargs)


def test_allowed_loss_is_the_spec_integer_formula() -> None:
    from dlcp.proto.wire import allowed_loss

    # spec §2.5: floor(bound * M / 1000); a float product lands one short here
    assert allowed_loss(0.172, 135_300_250) == 172 * 135_300_250 // 1000 == 23_271_643
    assert allowed_loss(0.05, 1000) == 50 and allowed_loss(0.0, 10**9) == 0
    assert allowed_loss(0.0509, 1000) == 50  # p is carried in thousandths, rounded down


@pytest.mark.parametrize("key", [b"", b"k" * 15, b"k" * 20, b"k" * 64])
def test_keys_other_than_aes_keys_are_refused(key: bytes) -> None:
    with pytest.raises(ValueError, match=r"authentication key must be 16, 24 or 32 bytes"):
        wire.gmac_tag(key, b"data", domain=Domain.DATA, src=0, nonce=0)


@pytest.mark.parametrize("nonce", [None, -1, 2**64])
def test_a_tagged_datagram_without_a_64_bit_nonce_is_refused(nonce: int | None) -> None:
    h = DataHeader(job=1, step=0, msg=0, seq=0, offset=0, msg_elems=1, payload_len=1,
                   dtype=DType.UINT8)  # fmt: skip
    with pytest.raises(ValueError, match="needs a 64-bit nonce"):
        wire.encode_data(h, b"\x05", key=KEY, nonce=nonce)
    with pytest.raises(ValueError, match="needs a 64-bit nonce"):
        control.encode_control(Stop(1, 2, 3), job=1, key=KEY, nonce=nonce)


def test_the_nonce_and_the_domain_are_part_of_the_tag() -> None:
    raw = _record(0)
    again = _record(0)
    assert raw == again  # same nonce, same bytes: the reference is deterministic
    header = batch_codec.decode_data(raw, job=1, key=KEY)[0]
    other = wire.encode_data(header, raw[32:48], KEY, nonce=1)
    assert other[:-AUTH_TRAILER_LEN] == raw[:-AUTH_TRAILER_LEN]
    assert other[-AUTH_TAG_LEN:] != raw[-AUTH_TAG_LEN:]  # another nonce, another tag
    end = len(raw) - AUTH_TAG_LEN
    as_control = wire.gmac_tag(KEY, raw[:end], domain=Domain.CONTROL, src=0, nonce=1000)
    assert as_control != raw[end:]


def test_every_control_type_has_one_body_codec() -> None:
    # the decoder dispatches on the type byte: every control type has a codec
    # for its own message class, and none for data
    assert set(control.CODECS) == set(PacketType) - {PacketType.DATA}
    assert len({c.cls for c in control.CODECS.values()}) == len(control.CODECS)
    for ptype, codec in control.CODECS.items():
        msg = codec.cls(7, 3, 1)  # every field but the key at its default
        raw = control.encode_control(msg, job=1)
        assert raw[0] == (wire.VERSION << 4) | ptype
        assert control.decode_control(raw, job=1) == msg


def test_control_source_reads_the_claimed_rank_from_the_header() -> None:
    raw = control.encode_control(Stop(7, 3, 513, received_elems=9), job=1)
    assert control.control_source(raw) == 513
    assert control.control_source(raw[: wire.CONTROL_HEADER_LEN - 1]) is None
