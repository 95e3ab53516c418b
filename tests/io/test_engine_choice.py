"""Which engine an endpoint sends with: ``DLCP_ENGINE`` / ``EndpointConfig.engine``,
``auto`` meaning native where it was built. A build without a C compiler (no
``dlcp.io._engine``) runs the Python engine on ``auto`` and says so, and refuses
``native`` by name; so does an engine built without libcrypto for an
authenticating job (it cannot tag). The native engine's send threads
(``DLCP_ENGINE_THREADS``): bad counts named as typed, refused with the Python
engine, ignored (and said) where ``auto`` runs it."""

from __future__ import annotations

import logging
import os

import pytest

from dlcp.errors import ConfigError
from dlcp.io import engine
from dlcp.io.config import EndpointConfig


class _Build:
    def __init__(self, seals: int) -> None:
        self.SEALS = seals


def test_auto_is_native_where_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_native", _Build(seals=1))
    assert engine.choose_engine("auto") == "native"
    assert engine.choose_engine("python") == "python"
    # built with libcrypto, the native engine tags as it sends: auto keeps it
    assert engine.choose_engine("auto", authenticate=True) == "native"
    assert engine.choose_engine("native", authenticate=True) == "native"
    assert engine.choose_engine("python", authenticate=True) == "python"


def test_a_build_without_libcrypto_leaves_authentication_to_python(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(engine, "_native", _Build(seals=0))
    assert engine.choose_engine("auto") == "native"
    with caplog.at_level(logging.INFO, logger="dlcp.io"):
        assert engine.choose_engine("auto", authenticate=True) == "python"
    assert "built without libcrypto" in caplog.text
    with pytest.raises(ConfigError, match=r"DLCP_ENGINE.*without OpenSSL's libcrypto"):
        engine.choose_engine("native", authenticate=True)


def test_this_build_seals_where_libcrypto_is() -> None:
    from dlcp.proto import auth

    # setup.py builds both with libcrypto or neither
    assert engine.native_seals() == (engine.native_available() and auth.ACCELERATED)


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

    from tests.io.test_engines import pair

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
    """As the user typed it: the keyword given to the configuration, the variable set
    in the environment."""
    with pytest.raises(ConfigError) as by_keyword:
        EndpointConfig(engine=value)
    assert str(by_keyword.value) == f"engine={value!r}: use 'auto', 'native' or 'python'"
    with pytest.raises(ConfigError) as by_variable:
        EndpointConfig.from_env({"DLCP_ENGINE": value})
    assert str(by_variable.value) == f"DLCP_ENGINE={value}: use 'auto', 'native' or 'python'"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-1", "DLCP_ENGINE_THREADS=-1 outside 1..32 (0: auto)"),
        ("33", "DLCP_ENGINE_THREADS=33 outside 1..32 (0: auto)"),
        ("two", "DLCP_ENGINE_THREADS='two' is not a valid int"),
        ("1.5", "DLCP_ENGINE_THREADS='1.5' is not a valid int"),
    ],
)
def test_a_bad_thread_count_is_named_as_typed(value: str, said: str) -> None:
    with pytest.raises(ConfigError) as by_variable:
        EndpointConfig.from_env({"DLCP_ENGINE_THREADS": value})
    assert str(by_variable.value) == said
    with pytest.raises(ConfigError, match=r"^engine_threads=33 outside 1\.\.32 \(0: auto\)$"):
        EndpointConfig(engine_threads=33)
    assert EndpointConfig.from_env({"DLCP_ENGINE_THREADS": "4"}).engine_threads == 4


@pytest.mark.parametrize("typed", ["auto", " Auto ", "0"])
def test_auto_send_threads_are_the_hosts_cpus_shared_by_its_ranks(
    typed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` (the default) is the CPUs this process may use over LOCAL_WORLD_SIZE,
    1 to 2; 1 where the ranks on the host are not known; a number is itself."""
    assert EndpointConfig().engine_threads == 0
    assert EndpointConfig.from_env({"DLCP_ENGINE_THREADS": typed}).engine_threads == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert [engine.send_threads(0, {"LOCAL_WORLD_SIZE": n}) for n in ("1", "4", "8", "16")] == [
        2, 2, 1, 1
    ]
    for unknown in ({}, {"LOCAL_WORLD_SIZE": ""}, {"LOCAL_WORLD_SIZE": "x"},
                    {"LOCAL_WORLD_SIZE": "0"}):  # fmt: skip
        assert engine.send_threads(0, unknown) == 1
    assert engine.send_threads(3, {"LOCAL_WORLD_SIZE": "1"}) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert engine.send_threads(0, {"LOCAL_WORLD_SIZE": "1"}) == 1


def test_send_threads_are_the_native_engines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Python engine has none: asking for it and for threads is refused, naming
    both settings; ``auto`` that runs the Python engine ignores the count and says so."""
    with pytest.raises(ConfigError) as both:
        EndpointConfig.from_env({"DLCP_ENGINE": "python", "DLCP_ENGINE_THREADS": "2"})
    assert "engine_threads=2 with engine='python'" in str(both.value)
    assert "(from DLCP_ENGINE=python, DLCP_ENGINE_THREADS=2)" in str(both.value)
    with pytest.raises(ConfigError, match=r"^engine_threads=3 with engine='python'"):
        EndpointConfig(engine="python", engine_threads=3)

    from tests.io.test_engines import pair

    monkeypatch.setattr(engine, "_native", None)
    with (
        caplog.at_level(logging.INFO, logger="dlcp.io"),
        pair(("auto", "auto"), threads=2) as (a, _),
    ):
        assert a.engine == "python" and a.stats()["engine_threads"] is None
    assert "engine_threads=2 ignored: the Python engine runs" in caplog.text


def test_an_endpoint_alone_on_its_host_sends_from_two_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default (``auto``) as an endpoint resolves it: 2 threads for the one rank
    of a 2-CPU host, 1 for one of two ranks there; the JSON-facing count is the
    one that runs."""
    from dlcp.io import Endpoint
    from tests.io.endpoint_helpers import JOB

    if not engine.native_available():
        pytest.skip("the native engine was not built")
    if "DLCP_ENGINE_THREADS" in os.environ:
        pytest.skip("DLCP_ENGINE_THREADS sets every endpoint's count (tests/conftest.py)")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for local_ranks, want in (("1", 2), ("2", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
        cfg = EndpointConfig(engine="native")
        ep = Endpoint(0, peers={}, job=JOB, config=cfg)
        try:
            assert ep.stats()["engine_threads"] == want
        finally:
            ep.close()
