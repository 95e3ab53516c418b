"""The scapy layers read and build the golden vectors exactly as the codec does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from dlcp.inspect import (
    DEFAULT_PORT,
    DLCPAbort,
    DLCPControl,
    DLCPData,
    DLCPFinish,
    DLCPNack,
    DLCPNackRange,
    DLCPRate,
    DLCPStop,
    authenticate,
    layer_for,
)
from dlcp.proto.control import AbortReason
from dlcp.proto.wire import DType, Flags, PacketType, TosMap

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "wire_vectors.json").read_text())
DATA = GOLDEN["data"]
CONTROL = GOLDEN["control"]
BAD = [v for v in GOLDEN["bad"] if v["hex"]]

HEADER_FIELDS = ("job", "step", "msg", "layer", "seq", "offset", "msg_elems", "payload_len")
HEADER_FIELDS += ("src", "prio", "mag", "bound", "path", "flags")


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


def data_fields(vector: dict[str, Any]) -> dict[str, Any]:
    """The golden header as scapy field values (without the tag)."""
    h = vector["header"]
    fields = {name: h[name] for name in HEADER_FIELDS}
    fields.update(drop=int(h["drop"]), dtype=int(DType[h["dtype"]]))
    fields["data"] = bytes.fromhex(vector["payload"])
    return fields


def control_body(vector: dict[str, Any]) -> Packet:
    f = vector["fields"]
    ptype = PacketType[vector["type"]]
    if ptype is PacketType.STOP:
        return DLCPStop(received_elems=f["received_elems"])
    if ptype is PacketType.FINISH:
        return DLCPFinish(
            round=f["round"],
            total_chunks=f["total_chunks"],
            protected_chunks=f["protected_chunks"],
            class_chunks=f["class_chunks"],
            tail=f.get("tail", []),
        )
    if ptype is PacketType.NACK:
        ranges = [DLCPNackRange(first_seq=a, count=n) for a, n in f["ranges"]]
        return DLCPNack(
            round=f["round"],
            nack_flags=1 if f.get("more") else 0,
            needed_elems=f["needed_elems"],
            ranges=ranges,
        )
    if ptype is PacketType.RATE:
        return DLCPRate(bytes_per_s=f["bytes_per_s"], interval_us=f["interval_us"])
    return DLCPAbort(reason=int(AbortReason[f["reason"]]), by_receiver=int(f.get("by_receiver", 0)))


def build_control(vector: dict[str, Any]) -> Packet:
    f = vector["fields"]
    pkt = DLCPControl(
        type=int(PacketType[vector["type"]]),
        flags=vector["flags"] & ~int(Flags.AUTH),  # (AUTH: set by authenticate)
        job=vector["job"],
        step=f["step"],
        msg=f["msg"],
        src=f["src"],
        body=control_body(vector),
    )
    if vector["key"] is None:
        return pkt
    return authenticate(pkt, bytes.fromhex(vector["key"]), vector["nonce"])


# ------------------------------------------------------------------------------ data


@pytest.mark.parametrize("vector", DATA, ids=_ids(DATA))
def test_data_vectors_dissect_to_the_golden_fields(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    pkt = layer_for(raw)
    assert isinstance(pkt, DLCPData)
    assert (pkt.version, pkt.type) == (1, PacketType.DATA)
    for name, value in data_fields(vector).items():
        assert pkt.getfieldval(name) == value, name
    assert int(pkt.flags) == vector["wire"]["flags"]
    assert pkt.dtype_reserved == 0
    if vector["tag"] is None:
        assert "tag" not in pkt.fields
        assert not pkt.flags.AUTH
    else:
        assert pkt.flags.AUTH
        assert int.from_bytes(pkt.nonce, "big") == vector["nonce"]
        assert pkt.tag == bytes.fromhex(vector["tag"])
    assert not pkt.payload  # nothing left over
    assert bytes(pkt) == raw


@pytest.mark.parametrize("vector", DATA, ids=_ids(DATA))
def test_data_vectors_built_with_scapy_give_the_golden_bytes(vector: dict[str, Any]) -> None:
    fields = data_fields(vector)
    del fields["payload_len"]  # scapy fills it in from the data
    pkt = DLCPData(**fields)
    if vector["key"] is not None:
        nonce = vector["nonce"].to_bytes(8, "big")
        with_tag = DLCPData(**fields, nonce=nonce, tag=bytes.fromhex(vector["tag"]))
        assert bytes(with_tag) == bytes.fromhex(vector["hex"])
        pkt = authenticate(pkt, bytes.fromhex(vector["key"]), vector["nonce"])
    assert bytes(pkt) == bytes.fromhex(vector["hex"])


# --------------------------------------------------------------------------- control


@pytest.mark.parametrize("vector", CONTROL, ids=_ids(CONTROL))
def test_control_vectors_dissect_to_the_golden_fields(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    pkt = layer_for(raw)
    assert isinstance(pkt, DLCPControl)
    assert (pkt.version, pkt.type) == (1, PacketType[vector["type"]])
    assert int(pkt.flags) == vector["flags"]
    assert (pkt.job, pkt.body_len, pkt.reserved) == (vector["job"], vector["body_len"], 0)
    f = vector["fields"]
    assert (pkt.step, pkt.msg, pkt.src) == (f["step"], f["msg"], f["src"])
    body = pkt.body
    assert type(body) is type(control_body(vector))
    for name, value in f.items():
        if name in ("step", "msg", "src"):
            continue
        if name == "ranges":
            assert body.n_ranges == len(value)
            assert [[r.first_seq, r.count] for r in body.ranges] == value
        elif name == "reason":
            assert body.reason == AbortReason[value]
        elif name == "more":
            assert bool(int(body.nack_flags) & 1) == value
        elif name == "shared":  # (a header flag of RATE's)
            assert bool(int(pkt.flags) & 1) == value
        else:
            assert body.getfieldval(name) == value, name
    if vector["tag"] is not None:
        assert int.from_bytes(pkt.nonce, "big") == vector["nonce"]
        assert pkt.tag == bytes.fromhex(vector["tag"])
    assert not pkt.payload
    assert bytes(pkt) == raw


@pytest.mark.parametrize("vector", CONTROL, ids=_ids(CONTROL))
def test_control_vectors_built_with_scapy_give_the_golden_bytes(vector: dict[str, Any]) -> None:
    assert bytes(build_control(vector)) == bytes.fromhex(vector["hex"])


# ---------------------------------------------------------------------- frames, misc


@pytest.mark.parametrize("vector", DATA + CONTROL, ids=_ids(DATA + CONTROL))
def test_frames_on_the_dlcp_port_dissect_as_dlcp(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    layer = layer_for(raw)
    if isinstance(layer, DLCPData):
        tos = TosMap().tos(layer.prio, bool(layer.drop))
    else:
        tos = TosMap().tos(7, False)  # control travels protected, highest class
    frame = Ether() / IP(src="10.0.0.1", dst="10.0.0.2", tos=tos) / UDP(sport=40000) / layer
    wire_bytes = bytes(frame)
    back = Ether(wire_bytes)
    assert back[UDP].dport == DEFAULT_PORT
    assert back[IP].tos == tos
    dlcp = back[type(layer)]
    assert bytes(dlcp) == raw
    assert dlcp.job == vector["job"]
    assert not dlcp.payload


def test_replies_from_the_dlcp_port_dissect_too() -> None:
    raw = bytes.fromhex(CONTROL[0]["hex"])
    frame = Ether() / IPv6() / UDP(sport=DEFAULT_PORT, dport=51000) / Raw(raw)
    assert bytes(Ether(bytes(frame))[DLCPControl]) == raw


def test_either_layer_class_dispatches_on_the_type_nibble() -> None:
    data = bytes.fromhex(DATA[0]["hex"])
    control = bytes.fromhex(CONTROL[0]["hex"])
    assert isinstance(DLCPControl(data), DLCPData)
    assert isinstance(DLCPData(control), DLCPControl)


@pytest.mark.parametrize("vector", BAD, ids=_ids(BAD))
def test_malformed_datagrams_dissect_without_losing_bytes(vector: dict[str, Any]) -> None:
    raw = bytes.fromhex(vector["hex"])
    assert bytes(layer_for(raw)) == raw


def test_unknown_control_types_keep_their_body_raw() -> None:
    pkt = layer_for(bytes.fromhex("17000001000000010002000300040000deadbeef"))
    assert isinstance(pkt, DLCPControl) and pkt.type == 7
    assert isinstance(pkt.body, Raw) and pkt.body.load == bytes.fromhex("deadbeef")


def test_layer_for_rejects_an_empty_datagram() -> None:
    with pytest.raises(ValueError, match="empty datagram"):
        layer_for(b"")


def test_authenticate_needs_a_dlcp_layer() -> None:
    with pytest.raises(TypeError, match="not UDP"):
        authenticate(UDP(), b"k" * 16, 0)
