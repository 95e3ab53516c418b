"""Settings shared by the whole suite.

Hypothesis's default deadline (200 ms an example) measures the machine, not the
code: on a machine whose cores are busy with other jobs an example of the
pacer's property tests took longer and the run failed. The properties here are
about values, never about time, so no example has a deadline."""

import dataclasses
import os
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("dlcp", deadline=None)
settings.load_profile("dlcp")


@pytest.fixture(autouse=True)
def _engine_from_the_environment(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DLCP_ENGINE=python pytest ...`` runs every endpoint a test makes on that
    engine, and ``DLCP_ENGINE_THREADS=N pytest ...`` every native one on N send
    threads, those whose ``EndpointConfig`` the test builds itself included (a
    config built directly reads no environment; only ``EndpointConfig.from_env``
    does), unless the test chose the engine (anything but ``auto``, or more than
    one send thread) or a thread count other than 1, or is marked
    ``auto_engine`` (what ``auto`` picks is what it checks) or ``one_send_thread``.
    Processes a test starts inherit the variables."""
    engine = os.environ.get("DLCP_ENGINE")
    raw = os.environ.get("DLCP_ENGINE_THREADS")
    if request.node.get_closest_marker("one_send_thread") is not None:
        raw = None
    if request.node.get_closest_marker("auto_engine") is not None:
        engine = None
    if engine is None and raw is None:
        return
    from dlcp.io import endpoint as endpoint_module
    from dlcp.io.config import EndpointConfig

    chosen = EndpointConfig.from_env(
        {k: v for k, v in (("DLCP_ENGINE", engine), ("DLCP_ENGINE_THREADS", raw)) if v is not None}
    )
    made = endpoint_module.Endpoint.__init__

    def make(self: Any, *args: Any, config: EndpointConfig | None = None, **kw: Any) -> None:
        if config is not None:
            if engine is not None and config.engine == "auto" and config.engine_threads <= 1:
                config = dataclasses.replace(config, engine=chosen.engine)
            if raw is not None and config.engine != "python" and config.engine_threads <= 1:
                config = dataclasses.replace(config, engine_threads=chosen.engine_threads)
        made(self, *args, config=config, **kw)

    monkeypatch.setattr(endpoint_module.Endpoint, "__init__", make)
