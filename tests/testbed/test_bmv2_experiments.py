"""Training scenarios over BMv2 (``dlcp testbed run --switch bmv2``): the pure parts
(no root), a failed link routed around by the controller, and a short real
training run under the P4 program's loss injection (root + BMv2)."""

from __future__ import annotations

import csv
import io
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlcp.switch.policy import SwitchPolicy
from testbed import cli as testbed_cli
from testbed import experiments as ex
from testbed.bmv2 import missing_bmv2
from testbed.bmv2_backend import bmv2_counters, bmv2_link_down, build_bmv2
from testbed.topology import Topology

MISSING = missing_bmv2(grpc=True)
needs_bmv2 = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (BMv2 switch)")

# --- no root ---------------------------------------------------------------------------


def test_bmv2_run_name() -> None:
    assert ex.run_name("loss", "dlcp", ("spray",), "bmv2") == "loss-dlcp-no-spray-bmv2"
    assert ex.run_name("loss", "dlcp", (), "linux") == "loss-dlcp"


def test_bmv2_arguments_are_rejected_before_building() -> None:
    with pytest.raises(ValueError, match="unknown switch"):
        ex.ExperimentConfig("clean", "dlcp", switch="tofino")
    with pytest.raises(ValueError, match="BMv2 links are not shaped"):
        ex.ExperimentConfig("clean", "dlcp", switch="bmv2", link_rate_mbit=100)


def _counters(fwd: int, dropped: int, taken: int, sent: int, injected: int) -> dict[str, Any]:
    return {
        "forwarded": {0: fwd, 5: 0},
        "dropped": {0: dropped, 5: 0},
        "ingress": {"h1": taken},
        "egress": {"spine1": sent},
        "injected": injected,
    }


def test_bmv2_totals_per_queue_and_unaccounted() -> None:
    before = {"spine1": _counters(10, 1, 20, 10, 2)}
    after = {"spine1": _counters(110, 4, 130, 110, 7)}
    tot = ex.bmv2_class_totals(before, after)
    assert tot["q0"] == {"packets": 100, "drops": 3}
    assert tot["loss-injected"]["drops"] == 5
    assert tot["other"]["drops"] == 110 - 100 - 3 - 5  # taken, not forwarded, not counted
    assert ex.drops_summary(tot) == "loss-injected:5/0 other:2/0 q0:3/100"
    assert ex.bmv2_link_packets(before, after) == {"spine1": {"spine1": {"all": 100}}}


def test_switch_column_note_and_old_csv(tmp_path: Path) -> None:
    old_fields = [f for f in ex.CSV_FIELDS if f != "switch"]
    row = dict.fromkeys(ex.CSV_FIELDS, "0")
    with (tmp_path / ex.CSV_NAME).open("w", newline="") as f:  # a file from before the column
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerow({**row, "scenario": "clean", "transport": "gloo", "ablation": ""})
    ex.append_csv(tmp_path, {**row, "scenario": "clean", "transport": "gloo", "ablation": "",
                             "switch": "bmv2"})  # fmt: skip
    with (tmp_path / ex.CSV_NAME).open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["switch"] for r in rows] == ["", "bmv2"]
    latest = ex.read_csv(tmp_path)
    assert len(latest) == 2  # the Linux and the BMv2 row of the same run are both kept
    text = ex.table(latest)
    assert "| linux |" in text and "| bmv2 |" in text
    assert text.splitlines()[-1] == f"switch bmv2: {ex.FUNCTIONAL_NOTE}."
    assert "functional" not in ex.table(latest[:1])


# --- root + BMv2 -----------------------------------------------------------------------


def _policy(t: Topology) -> SwitchPolicy:
    policy = testbed_cli._policy("dlcp", t)
    assert isinstance(policy, SwitchPolicy)
    return policy


# Paced at ~1,000 datagrams/s: BMv2 queues 64 packets per port, and an unpaced burst
# of 300 over one spine lost 55 of them in CI (a loaded machine slows the switches).
_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(b"x" * 200, (sys.argv[1], 40000 + i % 64))  # 64 flows: ECMP uses both spines
    if i % 8 == 7:
        time.sleep(0.008)  # pacing, not waiting for anything
"""


@pytest.mark.root
@needs_bmv2
def test_failed_link_is_routed_around() -> None:
    """leaf1--spine1 down: the ports leave the switches, the controller moves every
    route to spine2, and traffic between the leaves (many flows, which the ECMP
    hash spread over both spines before) all goes over spine2."""
    t = Topology.default()
    with build_bmv2(t, _policy(t), prefix="dlcpbmd") as net:
        n = 300

        def spine_packets() -> dict[str, int]:  # towards leaf2 (h3's ICMP replies: leaf1)
            c = bmv2_counters(net)
            return {s: c[s]["egress"]["leaf2"] for s in t.spines}

        def send() -> dict[str, int]:
            before = spine_packets()
            net.run("h1", [sys.executable, "-c", _SEND, net.host_addr("h3"), str(n)])
            # until the spines have forwarded every datagram, or their counters
            # stood still for 2 s (a datagram lost in a full queue)
            got, still_since = {}, time.monotonic()
            while True:
                after = spine_packets()
                now = {s: after[s] - before[s] for s in t.spines}
                if now != got:
                    got, still_since = now, time.monotonic()
                if sum(got.values()) >= n or time.monotonic() - still_since > 2.0:
                    return got

        got = send()
        assert min(got.values()) > n // 10, f"flows not spread over both spines: {got}"
        bmv2_link_down(net, "leaf1", "spine1")  # returns once hosts reach each other again
        assert "spine1" not in net.switches["leaf1"].cli("show_ports")[0]
        got = send()
        # everything over spine2 (a datagram may still be lost in a full queue)
        assert got["spine1"] == 0 and got["spine2"] >= 0.9 * n, got


@pytest.mark.root
@needs_bmv2
def test_loss_run_over_bmv2(tmp_path: Path) -> None:
    """A short DLCP training run with 1 % loss injected by the P4 program on spine1:
    training completes, the program's counter saw the drops (spine1 only), and the
    results say they come from BMv2 and are functional."""
    log = io.StringIO()
    config = ex.ExperimentConfig(
        "loss", "dlcp", epochs=1, batch_size=32, results=tmp_path, switch="bmv2",
        prefix="dlcpbml", plot_after=False,
    )  # fmt: skip
    r = ex.run_experiment(config, out=log)
    assert "[testbed] loss-dlcp-bmv2-batch32: epoch 1/1 done" in log.getvalue()
    assert f"[testbed] loss-dlcp-bmv2-batch32: {ex.FUNCTIONAL_NOTE}" in log.getvalue()
    # beside a Linux run's, not over it
    assert (tmp_path / "loss-dlcp-bmv2-batch32.json").is_file()
    assert r["final_accuracy"] > 10.0  # above chance
    injected = r["setup"]["loss_rule_drops"]
    assert injected["spine1"] > 0 and injected["leaf1"] == injected["spine2"] == 0, injected
    assert r["router_classes"]["loss-injected"]["drops"] == injected["spine1"]
    # 1 % of what reached spine1 (measured: 30 of about 2600), wide bounds
    spine1 = sum(v["all"] for v in r["router_link_packets"]["spine1"].values())
    share = injected["spine1"] / (spine1 + injected["spine1"])
    assert 0.003 < share < 0.03, (injected, spine1)
    # DLCP's classes reached their queues in the switches
    assert any(r["router_classes"][f"q{q}"]["packets"] > 100 for q in range(1, 8))
    assert r["switch"] == "bmv2" and r["note"] == ex.FUNCTIONAL_NOTE
    with (tmp_path / ex.CSV_NAME).open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["switch"] == "bmv2" and "loss-injected:" in row["router_drops"]
