"""Authenticated data sent again once its receiver forgot the message
(``dlcp.proto.replay``): refused as ``replayed`` on every Python receive path,
whether it would open the message as an unexpected one, fill a receive posted
for a later message of the same key, or land in that message while it arrives.
Genuine data keeps flowing; the floor is per source."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dlcp.proto.events import DataBatch, MessageReceived
from dlcp.proto.replay import ReplayFloor
from dlcp.proto.session import Session
from tests.proto.session_helpers import JOB, KEY, config

NOW = 1.0
MEMORY = 4  # completed_memory: the receiver forgets a message 4 ends later
N = 2_000  # float32 elements a message: 32 datagrams of 256 payload bytes


def session(rank: int, *, nonce_start: int = 0) -> Session:
    cfg = config(authenticate=True, completed_memory=MEMORY, pacer="unpaced")
    return Session(rank=rank, job=JOB, config=cfg, key=KEY, peers=(0, 1, 2),
                   nonce_start=nonce_start)  # fmt: skip


def sealed(tx: Session, step: int, value: float, dst: int = 1) -> list[bytes]:
    """The data datagrams of message (step, msg 0) of N elements of ``value``."""
    tx.send_message(dst, np.full(N, value, np.float32), step=step, msg=0, now=0.0)
    grams: list[bytes] = []
    for item in tx.datagrams_to_send(now=0.0, max_batches=1 << 20):
        if isinstance(item, DataBatch):
            raw, seg = bytes(item.data), item.segment_size
            grams += [raw[i : i + seg] for i in range(0, len(raw), seg)]
    return grams


def feed(rx: Session, grams: list[bytes], *, run: bool = False) -> None:
    """Each datagram on its own, or all as one run (one GRO read)."""
    if not run:
        for g in grams:
            rx.receive_datagram(g, now=NOW)
        return
    buf = np.frombuffer(b"".join(grams), np.uint8).copy()
    rx.receive_batch(buf, len(grams[0]), now=NOW)


def received(rx: Session) -> dict[int, npt.NDArray[np.float32]]:
    """step -> data of each message rx handed out since the last call."""
    got = {}
    while (e := rx.next_event()) is not None:
        assert isinstance(e, MessageReceived), e
        got[e.step] = e.data
    return got


def forget_step_1(tx: Session, rx: Session) -> list[bytes]:
    """rx receives message step 1 from tx, then MEMORY more (steps 2..): it
    forgets step 1. Returns step 1's datagrams, as an eavesdropper kept them."""
    old = sealed(tx, 1, 1.0)
    feed(rx, old)
    for step in range(2, MEMORY + 3):
        feed(rx, sealed(tx, step, float(step)))
    assert sorted(received(rx)) == list(range(1, MEMORY + 3))
    return old


def test_a_forgotten_message_replayed_opens_nothing() -> None:
    tx, rx = session(0), session(1)
    old = forget_step_1(tx, rx)
    for run in (False, True):
        feed(rx, old, run=run)
    assert received(rx) == {}
    assert rx.stats.rejected == {"replayed": 2 * len(old)}
    assert rx.progress(0, step=1, msg=0, outgoing=False, now=NOW).startswith("nothing")
    feed(rx, sealed(tx, 10, 10.0))  # genuine data still comes in
    assert (received(rx)[10] == 10.0).all()


def test_a_replay_cannot_fill_a_receive_posted_for_a_later_message_of_its_key() -> None:
    tx, rx = session(0), session(1)
    old = forget_step_1(tx, rx)
    out = np.zeros(N, np.float32)
    rx.expect_message(0, step=1, msg=0, out=out)
    feed(rx, old[:1])  # (opens nothing)
    feed(rx, old[1:], run=True)
    assert received(rx) == {}
    later = session(0, nonce_start=tx.keys.data_nonces.next + 1000)  # type: ignore[union-attr]
    genuine = sealed(later, 1, 7.0)
    feed(rx, genuine[:10])
    feed(rx, old, run=True)  # (the run path declines it, the general path refuses it)
    feed(rx, genuine[10:], run=True)
    got = received(rx)
    assert list(got) == [1] and (got[1] == 7.0).all() and (out == 7.0).all()
    assert rx.stats.rejected == {"replayed": 2 * len(old)}


def test_the_floor_is_per_source() -> None:
    tx, rx = session(0), session(1)
    forget_step_1(tx, rx)
    other = session(2)  # its nonces start at 0, below rank 0's floor
    feed(rx, sealed(other, 1, 3.0), run=True)
    assert (received(rx)[1] == 3.0).all()
    assert rx.stats.rejected == {}


def test_the_floor_rises_to_the_mark_of_the_message_forgotten() -> None:
    floor = ReplayFloor(2)
    floor.took(0, 10)
    floor.ended(0)  # marked 11
    floor.took(0, 20)
    floor.took(5, 99)
    floor.ended(5)
    assert floor.floor(0) == 0  # (nothing forgotten yet)
    floor.ended(0)  # forgets the first end: rank 0's floor is its mark
    assert (floor.floor(0), floor.floor(5)) == (11, 0)
    floor.took(0, 3)  # (a lower nonce moves no mark)
    floor.ended(0)
    floor.ended(0)
    assert (floor.floor(0), floor.floor(5)) == (21, 100)
