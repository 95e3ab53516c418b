"""Scapy layers for looking at DLCP traffic: inspection and tests only.

These layers are a second, independent reading of ``docs/spec.md``; the codec
in :mod:`dlcp.proto.wire` is the data path and never goes through scapy
(scapy builds about a thousand packets per second). Both are checked against
the same golden vectors in ``tests/golden/wire_vectors.json``.

* :class:`DLCPData`: the 32-byte data header with its bit fields split out,
  then the payload (``data``) and, when the AUTH flag is set, the 8-byte
  ``nonce`` (big-endian bytes) and the 16-byte ``tag``.
* :class:`DLCPControl`: the 16-byte control header, then the body dissected by
  packet type (:class:`DLCPStop`, :class:`DLCPFinish`, :class:`DLCPNack`,
  :class:`DLCPRate`, :class:`DLCPAbort`; raw bytes for unknown types), then
  the nonce and tag when the AUTH flag is set.

Both classes dispatch on the type nibble of the first byte, so either one
dissects any DLCP datagram into the right layer, and binding them to a UDP
port (done here for :data:`DEFAULT_PORT`) dissects captures of both kinds::

    >>> pkt = layer_for(datagram)               # DLCPData or DLCPControl
    >>> Ether(frame)[DLCPControl].body.ranges   # a NACK's ranges

Field names follow :data:`dlcp.proto.wire.HEADER_DTYPE`; bytes that no field
claims (anything after the tag) are kept as scapy ``Padding``.
"""

from __future__ import annotations

from typing import Any, ClassVar

try:
    import scapy  # noqa: F401  (the dissector's layers are scapy's)
except ModuleNotFoundError as exc:  # (the inspect extra; the data path never needs it)
    raise ModuleNotFoundError(
        "dlcp.inspect dissects DLCP packets with scapy, which is not installed: "
        "pip install 'dlcp[inspect]' (or the dev extra)",
        name=exc.name,
    ) from None

from scapy.fields import (
    AnyField,
    BitEnumField,
    BitField,
    ByteField,
    ConditionalField,
    FieldLenField,
    FieldListField,
    FlagsField,
    IntField,
    LongField,
    PacketLenField,
    PacketListField,
    ShortEnumField,
    ShortField,
    StrLenField,
    XStrFixedLenField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_bottom_up, bind_layers

from dlcp.proto.control import AbortReason
from dlcp.proto.wire import (
    AUTH_NONCE_LEN,
    AUTH_TAG_LEN,
    CONTROL_HEADER_LEN,
    DATA_HEADER_LEN,
    DEFAULT_PORT,
    VERSION,
    Domain,
    DType,
    Flags,
    PacketType,
    gmac_tag,
)

from .errors import ArgumentTypeError, UsageError

__all__ = [
    "DEFAULT_PORT",
    "DLCPAbort",
    "DLCPControl",
    "DLCPData",
    "DLCPFinish",
    "DLCPNack",
    "DLCPNackRange",
    "DLCPRate",
    "DLCPStop",
    "authenticate",
    "bind_port",
    "layer_for",
]

#: UDP port DLCP uses unless configured otherwise

_TYPE_NAMES = {t.value: t.name for t in PacketType}
_DTYPE_NAMES = {d.value: d.name for d in DType}
_ABORT_NAMES = {r.value: r.name for r in AbortReason}
#: FlagsField names, bit 0 first (bits 3-7 are reserved)
_FLAG_NAMES = ["LAST", "RETRANSMIT", "AUTH"]
#: a control header's flags: AUTH, and SHARED in RATE (spec 5.1, 5.5)
_CONTROL_FLAG_NAMES = ["SHARED", "bit1", "AUTH"]


def _has_tag(pkt: Packet) -> bool:
    return bool(int(pkt.flags) & Flags.AUTH)


def _class_for(data: bytes | None, default: type[Packet]) -> type[Packet]:
    """DLCPData for a type nibble of 1, DLCPControl for anything else."""
    if not data:
        return default
    return DLCPData if data[0] & 0x0F == PacketType.DATA else DLCPControl


class _DLCPHeader(Packet):
    """Shared behaviour: dispatch on the type nibble, nothing carried above."""

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        return _class_for(_pkt, cls)

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class DLCPData(_DLCPHeader):
    """A data datagram: 32-byte header, payload, optional tag."""

    name = "DLCP data"
    fields_desc: ClassVar[list[AnyField]] = [
        # byte 0: ver_type
        BitField("version", VERSION, 4),
        BitEnumField("type", PacketType.DATA, 4, _TYPE_NAMES),
        FlagsField("flags", 0, 8, _FLAG_NAMES),
        ShortField("job", 0),
        IntField("step", 0),
        ShortField("msg", 0),
        ShortField("layer", 0),
        IntField("seq", 0),
        IntField("offset", 0),
        IntField("msg_elems", 0),
        FieldLenField("payload_len", None, length_of="data", fmt="!H"),
        ShortField("src", 0),
        # byte 28: tclass
        BitField("prio", 0, 3),
        BitField("drop", 0, 1),
        BitField("mag", 0, 4),
        # byte 29: dtype
        BitEnumField("dtype", DType.FLOAT32, 4, _DTYPE_NAMES),
        BitField("dtype_reserved", 0, 4),
        ByteField("bound", 0),
        ByteField("path", 0),
        StrLenField("data", b"", length_from=lambda pkt: pkt.payload_len),
        ConditionalField(XStrFixedLenField("nonce", b"", AUTH_NONCE_LEN), _has_tag),
        ConditionalField(XStrFixedLenField("tag", b"", AUTH_TAG_LEN), _has_tag),
    ]
    dispatch_hook = _DLCPHeader.__dict__["dispatch_hook"]

    def mysummary(self) -> str:
        return str(
            self.sprintf(
                "DLCP data job=%DLCPData.job% step=%DLCPData.step% msg=%DLCPData.msg% "
                "seq=%DLCPData.seq% prio=%DLCPData.prio% drop=%DLCPData.drop%"
            )
        )


# --------------------------------------------------------------------- control bodies


class _Body(Packet):
    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


class DLCPStop(_Body):
    name = "DLCP STOP"
    fields_desc: ClassVar[list[AnyField]] = [IntField("received_elems", 0)]


#: scapy types a FieldListField default as a list of fields; it is a list of values
_NO_CLASS_CHUNKS: Any = [0] * 16


class DLCPFinish(_Body):
    name = "DLCP FINISH"
    fields_desc: ClassVar[list[AnyField]] = [
        ShortField("round", 0),
        FieldLenField("tail_count", None, count_of="tail", fmt="!H"),
        IntField("total_chunks", 0),
        IntField("protected_chunks", 0),
        # chunks per (priority, drop) class at index prio * 2 + drop
        FieldListField(
            "class_chunks", _NO_CLASS_CHUNKS, IntField("", 0), count_from=lambda pkt: 16
        ),
        # the last chunk of the round on each path (spec 5.3)
        FieldListField("tail", [], IntField("", 0), count_from=lambda pkt: pkt.tail_count),
    ]


class DLCPNackRange(_Body):
    name = "DLCP NACK range"
    fields_desc: ClassVar[list[AnyField]] = [IntField("first_seq", 0), IntField("count", 0)]


class DLCPNack(_Body):
    name = "DLCP NACK"
    fields_desc: ClassVar[list[AnyField]] = [
        ShortField("round", 0),
        FlagsField("nack_flags", 0, 8, ["MORE"]),
        FieldLenField("n_ranges", None, count_of="ranges", fmt="!B"),
        IntField("needed_elems", 0),
        PacketListField("ranges", [], DLCPNackRange, count_from=lambda pkt: pkt.n_ranges),
    ]


class DLCPRate(_Body):
    name = "DLCP RATE"
    fields_desc: ClassVar[list[AnyField]] = [
        LongField("bytes_per_s", 0),
        IntField("interval_us", 0),
    ]


class DLCPAbort(_Body):
    name = "DLCP ABORT"
    fields_desc: ClassVar[list[AnyField]] = [
        ShortEnumField("reason", AbortReason.GAVE_UP, _ABORT_NAMES),
        BitField("reserved", 0, 15),  # the flags field's other bits
        BitField("by_receiver", 0, 1),  # flags bit 0 (spec 5.6)
    ]


_BODY_CLASSES: dict[int, type[Packet]] = {
    PacketType.STOP: DLCPStop,
    PacketType.FINISH: DLCPFinish,
    PacketType.NACK: DLCPNack,
    PacketType.RATE: DLCPRate,
    PacketType.ABORT: DLCPAbort,
}


def _control_body(data: bytes, _parent: Packet | None = None, **kargs: Any) -> Packet:
    """Dissect a control body by the packet type already read from the header."""
    ptype = int(_parent.type) if _parent is not None else -1
    cls = _BODY_CLASSES.get(ptype, Raw)
    return cls(data, _parent=_parent, **kargs)


class DLCPControl(_DLCPHeader):
    """A control datagram: 16-byte header, typed body, optional tag."""

    name = "DLCP control"
    fields_desc: ClassVar[list[AnyField]] = [
        # byte 0: ver_type
        BitField("version", VERSION, 4),
        BitEnumField("type", PacketType.STOP, 4, _TYPE_NAMES),
        FlagsField("flags", 0, 8, _CONTROL_FLAG_NAMES),
        ShortField("job", 0),
        IntField("step", 0),
        ShortField("msg", 0),
        ShortField("src", 0),
        FieldLenField("body_len", None, length_of="body", fmt="!H"),
        ShortField("reserved", 0),
        PacketLenField(
            "body",
            None,  # type: ignore[arg-type]  # scapy types the default as Packet; None is "no body"
            _control_body,
            length_from=lambda pkt: pkt.body_len,
        ),
        ConditionalField(XStrFixedLenField("nonce", b"", AUTH_NONCE_LEN), _has_tag),
        ConditionalField(XStrFixedLenField("tag", b"", AUTH_TAG_LEN), _has_tag),
    ]
    dispatch_hook = _DLCPHeader.__dict__["dispatch_hook"]

    def mysummary(self) -> str:
        return str(
            self.sprintf(
                "DLCP %DLCPControl.type% job=%DLCPControl.job% step=%DLCPControl.step% "
                "msg=%DLCPControl.msg%"
            )
        )


# --------------------------------------------------------------------------- helpers


def layer_for(data: bytes) -> Packet:
    """Dissect one DLCP datagram (UDP payload) into DLCPData or DLCPControl.

    Malformed datagrams are dissected as far as their bytes go (the codec, not
    this layer, decides what is valid); one too short for its header comes back
    as ``Raw``, as scapy shows any undissectable payload inside a frame.
    """
    if not data:
        raise UsageError("empty datagram: a DLCP datagram starts with its ver_type byte")
    data = bytes(data)
    cls = _class_for(data, DLCPData)
    if len(data) < (DATA_HEADER_LEN if cls is DLCPData else CONTROL_HEADER_LEN):
        return Raw(load=data)
    return cls(data)


def authenticate(pkt: Packet, key: bytes, nonce: int) -> Packet:
    """A copy of a DLCPData/DLCPControl layer with AUTH set, ``nonce`` in its
    trailer and its tag computed: AES-GMAC over every byte before the tag (spec
    §3), as :func:`dlcp.proto.wire.gmac_tag` computes it.
    """
    if not isinstance(pkt, DLCPData | DLCPControl):
        raise ArgumentTypeError(
            f"authenticate takes a DLCPData or DLCPControl layer, not {type(pkt).__name__}"
        )
    signed = pkt.copy()
    signed.remove_payload()
    signed.flags = int(signed.flags) | Flags.AUTH
    signed.nonce = nonce.to_bytes(AUTH_NONCE_LEN, "big")
    signed.tag = bytes(AUTH_TAG_LEN)
    covered = bytes(signed)[:-AUTH_TAG_LEN]
    domain = Domain.DATA if isinstance(pkt, DLCPData) else Domain.CONTROL
    signed.tag = gmac_tag(key, covered, domain=domain, src=int(signed.src), nonce=nonce)
    return signed


def bind_port(port: int) -> None:
    """Dissect UDP traffic to or from ``port`` as DLCP (DEFAULT_PORT is bound on import)."""
    for cls in (DLCPData, DLCPControl):
        bind_layers(UDP, cls, dport=port)
        bind_bottom_up(UDP, cls, sport=port)


bind_port(DEFAULT_PORT)
