"""``dlcp demo``: what its table says is what happened on the emulated link.

The bound must buy what the demo claims: far fewer retransmissions than p = 0
for the same losses, and no later finish. (Before, a message NACKed once waited
the reorder grace a second time before completing by the bound: 5.55 ms per
bucket against 3.56 ms for p = 0.)
"""

from __future__ import annotations

import json

import pytest

from dlcp.demo import main, run_demo


def test_the_bound_resends_less_and_finishes_no_later() -> None:
    bounded = run_demo(p=0.05, loss=0.05, steps=5, seed=0)
    exact = run_demo(p=0.0, loss=0.05, steps=5, seed=0)
    assert exact.lost_fraction_max == 0.0 and exact.relative_error_max == 0.0
    assert 0 < bounded.lost_fraction_max <= 0.05
    assert bounded.retransmitted_packets * 3 < exact.retransmitted_packets
    # the same first-pass losses (same seed); a bucket's time is its path delays,
    # one retransmission round and one reorder grace either way
    assert bounded.received_ms_max <= exact.received_ms_max + 0.05
    assert sum(bounded.lost_chunks_by_priority[6:]) == 0  # the front layers lose nothing


def test_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(p=0.05, loss=0.05, steps=2, seed=0, as_json=True) == 0
    out = capsys.readouterr().out.splitlines()
    assert "EMULATED" in out[0] and "received ms" in out[1]
    doc = json.loads(out[-1])
    assert doc["emulated"] is True
    assert [r["p"] for r in doc["results"]] == [0.05, 0.0]
    assert all(r["received_ms_mean"] > 0 for r in doc["results"])
