"""Which engine an endpoint sends with: ``DLCP_ENGINE`` / ``EndpointConfig.engine``,
``auto`` meaning native where it was built. A build without a C compiler (no
``dlcp.io._engine``) runs the Python engine on ``auto`` and says so, and refuses
``native`` by name."""

from __future__ import annotations

import logging

import pytest

from dlcp.errors import ConfigError
from dlcp.io import engine
from dlcp.io.config import EndpointConfig


def test_auto_is_native_where_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_native", object())
    assert engine.choose_engine("auto") == "native"
    assert engine.choose_engine("python") == "python"
    # authenticated, auto takes the engine that tags batch by batch
    assert engine.choose_engine("auto", authenticate=True) == "python"
    assert engine.choose_engine("native", authenticate=True) == "native"


def test_without_the_build_auto_runs_python_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(engine, "_native", None)
    with caplog.at_level(logging.INFO, logger="dlcp.io"):
        assert engine.choose_engine("auto") == "python"
    assert "native engine was not built" in caplog.text
    with pytest.raises(ConfigError, match=r"DLCP_ENGINE.*not built"):
        engine.choose_engine("native")


def test_an_endpoint_without_the_build_sends_with_python(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from tests.integration.test_engines import pair

    monkeypatch.setattr(engine, "_native", None)
    with pair(("auto", "auto")) as (a, b):
        assert a.engine == b.engine == "python"
        data = np.arange(100_000, dtype=np.float32)
        out = np.empty_like(data)
        got = b.recv(src=0, msg=3, out=out)
        a.send(data, to=1, msg=3).result(10)
        got.result(10)
        assert np.array_equal(out, data)
        assert a.stats()["engine"] == "python"


@pytest.mark.parametrize("value", ["fast", "Native", ""])
def test_a_bad_setting_is_named(value: str) -> None:
    with pytest.raises(ConfigError, match="DLCP_ENGINE"):
        EndpointConfig(engine=value)
    with pytest.raises(ConfigError, match="DLCP_ENGINE"):
        EndpointConfig.from_env({"DLCP_ENGINE": value})
