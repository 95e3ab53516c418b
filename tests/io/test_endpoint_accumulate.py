"""``Endpoint.recv(accumulate=True)`` over real sockets: the message's values are
added to what ``out`` holds (posted before the message, or after it completed),
lost elements add nothing (the report names them), and a receive that cannot add
is refused in the caller's words."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from dlcp.errors import UsageError
from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore

pytestmark = pytest.mark.integration

N = 300_000  # float32 elements: about 830 datagrams at MTU 1500


def _pair(**config: object) -> tuple[Endpoint, Endpoint]:
    store = LocalStore()
    sender = Endpoint(0, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=10.0))
    receiver = Endpoint(1, store=store, world_size=2, job=JOB,
                        config=EndpointConfig(timeout=10.0, **config))  # fmt: skip
    return sender, receiver


@pytest.fixture
def pair() -> Iterator[tuple[Endpoint, Endpoint]]:
    a, b = _pair()
    yield a, b
    a.close()
    b.close()


def _arrays(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)


def test_a_posted_receive_adds_the_message(pair: tuple[Endpoint, Endpoint]) -> None:
    a, b = pair
    sent, held = _arrays(1)
    out = held.copy()
    incoming = b.recv(src=0, msg=1, out=out, accumulate=True)
    a.send(sent, to=1, msg=1).result(10)
    got = incoming.result(10)
    assert got.data is out and got.report.lost_elems == 0
    np.testing.assert_array_equal(out, held + sent)


def test_a_message_that_completed_first_is_added_when_asked_for(
    pair: tuple[Endpoint, Endpoint],
) -> None:
    a, b = pair
    sent, held = _arrays(2)
    a.send(sent, to=1, msg=2).result(10)  # completed at b, nobody asked for it yet
    out = held.copy()
    got = b.recv(src=0, msg=2, out=out, accumulate=True).result(10)
    assert got.data is out
    np.testing.assert_array_equal(out, held + sent)


def test_lost_elements_add_nothing() -> None:
    a, b = _pair(emulated_loss=0.05, emulated_loss_seed=3)
    try:
        sent, held = _arrays(3)
        out = held.copy()
        incoming = b.recv(src=0, msg=3, out=out, accumulate=True)
        a.send(sent, to=1, msg=3, p=0.2).result(10)
        report = incoming.result(10).report
    finally:
        a.close()
        b.close()
    assert report.lost_elems > 0  # (the bound let the receiver give up some)
    lost = np.zeros(N, np.bool_)
    for off, n in report.lost_ranges:
        lost[off : off + n] = True
    assert int(lost.sum()) == report.lost_elems
    np.testing.assert_array_equal(out[lost], held[lost])
    np.testing.assert_array_equal(out[~lost], (held + sent)[~lost])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "accumulate=True needs out="),
        ({"out": np.zeros(N, np.float16)}, "needs a float32 out, not float16"),
        ({"out": np.zeros(N, np.float32), "fill": "rescale"}, "not fill='rescale'"),
    ],
)
def test_a_receive_that_cannot_add_is_refused(
    pair: tuple[Endpoint, Endpoint], kwargs: dict, words: str
) -> None:
    _, b = pair
    with pytest.raises(UsageError, match=words):
        b.recv(src=0, msg=4, accumulate=True, **kwargs)
