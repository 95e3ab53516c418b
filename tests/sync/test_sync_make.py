"""``dlcp.sync.make``: every bad setting is refused with a clear ConfigError before
any message is sent (the endpoint here is a stand-in that fails on any use
beyond its rank and configuration)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dlcp.errors import ConfigError
from dlcp.sync import SCHEMES, make
from dlcp.sync.clocks import ClockTable, RoundBuffer, read_is_consistent


class _Silent:
    """An endpoint that must not be used: only ``rank`` may be read."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the endpoint was used ({name}) before the settings were checked")


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("nope", {}, "unknown synchronisation scheme 'nope'"),
        ("ssp", {"staleness": -1}, r"staleness s=-1 must be an integer >= 0"),
        ("ssp", {"staleness": 1.5}, r"staleness s=1.5"),
        ("bsp", {"staleness": 2}, "staleness applies to 'ssp' only"),
        ("ssp", {"world_size": 4, "rank_of": 1}, r"takes no option\(s\) \['rank_of'\]"),
        ("ssp", {"world_size": 3, "endpoint": _Silent(3)}, r"rank 3 is outside the world 0..2"),
        ("ssp", {"world_size": 3, "endpoint": _Silent(0), "p": 1.0}, r"p=1.0 outside \[0, 1\)"),
        ("ssp", {"world_size": 3, "endpoint": _Silent(0), "servers": [0, 5]},
         r"servers: rank\(s\) \[5\] outside the world 0..2"),
        ("ssp", {"world_size": 3, "endpoint": _Silent(0), "servers": [0], "workers": [1]},
         r"rank\(s\) \[2\] are neither server nor worker"),
        ("ssp", {"world_size": 4, "endpoint": _Silent(0), "servers": [0, 1, 2, 3, 3]},
         "must be distinct"),
        ("ssp", {"world_size": 8, "endpoint": _Silent(0), "servers": [0, 1, 2, 3, 4]},
         "5 servers for 4 parameter tensors"),
        ("ssp", {"world_size": 2, "endpoint": _Silent(0), "fill": "previous"},
         "no previous update"),
    ],
)
def test_bad_settings_are_refused_before_any_traffic(
    name: str, options: dict[str, Any], message: str
) -> None:
    model, opt = _model()
    with pytest.raises(ConfigError, match=message):
        make(name, model, opt, **{"endpoint": _Silent(0), "world_size": 2, **options})


def test_a_scheme_says_what_it_needs() -> None:
    model, opt = _model()
    with pytest.raises(ConfigError, match="needs world_size="):
        make("ssp", model, opt, endpoint=_Silent(0))
    with pytest.raises(ConfigError, match="needs endpoint="):
        make("asp", model, opt, world_size=2)


def test_the_schemes_listed_are_the_ones_built() -> None:
    assert {"bsp", "asp", "ssp"} <= set(SCHEMES)


def test_ssp_clock_rules() -> None:
    t = ClockTable((0, 1, 2), staleness=1)
    assert t.can_read(0, 0) and t.can_read(0, 1) is False  # own write 0 not in yet
    t.applied_one(0, 0)
    assert t.can_read(0, 1)  # slowest at 0 >= 1 - 1
    t.applied_one(0, 1)
    assert not t.can_read(0, 2)  # slowest at 0 < 2 - 1
    t.applied_one(1, 0)
    t.applied_one(2, 0)
    assert t.can_read(0, 2) and t.version == 4 and t.clocks() == (2, 1, 1)
    with pytest.raises(ValueError, match="out of order"):
        t.applied_one(1, 2)
    t.finish(1), t.finish(2)
    assert t.can_read(0, 7) is False and t.slowest() == 2  # own writes still count
    asp = ClockTable((0, 1), staleness=None)
    assert asp.can_read(0, 100)
    assert read_is_consistent((3, 2, 4), 4, 2) and not read_is_consistent((1, 2), 4, 2)
    with pytest.raises(ValueError, match="staleness=-1"):
        ClockTable((0,), staleness=-1)


def test_bsp_rounds_come_out_whole_and_in_worker_order() -> None:
    import numpy as np

    b = RoundBuffer((0, 1, 2))
    one = np.ones(2, np.float32)
    assert b.add(2, 0, one * 3, ()) == []
    assert b.add(0, 0, one, ()) == []
    assert b.add(0, 1, one, ()) == []
    out = b.add(1, 0, one * 2, ())
    assert [(c, [w for w, _ in ups]) for c, ups in out] == [(0, [0, 1, 2])]
    assert b.ready({1, 2}) and not b.pending  # the others finished: round 1 is whole
