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


def test_the_main_jobs_plot_draws_the_loss_bound() -> None:
    """The demo's plot named the loss bound in a title but did not draw it: the loss
    panel has a line at ``100 p`` percent, inside its y range, labelled with it."""
    from dlcp.train_demo import figure

    epochs = [
        {"epoch": e, "test_accuracy": 90.0, "iter_s": 0.02, "loss_fraction": 0.005,
         "retransmitted_packets": 100}
        for e in (1, 2)
    ]  # fmt: skip
    dlcp = {"epochs": epochs, "p": 0.05, "collective": "ring", "emulated_loss": 0.01,
            "world_size": 4}  # fmt: skip
    gloo = {"epochs": [{k: e[k] for k in ("epoch", "test_accuracy", "iter_s")} for e in epochs]}
    fig = figure(dlcp, gloo)
    try:
        loss_panel = fig.axes[2]
        bounds = [line for line in loss_panel.get_lines() if "loss bound" in line.get_label()]
        assert len(bounds) == 1
        assert list(bounds[0].get_ydata()) == [5.0, 5.0]  # percent, across the panel
        assert loss_panel.get_ylim()[1] > 5.0
        assert "p = 5% per message" in bounds[0].get_label()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
