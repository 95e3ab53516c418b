"""The controller against the P4Info the compiler wrote (p4/bmv2/build, committed):
every name of docs/switch.md resolves with the documented widths, the test fixture
has the same shape, and every entry the controller computes encodes. Skipped until
the compiled P4Info is committed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ACTIONS,
    COMMITTED_JSON,
    COMMITTED_P4INFO,
    COUNTERS,
    TABLES,
    FakeDevice,
    FakeServer,
    build_p4info,
    protos,
)

from dlcp.switch.controller import configure_switch, fabric_config
from dlcp.switch.p4entries import P4Names
from dlcp.switch.policy import SwitchPolicy, load_policy

pytestmark = pytest.mark.skipif(
    not COMMITTED_P4INFO.exists(),
    reason="p4/bmv2/build/dlcp.p4info.txtpb is not built and committed yet",
)

CUSTOM = Path(__file__).resolve().parents[1] / "golden" / "switch" / "custom_policy.toml"


@pytest.fixture
def helper() -> Any:
    protos()
    from dlcp.switch.p4info import P4InfoHelper

    return P4InfoHelper.from_file(COMMITTED_P4INFO)


def test_tables_match_the_documented_interface(helper: Any) -> None:
    kinds = protos().p4info["MatchField"]
    for name, fields, actions in TABLES:
        t = helper.table(name)
        got = [(mf.name, kinds.MatchType.Name(mf.match_type), mf.bitwidth) for mf in t.match_fields]
        assert got == fields, name
        refs = set(helper.table_actions(t))
        assert set(actions) - {"NoAction"} <= refs, name


def test_actions_and_counters_match(helper: Any) -> None:
    for name, params in ACTIONS:
        if name == "NoAction":
            continue
        got = [(p.name, p.bitwidth) for p in helper.action(name).params]
        assert got == params, name
    for name, size in COUNTERS:
        assert helper.counter(name).size == size, name


@pytest.mark.parametrize("policy", [SwitchPolicy(), load_policy(CUSTOM)], ids=["default", "custom"])
def test_every_computed_entry_encodes(helper: Any, policy: SwitchPolicy) -> None:
    from testbed.topology import Topology

    for node, cfg in fabric_config(Topology.default(), policy).items():
        updates = helper.updates(cfg.entries)
        assert len(updates) == len(cfg.entries), node


def test_configure_with_the_committed_pipeline(
    fake_server: FakeServer, device: FakeDevice, helper: Any
) -> None:
    from testbed.topology import Topology

    if not COMMITTED_JSON.exists():
        pytest.skip("the BMv2 JSON is not committed")
    json.loads(COMMITTED_JSON.read_text())
    entries = fabric_config(Topology.default(), SwitchPolicy())["leaf2"].entries
    configure_switch(fake_server.address, 0, COMMITTED_P4INFO, COMMITTED_JSON, entries)
    assert device.pipelines[0].config.p4_device_config == COMMITTED_JSON.read_bytes()
    assert device.pipelines[0].config.p4info == helper.p4info
    sent = device.writes[0].updates
    assert sent[0].entity.table_entry.table_id == helper.table(P4Names.IPV4_LPM).preamble.id
    assert sent[-1].entity.table_entry.table_id == helper.table(P4Names.DROP_THRESHOLD).preamble.id


def test_loss_injection_register_and_counter() -> None:
    loss_info = COMMITTED_P4INFO.with_name("dlcp_loss.p4info.txtpb")
    if not loss_info.exists():
        pytest.skip("the loss-injection P4Info is not committed")
    protos()
    from dlcp.switch.p4info import P4InfoHelper

    h = P4InfoHelper.from_file(loss_info)
    assert h.counter(P4Names.LOSS_INJECTED).size == 1
    upd = h.register_update(P4Names.LOSS_PROBABILITY, 0, 655)
    reg = upd.entity.register_entry
    assert reg.register_id == h.register(P4Names.LOSS_PROBABILITY).preamble.id
    assert reg.data.bitstring == b"\x02\x8f"


def _by_name(info: Any, updates: Any) -> list[tuple[Any, ...]]:
    """Updates with table/action ids replaced by names (match and param ids kept:
    they are positions in the P4Info, the same in both)."""
    names = {t.preamble.id: t.preamble.name for t in info.tables}
    names |= {a.preamble.id: a.preamble.name for a in info.actions}
    out = []
    for u in updates:
        te = u.entity.table_entry
        te_names = (names[te.table_id], names[te.action.action.action_id])
        te.table_id = 0
        te.action.action.action_id = 0
        out.append((u.type, te_names, te.SerializeToString(deterministic=True)))
    return out


def test_committed_and_fixture_p4info_give_the_same_requests(
    fake_server: FakeServer, device: FakeDevice, helper: Any, p4info_file: Path, tmp_path: Path
) -> None:
    """The fake-device tests run on the fixture P4Info; with the committed one, every
    request is the same up to the (compiler-chosen) table and action ids."""
    from testbed.topology import Topology

    blob = tmp_path / "dlcp.json"
    blob.write_text("{}")
    entries = fabric_config(Topology.default(), load_policy(CUSTOM))["leaf1"].entries
    configure_switch(fake_server.address, 0, p4info_file, blob, entries)
    configure_switch(fake_server.address, 0, COMMITTED_P4INFO, blob, entries)
    fixture_run, committed_run = device.writes
    assert _by_name(build_p4info(), fixture_run.updates) == _by_name(
        helper.p4info, committed_run.updates
    )
