"""``dlcp switch config`` for every target against reviewed golden files.

The goldens live in tests/golden/switch/. After an intended change, regenerate them
with ``DLCP_REGEN_GOLDEN=1 pytest tests/switch/test_switch_golden.py`` and review
the diff before committing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest

from dlcp.cli import main as dlcp_main
from dlcp.switch.cli import render

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "switch"
CUSTOM = GOLDEN / "custom_policy.toml"
REGEN = os.environ.get("DLCP_REGEN_GOLDEN") == "1"


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "target": "bmv2", "policy": None, "topology": None, "switch": None, "dev": None,
        "ports": "Ethernet0", "format": "json",
    }  # fmt: skip
    base.update(kw)
    return argparse.Namespace(**base)


CASES = {
    "tc_default_eth0.txt": _args(target="linux", dev="eth0"),
    "tc_custom_eth0.txt": _args(target="linux", dev="eth0", policy=str(CUSTOM)),
    "tc_topology_leaf1.txt": _args(target="linux", switch="leaf1"),
    "sonic_default.json": _args(target="sonic"),
    "sonic_custom.json": _args(target="sonic", policy=str(CUSTOM), ports="Ethernet0,Ethernet4"),
    "bmv2_leaf_spine_4h.json": _args(target="bmv2"),
    "bmv2_custom_leaf2.txt": _args(target="bmv2", policy=str(CUSTOM), switch="leaf2",
                                   format="text"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    out = render(CASES[name]) + "\n"
    path = GOLDEN / name
    if REGEN:
        path.write_text(out)
    assert out == path.read_text(), f"{name} differs; see the module docstring to regenerate"


def test_cli_prints_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert dlcp_main(["switch", "config", "--target", "sonic", "--policy", str(CUSTOM),
                      "--ports", "Ethernet0,Ethernet4"]) == 0  # fmt: skip
    assert capsys.readouterr().out == (GOLDEN / "sonic_custom.json").read_text()


def test_cli_errors_name_the_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text("queue_packets = 10\ndrop_eligible_packets = 10\n")
    assert dlcp_main(["switch", "config", "--target", "linux", "--dev", "x", "--policy",
                      str(bad)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"dlcp switch: {bad}: drop_eligible_packets (10) must be smaller")
    assert dlcp_main(["switch", "config", "--target", "bmv2", "--switch", "h1"]) == 2
    assert "--switch h1: not a switch of leaf_spine_4h (leaf1, leaf2, spine1, spine2)" in (
        capsys.readouterr().err
    )
    topo = tmp_path / "t.toml"
    topo.write_text('leaves = ["l1"]\nspines = []\n[hosts]\nh1 = "l1"\n')
    assert dlcp_main(["switch", "config", "--target", "bmv2", "--topology", str(topo)]) == 2
    assert "spines: at least one spine" in capsys.readouterr().err
    assert dlcp_main(["switch", "config", "--target", "sonic", "--ports", "Ethernet0,"]) == 2
    assert "ports: invalid port name ''" in capsys.readouterr().err


def test_linux_config_of_a_link_with_its_own_rate_and_buffer() -> None:
    """leaf_spine_8h.toml gives leaf4--spine3 500 Mbit/s and 50 packets: that
    link's tc profile says so (the rest of leaf4 keeps 1000 and 100), as the
    testbed installs it."""
    topology = Path(__file__).resolve().parents[2] / "testbed/topologies/leaf_spine_8h.toml"
    out = render(_args(target="linux", topology=str(topology), switch="leaf4"))
    blocks = {b.split("\n", 1)[0]: b for b in out.split("# leaf4: egress ")[1:]}
    assert set(blocks) == {"h7", "h8", "spine1", "spine2", "spine3"}, sorted(blocks)
    assert "classid 1:1 htb rate 500000kbit ceil 500000kbit" in blocks["spine3"]
    assert "classid 1:1 htb rate 1000000kbit ceil 1000000kbit" in blocks["spine2"]
    limits = {b: re.findall(r"pfifo limit (\d+)", blocks[b]) for b in ("spine3", "spine2")}
    assert set(limits["spine3"]) == {"50", "20"}, limits  # drop-eligible: 2/5 of the buffer
    assert set(limits["spine2"]) == {"100", "40"}, limits


def test_sonic_drop_eligible_threshold_below_queue() -> None:
    """The SONiC config's meaning, not just its bytes: Not-ECT packets are dropped by
    WRED from the drop threshold on, below the queue's buffer limit; ECT ones are
    marked (ecn_all)."""
    cfg = json.loads(render(_args(target="sonic", policy=str(CUSTOM))))
    for c, (thr, limit) in enumerate([(4, 64), (16, 64), (32, 128)]):
        w = cfg["WRED_PROFILE"][f"DLCP_C{c}"]
        assert w["ecn"] == "ecn_all" and w["wred_green_enable"] == "true"
        assert int(w["green_min_threshold"]) == thr * 9000
        assert int(w["green_max_threshold"]) < int(cfg["BUFFER_PROFILE"][f"DLCP_Q{c}"]["static_th"])
        assert int(cfg["BUFFER_PROFILE"][f"DLCP_Q{c}"]["static_th"]) == limit * 9000
        assert cfg["QUEUE"][f"Ethernet0|{c}"] == {"scheduler": f"DLCP_SP_Q{c}",
                                                  "wred_profile": f"DLCP_C{c}"}  # fmt: skip
        assert cfg["SCHEDULER"][f"DLCP_SP_Q{c}"]["type"] == "STRICT"
    dscp = cfg["DSCP_TO_TC_MAP"]["DLCP"]
    assert (dscp["10"], dscp["18"], dscp["46"]) == ("0", "1", "2")
    assert len(dscp) == 64 and set(dscp.values()) == {"0", "1", "2"}
    assert cfg["PORT_QOS_MAP"]["Ethernet0"] == {"dscp_to_tc_map": "DLCP", "tc_to_queue_map": "DLCP"}


def test_sonic_refuses_a_tos_map_its_wred_would_invert() -> None:
    """WRED with ecn_all drops Not-ECT packets and marks ECN-capable ones: a map
    whose drop-eligible packets are ECN-capable would come out the other way round."""
    from dlcp.switch.policy import PolicyError, SwitchPolicy, TosMap
    from dlcp.switch.sonic import sonic_config

    flipped = SwitchPolicy(tos=TosMap(ecn_protected=0, ecn_droppable=2))
    with pytest.raises(PolicyError, match="needs ecn_droppable = 0"):
        sonic_config(flipped)
    assert sonic_config(SwitchPolicy())["WRED_PROFILE"]  # the default map renders
