"""P4Info name resolution and canonical value encoding, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import build_p4info, protos

from dlcp.switch.p4entries import Exact, Lpm, P4Names, TableEntry

pytest.importorskip("grpc", reason="the switch extra (grpcio) is not installed")
pytest.importorskip("p4", reason="the switch extra (p4runtime) is not installed")

from dlcp.switch.p4info import P4InfoError, P4InfoHelper, canonical_bytes, to_int

N = P4Names


@pytest.fixture
def helper() -> P4InfoHelper:
    return P4InfoHelper(build_p4info(), protos())


@pytest.mark.parametrize(
    ("value", "width", "expected"),
    [(0, 9, b"\x00"), (1, 9, b"\x01"), (511, 9, b"\x01\xff"), (0x0AD70002, 32, b"\x0a\xd7\x00\x02"),
     (0x00D7, 32, b"\xd7"), (7, 3, b"\x07"), (2**48 - 1, 48, b"\xff" * 6)],
)  # fmt: skip
def test_canonical_bytes(value: int, width: int, expected: bytes) -> None:
    assert canonical_bytes(value, width, "f") == expected


def test_value_too_wide_names_the_field() -> None:
    with pytest.raises(P4InfoError, match="port: value 512 does not fit in 9 bits"):
        canonical_bytes(512, 9, "port")
    with pytest.raises(P4InfoError, match="does not fit"):
        canonical_bytes(-1, 9, "port")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), ("10.215.0.2", 0x0AD70002), ("02:dc:00:04:00:01", 0x02DC00040001)],
)
def test_to_int(value: int | str, expected: int) -> None:
    assert to_int(value, "x") == expected


@pytest.mark.parametrize("value", ["10.215.0", "10.215.0.300", "02:dc:00:04:00", "zz", True])
def test_to_int_rejects(value: str) -> None:
    with pytest.raises(P4InfoError, match="where: "):
        to_int(value, "where")


def test_lookups_by_name_and_alias(helper: P4InfoHelper) -> None:
    assert helper.table(N.IPV4_LPM).preamble.id == 0x02002000
    assert helper.table("ipv4_lpm") is helper.table(N.IPV4_LPM)
    assert helper.counter(N.FORWARDED).size == 8
    assert helper.table_name(0x02002000) == N.IPV4_LPM
    assert helper.table_name(7) == "<table id 7>"
    with pytest.raises(P4InfoError, match=r"table 'nope' is not in the P4Info \(known: "):
        helper.table("nope")
    with pytest.raises(P4InfoError, match="counter 'nope'"):
        helper.counter("nope")


def _entry(**kw: object) -> TableEntry:
    base: dict[str, object] = {
        "table": N.IPV4_LPM,
        "match": ((N.DST_ADDR, Lpm("10.215.2.0", 24)),),
        "action": N.SET_NEXT_HOP,
        "params": (("port", 3), ("smac", "02:00:00:00:00:01"), ("dmac", 0x020000000002)),
    }
    base.update(kw)
    return TableEntry(**base)  # type: ignore[arg-type]


def test_table_entry_encoding(helper: P4InfoHelper) -> None:
    te = helper.table_entry(_entry())
    assert te.table_id == 0x02002000
    (fm,) = te.match
    assert fm.field_id == 1 and fm.lpm.value == b"\x0a\xd7\x02\x00" and fm.lpm.prefix_len == 24
    params = [(p.param_id, p.value) for p in te.action.action.params]
    assert params == [(1, b"\x03"), (2, bytes.fromhex("020000000001")),
                      (3, bytes.fromhex("020000000002"))]  # fmt: skip
    # a /0 route is a don't-care: no match field at all
    default = helper.table_entry(_entry(match=((N.DST_ADDR, Lpm("0.0.0.0", 0)),)))
    assert len(default.match) == 0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"match": ((N.DST_ADDR, Lpm("10.215.2.1", 24)),)},
         "ipv4_lpm field hdr.ipv4.dst_addr: 10.215.2.1/24 has bits set past the prefix"),
        ({"match": ((N.DST_ADDR, Lpm("10.215.2.0", 33)),)}, r"prefix length 33 outside 0\.\.32"),
        ({"match": ((N.DST_ADDR, Exact("10.215.2.0")),)}, "is not an exact field"),
        ({"match": (("hdr.ipv4.src_addr", Lpm("10.0.0.0", 8)),)},
         r"no match field 'hdr.ipv4.src_addr' \(fields: hdr.ipv4.dst_addr\)"),
        ({"action": N.SET_QUEUE, "params": (("queue", 1),)},
         "action DlcpIngress.queueing.set_queue is not one of the table's actions"),
        ({"params": (("port", 3), ("smac", 1))}, "needs parameter dmac"),
        ({"params": (("port", 512), ("smac", 1), ("dmac", 2))},
         "set_next_hop parameter port: value 512 does not fit in 9 bits"),
        ({"params": (("port", 1), ("smac", 1), ("dmac", 2), ("vlan", 3))},
         "no parameter 'vlan'"),
    ],
)  # fmt: skip
def test_entry_errors_name_the_bad_part(
    helper: P4InfoHelper, kw: dict[str, object], match: str
) -> None:
    with pytest.raises(P4InfoError, match=match):
        helper.table_entry(_entry(**kw))


def test_missing_exact_field(helper: P4InfoHelper) -> None:
    e = TableEntry(N.ECMP_MEMBER, ((N.ECMP_GROUP_ID, Exact(1)),), N.SET_MEMBER_NEXT_HOP,
                   (("port", 1), ("smac", 1), ("dmac", 2)))  # fmt: skip
    with pytest.raises(P4InfoError, match=r"exact field meta\.ecmp_member has no value"):
        helper.table_entry(e)


def test_from_file_errors(tmp_path: Path) -> None:
    protos()
    with pytest.raises(P4InfoError, match="cannot read P4Info"):
        P4InfoHelper.from_file(tmp_path / "absent.txtpb")
    bad = tmp_path / "bad.txtpb"
    bad.write_text("tables { nonsense: 1 }")
    with pytest.raises(P4InfoError, match=r"bad\.txtpb: not a P4Info"):
        P4InfoHelper.from_file(bad)
    binary = tmp_path / "dlcp.p4info.bin"
    binary.write_bytes(build_p4info().SerializeToString())
    assert P4InfoHelper.from_file(binary).table(N.DSCP_TO_QUEUE).preamble.id == 0x02000000 | (
        0x2000 + 3 * 31
    )
