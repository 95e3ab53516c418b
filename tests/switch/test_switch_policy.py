"""The policy model: TOML files, per-class overrides, validation errors that name the
field, and the one model behind every renderer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlcp.proto.wire import TosMap
from dlcp.switch.linux_tc import tc_commands
from dlcp.switch.p4entries import P4Names, policy_entries, queue_depths
from dlcp.switch.policy import (
    ClassQueue,
    PolicyError,
    SwitchPolicy,
    load_policy,
    on_link,
    policy_from_dict,
)
from dlcp.switch.sonic import sonic_config


def test_defaults_and_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "p.toml"
    empty.write_text("")
    assert load_policy(empty) == SwitchPolicy() == load_policy(None)
    p = SwitchPolicy()
    assert (p.queue_limit(3), p.drop_threshold(3), p.queue_of(7)) == (100, 20, 7)


def test_testbed_module_reexports_the_same_classes() -> None:
    from testbed import switch_profile

    assert switch_profile.SwitchPolicy is SwitchPolicy
    assert switch_profile.tc_commands is tc_commands


def test_full_file(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        "n_classes = 4\nlink_rate_mbit = 25\nqueue_packets = 50\ndrop_eligible_packets = 10\n"
        "[tos]\ndscp = [0, 10, 20, 30, 40, 50, 60, 62]\necn_protected = 1\n"
        "[classes.3]\nqueue_packets = 80\n[classes.1]\ndrop_eligible_packets = 2\n"
    )
    p = load_policy(f)
    assert p.n_classes == 4 and p.link_rate_mbit == 25.0
    assert p.tos == TosMap(dscp=(0, 10, 20, 30, 40, 50, 60, 62), ecn_protected=1)
    assert p.classes == (ClassQueue(1, drop_eligible_packets=2), ClassQueue(3, queue_packets=80))
    assert [p.queue_limit(c) for c in range(4)] == [50, 50, 50, 80]
    assert [p.drop_threshold(c) for c in range(4)] == [10, 2, 10, 10]


def test_overrides_reach_every_renderer() -> None:
    p = SwitchPolicy(n_classes=2, classes=(ClassQueue(1, 300, 60),))
    limits = {
        c[c.index("parent") + 1]: c[-1]
        for c in tc_commands(p, "d")
        if c[1] == "qdisc" and "parent" in c
    }
    assert (limits["1:21"], limits["1:22"], limits["1:11"], limits["1:12"]) == (
        "300", "60", "100", "20")  # fmt: skip
    thresholds = {
        e.match[0][1].value: dict(e.params)["depth"]  # type: ignore[union-attr]
        for e in policy_entries(p)
        if e.table == P4Names.DROP_THRESHOLD
    }
    assert thresholds == {0: 20, 1: 60}
    assert queue_depths(p) == {0: 100, 1: 300}
    wred = sonic_config(p)["WRED_PROFILE"]
    assert wred["DLCP_C1"]["green_min_threshold"] == str(60 * 1500)


def test_for_link_matches_the_testbed() -> None:
    p = SwitchPolicy.for_link(50, 100)
    assert (p.link_rate_mbit, p.queue_packets, p.drop_eligible_packets) == (50, 100, 40)
    assert SwitchPolicy.for_link(1000, 3).drop_eligible_packets == 1
    assert SwitchPolicy.for_link(1000, 2).drop_eligible_packets == 1  # below the queue
    assert SwitchPolicy.for_link(1000, 1000).drop_eligible_packets == 400


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"n_classes": 9}, r"n_classes must be 1\.\.8, got 9"),
        ({"n_clases": 3}, r"n_clases: unknown field \(known: "),
        ({"queue_packets": "many"}, "queue_packets: must be an integer, got 'many'"),
        ({"link_rate_mbit": True}, "link_rate_mbit: must be a number"),
        ({"link_rate_mbit": -1}, r"link_rate_mbit must be a number from 0\.001 .* got -1"),
        ({"link_rate_mbit": float("inf")}, r"link_rate_mbit must be a number .* got inf"),
        ({"mtu_bytes": 0}, "mtu_bytes must be a positive integer"),
        ({"queue_packets": 700_000, "drop_eligible_packets": 600_000},
         r"queue_packets must be at most 524287 \(the deepest queue the P4 switch measures"),
        ({"classes": {"3": {"queue_packets": 600_000}}},
         r"classes.3.queue_packets must be at most 524287"),
        # (the limit is tc's: quantum = weight x 1514, a full frame; it was checked
        # against mtu_bytes, 1500, and passed quanta over 32 bits that tc refuses)
        ({"protected_weight": 2_863_311},
         r"protected_weight must be at most 2836834 \(tc's quantum, weight x 1514 bytes, is 32"),
        ({"mtu_bytes": 70_000}, r"mtu_bytes must be at most 65535"),
        ({"queue_packets": 10, "drop_eligible_packets": 10},
         r"drop_eligible_packets \(10\) must be smaller than queue_packets \(10\)"),
        ({"tos": {"dscp": [0, 8]}}, "tos: TosMap.dscp needs one DSCP per priority class"),
        ({"tos": {"dscp": [0, 8, 16, 24, 32, 40, 48, 64]}}, r"tos: TosMap.dscp\[7\]=64"),
        ({"tos": {"dscp": [0, 0, 16, 24, 32, 40, 48, 56]}}, "tos.dscp: classes 0..7 need distinct"),
        ({"tos": {"ecn_protected": 0}}, "tos.ecn_protected and tos.ecn_droppable must differ"),
        ({"tos": {"ecn": 1}}, "tos.ecn: unknown field"),
        ({"tos": 3}, "tos: must be a table"),
        ({"classes": {"x": {}}}, r"classes.x: class must be a number 0\.\.7"),
        ({"n_classes": 2, "classes": {"5": {}}},
         r"classes.5: no such class \(classes are 0\.\.1\)"),
        ({"classes": {"3": {"queue_packets": 10}}},
         r"classes.3.drop_eligible_packets \(20\) must be smaller than classes.3.queue_packets"),
        ({"classes": {"3": {"drop_eligible_packets": 0}}},
         "classes.3.drop_eligible_packets must be a positive integer"),
        ({"classes": {"3": {"weight": 1}}}, "classes.3.weight: unknown field"),
        ({"classes": {"3": 1}}, "classes.3: must be a table"),
    ],
)  # fmt: skip
def test_validation_names_the_field(data: dict[str, Any], match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        policy_from_dict(data)


def test_tos_map_takes_integers_only() -> None:
    # (a policy file's TOML is type-checked before; this is the Python API's check)
    from dlcp.proto.wire import TosMap

    with pytest.raises(ValueError, match=r"TosMap.dscp\[7\]=56\.0 is not a DSCP \(an integer"):
        TosMap(dscp=(0, 8, 16, 24, 32, 40, 48, 56.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"TosMap.ecn_protected=True is not an ECN codepoint"):
        TosMap(ecn_protected=True)


def test_duplicate_override() -> None:
    with pytest.raises(PolicyError, match=r"classes\.2: class given twice"):
        SwitchPolicy(classes=(ClassQueue(2, 50), ClassQueue(2, 60)))


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"absent\.toml: cannot read policy file"):
        load_policy(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("n_classes = = 3")
    with pytest.raises(PolicyError, match=r"bad\.toml: not valid TOML"):
        load_policy(bad)
    bad.write_bytes(b"\xff\xfe n_classes = 4\n")
    with pytest.raises(PolicyError, match=r"bad\.toml: not valid TOML \(UTF-8\)"):
        load_policy(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("n_classes = 0")
    with pytest.raises(PolicyError, match=r"wrong.toml: n_classes must be 1\.\.8, got 0"):
        load_policy(wrong)


def test_policy_error_is_a_value_error() -> None:
    # existing callers catch ValueError
    with pytest.raises(ValueError, match="queue_packets"):
        SwitchPolicy(queue_packets=0)


def test_queue_of_outside_classes() -> None:
    """Classes above a policy's share its top queue (senders use all eight, and
    the control channel has class 7's DSCP): they used to have no mapping and
    fell to queue 0, below every DLCP class."""
    p = SwitchPolicy(n_classes=3)
    assert [p.queue_of(c) for c in range(8)] == [0, 1, 2, 2, 2, 2, 2, 2]
    assert p.marked_classes() == list(range(8))  # the default map: 8 DSCPs of their own
    with pytest.raises(PolicyError, match=r"class 8 outside 0\.\.7"):
        p.queue_of(8)
    # a map that sends the upper classes unmarked (DSCP 0) leaves them best effort
    unmarked = SwitchPolicy(n_classes=3, tos=TosMap(dscp=(10, 18, 46, 0, 0, 0, 0, 0)))
    assert unmarked.marked_classes() == [0, 1, 2]


def test_a_policy_of_four_queues_serves_the_upper_classes_and_control_first() -> None:
    """With 4 queues, class 7's DSCP (56: DLCP's most urgent data and its control
    channel) went to best effort in tc, to queue 0 on BMv2, and to queue 0 with
    class 0's WRED profile on SONiC (a review's finding): now to the top queue,
    in every rendering."""
    p = SwitchPolicy(n_classes=4)
    top = "1:41"  # tc: class 3's protected leaf
    filters = [c for c in tc_commands(p, "eth0") if c[:3] == ["tc", "filter", "add"]]
    for tos in (56 << 2 | 0b10, 56 << 2):  # protected, and drop-eligible non-UDP
        assert any(f"0x{tos:02x}" in c and c[-1] == top for c in filters), tos
    dscp = {e.match[0][1].value: dict(e.params)["queue"] for e in policy_entries(p)
            if e.table == P4Names.DSCP_TO_QUEUE}  # fmt: skip
    assert dscp == {0: 0, 8: 1, 16: 2, 24: 3, 32: 3, 40: 3, 48: 3, 56: 3}
    assert sonic_config(p)["DSCP_TO_TC_MAP"]["DLCP"]["56"] == "3"


def test_a_links_buffer_scales_the_per_class_overrides_too() -> None:
    """on_link rescaled only the policy-wide limit and threshold: a class 7 of
    200 / 80 packets kept them on a 50-packet link (a drop threshold above the
    whole buffer), and a class 7 of 50 on a 200-packet link was refused with a
    threshold (80) the user never wrote (a review's finding)."""
    deep7 = SwitchPolicy(queue_packets=100, drop_eligible_packets=40,
                         classes=(ClassQueue(7, 200, 80),))  # fmt: skip
    small = on_link(deep7, None, 50)
    assert (small.queue_limit(7), small.drop_threshold(7)) == (100, 40)
    assert (small.queue_limit(0), small.drop_threshold(0)) == (50, 20)
    short7 = SwitchPolicy(queue_packets=100, drop_eligible_packets=40,
                          classes=(ClassQueue(7, queue_packets=50),))  # fmt: skip
    big = on_link(short7, None, 200)
    assert (big.queue_limit(7), big.drop_threshold(7)) == (100, 80)
    assert (big.queue_limit(0), big.drop_threshold(0)) == (200, 80)


def test_sonic_refuses_thresholds_past_32_bits() -> None:
    """orchagent parses WRED thresholds and buffer sizes as 32-bit integers: a
    deep queue of jumbo frames rendered into a value it would reject (or wrap)."""
    deep = SwitchPolicy(queue_packets=300_000, drop_eligible_packets=100_000, mtu_bytes=9000)
    with pytest.raises(PolicyError, match=r"class 0: 300000 packets of 9000 bytes exceed"):
        sonic_config(deep)
    sonic_config(SwitchPolicy(queue_packets=200_000, drop_eligible_packets=100_000))  # 1500 B
