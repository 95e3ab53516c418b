"""Bad arguments are clear errors in the calling thread, before any lock is
taken, naming what the caller typed: ranks given as strings (or bools, which
were read as ranks 0 and 1), ``out=`` of the wrong type, bad ``layers``, a
message too large, a key without authentication. No authentication is said in
the log."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dlcp.errors import ConfigError, PeerTimeout
from dlcp.io import Endpoint, EndpointConfig
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import Session
from tests.io.endpoint_helpers import JOB, KEY, LocalStore

pytestmark = pytest.mark.integration

X = np.arange(1000, dtype=np.float32)


@pytest.fixture(scope="module")
def pair() -> Any:
    store = LocalStore()
    cfg = EndpointConfig(timeout=5.0)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2))
    yield a, b
    a.close()
    b.close()


def _raises_without_the_lock(ep: Endpoint, call: Callable[[], Any]) -> BaseException:
    """What ``call`` raises while another thread holds ``ep``'s lock: it must not
    wait for the lock (a check made under it would block here)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with ep._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # (what the test inspects)
            raised.append(exc)

    caller = threading.Thread(target=run)
    caller.start()
    caller.join(5)
    blocked = caller.is_alive()
    release.set()
    holder.join(10)
    caller.join(10)
    assert not blocked, "the call waited for the endpoint's lock"
    assert raised, "the call did not raise"
    return raised[0]


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"),
    [
        ("send", {"to": "1"}, r"to='1' \(str\) is not a rank: give an int \(to=1\)"),
        ("send", {"to": True}, r"to=True \(bool\) is not a rank"),
        ("send", {"to": 1.0}, r"to=1\.0 \(float\) is not a rank"),
        ("recv", {"src": "0"}, r"src='0' \(str\) is not a rank: give an int \(src=0\)"),
        ("send", {"msg": "2"}, r"msg='2' must be an integer"),
        ("recv", {"step": 1.5}, r"step=1\.5 must be an integer"),
        ("recv", {"out": [0.0] * 1000}, r"out must be a numpy array, got builtins\.list"),
        ("recv", {"out": torch.zeros(1000)},
         r"out must be a numpy array, got torch\.Tensor: pass tensor\.numpy\(\)"),
        ("recv", {"out": np.zeros((10, 100), np.float32)},
         r"out must be a contiguous 1-D array, got shape \(10, 100\)"),
        ("send", {"layers": "abc"}, r"layers='abc' \(str\) is not a sequence of \(offset, length"),
        ("send", {"layers": 5}, r"layers=5 \(int\) is not a sequence"),
        ("send", {"layers": [(0, 1000)]},
         r"layers\[0\]=\(0, 1000\) is not an \(offset, length, layer\) triple of integers"),
        ("send", {"layers": [(0, 999.5, 0)]}, r"layers\[0\]=\(0, 999\.5, 0\) is not an"),
        ("send", {"layers": [(0, 500, 0), (500, 500)]}, r"layers\[1\]=\(500, 500\) is not an"),
        ("send", {"layers": [(0, 500, 0)]},
         r"\(step 0, msg 1\) to rank 1: layers: segments leave a gap: elements \[500, 1000\)"),
        ("send", {"layers": [(0, 1000, -1)]}, r"layer must be 0\.\.65535"),
    ],
)  # fmt: skip
def test_a_bad_argument_is_named_before_any_lock(
    pair: tuple[Endpoint, Endpoint], kind: str, kwargs: dict[str, Any], message: str
) -> None:
    a, b = pair
    if kind == "send":
        args = {"to": 1, "msg": 1, **kwargs}
        exc = _raises_without_the_lock(a, lambda: a.send(X, **args))
    else:
        args = {"src": 0, "msg": 1, **kwargs}
        exc = _raises_without_the_lock(b, lambda: b.recv(**args))
    assert isinstance(exc, ConfigError), repr(exc)
    assert isinstance(exc, ValueError)  # (what callers caught before)
    assert re.search(message, str(exc)), str(exc)


def test_good_arguments_still_work_and_the_endpoints_carry_on(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    a, b = pair
    out = np.zeros(1000, np.float32)
    got = b.recv(src=np.int64(0), msg=7, out=out)
    a.send(X, to=np.int32(1), msg=7, layers=[(0, 600, 0), (600, 400, np.int64(1))]).result(10)
    assert np.array_equal(got.result(10).data, X)
    a.send(X, to=1, msg=8, layers=[(0, 600, 0), (600, 400, 1)])  # cached as good: still sent
    assert np.array_equal(b.recv(src=0, msg=8).result(10).data, X)


def test_numpy_integer_message_keys_work_and_their_failures_settle(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    """A numpy step or msg is taken as an int: the C parts key messages by ints,
    and a numpy key used to kill the I/O thread where it reached them (a send on
    the native engine, a receive's end), leaving its future pending forever."""
    a, b = pair
    got = b.recv(src=0, step=np.int64(3), msg=np.uint16(21))
    a.send(X, to=1, step=np.int32(3), msg=np.int64(21)).result(10)
    assert np.array_equal(got.result(10).data, X)
    waiting = b.recv(src=0, step=np.int64(4), msg=np.int64(22))
    assert waiting.cancel()
    nobody = b.recv(src=0, step=np.int64(5), msg=22)  # nothing is sent: it times out
    with pytest.raises(PeerTimeout):
        nobody.result(30)
    got = b.recv(src=0, msg=23)  # the endpoints carry on
    a.send(X, to=1, msg=23).result(10)
    assert np.array_equal(got.result(10).data, X)


def test_a_message_too_large_is_refused_before_it_is_copied(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    """A non-contiguous view of 2**32 elements: flattening it would copy 4 GiB
    before the packetizer found it too large; a zero-stride view takes no memory."""
    a, _ = pair
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=(2**16, 2**16),
                                           strides=(0, 0))  # fmt: skip
    exc = _raises_without_the_lock(a, lambda: a.send(huge, to=1, msg=9))
    assert isinstance(exc, ConfigError)
    want = "an array of 4294967296 elements (shape (65536, 65536)); a message holds at most"
    assert want in str(exc)


def test_a_key_without_authentication_is_an_error() -> None:
    store = LocalStore()
    with pytest.raises(ConfigError, match=r"key= was given but authentication is off"):
        Endpoint(0, store=store, world_size=2, job=JOB, config=EndpointConfig(), key=KEY)
    auth = EndpointConfig(protocol=ProtocolConfig(authenticate=True))
    with pytest.raises(ConfigError, match=r"authentication is on .* but no key was given"):
        Endpoint(0, store=store, world_size=2, job=JOB, config=auth)
    with pytest.raises(ValueError, match=r"a key was given but config\.authenticate is off"):
        Session(rank=0, job=JOB, key=KEY)


def test_no_authentication_is_said_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    store = LocalStore()
    auth = EndpointConfig(protocol=ProtocolConfig(authenticate=True))
    with caplog.at_level(logging.WARNING, logger="dlcp.io"):
        on = Endpoint(0, store=store, world_size=2, job=JOB, config=auth, key=KEY)
        on.close()
        assert "without authentication" not in caplog.text
        off = Endpoint(1, store=store, world_size=2, job=JOB, config=EndpointConfig())
        off.close()
    (line,) = [r.getMessage() for r in caplog.records if "without authentication" in r.getMessage()]
    assert "rank 1 runs without authentication" in line
    assert "inject data" in line and "DLCP_JOB_SECRET" in line
