"""Authenticated data replayed after its receiver forgot the message, through
the native receive table (``dlcp.proto.replay``): the table reports the nonces
it took, so a source's floor rises even when every datagram went through C, and
a receive posted before its data is registered with the floor, so the table
hands a replayed run back to Python, which refuses it (``replayed``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dlcp.io import native_receive
from dlcp.proto.session import Session
from tests.io.test_native_receive import Native
from tests.proto.session_helpers import KEY
from tests.proto.test_replay_floor import MEMORY, N, received, sealed, session

pytestmark = pytest.mark.skipif(
    not native_receive.verifies_tags(), reason="the native receive path verifies no tags"
)


def posted_then_fed(rx: Native, grams: list[bytes], step: int) -> np.ndarray:
    """A receive posted for (step, msg 0) before its data, fed as one run."""
    out = np.zeros(N, np.float32)
    rx.session.expect_message(0, step=step, msg=0, out=out)
    rx.feed([(grams, len(grams[0]))])
    return out


def replay_after_forgetting(feed_genuine: Callable[[Native, list[bytes], int], object]) -> Native:
    tx, rx = session(0), Native(KEY, completed_memory=MEMORY)
    old = sealed(tx, 1, 1.0)
    for step in range(1, MEMORY + 3):
        grams = old if step == 1 else sealed(tx, step, float(step))
        feed_genuine(rx, grams, step)
    assert sorted(received(rx.session)) == list(range(1, MEMORY + 3))
    taken = rx.native
    out = np.zeros(N, np.float32)
    rx.session.expect_message(0, step=1, msg=0, out=out)  # (the key comes again)
    rx.feed([(old, len(old[0]))])
    assert received(rx.session) == {} and (out == 0).all()
    assert rx.session.stats.rejected == {"replayed": len(old)}
    assert rx.native == taken  # (the table took none of it)
    return rx


def test_a_replay_is_refused_when_the_table_took_every_genuine_datagram() -> None:
    rx = replay_after_forgetting(lambda rx, grams, step: posted_then_fed(rx, grams, step))
    assert rx.session.stats.datagrams_fast == rx.native == (MEMORY + 2) * 32


def test_a_replay_is_refused_when_python_opened_the_messages() -> None:
    replay_after_forgetting(lambda rx, grams, step: rx.feed([(grams, len(grams[0]))]))


def test_the_genuine_message_of_a_reused_key_is_taken_by_the_table() -> None:
    def genuine(rx: Native, grams: list[bytes], step: int) -> None:
        rx.feed([(grams, len(grams[0]))])

    rx = replay_after_forgetting(genuine)
    tx: Session = session(0, nonce_start=1 << 40)
    taken = rx.native
    rx.feed([(sealed(tx, 1, 7.0), 32 + 256 + 24)])
    got = received(rx.session)
    assert list(got) == [1] and (got[1] == 7.0).all()
    assert rx.native == taken + 32
