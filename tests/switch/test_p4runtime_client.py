"""The P4Runtime client and controller against an in-process fake device: the exact
requests for a topology, itemised write errors, counters, timeouts."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeDevice, FakeServer, build_p4info, protos

from dlcp.switch.controller import configure_switch, fabric_config
from dlcp.switch.p4entries import P4Names
from dlcp.switch.policy import SwitchPolicy

pytest.importorskip("grpc", reason="the switch extra (grpcio) is not installed")
pytest.importorskip("p4", reason="the switch extra (p4runtime) is not installed")

from dlcp.switch.p4info import P4InfoHelper
from dlcp.switch.p4runtime import (
    CounterValue,
    P4RuntimeClient,
    P4RuntimeError,
    P4RuntimeWriteError,
)


def _topology() -> Any:
    from testbed.topology import Topology

    return Topology.default()


def _ids() -> dict[str, int]:
    """Name -> id in the fixture P4Info, read back independently of the helper."""
    info = build_p4info()
    out = {t.preamble.name: t.preamble.id for t in info.tables}
    out |= {a.preamble.name: a.preamble.id for a in info.actions}
    out |= {c.preamble.name: c.preamble.id for c in info.counters}
    return out


def _decode(update: Any) -> tuple[str, dict[str, Any], str, dict[str, bytes]]:
    """(table, {field id: value}, action, {param id: bytes}) with names for tables
    and actions, to compare whole requests readably."""
    names = {v: k for k, v in _ids().items()}
    te = update.entity.table_entry
    match: dict[str, Any] = {}
    for fm in te.match:
        kind = fm.WhichOneof("field_match_type")
        match[str(fm.field_id)] = (
            (fm.lpm.value, fm.lpm.prefix_len) if kind == "lpm" else fm.exact.value
        )
    act = te.action.action
    return (names[te.table_id], match, names[act.action_id],
            {str(p.param_id): p.value for p in act.params})  # fmt: skip


def test_configure_switch_sends_exact_requests(
    fake_server: FakeServer, device: FakeDevice, p4info_file: Path, tmp_path: Path
) -> None:
    pr = protos()
    bmv2_json = tmp_path / "dlcp.json"
    bmv2_json.write_bytes(b'{"program": "dlcp"}')
    entries = fabric_config(_topology(), SwitchPolicy())["leaf1"].entries
    election = (1 << 64) + 5
    configure_switch(fake_server.address, 3, p4info_file, bmv2_json, entries,
                     election_id=election, timeout=5)  # fmt: skip

    # arbitration first: device 3, election id high 1 / low 5
    assert len(device.arbitrations) == 1
    arb = device.arbitrations[0].arbitration
    assert (arb.device_id, arb.election_id.high, arb.election_id.low) == (3, 1, 5)
    # the pipeline: P4Info as read from the file, the BMv2 JSON bytes, commit
    (pipe,) = device.pipelines
    assert pipe.device_id == 3 and (pipe.election_id.high, pipe.election_id.low) == (1, 5)
    assert pipe.action == pr.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
    assert pipe.config.p4info == build_p4info()
    assert pipe.config.p4_device_config == b'{"program": "dlcp"}'
    # one Write with every entry, all INSERTs, in order
    (write,) = device.writes
    assert write.device_id == 3 and (write.election_id.high, write.election_id.low) == (1, 5)
    assert len(write.updates) == len(entries) == 2 + 2 + 2 + 3 * 8
    assert {u.type for u in write.updates} == {pr.Update.INSERT}
    got = [_decode(u) for u in write.updates]
    ids = _ids()
    n = P4Names
    mac = bytes.fromhex
    # h1 (10.215.0.2/32) on port 1; leaf1 is node 4, h1 node 0 in the topology
    assert got[0] == (
        n.IPV4_LPM,
        {"1": (bytes([10, 215, 0, 2]), 32)},
        n.SET_NEXT_HOP,
        {"1": b"\x01", "2": mac("02dc00040000"), "3": mac("02dc00000004")},
    )
    assert got[1][1] == {"1": (bytes([10, 215, 1, 2]), 32)} and got[1][3]["1"] == b"\x02"
    # remote hosts' /24 to ECMP group 1 of 2 spines
    assert got[2] == (
        n.IPV4_LPM,
        {"1": (bytes([10, 215, 2, 0]), 24)},
        n.SET_ECMP_GROUP,
        {"1": b"\x01", "2": b"\x02"},
    )
    assert got[3][1] == {"1": (bytes([10, 215, 3, 0]), 24)}
    # members 0 and 1: spine1 on port 3, spine2 on port 4 (zero is one 0x00 byte)
    assert got[4] == (
        n.ECMP_MEMBER,
        {"1": b"\x01", "2": b"\x00"},
        n.SET_MEMBER_NEXT_HOP,
        {"1": b"\x03", "2": mac("02dc00040006"), "3": mac("02dc00060004")},
    )
    assert got[5][1] == {"1": b"\x01", "2": b"\x01"} and got[5][3]["1"] == b"\x04"
    # priority map: class c and DSCP 8c -> queue c; thresholds 20 packets
    for c in range(8):
        q = bytes([c])
        assert got[6 + c] == (n.CLASS_TO_QUEUE, {"1": q}, n.SET_QUEUE, {"1": q})
        assert got[14 + c] == (n.DSCP_TO_QUEUE, {"1": bytes([8 * c])}, n.SET_QUEUE, {"1": q})
        assert got[22 + c] == (n.DROP_THRESHOLD, {"1": q}, n.SET_THRESHOLD, {"1": b"\x14"})
    assert write.updates[0].entity.table_entry.table_id == ids[n.IPV4_LPM]
    # the connection ended cleanly: the device saw the stream close
    assert device.stream_closed.wait(5)


def test_spine_routes_each_host_to_its_leaf(
    fake_server: FakeServer, device: FakeDevice, p4info_file: Path
) -> None:
    helper = P4InfoHelper.from_file(p4info_file)
    entries = fabric_config(_topology(), SwitchPolicy(n_classes=2))["spine2"].entries
    with P4RuntimeClient(fake_server.address, 0, timeout=5) as c:
        c.write_entries(helper, entries)
    got = [_decode(u) for u in device.writes[0].updates]
    routes = [(m["1"], p["1"]) for t, m, _a, p in got if t == P4Names.IPV4_LPM]
    assert routes == [
        ((bytes([10, 215, i, 0]), 24), port)
        for i, port in enumerate([b"\x01", b"\x01", b"\x02", b"\x02"])
    ]
    # no ECMP on a spine; two queues: every class (8) and every class's DSCP (8)
    # mapped to one of them (classes 2..7 share the top one), two thresholds
    assert len(got) == 4 + 8 + 8 + 2


def test_write_errors_name_each_failed_update(
    fake_server: FakeServer, device: FakeDevice, p4info_file: Path
) -> None:
    device.fail_updates = {1: (6, "Match entry exists"), 3: (3, "Invalid action parameter")}
    helper = P4InfoHelper.from_file(p4info_file)
    entries = fabric_config(_topology(), SwitchPolicy())["leaf1"].entries
    with (
        P4RuntimeClient(fake_server.address, 1, timeout=5) as c,
        pytest.raises(P4RuntimeWriteError) as ei,
    ):
        c.write_entries(helper, entries)
    err = ei.value
    assert [f.index for f in err.failures] == [1, 3]
    assert [f.code for f in err.failures] == ["ALREADY_EXISTS", "INVALID_ARGUMENT"]
    msg = str(err)
    assert f"rejected 2 of {len(entries)} updates" in msg
    assert (
        "update 1 (DlcpIngress.routing.ipv4_lpm[hdr.ipv4.dst_addr=10.215.1.2/32] -> "
        "DlcpIngress.routing.set_next_hop(port=2, smac=02:dc:00:04:00:01, "
        "dmac=02:dc:00:01:00:04)): ALREADY_EXISTS: Match entry exists"
    ) in msg
    assert "update 3 (DlcpIngress.routing.ipv4_lpm[hdr.ipv4.dst_addr=10.215.3.0/24]" in msg
    assert "INVALID_ARGUMENT: Invalid action parameter" in msg


def test_read_counters(fake_server: FakeServer, device: FakeDevice, p4info_file: Path) -> None:
    helper = P4InfoHelper.from_file(p4info_file)
    fwd = _ids()[P4Names.FORWARDED]
    device.counters = {fwd: {0: (5, 500), 7: (2, 3000)}}
    with P4RuntimeClient(fake_server.address, 0, primary=False, timeout=5) as c:
        every = c.read_counter(helper, P4Names.FORWARDED)
        one = c.read_counter(helper, P4Names.FORWARDED, 7)
        with pytest.raises(ValueError, match=r"index 8 outside 0\.\.7"):
            c.read_counter(helper, P4Names.FORWARDED, 8)
    assert every == {0: CounterValue(5, 500), 7: CounterValue(2, 3000)}
    assert one == {7: CounterValue(2, 3000)}
    first, second = (r.entities[0].counter_entry for r in device.reads)
    assert first.counter_id == second.counter_id == fwd
    assert not first.HasField("index") and second.index.index == 7
    assert device.arbitrations == []  # primary=False: no arbitration


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_device_is_a_clear_error() -> None:
    protos()
    addr = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(P4RuntimeError, match=rf"{addr} not reachable within 0\.5 s"):
        P4RuntimeClient(addr, 0, timeout=0.5).connect()


def test_arbitration_without_answer_times_out(fake_server: FakeServer, device: FakeDevice) -> None:
    device.answer_arbitration = False
    with pytest.raises(P4RuntimeError, match=r"no arbitration answer for device 4 within 0\.5 s"):
        P4RuntimeClient(fake_server.address, 4, timeout=0.5).connect()


def test_backup_controller_is_refused(fake_server: FakeServer, device: FakeDevice) -> None:
    device.arbitration_code = 6  # ALREADY_EXISTS: someone else is primary
    with pytest.raises(P4RuntimeError, match=r"did not make this client primary.*ALREADY_EXISTS"):
        P4RuntimeClient(fake_server.address, 0, election_id=2, timeout=2).connect()


def test_rpc_deadline(fake_server: FakeServer, device: FakeDevice, p4info_file: Path) -> None:
    device.write_delay = 1.0
    helper = P4InfoHelper.from_file(p4info_file)
    entries = fabric_config(_topology(), SwitchPolicy(n_classes=1))["leaf1"].entries
    with (
        P4RuntimeClient(fake_server.address, 0, timeout=0.3) as c,
        pytest.raises(
            P4RuntimeError, match=r"Write failed: DEADLINE_EXCEEDED \(no answer within 0\.3 s\)"
        ),
    ):
        c.write_entries(helper, entries)


def test_client_connects_again_after_close(
    fake_server: FakeServer, device: FakeDevice, p4info_file: Path
) -> None:
    # the first stream's end must not end the second one's arbitration
    helper = P4InfoHelper.from_file(p4info_file)
    entries = fabric_config(_topology(), SwitchPolicy(n_classes=1))["leaf1"].entries[:3]
    c = P4RuntimeClient(fake_server.address, 0, timeout=2)
    for _ in range(2):
        with c:
            c.write_entries(helper, entries)
    assert len(device.writes) == 2, device.writes


def test_rpc_before_connect() -> None:
    protos()
    c = P4RuntimeClient("127.0.0.1:1", 0)
    with pytest.raises(P4RuntimeError, match="not connected"):
        c.write([])
    c.close()
    c.close()  # idempotent


def test_configure_switch_checks_names_before_connecting(tmp_path: Path, p4info_file: Path) -> None:
    from dlcp.switch.p4entries import Exact, TableEntry
    from dlcp.switch.p4info import P4InfoError

    (tmp_path / "x.json").write_text("{}")
    bad = [TableEntry("DlcpIngress.queueing.no_such_table", (("x", Exact(1)),), "a")]
    # the address is unreachable: the name error must come first
    with pytest.raises(P4InfoError, match=r"table 'DlcpIngress\.queueing\.no_such_table'"):
        configure_switch(f"127.0.0.1:{_closed_port()}", 0, p4info_file, tmp_path / "x.json", bad)
    with pytest.raises(P4RuntimeError, match="cannot read the BMv2 JSON"):
        configure_switch("127.0.0.1:1", 0, p4info_file, tmp_path / "missing.json", [])


def test_write_register(fake_server: FakeServer, device: FakeDevice, p4info_file: Path) -> None:
    from dlcp.switch.p4info import P4InfoError

    pr = protos()
    helper = P4InfoHelper.from_file(p4info_file)
    with P4RuntimeClient(fake_server.address, 0, timeout=5) as c:
        c.write_register(helper, P4Names.LOSS_PROBABILITY, 0, 655)  # 1 %
        with pytest.raises(P4InfoError, match="value 65536 does not fit in 16 bits"):
            c.write_register(helper, P4Names.LOSS_PROBABILITY, 0, 65536)
        with pytest.raises(P4InfoError, match=r"index 1 outside 0\.\.0"):
            c.write_register(helper, P4Names.LOSS_PROBABILITY, 1, 1)
    (write,) = device.writes
    (upd,) = write.updates
    assert upd.type == pr.Update.MODIFY
    reg = upd.entity.register_entry
    assert (reg.register_id, reg.index.index, reg.data.bitstring) == (0x10004000, 0, b"\x02\x8f")
